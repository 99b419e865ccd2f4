"""Step 1 of decide: the order pending jobs are considered in.

Priority first (higher first).  Within a priority, tenants take turns by weighted
dominant-resource share (DRF): the tenant whose largest share of its guaranteed
quota (or, without a quota, of the fleet) is smallest goes next, recomputed after
each of its jobs is considered.  FIFO (log order) within a tenant.
"""

from __future__ import annotations

import heapq
from collections.abc import Generator

import numpy as np

from fleetlog.core.arrays import Array
from fleetlog.core.state import JobState, NodeStatus, Quota, State

SCALE = 1_000_000_000


def fleet_capacity(state: State) -> tuple[int, int, int]:
    n, c = state.nodes.size, state.nodes.cols
    up = c["status"][:n] == NodeStatus.UP
    return (
        int(c["cpu_alloc"][:n][up].sum()),
        int(c["mem_alloc"][:n][up].sum()),
        int(c["gpu_count"][:n][up].sum()) * 1000,
    )


def dominant_share(
    state: State, usage: dict[tuple[int, int], list[int]], tenant: int, fleet: tuple[int, int, int]
) -> int:
    """The tenant's weighted dominant share, as an integer (parts per billion / weight)."""
    return weighted_share(state.quotas.get((tenant, -1)), usage.get((tenant, -1), [0, 0, 0]), fleet)


def weighted_share(quota: Quota | None, used: list[int], fleet: tuple[int, int, int]) -> int:
    """A tenant's weighted dominant share from its fleet-wide quota (``None``: none) and usage:
    of its nominal quota when it has one, else of the ``fleet``; shared with the dispatcher."""
    base = quota.nominal if quota is not None and any(quota.nominal) else fleet
    weight = quota.weight_milli if quota is not None else 1000
    share = max((used[i] * SCALE // base[i] for i in range(3) if base[i] > 0), default=0)
    return share * 1000 // weight


Runs = Generator[tuple[Array, bool], tuple[int, bool], None]
"""Yields the rest of the front tenant's queue (job rows in order) and whether that tenant is
alone in its priority class (then no placement can change whose turn it is: the caller may go
through the whole run); the caller sends back how many of them it considered and whether the
last one was placed (its tenant's share moved)."""


def drf_runs(state: State, usage: dict[tuple[int, int], list[int]]) -> Runs:
    """Pending job rows in decide order, a tenant's run at a time; ``usage`` is read afresh
    after each placement."""
    jc = state.jobs.cols
    pending = np.flatnonzero(state.jobs.view("state") == JobState.PENDING)
    if pending.size == 0:
        return
    prio, tenant, seq = jc["priority"][pending], jc["tenant"][pending], jc["seq"][pending]
    pending = pending[np.lexsort((seq, tenant, -prio))]
    fleet = fleet_capacity(state) if np.any(tenant != tenant[0]) else (0, 0, 0)  # (one tenant: unused)
    prio, tenant = jc["priority"][pending], jc["tenant"][pending]
    bounds = np.flatnonzero(np.diff(prio)) + 1
    for block, tenants in zip(np.split(pending, bounds), np.split(tenant, bounds), strict=True):
        yield from _one_class(state, usage, block, tenants, fleet)


def _one_class(
    state: State,
    usage: dict[tuple[int, int], list[int]],
    jobs: Array,
    tenants: Array,
    fleet: tuple[int, int, int],
) -> Runs:
    cuts = np.flatnonzero(np.diff(tenants)) + 1
    if cuts.size == 0:  # one tenant: its turn whatever its share
        queue = jobs
        while queue.size:
            used, _ = yield queue, True
            queue = queue[used:]
        return
    queues = {int(t[0]): q for q, t in zip(np.split(jobs, cuts), np.split(tenants, cuts), strict=True)}
    heap = [(dominant_share(state, usage, t, fleet), t) for t in sorted(queues)]
    heapq.heapify(heap)
    while heap:
        _, t = heapq.heappop(heap)
        queue = queues[t]
        while queue.size:
            used, placed = yield queue, False
            queue = queues[t] = queue[used:]
            if placed:  # the share moved: re-rank
                if queue.size:
                    heapq.heappush(heap, (dominant_share(state, usage, t, fleet), t))
                break
            # Not placed (the run ended without a placement): the share is unchanged and was the
            # smallest, so this tenant stays in front — exactly what popping it again would give.
