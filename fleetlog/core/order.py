"""Step 1 of decide: the order pending jobs are considered in.

Priority first (higher first).  Within a priority, tenants take turns by weighted
dominant-resource share (DRF): the tenant whose largest share of its guaranteed
quota (or, without a quota, of the fleet) is smallest goes next, recomputed after
each of its jobs is considered.  FIFO (log order) within a tenant.
"""

from __future__ import annotations

import heapq
from collections.abc import Generator
from dataclasses import dataclass
from typing import Final

import numba
import numpy as np

from fleetlog.core.arrays import Array
from fleetlog.core.shares import SCALE, weighted_share
from fleetlog.core.state import JobState, NodeStatus, State


def fleet_capacity(state: State) -> tuple[int, int, int]:
    n, c = state.nodes.size, state.nodes.cols
    up = c["status"][:n] == int(NodeStatus.UP)
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


def waiting_order(state: State) -> Array:
    """Pending job rows in the order decide considers them while none of them is placed (what
    :func:`drf_runs` yields then): priority first (higher first); within a priority the tenants
    by their weighted dominant share now (ties: the tenant's id, as the turns' heap breaks them),
    each tenant's whole queue in one turn (no placement, no share moves); FIFO (log order)
    within a tenant. A placement re-ranks its tenant, so this is the order up to the first job
    placed (``docs/api.md``, ``queue_position``)."""
    jc = state.jobs.cols
    pending = np.flatnonzero(state.jobs.view("state") == int(JobState.PENDING))
    if pending.size == 0:
        return pending
    prio, tenant, seq = jc["priority"][pending], jc["tenant"][pending], jc["seq"][pending]
    tenants = np.unique(tenant)
    turn = np.zeros(pending.size, np.int64)
    if tenants.size > 1:
        fleet = fleet_capacity(state)
        ranked = sorted((dominant_share(state, state.usage, t, fleet), t) for t in tenants.tolist())
        rank = np.zeros(int(tenants.max()) + 1, np.int64)
        rank[[t for _, t in ranked]] = np.arange(len(ranked))
        turn = rank[tenant]
    order: Array = pending[np.lexsort((seq, turn, -prio.astype(np.int64)))]
    return order


CONTESTED: Final = 0
"""A run of the front tenant's queue, other tenants waiting: consider it until one is placed."""
ALONE: Final = 1
"""A run of the front tenant's queue, the tenant alone in its class: consider it all."""
MERGED: Final = 2
"""A run of several tenants' jobs in the order the turns would go if every one were placed
(:func:`_predicted`): consider them in order while each is placed, stop after the first that is
not (from there the turns go otherwise)."""
MERGED_FIRST: Final = 16
MERGED_FIRST_KERNEL: Final = 128
MERGED_MOST: Final = 4096
"""A merged run's length: from 16, doubled after a run whose every job was placed, back to 16
after one that was not (predicting further costs a heap operation per job); from 128 when the
kernel foresees the turns (:class:`_Turns`: a turn costs next to nothing there, while each run
costs a kernel call and the turns taken)."""

Runs = Generator[tuple[Array, int], tuple[int, bool], None]
"""Yields a run of job rows in order and its kind (:data:`CONTESTED`, :data:`ALONE`,
:data:`MERGED`); the caller sends back how many of them it considered and whether the last one
was placed (its tenant's share moved). A merged run answered with 0 considered: no more merged
runs in this call (the caller can no longer place them as a run)."""


def drf_runs(state: State, usage: dict[tuple[int, int], list[int]], merge: bool = False) -> Runs:
    """Pending job rows in decide order, a tenant's run at a time (``merge``: several tenants'
    runs merged while the turns can be foreseen); ``usage`` is read afresh after each placement."""
    jc = state.jobs.cols
    pending = np.flatnonzero(state.jobs.view("state") == int(JobState.PENDING))
    if pending.size == 0:
        return
    prio, tenant, seq = jc["priority"][pending], jc["tenant"][pending], jc["seq"][pending]
    pending = pending[np.lexsort((seq, tenant, -prio))]
    fleet = fleet_capacity(state) if np.any(tenant != tenant[0]) else (0, 0, 0)  # (one tenant: unused)
    prio, tenant = jc["priority"][pending], jc["tenant"][pending]
    bounds = np.flatnonzero(np.diff(prio)) + 1
    for block, tenants in zip(np.split(pending, bounds), np.split(tenant, bounds), strict=True):
        yield from _one_class(state, usage, block, tenants, fleet, merge)


