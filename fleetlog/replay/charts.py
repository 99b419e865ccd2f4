"""The data behind ``replay report``'s charts, kept apart from the drawing so it can be checked.

- pending time: the empirical CDF of each job's wait to its first placement, over every job
  submitted, so jobs never placed keep the curve below 1 (and are counted on the chart);
- tenants: each tenant's share of the GPU-time used next to its share of the nominal GPU quota
  that the log's ``QuotaSet`` events gave it (the latest per tenant and cell).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fleetlog.core.state import State
from fleetlog.events.model import DecisionBatch, QuotaSet
from fleetlog.replay.observe import Measures
from fleetlog.replay.source import Input

FLOOR_S = 0.001
"""Where the log x-axis starts: the log's time resolution (1 ms); shorter waits are drawn there."""


@dataclass(frozen=True)
class Ecdf:
    """A step ECDF (steps after each point): share of all submitted jobs placed within
    ``seconds[i]`` is ``share[i]``."""

    seconds: tuple[float, ...]
    share: tuple[float, ...]
    placed: int
    submitted: int

    @property
    def never_placed(self) -> int:
        return self.submitted - self.placed


def pending_ecdf(measures: Measures) -> Ecdf:
    """Waits to the first placement as a step ECDF over every submitted job; waits under
    :data:`FLOOR_S` sit at the floor so a log axis can show them."""
    waits = sorted(max(FLOOR_S, w / 1000) for w in measures.waits_ms.values())
    submitted = max(len(measures.submitted_at), len(waits))
    seconds, share = [FLOOR_S], [0.0]
    for i, w in enumerate(waits, start=1):
        if w == seconds[-1]:
            share[-1] = i / submitted
        else:
            seconds.append(w)
            share.append(i / submitted)
    return Ecdf(tuple(seconds), tuple(share), len(waits), submitted)


@dataclass
class Quotas:
    """Observer of the log's ``QuotaSet`` events: the latest nominal GPU quota per tenant and cell."""

    gpu_milli: dict[tuple[str, str], int] = field(default_factory=dict)

    def inputs(self, state: State, events: Sequence[Input]) -> None:
        for _, e, _ in events:
            if type(e) is QuotaSet:
                self.gpu_milli[(e.tenant, e.cell)] = e.nominal.gpu_milli

    def decided(self, state: State, batch: DecisionBatch) -> None:
        """Quotas are inputs; decisions change none."""

    def shares(self) -> dict[str, float]:
        """Each tenant's nominal GPU quota (summed over its cells) over every tenant's."""
        per_tenant: dict[str, int] = {}
        for (tenant, _), milli in sorted(self.gpu_milli.items()):
            per_tenant[tenant] = per_tenant.get(tenant, 0) + milli
        total = sum(per_tenant.values())
        return {t: (m / total if total else 0.0) for t, m in sorted(per_tenant.items())}


@dataclass(frozen=True)
class TenantBar:
    """One tenant on the tenants chart: its share of GPU-time used and of the GPU quota
    (``None``: the log never set it a quota)."""

    tenant: str
    usage_share: float
    quota_share: float | None


def tenant_bars(measures: Measures, quotas: Quotas) -> list[TenantBar]:
    """Every tenant that used GPUs or holds a quota, by name."""
    used = sum(measures.tenant_gpu_ms.values())
    quota = quotas.shares()
    names = sorted(set(measures.tenant_gpu_ms) | set(quota))
    return [
        TenantBar(t, measures.tenant_gpu_ms.get(t, 0.0) / used if used else 0.0, quota.get(t)) for t in names
    ]


def draw_pending(ax: Any, ecdf: Ecdf) -> None:
    """The ECDF as steps on a log x-axis, with the share never placed marked at the top."""
    ax.step(ecdf.seconds, ecdf.share, where="post")
    reached = ecdf.share[-1]
    ax.axhline(reached, color="grey", linestyle=":", linewidth=1)
    if ecdf.never_placed:
        ax.annotate(
            f"{ecdf.never_placed:,} of {ecdf.submitted:,} never placed",
            xy=(ecdf.seconds[-1], reached),
            xytext=(0.98, 0.97),
            textcoords="axes fraction",
            ha="right",
            va="top",
        )
    ax.set_xscale("log")
    ax.set(
        xlabel="seconds pending before the first placement (log; under 1 ms drawn at 1 ms)",
        ylabel="share of submitted jobs",
        ylim=(0, 1.05),
        title="pending time (ECDF)",
    )


def draw_tenants(ax: Any, bars: Sequence[TenantBar]) -> None:
    """Side by side per tenant: its share of GPU-time used and its share of the GPU quota."""
    x = list(range(len(bars)))
    ax.bar([i - 0.2 for i in x], [b.usage_share for b in bars], width=0.4, label="share of GPU-time used")
    quota = [b.quota_share or 0.0 for b in bars]
    ax.bar([i + 0.2 for i in x], quota, width=0.4, label="share of GPU quota")
    ax.set_xticks(x, [b.tenant + ("" if b.quota_share is not None else "\n(no quota)") for b in bars])
    ax.set(ylabel="share", title="per-tenant GPU-time against quota")
    ax.legend()
