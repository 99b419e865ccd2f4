"""Step 5 of decide: a gang that still does not fit reserves the domain it fits best in once
drained; later jobs may use reserved nodes only if they are expected to finish before the
reservation can start (backfill: :func:`fleetlog.core.place.may_backfill`).
"""

from __future__ import annotations

import numpy as np

from fleetlog.core.arrays import Array
from fleetlog.core.fitting import place_in_cell
from fleetlog.core.place import allowed_cells
from fleetlog.core.scratch import Outcome, Scratch
from fleetlog.core.shapes import LEVELS
from fleetlog.core.state import LEVEL_MASK, NO_LIMIT, State


def reserve_for(sc: Scratch, job: int, failure: Outcome) -> Outcome:
    """A blocked gang reserves the domain with the most free GPU share in which it would fit
    once drained (a gang that fits nowhere even on empty nodes reserves nothing)."""
    state, policy = sc.state, sc.policy
    if (
        not policy.reserve
        or len(sc.reservations) >= policy.max_reservations
        or failure.reason not in ("gang_does_not_fit", "gang_does_not_fit_topology")
    ):
        return failure
    cell = allowed_cells(sc, job)[0]
    cands = sc.candidates(cell, False, job)
    level = int(state.jobs.cols["topology"][job]) & LEVEL_MASK
    domain = (
        state.nodes.cols[LEVELS[level]][: state.nodes.size][cands]
        if level
        else np.zeros(cands.size, np.int64)
    )
    nodes = drained_fit(sc, job, cands, domain)
    if nodes is None:
        return failure
    sc.reserved[nodes] = True
    start = reservation_start(state, nodes)
    sc.reservations.append((job, cell, start))
    where = (
        state.names["topo"].names[int(domain[np.searchsorted(cands, nodes[0])])].split("\x00")[-1]
        if level
        else "its cell"
    )
    when = "unknown (a job running there has no expected duration)" if start >= NO_LIMIT else f"{start} ms"
    return Outcome(
        "waiting_for_reservation",
        f"{failure.message}; reserved {nodes.size} nodes of {where}; expected free at {when}",
        False,
    )


def drained_fit(sc: Scratch, job: int, cands: Array, domain: Array) -> Array | None:
    """The nodes of the domain (most free GPU share first, at most 8 tried) where ``job``
    would fit if every task running there ended, or None."""
    valid = domain >= 0
    if not valid.any():
        return None
    free = sc.gpu_free[cands].sum(axis=1, dtype=np.int64)
    totals = np.bincount(domain[valid], weights=free[valid]).astype(np.int64)
    present = np.unique(domain[valid])
    for d in present[np.lexsort((present, -totals[present]))][:8].tolist():
        nodes: Array = cands[domain == d]
        if fits_when_drained(sc, job, nodes):
            return nodes
    return None


def fits_when_drained(sc: Scratch, job: int, nodes: Array) -> bool:
    c, n = sc.state.nodes.cols, sc.state.nodes.size
    full = np.where(np.arange(c["gpu_free"].shape[1]) < c["gpu_count"][:n, None], 1000, 0).astype(np.int16)
    drained = (c["cpu_alloc"][:n].copy(), c["mem_alloc"][:n].copy(), full, full.sum(axis=1, dtype=np.int64))
    saved = sc.swap_free(drained)
    try:
        return place_in_cell(sc, job, -1, nodes) is not None
    finally:
        sc.swap_free(saved)


def reservation_start(state: State, nodes: Array) -> int:
    """When every task now running on ``nodes`` is expected to have ended (NO_LIMIT if unknown)."""
    tc, jc = state.tasks.cols, state.jobs.cols
    on = np.flatnonzero(np.isin(state.tasks.view("node"), nodes))
    jobs = np.unique(tc["job"][on])
    if jobs.size == 0:
        return state.now_ms
    expected = jc["expected_ms"][jobs]
    if (expected < 0).any():
        return NO_LIMIT
    return int((jc["placed_at_ms"][jobs] + expected).max())
