"""The merged runs' share (``order._ShareOf``, its quota and base read once per tenant) against
``order.weighted_share``, at the limits: no quota, a quota of zero nominal (the fleet is the
base), a resource the base lacks, a fleet of nothing, weights, usage of zero or below."""

from __future__ import annotations

import random

from fleetlog.core.order import _ShareOf, weighted_share
from fleetlog.core.state import CoreConfig, Quota, State


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
