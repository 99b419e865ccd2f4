"""Steps 2-6 of decide for one job (:func:`schedule_job`): quota and place, else preempt,
else reserve, and why it waits — the plain path every job can take. The pipeline that runs it
for each job in turn is :mod:`fleetlog.core.decide`; :mod:`fleetlog.core.decide_fast` settles
runs of jobs the same way, faster.

A job's key (:func:`job_key`) groups jobs that succeed or fail alike within one call; key ids
are remembered per job in ``state.derived`` (derived: rebuilt as needed, see
:class:`~fleetlog.core.state.Derived`).
"""

from __future__ import annotations

from itertools import repeat

import numpy as np

from fleetlog.core.arrays import Array
from fleetlog.core.place import commit, try_place
from fleetlog.core.preempt import preempt_for
from fleetlog.core.reserve import reserve_for
from fleetlog.core.scratch import Outcome, Placement, Scratch, job_name
from fleetlog.core.state import State
from fleetlog.events.model import JobPending, JobRejected


def schedule_job(sc: Scratch, job: int, unplaceable: bool = False) -> bool:
    """Steps 2-6 for one job. True when it was placed (so its tenant's share changed).
    ``unplaceable``: the caller just found it fits on none of the nodes step 3 would try."""
    key = int(sc.key_of[job]) if job < sc.key_of.size and sc.key_of[job] >= 0 else job_key(sc.state, job)
    known = sc.failed.get(key)
    if known is not None:
        return reject(sc, job, known) if sc.policy.fail_unplaced else pending(sc, job, known)
    outcome = try_place(sc, job, unplaceable)
    if isinstance(outcome, Placement):
        commit(sc, job, outcome)
        return True
    if preempt_for(sc, job, outcome):
        return True
    if sc.policy.fail_unplaced:
        sc.failed[key] = outcome
        return reject(sc, job, outcome)
    outcome = reserve_for(sc, job, outcome)
    if outcome.cacheable:
        sc.failed[key] = outcome
    return pending(sc, job, outcome)


def reject(sc: Scratch, job: int, outcome: Outcome) -> bool:
    """``fail_unplaced`` policies: a job that does not fit now is rejected, with the reason."""
    message = f"{outcome.reason}: {outcome.message}"
    sc.decisions.append(JobRejected(job_id=job_name(sc.state, job), reason="unplaceable", message=message))
    return False


def pending(sc: Scratch, job: int, outcome: Outcome) -> bool:
    """Record why ``job`` waits; emit a decision only when the reason or its numbers changed."""
    state = sc.state
    code = int(state.jobs.cols["reason"][job])
    same = code > 0 and state.reason_codes.names[code - 1] == outcome.reason
    if not (same and state.reason_text.get(job) == outcome.message):
        sc.decisions.append(
            JobPending(job_id=job_name(state, job), reason=outcome.reason, message=outcome.message)
        )
    return False


_KEY_COLUMNS = ("cpu", "mem", "gpus", "milli", "models", "cls")
"""The task columns of a job's key: its tasks' shapes and constraint classes."""


def job_key(state: State, job: int) -> int:
    """Jobs with equal keys succeed or fail alike (until capacity is freed in this call).
    The key is interned to a small integer, memoized per job (a job's shape never changes)."""
    return int(job_keys(state, np.array([job], dtype=np.int64))[0])


def job_keys(state: State, rows: Array) -> Array:
    """:func:`job_key` of each of ``rows``: the memoized ones at once, the others computed."""
    derived = state.derived
    keys: Array = derived.job_keys.of(rows)
    new = np.flatnonzero(keys < 0)
    if new.size == 0:
        return keys
    jc, tc = state.jobs.cols, state.tasks.cols
    jobs = rows[new]
    single = jc["ntasks"][jobs] == 1
    firsts = np.where(single, jc["first_task"][jobs], 0)  # (a job of no task has no row)
    # one-task jobs (most): the key from the columns at once, the task's shape as integers
    tenant, priority, topology, expected = (
        jc[c][jobs].tolist() for c in ("tenant", "priority", "topology", "expected_ms")
    )
    shape = zip(*(tc[c][firsts].tolist() for c in _KEY_COLUMNS), strict=True)
    cells = (
        [state.job_cells.get(job, ()) for job in jobs.tolist()] if state.job_cells else repeat((), jobs.size)
    )
    ids, key_ids = [], derived.key_ids
    one_task_keys = zip(tenant, priority, topology, expected, cells, shape, strict=True)
    for job, one, key in zip(jobs.tolist(), single.tolist(), one_task_keys, strict=True):
        ids.append(key_ids.setdefault(key if one else _job_key(state, job), len(key_ids)))
    keys[new] = ids
    derived.job_keys.cover(int(jobs.max()))
    derived.job_keys.col[jobs] = ids
    return keys


def _job_key(state: State, job: int) -> tuple[object, ...]:
    """A gang's key: its task columns as bytes (a one-task job's are integers: never equal)."""
    jc, tc = state.jobs.cols, state.tasks.cols
    rows = state.job_tasks(job)
    shape = tuple(tc[c][rows.start : rows.stop].tobytes() for c in _KEY_COLUMNS)
    return (
        int(jc["tenant"][job]),
        int(jc["priority"][job]),
        int(jc["topology"][job]),
        int(jc["expected_ms"][job]),
        state.job_cells.get(job, ()),
        shape,
    )