def _one_class(
    state: State,
    usage: dict[tuple[int, int], list[int]],
    jobs: Array,
    tenants: Array,
    fleet: tuple[int, int, int],
    merge: bool = False,
) -> Runs:
    cuts = np.flatnonzero(np.diff(tenants)) + 1
    if cuts.size == 0:  # one tenant: its turn whatever its share
        queue = jobs
        while queue.size:
            used, _ = yield queue, ALONE
            queue = queue[used:]
        return
    queues = {int(t[0]): q for q, t in zip(np.split(jobs, cuts), np.split(tenants, cuts), strict=True)}
    heap = [(dominant_share(state, usage, t, fleet), t) for t in sorted(queues)]
    heapq.heapify(heap)
    turns = _Turns.of(state, jobs, cuts, fleet) if merge and cuts.size < TURNS_MOST_TENANTS else None
    first = MERGED_FIRST_KERNEL if turns is not None else MERGED_FIRST
    size = first
    while heap:
        if merge:
            run = (turns.predicted(usage, queues, heap, size) if turns is not None else None) or _predicted(
                state, usage, queues, heap, fleet, size
            )
            used, placed = yield run.jobs, MERGED
            if used == 0:
                merge = False
                continue
            t = _took(state, usage, queues, heap, fleet, run, used, placed)
            size = min(2 * size, MERGED_MOST) if placed and used == run.jobs.size else first
            if placed:
                continue
            # its last job was not placed: that tenant stays in front (its turn goes on below)
        else:
            _, t = heapq.heappop(heap)
        queue = queues[t]
        while queue.size:
            used, placed = yield queue, CONTESTED
            queue = queues[t] = queue[used:]
            if placed:  # the share moved: re-rank
                if queue.size:
                    heapq.heappush(heap, (dominant_share(state, usage, t, fleet), t))
                break
            # Not placed (the run ended without a placement): the share is unchanged and was the
            # smallest, so this tenant stays in front — exactly what popping it again would give.


def _requests(state: State, jobs: Array) -> list[list[int]]:
    jc = state.jobs.cols
    return np.stack([jc[c][jobs] for c in ("req_cpu", "req_mem", "req_gpu")], axis=1).tolist()  # type: ignore[no-any-return]


@dataclass
class Predicted:
    """A merged run (:func:`_predicted`): its jobs, each one's tenant, and the share its tenant
    was re-ranked on after it (``None``: not re-ranked, its queue done or the run's end)."""

    jobs: Array
    tenants: list[int]
    shares: list[int | None]


def _predicted(
    state: State,
    usage: dict[tuple[int, int], list[int]],
    queues: dict[int, Array],
    heap: list[tuple[int, int]],
    fleet: tuple[int, int, int],
    size: int,
) -> Predicted:
    """Up to ``size`` jobs in the order the turns go if each is placed: the heap's turns played
    on a copy, each tenant's share grown by its job's request, what a placement adds to its
    usage. Nothing is changed."""
    heap, at = list(heap), {}
    out: list[int] = []
    tenants: list[int] = []
    shares: list[int | None] = []
    used: dict[int, list[int]] = {}
    heads: dict[int, Array] = {}
    req: dict[int, list[list[int]]] = {}
    share = _ShareOf(state, fleet)
    while heap and len(out) < size:
        _, t = heapq.heappop(heap)
        if t not in heads:  # (read when its turn first comes: most tenants may get none)
            heads[t], used[t], at[t] = queues[t][:size], list(usage.get((t, -1), (0, 0, 0))), 0
            req[t] = _requests(state, heads[t])
        i = at[t]
        out.append(int(heads[t][i]))
        tenants.append(t)
        row, cost = used[t], req[t][i]
        row[0], row[1], row[2] = row[0] + cost[0], row[1] + cost[1], row[2] + cost[2]
        at[t] = i + 1
        if i + 1 == queues[t].size or i + 1 == heads[t].size:
            shares.append(None)
            if i + 1 < queues[t].size:
                break  # (its head ran out: the run stops at a turn it did not read ahead)
            continue  # (its queue is done: out of the turns)
        now = share(t, row)
        shares.append(now)
        heapq.heappush(heap, (now, t))
    return Predicted(np.array(out, dtype=np.int64), tenants, shares)


TURNS_MOST_TENANTS: Final = 64
"""Up to this many tenants in a class, merged runs are foreseen by :func:`_turns` (a kernel),
beyond by :func:`_predicted` (reads only the tenants whose turn comes)."""
_INT64: Final = (1 << 63) - 1


