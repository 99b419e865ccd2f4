"""The measures of a run that ``fleetlog simulate`` and ``fleetlog replay report`` (and
``replay what-if``) both show: one definition each, one percentile function, one unit (percent
for shares, seconds for times), one way to print them.

Both commands compute them with the same observer (``fleetlog.replay.observe.Measures``) over
the same data, the run's logs; this module holds what needs no scheduler state: the percentile,
the units, the names and the rows of the human table. ``docs/replay.md`` ("The measures") has
the definitions and why.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from decimal import Decimal
from typing import Any, Final

PERCENTILES: Final = (50, 90, 99)
WAIT_KEYS: Final = ("p50", "p90", "p99", "max")
PCT_DIGITS: Final = 4
"""Decimals of a percentage in JSON (display: 2)."""


def percentile(ordered: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile of ``ordered`` (sorted, not empty): the smallest
    value with at least ``q`` percent of the values at or below it — the ``ceil(q/100 * n)``-th
    value (numpy's ``method="inverted_cdf"``). Always a value that occurred: a p99 wait is a
    job's wait, never an interpolation between two jobs."""
    if not ordered:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is not within 0..100")
    rank = max(1, math.ceil(Decimal(str(q)) * len(ordered) / 100))  # decimal: 99.9% of 1000 is 999
    return ordered[rank - 1]


def wait_percentiles_s(waits_ms: Sequence[int]) -> dict[str, float | None]:
    """p50, p90, p99 and max of ``waits_ms`` in seconds (``None`` each when there are none)."""
    if not waits_ms:
        return dict.fromkeys(WAIT_KEYS)
    ordered = sorted(waits_ms)
    out: dict[str, float | None] = {f"p{q}": percentile(ordered, q) / 1000 for q in PERCENTILES}
    out["max"] = ordered[-1] / 1000
    return out


def pct(part: float, whole: float) -> float | None:
    """``part`` as a percentage of ``whole``, rounded for JSON (``None`` when ``whole`` is 0)."""
    return round(100 * part / whole, PCT_DIGITS) if whole else None


def fmt_pct(value: object) -> str:
    return "-" if value is None else f"{float(value):.2f}%"  # type: ignore[arg-type]


def fmt_count(value: object) -> str:
    return "-" if value is None else f"{float(value):,.0f}"  # type: ignore[arg-type]


def fmt_waits(value: object) -> str:
    waits = value if isinstance(value, dict) else {}
    shown = [waits.get(k) for k in WAIT_KEYS]
    return " / ".join("-" if v is None else f"{v:,.1f}" for v in shown)


def fmt_shares(value: object) -> str:
    shares = value if isinstance(value, dict) else {}
    return ", ".join(f"{t} {v:.2f}%" for t, v in shares.items()) or "-"


ROWS: Final = (
    ("GPU allocation, time-weighted (%)", "gpu_allocation_pct", fmt_pct),
    ("jobs submitted", "jobs_submitted", fmt_count),
    ("jobs placed (at least once)", "jobs_placed", fmt_count),
    ("jobs never placed", "jobs_never_placed", fmt_count),
    ("placements", "placements", fmt_count),
    ("preemptions (of a job)", "preemptions", fmt_count),
    ("wait to first placement p50/p90/p99/max (s)", "wait_s", fmt_waits),
    ("tenant share of GPU-time (%)", "tenant_share_pct", fmt_shares),
)
"""(label, key, format) of every shared measure, in the order both commands print them."""
KEYS: Final = tuple(key for _, key, _ in ROWS)


def rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, text) of each shared measure of ``summary``, as both commands print them."""
    return [(label, fmt(summary.get(key))) for label, key, fmt in ROWS]
