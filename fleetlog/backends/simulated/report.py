"""The result of a run: a summary (JSON), and a plot (PNG) of allocation against arrived demand
(inflate) or of utilisation and queue depth over time (replay)."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import msgspec
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from fleetlog.backends.simulated.metrics import JobStatus, Recorder, Sample

CURVE_STEP_PCT: Final = 1.0
MAX_TIMELINE_POINTS: Final = 400
MEAN_FIELDS: Final = (
    "gpu_alloc_ratio",
    "gpu_alloc_final",
    "placed",
    "failed",
    "pending",
    "running",
    "done",
    "preempted",
    "lost",
    "decisions_per_s",
    "events",
    "wall_s",
)


class RunSummary(msgspec.Struct, frozen=True):
    """One seeded run. Ratios are fractions (0..1); times are milliseconds unless named ``_s``."""

    seed: int
    policy: str
    mode: str
    cluster: str
    workload: str
    nodes: int
    gpus: int
    jobs: int
    placed: int
    failed: int
    pending: int
    running: int
    done: int
    preempted: int
    lost: int
    node_failures: int
    gpu_alloc_ratio: float
    """inflate: allocated/total milli-GPU when arrived demand reached the target (130%);
    replay: the time-weighted mean from the first arrival to the last."""
    gpu_alloc_final: float
    arrived_demand_ratio: float
    wait_ms: dict[str, int]
    decisions_per_s: float
    events: int
    inputs: int
    decisions: int
    steps: int
    virtual_s: float
    wall_s: float
    """The run's wall time, from its first append to its end: kernels are compiled before it."""
    interrupted: bool = False
    """Stopped early (Ctrl-C): every number is of what was simulated until then."""
    compile_s: float = 0.0
    """Seconds spent compiling (first run) or loading the kernels before the first seed's run;
    not part of ``wall_s`` nor of ``decisions_per_s``."""
    curve: list[tuple[float, float]] = []
    """inflate: (arrived demand %, allocation %) each percent of demand."""
    timeline: list[tuple[float, float, int, int]] = []
    """replay: (hours, allocation %, pending jobs, running jobs), at most 400 points."""


def summarise(
    head: dict[str, Any], recorder: Recorder, target_ratio: float | None, stats: dict[str, Any]
) -> RunSummary:
    """The summary of one run. ``head`` names it (seed, policy, mode, cluster, workload, nodes, gpus);
    ``target_ratio`` is the inflate target (None in replay); ``stats`` the run's counters."""
    cap = max(1, recorder.capacity_milli)
    final = recorder.samples[-1].allocated_milli / cap if recorder.samples else 0.0
    if target_ratio is not None:
        alloc = at_target(recorder, target_ratio)
    else:
        times = recorder.arrived_at.values()
        alloc = time_weighted(recorder.samples, cap, min(times, default=0), max(times, default=0))
    c = recorder.counts
    return RunSummary(
        **head,
        jobs=len(recorder.status),
        placed=recorder.placed_jobs,
        failed=c[JobStatus.REJECTED],
        pending=c[JobStatus.PENDING],
        running=c[JobStatus.RUNNING],
        done=c[JobStatus.DONE],
        preempted=recorder.preemptions,
        lost=recorder.lost,
        node_failures=recorder.node_failures,
        gpu_alloc_ratio=round(alloc, 6),
        gpu_alloc_final=round(final, 6),
        arrived_demand_ratio=round(recorder.demand_milli / cap, 6),
        wait_ms=percentiles(recorder.waits_ms),
        decisions_per_s=round((recorder.placements + recorder.rejections) / max(stats["wall_s"], 1e-9), 1),
        events=stats["inputs"] + stats["decisions"],
        **stats,
        curve=curve_points(recorder) if target_ratio is not None else [],
        timeline=timeline_points(recorder.samples, cap) if target_ratio is None else [],
    )


def at_target(recorder: Recorder, ratio: float) -> float:
    """Allocation when arrived demand first reached ``ratio`` of capacity (else the last point)."""
    cap = max(1, recorder.capacity_milli)
    for demand, allocated in recorder.curve:
        if demand >= ratio * cap:
            return allocated / cap
    return recorder.curve[-1][1] / cap if recorder.curve else 0.0


def time_weighted(samples: Sequence[Sample], cap: int, start_ms: int, end_ms: int) -> float:
    """The mean allocation over ``start_ms..end_ms`` (the arrival window), each sample holding
    until the next; the allocation at ``end_ms`` when the window is empty."""
    if not samples:
        return 0.0
    if end_ms <= start_ms:
        return next((s.allocated_milli for s in reversed(samples) if s.at_ms <= end_ms), 0) / cap
    bounds = [s.at_ms for s in samples[1:]] + [max(end_ms, samples[-1].at_ms)]
    area = 0
    for sample, until in zip(samples, bounds, strict=True):
        lo, hi = max(sample.at_ms, start_ms), min(until, end_ms)
        if hi > lo:
            area += sample.allocated_milli * (hi - lo)
    return area / (end_ms - start_ms) / cap


