"""``decide(state, policy)``: the decisions to take now, as events. Pure: ``state`` is not changed.

The steps, in order, for each pending job:

1. **Order** — priority first; within a priority, the tenant with the lowest weighted
   dominant-resource share (DRF) goes next, recomputed after every placement; FIFO
   within a tenant (:mod:`fleetlog.core.order`).
2. **Quota** — the tenant's nominal quota per cell and in total, plus what it may
   borrow from its cohort's idle quota up to its borrowing limit (:mod:`fleetlog.core.quota`).
3. **Place** — the whole gang or nothing, on up nodes of allowed cells and GPU models,
   within one block/rack/host when required, scored by the policy; a job allowed in
   several cells goes where it scores best (:mod:`fleetlog.core.place`, over the kernel
   calls of :mod:`fleetlog.core.fitting`).
4. **Preempt** — when it does not fit, a higher priority may evict lower ones and a
   tenant within its nominal quota may evict cohort borrowers: the fewest whole gangs,
   lowest priority and youngest first, never twice for one cause within a window
   (:mod:`fleetlog.core.preempt`).
5. **Reserve / backfill** — a gang that still does not fit reserves the domain it fits
   best in; later jobs may use reserved nodes only if they are expected to finish
   before the reservation can start (:mod:`fleetlog.core.reserve`).
6. **Explain** — every job left pending gets a reason code and its numbers
   (:mod:`fleetlog.core.explain`); a decision is emitted only when the reason changes.

This module is the pipeline: it runs the steps for each job in turn and settles jobs whose
key already failed in bulk. The working copy of free capacity and usage lives in
:class:`~fleetlog.core.scratch.Scratch`; the modules import one way: scratch → fitting →
explain → place → preempt, reserve → decide (order and quota import none of them).
"""

from __future__ import annotations

from itertools import repeat
from typing import Final

import numpy as np

from fleetlog.core import kernels
from fleetlog.core.arrays import Array
from fleetlog.core.order import drf_runs
from fleetlog.core.place import commit, emit_placed, try_place
from fleetlog.core.policy import Policy
from fleetlog.core.preempt import preempt_for
from fleetlog.core.reserve import reserve_for
from fleetlog.core.scratch import (
    MAX_MEMOS,
    MEMO_ROWS,
    MemoCache,
    Memos,
    Outcome,
    Placement,
    Scratch,
    Shape,
    job_name,
    shape_matrix,
)
from fleetlog.core.state import JobState, State
from fleetlog.events.model import Decision, JobPending, JobRejected

# (re-exported: callers and tests import these from decide, where they lived before)
__all__ = [
    "MAX_MEMOS",
    "MEMO_ROWS",
    "Memos",
    "Scratch",
    "decide",
    "job_key",
    "job_keys",
    "shape_matrix",
]


def decide(state: State, policy: Policy) -> list[Decision]:
    """The decisions for every pending job, in the order they were taken.

    What the call learns of node scores is left in ``state.decide_memo`` for the next call
    (derived, not state: the next call checks it against the nodes' free capacity first)."""
    sc = Scratch(state, policy)
    kept, state.decide_memo = state.decide_memo, None  # (gone if this call fails)
    sc.adopt(kept if isinstance(kept, MemoCache) else None)
    pending_rows = np.flatnonzero(state.jobs.view("state") == JobState.PENDING)
    sc.key_of = np.full(state.jobs.size, -1, dtype=np.int64)
    sc.key_of[pending_rows] = job_keys(state, pending_rows)
    runs = drf_runs(state, sc.usage)
    try:
        run = next(runs)
        while True:
            run = runs.send(consider(sc, run))
    except StopIteration:
        pass
    state.decide_memo = sc.keep()
    return sc.decisions


def consider(sc: Scratch, turn: tuple[Array, bool]) -> tuple[int, bool]:
    """Schedule the jobs of a tenant's run in order until one is placed — or all of them when
    the tenant is alone in its priority class: (how many, the last one was placed).

    Jobs whose key already failed in this call are settled in bulk (:func:`settle_known`):
    the same outcome, in the same order, without the per-job Python path."""
    run, alone = turn
    at, placed = 0, False
    fast = alone and len(sc.cells) == 1 and not sc.state.quotas and not sc.policy.require_quota
    while at < run.size:
        at = settle_known(sc, run, at)
        if fast and not sc.reservations and not sc.swapped:
            at = place_singles(sc, run, at)
            if at < run.size and (sc.reservations or sc.swapped):
                continue  # (the job before was scheduled: back to the general path)
        if at == run.size:
            break
        placed = schedule_job(sc, int(run[at]))
        at += 1
        if placed and not alone:
            return at, True
    return at, placed


SINGLES_CHUNK: Final = 64  # jobs whose columns place_singles reads at once


