"""Compaction: the job and task tables without their retired rows, renumbered in order.

Retirement (``fleetlog.core.fold.retire``) frees a job's rows by marking them ``RETIRED``;
once free rows are ``CoreConfig.compact_min_rows`` or more and outnumber the live ones, the
sweep that retired the last of them compacts: the live rows keep their order (so every order
decide reads — submission, tie-breaks by row — is the same), the collections keyed by job row
are renumbered, the job-id interner keeps only live ids, and the droppable caches kept by job
row are dropped (``Derived.forget_jobs``).
Each compaction costs about the live state and comes after at least as many retirements, so
its cost per retired job is constant and the tables stay within twice the live jobs.
"""

from __future__ import annotations

from typing import Any, Final, TypeVar

import numpy as np

from fleetlog.core.arrays import Array, entries_sum
from fleetlog.core.state import (
    SUM_DISPATCHES,
    SUM_JOB_CELLS,
    SUM_REASON_TEXT,
    SUM_RETURNED,
    JobState,
    State,
)

_RETIRED: Final = int(JobState.RETIRED)
V = TypeVar("V")


def compact(state: State) -> None:
    """Drop the retired rows of the job table and their tasks' rows; renumber the rest."""
    jobs, tasks = state.jobs, state.tasks
    keep = jobs.view("state") != _RETIRED
    new_row = np.cumsum(keep, dtype=np.int64) - 1
    job_of = tasks.view("job")
    keep_task = keep[job_of]
    before = np.zeros(tasks.size + 1, dtype=np.int64)  # kept task rows before each old row
    np.cumsum(keep_task, out=before[1:])
    first = jobs.view("first_task")
    first[...] = before[first]
    job_of[...] = new_row[job_of]
    jobs.compact(keep)
    tasks.compact(keep_task)
    state.names["job"] = state.names["job"].kept(np.flatnonzero(keep))
    state.job_cells = _renumbered(state.job_cells, new_row)
    state.reason_text = _renumbered(state.reason_text, new_row)
    state.requeues = _renumbered(state.requeues, new_row)
    state.job_meta = _renumbered(state.job_meta, new_row)
    state.dispatches = _renumbered(state.dispatches, new_row)
    state.returned = _renumbered(state.returned, new_row)
    state.held = _renumbered(state.held, new_row)
    # the entry sums of the collections keyed by row (the retired ids' sum is not)
    state.sums[SUM_JOB_CELLS] = entries_sum(state.job_cells.items())
    state.sums[SUM_REASON_TEXT] = entries_sum(state.reason_text.items())
    state.sums[SUM_DISPATCHES] = entries_sum(state.dispatches.items())
    state.sums[SUM_RETURNED] = entries_sum(state.returned.items())
    state.retired_rows = 0
    state.derived.forget_jobs(state)


def _renumbered(rows: dict[int, V], new_row: Array) -> dict[int, V]:
    """``rows`` (job row -> value, none retired) keyed by the new rows, in the same order."""
    if not rows:
        return rows
    keys: Any = new_row[np.fromiter(rows, dtype=np.int64, count=len(rows))].tolist()
    return dict(zip(keys, rows.values(), strict=True))