class _Turns:
    """What :func:`_turns` needs of a priority class's pending jobs, read once per decide call:
    the tenants in order, where each one's queue ends in the class's rows, the jobs' requests,
    each tenant's share base and weight (as :class:`_ShareOf`)."""

    def __init__(
        self, jobs: Array, tenants: list[int], end: Array, req: Array, bases: Array, weights: Array
    ) -> None:
        self.jobs, self.tenants, self.end, self.req = jobs, tenants, end, req
        self.bases, self.weights = bases, weights
        self.index = {t: k for k, t in enumerate(tenants)}
        self.most_req = [int(x) for x in req.max(axis=0)] if req.size else [0, 0, 0]
        self.sound = bool(req.size == 0 or req.min() >= 0) and bool((weights > 0).all())
        positive = [bases[:, i][bases[:, i] > 0] for i in range(3)]
        self.base_min = [int(b.min()) if b.size else 0 for b in positive]
        """Each resource's least positive base (0: no tenant's share counts it)."""

    @classmethod
    def of(cls, state: State, jobs: Array, cuts: Array, fleet: tuple[int, int, int]) -> _Turns:
        tenants = [int(t) for t in state.jobs.cols["tenant"][jobs[np.concatenate(([0], cuts))]].tolist()]
        bases, weights = np.zeros((len(tenants), 3), np.int64), np.zeros(len(tenants), np.int64)
        for k, t in enumerate(tenants):
            quota = state.quotas.get((t, -1))
            bases[k] = quota.nominal if quota is not None and any(quota.nominal) else fleet
            weights[k] = quota.weight_milli if quota is not None else 1000
        end = np.append(cuts, jobs.size).astype(np.int64)
        req = np.ascontiguousarray(
            np.stack([state.jobs.cols[c][jobs] for c in ("req_cpu", "req_mem", "req_gpu")], axis=1),
            dtype=np.int64,
        )
        return cls(jobs, tenants, end, req, bases, weights)

    def predicted(
        self,
        usage: dict[tuple[int, int], list[int]],
        queues: dict[int, Array],
        heap: list[tuple[int, int]],
        size: int,
    ) -> Predicted | None:
        """:func:`_predicted`'s run by the kernel; None when its integers could leave int64 (then
        the plain one, in Python's unbounded integers, decides)."""
        if not self.sound:
            return None
        used_rows = [usage.get((t, -1), (0, 0, 0)) for t in self.tenants]
        for i in range(3):  # the most any usage can grow to in this run, scaled as the share scales it
            column = [row[i] for row in used_rows]
            if min(column) < 0:
                return None
            most = (max(column) + self.most_req[i] * size) * SCALE
            if self.base_min[i] and (most > _INT64 or most // self.base_min[i] * 1000 > _INT64):
                return None
        if max(share for share, _ in heap) > _INT64:
            return None
        at = self.end - np.array([queues[t].size for t in self.tenants], dtype=np.int64)
        used = np.array(used_rows, dtype=np.int64).reshape(-1, 3)
        rows = np.array([(share, t, self.index[t]) for share, t in heap], dtype=np.int64).reshape(-1, 3)
        out = np.empty((size, 3), dtype=np.int64)
        count = _turns(rows, at, self.end, self.req, used, self.bases, self.weights, size, out)
        out = out[:count]
        shares = out[:, 2].tolist()
        return Predicted(
            self.jobs[out[:, 0]],
            [self.tenants[k] for k in out[:, 1].tolist()],
            [None if x < 0 else x for x in shares],
        )


@numba.njit(cache=True)
def _turns(
    heap: Array,
    at: Array,
    end: Array,
    req: Array,
    used: Array,
    bases: Array,
    weights: Array,
    size: int,
    out: Array,
) -> int:
    """:func:`_predicted` over arrays: ``heap`` rows (share, tenant, its index k); per k, where
    its queue goes on (``at``) and ends (``end``) in the class's rows, its usage, share base
    and weight; ``req`` the rows' requests. Writes (row, k, share re-ranked on or -1) per turn
    into ``out``; returns how many. Changes ``heap``, ``at`` and ``used`` (the caller's copies)."""
    h = heap.shape[0]
    head = at + size  # (each tenant's head: at most ``size`` of its jobs are read ahead)
    for i in range(h // 2 - 1, -1, -1):
        _sift_down(heap, i, h)
    count = 0
    while h > 0 and count < size:
        t, k = heap[0, 1], heap[0, 2]
        h -= 1
        heap[0, 0], heap[0, 1], heap[0, 2] = heap[h, 0], heap[h, 1], heap[h, 2]
        _sift_down(heap, 0, h)
        i = at[k]
        used[k, 0] += req[i, 0]
        used[k, 1] += req[i, 1]
        used[k, 2] += req[i, 2]
        at[k] = i + 1
        out[count, 0], out[count, 1], out[count, 2] = i, k, -1
        count += 1
        if i + 1 == end[k] or i + 1 == head[k]:
            if i + 1 < end[k]:
                break  # (its head ran out: the run stops at a turn it did not read ahead)
            continue  # (its queue is done: out of the turns)
        share = -1
        for r in range(3):
            if bases[k, r] > 0:
                part = used[k, r] * SCALE // bases[k, r]
                share = max(share, part)
        share = max(share, 0) * 1000 // weights[k]
        out[count - 1, 2] = share
        heap[h, 0], heap[h, 1], heap[h, 2] = share, t, k
        _sift_up(heap, h)
        h += 1
    return count


@numba.njit(cache=True, inline="always")
def _below(heap: Array, a: int, b: int) -> bool:
    """Row ``a`` before row ``b``: (share, tenant) as Python compares the tuples of ``heapq``."""
    return bool(heap[a, 0] < heap[b, 0] or (heap[a, 0] == heap[b, 0] and heap[a, 1] < heap[b, 1]))


@numba.njit(cache=True)
def _swap(heap: Array, a: int, b: int) -> None:
    for c in range(3):
        heap[a, c], heap[b, c] = heap[b, c], heap[a, c]


@numba.njit(cache=True)
def _sift_down(heap: Array, i: int, h: int) -> None:
    while True:
        least, left = i, 2 * i + 1
        if left < h and _below(heap, left, least):
            least = left
        if left + 1 < h and _below(heap, left + 1, least):
            least = left + 1
        if least == i:
            return
        _swap(heap, i, least)
        i = least


@numba.njit(cache=True)
def _sift_up(heap: Array, i: int) -> None:
    while i > 0:
        parent = (i - 1) // 2
        if not _below(heap, i, parent):
            return
        _swap(heap, i, parent)
        i = parent


class _ShareOf:
    """:func:`weighted_share` of a tenant's usage row, its quota and base read once per tenant
    (asked once a job in a merged run)."""

    def __init__(self, state: State, fleet: tuple[int, int, int]) -> None:
        self.state, self.fleet = state, fleet
        self.terms: dict[int, tuple[tuple[tuple[int, int], ...], int]] = {}

    def __call__(self, tenant: int, used: list[int]) -> int:
        found = self.terms.get(tenant)
        if found is None:
            quota = self.state.quotas.get((tenant, -1))
            base = quota.nominal if quota is not None and any(quota.nominal) else self.fleet
            weight = quota.weight_milli if quota is not None else 1000
            found = self.terms[tenant] = (tuple((i, base[i]) for i in range(3) if base[i] > 0), weight)
        terms, weight = found
        share = None
        for i, base_i in terms:
            part = used[i] * SCALE // base_i
            if share is None or part > share:
                share = part
        return (share or 0) * 1000 // weight


def _took(
    state: State,
    usage: dict[tuple[int, int], list[int]],
    queues: dict[int, Array],
    heap: list[tuple[int, int]],
    fleet: tuple[int, int, int],
    run: Predicted,
    used: int,
    placed: bool,
) -> int:
    """The ``used`` turns a merged run took, played on the real ``heap`` and queues as the plain
    turns would have: each of its jobs but the last was placed as one run (its request added to
    its tenant's usage, nothing else), so its tenant is re-ranked on the share foreseen; the
    last, when placed, on the share ``usage`` gives now (the plain path may have preempted to
    place it). The tenant of the last job. When that job was not placed its tenant is left out
    of the heap: it stays in front (the caller goes on with its queue)."""
    taken: dict[int, int] = {}
    last = used - 1
    for k in range(used):
        t = run.tenants[k]
        _, front = heapq.heappop(heap)
        assert front == t, f"a merged run took tenant {t}'s job at tenant {front}'s turn"
        taken[t] = n = taken.get(t, 0) + 1
        if (k == last and not placed) or n == queues[t].size:
            continue
        share = dominant_share(state, usage, t, fleet) if k == last else run.shares[k]
        assert share is not None
        heapq.heappush(heap, (share, t))
    for t, n in taken.items():
        queues[t] = queues[t][n:]
    return run.tenants[last]
