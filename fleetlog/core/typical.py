"""The published FGD rule's shape mix: the "typical pods" of a whole workload.

As the authors' simulator takes them (Weng et al., ATC'23; ``hkust-adsl/kubernetes-scheduler-simulator``,
``pkg/utils/frag.go`` ``GetTypicalPods`` with the experiments' ``typicalPodsConfig``:
``isInvolvedCpuPods: true``, ``podPopularityThreshold: 95``, ``podIncreaseStep: 1``, no GPU
weight): every task of the workload counts once under its exact shape (GPU count, milli per GPU,
CPU milli; CPU-only tasks included), the shapes are ranked by count (ties: larger CPU, then
milli, then GPU count first, as the simulator's reversed order), and the most popular are kept,
one at a time, until they cover the threshold share of all tasks. The kept counts are the
weights (the simulator divides them by their sum, as the score does here). Shapes are
(gpus, milli, cpu) only: the simulator's shapes also carry a GPU-type constraint (``docs/scheduling.md``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from fleetlog.events import JobSubmitted

PUBLISHED_POPULARITY_PCT: Final = 95
"""The experiments' cumulative popularity threshold (the simulator's own default is 60)."""

Row = tuple[int, int, int, int]


def typical_pods(rows: Iterable[Row], threshold_pct: int = PUBLISHED_POPULARITY_PCT) -> tuple[Row, ...]:
    """The typical pods of a workload given as (gpus, milli, cpu, count) rows (a shape may
    repeat: counts add up): (gpus, milli, cpu, count) rows, most popular first."""
    counts: dict[tuple[int, int, int], int] = {}
    for gpus, milli, cpu, count in rows:
        key = (gpus, milli if gpus > 0 else 0, cpu)  # (a CPU-only task's milli is no request)
        counts[key] = counts.get(key, 0) + count
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], -kv[0][2], -kv[0][1], -kv[0][0]))
    total = sum(counts.values())
    kept: list[Row] = []
    covered = 0
    for (gpus, milli, cpu), count in ranked:
        if covered * 100 >= threshold_pct * total:
            break
        kept.append((gpus, milli, cpu, count))
        covered += count
    return tuple(kept)


def typical_pods_of_jobs(
    jobs: Iterable[JobSubmitted], threshold_pct: int = PUBLISHED_POPULARITY_PCT
) -> tuple[Row, ...]:
    """:func:`typical_pods` over every task of the submissions of a whole workload."""
    groups = (g for job in jobs for g in job.task_groups)
    return typical_pods(((g.gpu_count, g.gpu_milli, g.cpu_milli, g.count) for g in groups), threshold_pct)
