"""``timeline``: the recorded run as a Chrome/Perfetto trace (open it in ui.perfetto.dev), and
``report``: the same run as PNG plots.

Trace: one process per cell, one thread (track) per node, an ``X`` slice per task from its
placement to its end (finish, failure, preemption, cancel, node loss); ``C`` counters for the
queue depth and the GPU allocation after every decision batch; ``M`` metadata naming the tracks.
Timestamps are microseconds of log time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fleetlog.replay.engine import Start, replay
from fleetlog.replay.observe import Measures, Slices
from fleetlog.replay.source import Progress, Source

COUNTERS_PID = 0


async def record(source: Source, progress: Progress | None = None) -> tuple[Slices, Measures]:
    """Replay the whole log, keeping task slices and measures."""
    slices, measures = Slices(), Measures()
    done = await replay(source, Start.fresh(source.core), observers=(slices, measures), progress=progress)
    slices.finish(done.state)
    measures.finish(done.state)
    return slices, measures


Tracks = dict[tuple[str, str], tuple[int, int]]
"""(cell, node) -> (pid, tid)."""


def trace_events(slices: Slices, measures: Measures) -> list[dict[str, Any]]:
    """Metadata naming every track, then the task slices, then the counters."""
    tracks, out = _tracks(slices)
    for s in sorted(slices.done, key=lambda s: (s.start_ms, s.job_id, s.task)):
        pid, tid = tracks[(s.cell, s.node)]
        out.append(
            {
                "ph": "X",
                "name": s.job_id,
                "cat": "task",
                "pid": pid,
                "tid": tid,
                "ts": s.start_ms * 1000,
                "dur": max(0, s.end_ms - s.start_ms) * 1000,
                "args": {"task": s.task, "end": s.end},
            }
        )
    for p in measures.samples:
        out.append(_counter("queue depth", p.at_ms, {"pending": p.pending, "running": p.running}))
        gpus = {"allocated_gpus": p.gpu_used_milli / 1000, "available_gpus": p.gpu_total_milli / 1000}
        out.append(_counter("GPU allocation", p.at_ms, gpus))
    return out


def _tracks(slices: Slices) -> tuple[Tracks, list[dict[str, Any]]]:
    """A process per cell and a thread per node, with the metadata events that name them."""
    cells = sorted({s.cell for s in slices.done})
    pids = {cell: i + 1 for i, cell in enumerate(cells)}
    nodes = sorted({(s.cell, s.node) for s in slices.done})
    tracks = {(c, n): (pids[c], i + 1) for i, (c, n) in enumerate(nodes)}
    names = [(COUNTERS_PID, 0, "process_name", "scheduler")]
    names += [(pids[c], 0, "process_name", f"cell {c}") for c in cells]
    names += [(*tracks[(c, n)], "thread_name", n) for c, n in nodes]
    meta = [
        {"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": {"name": name}}
        for pid, tid, kind, name in names
    ]
    return tracks, meta


def _counter(name: str, at_ms: int, values: dict[str, float]) -> dict[str, Any]:
    return {"ph": "C", "name": name, "pid": COUNTERS_PID, "tid": 0, "ts": at_ms * 1000, "args": values}


def write_trace(path: Path, slices: Slices, measures: Measures) -> int:
    """Write the trace JSON; how many trace events it holds."""
    events = trace_events(slices, measures)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
    return len(events)


def _pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (files only, no display), imported when first needed."""
    import matplotlib  # noqa: PLC0415 - heavy, and only report needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    return plt


def write_report(directory: Path, measures: Measures) -> list[Path]:
    """PNG plots (allocation, queue depth, pending times, tenant shares) and summary.json."""
    plt = _pyplot()
    directory.mkdir(parents=True, exist_ok=True)
    samples = measures.samples
    t0 = samples[0].at_ms if samples else 0
    hours = [(p.at_ms - t0) / 3_600_000 for p in samples]
    written = []

    def save(name: str, fig: Any) -> None:
        path = directory / name
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)

    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.step(hours, [p.gpu_used_milli / max(1, p.gpu_total_milli) for p in samples], where="post")
    ax.set(xlabel="hours of log time", ylabel="GPU allocation", ylim=(0, 1.05), title="GPU allocation")
    save("allocation.png", fig)
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.step(hours, [p.pending for p in samples], where="post", label="pending")
    ax.step(hours, [p.running for p in samples], where="post", label="running")
    ax.set(xlabel="hours of log time", ylabel="jobs", title="queue depth")
    ax.legend()
    save("queue.png", fig)
    fig, ax = plt.subplots(figsize=(8, 3.5))
    waits = sorted(w / 1000 for w in measures.waits_ms.values())
    ax.plot(waits, [(i + 1) / max(1, len(waits)) for i in range(len(waits))])
    ax.set(xlabel="seconds pending before the first placement", ylabel="share of jobs", title="pending time")
    save("pending.png", fig)
    fig, ax = plt.subplots(figsize=(8, 3.5))
    share = measures.summary()["tenant_share_pct"]
    ax.bar(list(share), list(share.values()))
    ax.set(ylabel="share of GPU-time (%)", title="per-tenant share")
    save("tenants.png", fig)
    summary = directory / "summary.json"
    summary.write_text(json.dumps(measures.summary(), indent=2))
    return [*written, summary]