def percentiles(values: Sequence[int]) -> dict[str, int]:
    """p50/p90/p99/max of ``values`` (nearest rank); empty when there are none."""
    if not values:
        return {}
    ordered = sorted(values)
    pick = {
        name: ordered[min(len(ordered) - 1, int(q * len(ordered)))]
        for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))
    }
    return pick | {"max": ordered[-1]}


def curve_points(recorder: Recorder) -> list[tuple[float, float]]:
    """The allocation curve thinned to one point per percent of arrived demand."""
    cap = max(1, recorder.capacity_milli)
    out: list[tuple[float, float]] = []
    for demand, allocated in recorder.curve:
        x = demand * 100 / cap
        if not out or x >= out[-1][0] + CURVE_STEP_PCT:
            out.append((round(x, 3), round(allocated * 100 / cap, 3)))
    return out


def timeline_points(samples: Sequence[Sample], cap: int) -> list[tuple[float, float, int, int]]:
    stride = max(1, len(samples) // MAX_TIMELINE_POINTS)
    chosen = list(samples[::stride]) + ([samples[-1]] if samples and (len(samples) - 1) % stride else [])
    return [
        (round(s.at_ms / 3_600_000, 4), round(s.allocated_milli * 100 / cap, 3), s.pending, s.running)
        for s in chosen
    ]


def aggregate(runs: Sequence[RunSummary]) -> dict[str, Any]:
    """One JSON object for one or several seeds: the fields of the first run, the means of the
    counters over every run, and (several seeds) each run's headline numbers."""
    series = ("curve", "timeline")
    out: dict[str, Any] = {k: v for k, v in msgspec.to_builtins(runs[0]).items() if k not in series}
    out["interrupted"] = any(r.interrupted for r in runs)  # (only the last run can be)
    if len(runs) > 1:
        for name in MEAN_FIELDS:
            out[name] = round(statistics.fmean(getattr(r, name) for r in runs), 6)
        out["gpu_alloc_ratio_stdev"] = round(statistics.stdev(r.gpu_alloc_ratio for r in runs), 6)
        out["seeds"] = [r.seed for r in runs]
        out["runs"] = [
            {
                k: getattr(r, k)
                for k in ("seed", "gpu_alloc_ratio", "placed", "failed", "pending", "preempted", "wall_s")
            }
            for r in runs
        ]
    return out


def write_report(directory: Path, runs: Sequence[RunSummary]) -> list[Path]:
    """``summary.json`` (every run in full, and the aggregate) and ``plot.png``; the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    summary = directory / "summary.json"
    body = {"summary": aggregate(runs), "runs": [msgspec.to_builtins(r) for r in runs]}
    summary.write_text(json.dumps(body, indent=2) + "\n")
    plot = directory / "plot.png"
    draw(plot, runs)
    return [summary, plot]


def draw(path: Path, runs: Sequence[RunSummary]) -> None:
    """The PNG: allocation vs arrived demand (inflate) or utilisation and queue depth (replay)."""
    inflate = bool(runs[0].curve)
    fig = Figure(figsize=(8, 4.5 if inflate else 6.5))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1 if inflate else 2, 1, squeeze=False)
    if inflate:
        _draw_curve(axes[0][0], runs)
    else:
        _draw_timeline(axes[0][0], axes[1][0], runs)
    r = runs[0]
    where = f"{Path(r.workload).name} on {Path(r.cluster).name}"
    fig.suptitle(f"{r.mode.partition('?')[0]}: {where} — {r.policy}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _draw_curve(ax: Any, runs: Sequence[RunSummary]) -> None:
    for r in runs:
        xs, ys = zip(*r.curve, strict=True) if r.curve else ((), ())
        ax.plot(xs, ys, linewidth=1, label=f"seed {r.seed}: {r.gpu_alloc_ratio * 100:.2f}%")
    top = max((x for r in runs for x, _ in r.curve), default=100.0)
    ax.plot([0, min(top, 100)], [0, min(top, 100)], color="grey", linestyle=":", linewidth=1, label="ideal")
    ax.set_xlabel("arrived GPU demand (% of cluster GPUs)")
    ax.set_ylabel("GPU allocation (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", ncol=2 if len(runs) > 5 else 1)


def _draw_timeline(util: Any, queue: Any, runs: Sequence[RunSummary]) -> None:
    for r in runs:
        hours = [p[0] for p in r.timeline]
        util.plot(hours, [p[1] for p in r.timeline], linewidth=1, label=f"seed {r.seed}")
        queue.plot(hours, [p[2] for p in r.timeline], linewidth=1, label=f"seed {r.seed} pending")
    util.set_ylabel("GPU allocation (%)")
    util.set_ylim(0, 105)
    queue.set_ylabel("pending jobs (queue depth)")
    queue.set_xlabel("virtual time (hours)")
    for ax in (util, queue):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
