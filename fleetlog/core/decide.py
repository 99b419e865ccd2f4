"""``decide(state, policy)``: the decisions to take now, as events. The state is not changed:
only its droppable caches (``state.derived``: memos and key ids, see :func:`decide`).

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

This module is the pipeline: it runs steps 2-6 for each job in turn
(:func:`fleetlog.core.schedule.schedule_job`, the plain path) or, for runs of jobs, through
their batch twins (:mod:`fleetlog.core.decide_fast`); :func:`consider` chooses. The working
copy of free capacity and usage lives in :class:`~fleetlog.core.scratch.Scratch`, the node
scores remembered per task shape in :mod:`fleetlog.core.memo`; the modules import one way:
memo → scratch → fitting → explain → place → preempt, reserve → schedule → decide_fast →
decide (order and quota import none of them).
"""

from __future__ import annotations

import numpy as np

from fleetlog.core.arrays import Array
from fleetlog.core.decide_fast import place_singles, settle_known
from fleetlog.core.memo import MemoCache
from fleetlog.core.order import ALONE, MERGED, drf_runs
from fleetlog.core.policy import Policy
from fleetlog.core.schedule import job_keys, schedule_job
from fleetlog.core.scratch import Scratch
from fleetlog.core.state import JobState, State
from fleetlog.events.model import Decision


def decide(state: State, policy: Policy) -> list[Decision]:
    """The decisions for every pending job, in the order they were taken.

    Writes ``state.derived`` only, never the state the digest covers: the node scores this
    call learned (``decide_memo``, for the next call to reuse where nodes did not change),
    the key id of each pending job (``job_keys``, ``key_ids``) and the fleet's never-fits
    answers (``fit_memo``). All are checked before use and droppable
    (:class:`~fleetlog.core.state.Derived`)."""
    sc = Scratch(state, policy)
    derived = state.derived
    kept, derived.decide_memo = derived.decide_memo, None  # (gone if this call fails)
    sc.adopt(kept if isinstance(kept, MemoCache) else None)
    # (int(): against an IntEnum member numpy casts the whole int8 column, ~10x slower)
    pending_rows = np.flatnonzero(state.jobs.view("state") == int(JobState.PENDING))
    sc.key_of = np.full(state.jobs.size, -1, dtype=np.int64)
    sc.key_of[pending_rows] = job_keys(state, pending_rows)
    merge = MERGED_RUNS and len(sc.cells) == 1 and not state.quotas and not policy.require_quota
    runs = drf_runs(state, sc.usage, merge)
    try:
        run = next(runs)
        while True:
            run = runs.send(consider(sc, run))
    except StopIteration:
        pass
    derived.decide_memo = sc.keep()
    return sc.decisions


def consider(sc: Scratch, turn: tuple[Array, int]) -> tuple[int, bool]:
    """Schedule the jobs of a tenant's run in order until one is placed — or all of them when
    the tenant is alone in its priority class; a merged run of several tenants' jobs while each
    is placed (:func:`merged`): (how many, the last one was placed).

    The one place that chooses between the plain path (:func:`~fleetlog.core.schedule.schedule_job`,
    job by job) and its batch twins (:mod:`fleetlog.core.decide_fast`): jobs whose key already
    failed in this call are settled in bulk (``settle_known``), and runs of one-task jobs are
    placed a chunk at a time (``place_singles``) — the same outcome, in the same order."""
    run, kind = turn
    if kind == MERGED:
        return merged(sc, run)
    alone = kind == ALONE
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


MERGED_RUNS = True
"""Whether decide asks for merged runs (``order.MERGED``); the tests turn it off for the plain
twin (the turns taken one tenant at a time)."""


def merged(sc: Scratch, run: Array) -> tuple[int, bool]:
    """A merged run (``order.MERGED``: several tenants' jobs in the turns they get if each is
    placed): the jobs ``place_singles`` places as a run, then the first it does not through the
    plain path, and back to the turns (a job not placed, or placed by preempting, changes them).
    ``(0, False)``: the run cannot be placed as a run any more (a reservation, capacity swapped)."""
    if sc.reservations or sc.swapped:
        return 0, False
    at = place_singles(sc, run, 0, stop=True)
    if at == run.size:
        return at, True
    return at + 1, schedule_job(sc, int(run[at]))
