"""The merged runs' share (``order._ShareOf``, its quota and base read once per tenant) against
``shares.weighted_share``, at the limits: no quota, a quota of zero nominal (the fleet is the
base), a resource the base lacks, a fleet of nothing, weights, usage of zero or below."""

from __future__ import annotations

import heapq
import random

import numpy as np

from fleetlog.core.fold import fold
from fleetlog.core.order import _predicted, _ShareOf, _Turns, dominant_share
from fleetlog.core.shares import weighted_share
from fleetlog.core.state import CoreConfig, Quota, State
from tests.core.builders import job


def test_the_kept_share_is_weighted_share() -> None:
    rng = random.Random(3)
    for round_ in range(300):
        state = State(CoreConfig())
        sizes = [rng.choice((0, 1, 64_000, 10**12)) for _ in range(3)]
        fleet = (sizes[0], sizes[1], sizes[2])
        for tenant in range(4):
            if rng.random() < 0.6:
                nominal = (rng.choice((0, 8_000)), rng.choice((0, 10**9)), rng.choice((0, 0, 8_000, 10**9)))
                weight = rng.choice((1, 1000, 4000))
                quota = Quota(nominal=nominal, borrowing_limit=None, cohort="", weight_milli=weight)
                state.quotas[(tenant, -1)] = quota
        share = _ShareOf(state, fleet)
        for _ in range(10):
            tenant = rng.randrange(4)
            used = [rng.choice((-5, 0, 1, 7_999, 10**15)) for _ in range(3)]
            assert share(tenant, used) == weighted_share(state.quotas.get((tenant, -1)), used, fleet), round_


def class_of(state: State) -> tuple[np.ndarray, np.ndarray]:
    """The pending jobs of the one priority class, as ``drf_runs`` hands them to a class: rows
    by (tenant, seq), and the cuts between tenants."""
    jc = state.jobs.cols
    rows = np.arange(state.jobs.size, dtype=np.int64)
    rows = rows[np.lexsort((jc["seq"][rows], jc["tenant"][rows]))]
    return rows, np.flatnonzero(np.diff(jc["tenant"][rows])) + 1


def test_the_turns_kernel_foresees_what_predicted_does() -> None:
    """``_Turns.predicted`` (the kernel ``_turns``) against ``_predicted`` on generated classes at
    the limits: one to seven tenants, queues of one job to many, runs of 1 to 64 turns (heads
    that run out, queues that end), queues already partly taken, equal shares (the tenant id
    breaks the tie), quotas with zero or missing resources and weights, requests of zero and
    huge, usages near where int64 would overflow (then the kernel declines: None)."""
    rng = random.Random(11)
    kernel = declined = 0
    for round_ in range(400):
        state = State(CoreConfig())
        tenants, huge = rng.randint(1, 7), rng.choice((4000, 4000, 10**9))
        for i in range(rng.randint(tenants, 60)):
            t = rng.randrange(tenants)
            cpu, mem = rng.choice((0, 1000, 4000, huge)), rng.choice((0, 1024, 10**8))
            fold(state, job(f"j{i}", tenant=f"t{t}", gpus=rng.choice((0, 1, 8)), cpu=cpu, mem=mem), i + 1)
        for t in range(tenants):
            if rng.random() < 0.5:
                nominal = (rng.choice((0, 8_000)), rng.choice((0, 10**6)), rng.choice((0, 8_000, 10**9)))
                weight = rng.choice((1, 1000, 7))
                quota = Quota(nominal=nominal, borrowing_limit=None, cohort="", weight_milli=weight)
                state.quotas[(state.names["tenant"].get(f"t{t}"), -1)] = quota
        fleet = (rng.choice((0, 96_000, 10**12)), rng.choice((0, 10**9)), rng.choice((8_000, 10**6)))
        jobs, cuts = class_of(state)
        if cuts.size == 0:
            continue
        parts = [q[rng.randrange(q.size) if rng.random() < 0.3 else 0 :] for q in np.split(jobs, cuts)]
        queues = {int(state.jobs.cols["tenant"][q[0]]): q for q in parts}
        big = rng.choice((0, 10**6, 10**6, 9 * 10**9, 10**15))
        usage = {(t, -1): [rng.choice((0, 1, big)) for _ in range(3)] for t in queues if rng.random() < 0.7}
        share = rng.choice((None, 0, 5))  # None: each tenant's own share; else every share equal
        heap = [(share if share is not None else dominant_share(state, usage, t, fleet), t) for t in queues]
        heapq.heapify(heap)
        size = rng.choice((1, 2, 3, 16, 64))
        want = _predicted(state, usage, queues, list(heap), fleet, size)
        got = _Turns.of(state, jobs, cuts, fleet).predicted(usage, queues, list(heap), size)
        if got is None:
            declined += 1
            continue
        kernel += 1
        assert got.jobs.tolist() == want.jobs.tolist(), round_
        assert got.tenants == want.tenants, round_
        assert got.shares == want.shares, round_
    assert kernel > 200, (kernel, declined)
    assert declined > 10, (kernel, declined)
