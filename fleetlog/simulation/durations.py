"""Task durations drawn from the Microsoft Philly runtime distribution.

``builtin`` interpolates 25 quantiles of the Philly runtimes (83,154 jobs, see
``shared/traces/philly-runtime-via-alibaba/README.md``) log-linearly, so a run gives the
same durations on every machine, trace folder or not; ``philly`` or a path samples the
runtime CSV itself.
"""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from fleetlog.simulation.csvfile import read_rows
from fleetlog.simulation.spec import TraceError
from fleetlog.simulation.traces import philly_file

PHILLY_QUANTILES: Final = (
    (0.0, 0.0),
    (0.05, 48.0),
    (0.10, 61.0),
    (0.15, 68.0),
    (0.20, 76.0),
    (0.25, 131.0),
    (0.30, 229.0),
    (0.35, 428.0),
    (0.40, 630.0),
    (0.45, 889.0),
    (0.50, 1186.0),
    (0.55, 1500.0),
    (0.60, 1871.0),
    (0.65, 2242.0),
    (0.70, 2590.0),
    (0.75, 3342.0),
    (0.80, 4700.0),
    (0.85, 6300.0),
    (0.90, 12_860.0),
    (0.95, 49_969.0),
    (0.98, 167_785.0),
    (0.99, 287_333.0),
    (0.995, 484_829.0),
    (0.999, 1_361_908.0),
    (1.0, 4_628_239.0),
)
"""(probability, runtime in seconds): the Philly runtimes' quantiles (inverted CDF), computed from
``philly_runtime.csv``; the file's mean is 14,613 s."""
MIN_DURATION_MS: Final = 1000


@dataclass(frozen=True)
class Durations:
    """A duration sampler: the empirical runtimes (seconds) or, when empty, the built-in quantiles."""

    runtimes_s: tuple[float, ...] = ()
    scale: float = 1.0
    max_ms: int = 0
    """The longest duration (0: no limit) — a cap keeps a short simulation's warm-up short."""
    source: str = "builtin"

    def sample_ms(self, rng: random.Random) -> int:
        """One duration in milliseconds (at least a second), scaled by ``scale``."""
        seconds = rng.choice(self.runtimes_s) if self.runtimes_s else quantile_runtime(rng.random())
        ms = max(MIN_DURATION_MS, round(seconds * self.scale * 1000))
        return min(ms, self.max_ms) if self.max_ms else ms


def quantile_runtime(u: float) -> float:
    """The runtime at probability ``u`` of the built-in distribution (log-linear between quantiles)."""
    probs = [p for p, _ in PHILLY_QUANTILES]
    i = min(max(bisect.bisect_right(probs, u), 1), len(probs) - 1)
    (p0, v0), (p1, v1) = PHILLY_QUANTILES[i - 1], PHILLY_QUANTILES[i]
    w = (u - p0) / (p1 - p0)
    return math.expm1(math.log1p(v0) + w * (math.log1p(v1) - math.log1p(v0)))


def load_durations(name: str, scale: float = 1.0, max_ms: int = 0) -> Durations:
    """``builtin``, ``philly`` (the shared runtime file) or the path of a CSV with a ``runtime`` column."""
    if name == "builtin":
        return Durations(scale=scale, max_ms=max_ms)
    path = philly_file() if name == "philly" else Path(name)
    return Durations(read_runtimes(path), scale, max_ms, str(path))


def read_runtimes(path: Path) -> tuple[float, ...]:
    """The ``runtime`` column (seconds) of a runtime CSV."""
    runtimes = tuple(row.number("runtime") for row in read_rows(path, ("runtime",)))
    if not runtimes:
        raise TraceError(path, 0, "no runtimes (the file has a header but no data lines)")
    return runtimes