def place_singles(sc: Scratch, run: Array, at: int) -> int:
    """Schedule the jobs from ``at`` on while each is one task with no topology and no allowed
    cells of its own: exactly what :func:`schedule_job` does for such a job when its tenant is
    alone in its priority class and there is one cell, no quota and no reservation. The
    placing is done by ``kernels.place_run`` a chunk of jobs at a time; a job of a key that
    already failed is settled here, and one that does not fit goes through
    :func:`schedule_job`. The index of the first job left to the caller: ``run.size``, or a
    job of another kind, or the one after a reservation was made or free capacity swapped."""
    state = sc.state
    jc, tc = state.jobs.cols, state.tasks.cols
    (cell,) = sc.cells
    cands = sc.up_by_cell[cell]
    chunk = min(SINGLES_CHUNK, sc.memos.limit)  # (every shape of a chunk holds its slot)
    while at < run.size:
        jobs = run[at : at + chunk]
        simple = (jc["ntasks"][jobs] == 1) & (jc["topology"][jobs] == 0) & (sc.key_of[jobs] >= 0)
        if state.job_cells:
            simple &= np.fromiter((j not in state.job_cells for j in jobs.tolist()), np.bool_, jobs.size)
        k = jobs.size if simple.all() else int(np.argmin(simple))
        if k == 0:
            return at
        jobs, firsts, keys = jobs[:k], jc["first_task"][jobs[:k]], sc.key_of[jobs[:k]]
        tasks = np.empty((k, kernels.RUN_COLUMNS), dtype=np.int64)
        for i, c in enumerate(("cpu", "mem", "gpus", "milli", "models")):
            tasks[:, i] = tc[c][firsts]
        if sc.policy_id == kernels.FGD:  # (best fit needs no memo)
            shapes: list[Shape] = list(map(tuple, tasks[:, :5].tolist()))
            tasks[:, kernels.RUN_SLOT] = [sc.memos.slot(shape) for shape in shapes]
        out = np.empty((k, 2), dtype=np.int64)
        done = 0
        while done < k:
            tasks[done:, kernels.RUN_SKIP] = [key in sc.failed for key in keys[done:].tolist()]
            placed = kernels.place_run(
                cands, sc.cpu_free, sc.mem_free, sc.gpu_free, sc.gpu_total, sc.gpu_count, sc.model,
                sc.policy_id, sc.shapes, sc.floor_table(), sc.node_version, sc.memos.store,
                tasks[done:], out[done:], sc.run_buffer(),
            )  # fmt: skip
            emit_placed(sc, jobs[done : done + placed], out[done : done + placed], cell)
            done += placed
            if done == k:
                break
            job = int(jobs[done])
            done += 1
            if tasks[done - 1, kernels.RUN_SKIP]:  # its key failed earlier in this call
                if not sc.policy.fail_unplaced:
                    return at + done - 1  # for settle_known: the whole run of such jobs at once
                reject(sc, job, sc.failed[int(keys[done - 1])])
                continue
            schedule_job(sc, job, unplaceable=True)  # it fits on none of cands: why, and what then
            if sc.reservations or sc.swapped:
                return at + done
        at += k
        if k < chunk and at < run.size:
            return at  # the next job is of another kind
    return at


def settle_known(sc: Scratch, run: Array, at: int) -> int:
    """Settle the jobs from ``at`` on whose key already failed in this call — exactly as
    :func:`pending` would, one after another — and return the index of the first job that
    needs scheduling."""
    if sc.policy.fail_unplaced or not sc.failed:
        return at
    failed = np.fromiter(sc.failed, dtype=np.int64, count=len(sc.failed))
    end, size = at, 16
    while end < run.size:  # find the first job of an untried key, looking further each round
        known = np.isin(sc.key_of[run[end : end + size]], failed)
        if not known.all():
            end += int(np.argmin(known))
            break
        end, size = end + known.size, size * 4
    if end > at:
        emit_changed_pending(sc, run[at:end], sc.key_of[run[at:end]])
    return end


def emit_changed_pending(sc: Scratch, jobs: Array, keys: Array) -> None:
    """:func:`pending` for each of ``jobs`` (all of known failed keys), in order."""
    state = sc.state
    reasons, texts = state.jobs.cols["reason"][jobs], state.text_ids.of(jobs)
    changed = np.zeros(jobs.size, dtype=np.bool_)
    for key in np.unique(keys).tolist():
        outcome, mine = sc.failed[key], keys == key
        same = (reasons == state.reason_codes.get(outcome.reason) + 1) & (
            texts == state.text_index.get(outcome.message, -2)
        )
        changed |= mine & ~same
    for i in np.flatnonzero(changed).tolist():
        outcome = sc.failed[int(keys[i])]
        job_id = job_name(sc.state, int(jobs[i]))
        sc.decisions.append(JobPending(job_id=job_id, reason=outcome.reason, message=outcome.message))


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


def job_key(state: State, job: int) -> int:
    """Jobs with equal keys succeed or fail alike (until capacity is freed in this call).
    The key is interned to a small integer, memoized per job (a job's shape never changes)."""
    return int(job_keys(state, np.array([job], dtype=np.int64))[0])


def job_keys(state: State, rows: Array) -> Array:
    """:func:`job_key` of each of ``rows``: the memoized ones at once, the others computed."""
    keys: Array = state.job_keys.of(rows)
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
    shape = zip(*(tc[c][firsts].tolist() for c in ("cpu", "mem", "gpus", "milli", "models")), strict=True)
    cells = (
        [state.job_cells.get(job, ()) for job in jobs.tolist()] if state.job_cells else repeat((), jobs.size)
    )
    ids, key_ids = [], state.key_ids
    one_task_keys = zip(tenant, priority, topology, expected, cells, shape, strict=True)
    for job, one, key in zip(jobs.tolist(), single.tolist(), one_task_keys, strict=True):
        ids.append(key_ids.setdefault(key if one else _job_key(state, job), len(key_ids)))
    keys[new] = ids
    state.job_keys.cover(int(jobs.max()))
    state.job_keys.col[jobs] = ids
    return keys


def _job_key(state: State, job: int) -> tuple[object, ...]:
    """A gang's key: its task columns as bytes (a one-task job's are integers: never equal)."""
    jc, tc = state.jobs.cols, state.tasks.cols
    rows = state.job_tasks(job)
    shape = tuple(tc[c][rows.start : rows.stop].tobytes() for c in ("cpu", "mem", "gpus", "milli", "models"))
    return (
        int(jc["tenant"][job]),
        int(jc["priority"][job]),
        int(jc["topology"][job]),
        int(jc["expected_ms"][job]),
        state.job_cells.get(job, ()),
        shape,
    )
