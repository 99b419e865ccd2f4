"""The per-tenant bound on job metadata at ingest (issue 46, "Metadata"): the labels and
annotations of a tenant's jobs stay in the scheduler's memory from submission until the jobs
retire, so one tenant may hold at most ``max_metadata_bytes_per_tenant`` of them — counted as
the state holds them (:func:`fleetlog.core.state.held_bytes`), with the jobs accepted but not
folded yet.  Payloads are not counted: the state does not keep them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from fleetlog.core.state import State, held_bytes
from fleetlog.events.model import InputEvent, JobSubmitted
from fleetlog.service.http import Response, refusal

BOUND = "max_metadata_bytes_per_tenant"


def metadata_refusal(state: State, unfolded: Mapping[str, JobSubmitted], events: Iterable[InputEvent],
                     limit: int) -> Response | None:
    """``None`` when every tenant's jobs of ``events`` fit its metadata bound beside what it
    holds already (folded, and appended but not folded: ``unfolded``), else the 429
    ``too_much_metadata`` naming the tenant, what it holds and the bound."""
    wanted = _by_tenant(e for e in events if isinstance(e, JobSubmitted))
    if not wanted:
        return None
    pending = _by_tenant(e for e in unfolded.values() if e.tenant in wanted)
    for tenant, more in sorted(wanted.items()):
        held = state.metadata_bytes(tenant) + pending.get(tenant, 0)
        if held + more > limit:
            return refusal(429, "too_much_metadata", f"tenant {tenant!r} holds {held} bytes of job labels "
                           f"and annotations; {more} more would pass the limit of {limit} ({BOUND}): they "
                           "are freed as its jobs retire", extra={
                               "tenant": tenant, "held": held, "limit": limit, "bound": BOUND})
    return None


def _by_tenant(jobs: Iterable[JobSubmitted]) -> dict[str, int]:
    """Tenant -> :func:`held_bytes` of the labels and annotations of its ``jobs`` that have any."""
    out: dict[str, int] = {}
    for e in jobs:
        if e.labels or e.annotations:
            out[e.tenant] = out.get(e.tenant, 0) + held_bytes(e.labels, e.annotations)
    return out
