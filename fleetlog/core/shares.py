"""A tenant's weighted dominant share: what decide's DRF order (:mod:`fleetlog.core.order`) and
the dispatcher's (:mod:`fleetlog.core.dispatch`) both rank tenants by. Its own module so that
the dispatcher, which never imports numba, does not import the order's kernels."""

from __future__ import annotations

from fleetlog.core.state import Quota

SCALE = 1_000_000_000


def weighted_share(quota: Quota | None, used: list[int], fleet: tuple[int, int, int]) -> int:
    """A tenant's weighted dominant share from its fleet-wide quota (``None``: none) and usage:
    of its nominal quota when it has one, else of the ``fleet``; shared with the dispatcher."""
    base = quota.nominal if quota is not None and any(quota.nominal) else fleet
    weight = quota.weight_milli if quota is not None else 1000
    share = max((used[i] * SCALE // base[i] for i in range(3) if base[i] > 0), default=0)
    return share * 1000 // weight
