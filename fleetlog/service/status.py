"""Read-only views of a state for the service: they live in :mod:`fleetlog.core.views` (pure, so
replay shares them) and are re-exported here for the service's modules."""

from __future__ import annotations

from fleetlog.core.views import job_status, pending_by_reason, reason_code

__all__ = ["job_status", "pending_by_reason", "reason_code"]
