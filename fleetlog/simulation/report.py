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

from fleetlog.measures import PCT_DIGITS, fmt_pct, pct
from fleetlog.simulation.metrics import JobStatus, Recorder, Sample

CURVE_STEP_PCT: Final = 1.0
MAX_TIMELINE_POINTS: Final = 400
MEAN_FIELDS: Final = (
    "gpu_allocation_pct",
    "jobs_submitted",
    "jobs_placed",
    "jobs_never_placed",
    "placements",
    "preemptions",
    "gpu_alloc_at_target_pct",
    "gpu_alloc_final_pct",
    "failed",
    "pending",
    "running",
    "done",
    "lost",
    "decisions_per_s",
    "events",
    "wall_s",
)
Measured = dict[str, Any]
"""The shared measures of a run's log (:data:`fleetlog.measures.KEYS`), as ``replay report``
computes them: the caller injects the function (this package never imports the replay)."""


class RunSummary(msgspec.Struct, frozen=True):
    """One seeded run. Shares are percentages, times seconds (``_s``) or milliseconds (``_ms``).

    The measures ``replay report`` shows too (:mod:`fleetlog.measures`: allocation, jobs placed,
    placements, preemptions, waits, tenant shares) come from the run's log, computed by the same
    function; they are ``None`` when the caller measured no log (benchmarks that time runs).
    The others are the simulated cells' own view: how the run went, what the trace protocol asks
    (allocation at the inflate target), and what only a simulation knows (lost gangs)."""

    seed: int
    policy: str
    mode: str
    cluster: str
    workload: str
    nodes: int
    gpus: int
    jobs: int
    """Jobs in the run (the workload as the mode submits it)."""
    failed: int
    pending: int
    running: int
    done: int
    lost: int
    node_failures: int
    gpu_alloc_at_target_pct: float | None
    """inflate only (the FGD paper's measure): allocated over total GPU when arrived demand first
    reached the target (130%); ``None`` in replay mode."""
    gpu_alloc_final_pct: float
    arrived_demand_pct: float
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
    gpu_allocation_pct: float | None = None
    jobs_submitted: int | None = None
    jobs_placed: int | None = None
    jobs_never_placed: int | None = None
    placements: int | None = None
    preemptions: int | None = None
    wait_s: dict[str, float | None] | None = None
    tenant_share_pct: dict[str, float | None] | None = None


def summarise(
    head: dict[str, Any],
    recorder: Recorder,
    target_ratio: float | None,
    stats: dict[str, Any],
    measured: Measured | None = None,
) -> RunSummary:
    """The summary of one run. ``head`` names it (seed, policy, mode, cluster, workload, nodes, gpus);
    ``target_ratio`` is the inflate target (None in replay); ``stats`` the run's counters;
    ``measured`` the shared measures of its log (``None``: not measured)."""
    cap = max(1, recorder.capacity_milli)
    final = recorder.samples[-1].allocated_milli / cap if recorder.samples else 0.0
    at = at_target(recorder, target_ratio) if target_ratio is not None else None
    c = recorder.counts
    return RunSummary(
        **head,
        jobs=len(recorder.status),
        failed=c[JobStatus.REJECTED],
        pending=c[JobStatus.PENDING],
        running=c[JobStatus.RUNNING],
        done=c[JobStatus.DONE],
        lost=recorder.lost,
        node_failures=recorder.node_failures,
        gpu_alloc_at_target_pct=None if at is None else pct(at, 1),
        gpu_alloc_final_pct=pct(final, 1) or 0.0,
        arrived_demand_pct=pct(recorder.demand_milli, cap) or 0.0,
        decisions_per_s=round((recorder.placements + recorder.rejections) / max(stats["wall_s"], 1e-9), 1),
        events=stats["inputs"] + stats["decisions"],
        **stats,
        curve=curve_points(recorder) if target_ratio is not None else [],
        timeline=timeline_points(recorder.samples, cap) if target_ratio is None else [],
        **(measured or {}),
    )


def at_target(recorder: Recorder, ratio: float) -> float:
    """Allocation when arrived demand first reached ``ratio`` of capacity (else the last point)."""
    cap = max(1, recorder.capacity_milli)
    for demand, allocated in recorder.curve:
        if demand >= ratio * cap:
            return allocated / cap
    return recorder.curve[-1][1] / cap if recorder.curve else 0.0


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
            values = [getattr(r, name) for r in runs]
            out[name] = None if None in values else round(statistics.fmean(values), 6)
        for name in ("gpu_allocation_pct", "gpu_alloc_at_target_pct"):
            values = [getattr(r, name) for r in runs]
            if None not in values:
                out[f"{name}_stdev"] = round(statistics.stdev(values), PCT_DIGITS)
        out["seeds"] = [r.seed for r in runs]
        out["runs"] = [
            {
                k: getattr(r, k)
                for k in ("seed", "gpu_allocation_pct", "gpu_alloc_at_target_pct", "jobs_placed", "failed",
                          "pending", "preemptions", "wall_s")
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
        ax.plot(xs, ys, linewidth=1, label=f"seed {r.seed}: {fmt_pct(r.gpu_alloc_at_target_pct)}")
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
