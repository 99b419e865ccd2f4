"""``timeline``: the recorded run as a Chrome/Perfetto trace (open it in ui.perfetto.dev), and
``report``: the same run as PNG plots.

Trace: one process per node, one thread (track) per GPU of that node, plus CPU lanes for tasks
that hold no GPU. A task is an ``X`` slice from its placement to its end (finish, failure,
preemption, cancel, node loss) on the track of every GPU it holds. Tasks sharing a GPU
(fractional GPUs) or running side by side without GPUs get extra lanes, assigned greedily so no
two slices on one track overlap: Perfetto drops slices that overlap without nesting. Each
preemption is a flow arrow (``s``/``f``) linking the victim's slice and the preemptor's. ``C``
counters hold the queue depth and the GPU allocation after every decision batch; ``M`` metadata
names the tracks. Timestamps are microseconds of log time.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetlog.replay.charts import Quotas, draw_pending, draw_tenants, pending_ecdf, tenant_bars
from fleetlog.replay.engine import Observer, replay
from fleetlog.replay.observe import Measures, Preemption, Slice, Slices
from fleetlog.replay.source import Progress, Source
from fleetlog.replay.state_at import first_start

COUNTERS_PID = 0
MIN_DUR_US = 3
"""A slice placed and ended within one millisecond is drawn 3 us long, so a flow has an inside
to bind to."""
ARRIVE_US = 2
"""A flow arrives this far inside the preemptor's slice and leaves 1 us before the victim's end
(1 us after its start when it lasted no time): whole microseconds, so every reader turns them
into the same nanoseconds, strictly inside the slices (Perfetto binds a flow's end to the slice
enclosing it) and in time order."""


async def record(
    source: Source, progress: Progress | None = None, extra: Sequence[Observer] = ()
) -> tuple[Slices, Measures]:
    """Replay the whole log, keeping task slices and measures (and telling ``extra`` observers)."""
    slices, measures = Slices(), Measures()
    done = await replay(
        source, await first_start(source), observers=(slices, measures, *extra), progress=progress
    )
    slices.finish(done.state)
    measures.finish(done.state)
    return slices, measures


@dataclass(frozen=True)
class Drawn:
    """One slice as drawn: a task on one of its tracks."""

    slice: Slice
    pid: int
    tid: int
    ts: int
    dur: int


@dataclass
class Layout:
    """Every drawn slice, the tracks' names, and each job's drawn slices."""

    drawn: list[Drawn] = field(default_factory=list)
    meta: list[dict[str, Any]] = field(default_factory=list)
    by_job: dict[str, list[Drawn]] = field(default_factory=dict)


def trace_events(slices: Slices, measures: Measures) -> list[dict[str, Any]]:
    """Metadata naming every track, then the task slices, the preemption arrows, the counters."""
    layout = lay_out(slices.done)
    out = list(layout.meta)
    for d in sorted(layout.drawn, key=lambda d: (d.ts, d.pid, d.tid)):
        s = d.slice
        args = {"task": s.task, "node": s.node, "gpus": list(s.gpus), "end": s.end}
        out.append(
            {"ph": "X", "name": s.job_id, "cat": "task", "pid": d.pid, "tid": d.tid, "ts": d.ts, "dur": d.dur}
            | {"args": args}
        )
    out += preemption_flows(slices.preemptions, layout)
    for p in measures.samples:
        out.append(_counter("queue depth", p.at_ms, {"pending": p.pending, "running": p.running}))
        gpus = {"allocated_gpus": p.gpu_used_milli / 1000, "available_gpus": p.gpu_total_milli / 1000}
        out.append(_counter("GPU allocation", p.at_ms, gpus))
    return out


def resources(s: Slice) -> list[str]:
    """The resources a task's slice is drawn on: each GPU it holds, or the CPU when none."""
    return [f"gpu {g}" for g in sorted(set(s.gpus))] or ["cpu"]


def lanes(pieces: list[tuple[int, int, Slice]]) -> list[list[tuple[int, int, Slice]]]:
    """Interval partitioning, first fit: each piece (ts, dur, slice) goes on the lowest lane whose
    last piece ended by its start, so no two pieces on a lane overlap."""
    out: list[list[tuple[int, int, Slice]]] = []
    for piece in sorted(pieces, key=lambda p: (p[0], p[0] + p[1], p[2].job_id, p[2].task)):
        lane = next((lane for lane in out if lane[-1][0] + lane[-1][1] <= piece[0]), None)
        if lane is None:
            out.append([piece])
        else:
            lane.append(piece)
    return out


def lay_out(done: Sequence[Slice]) -> Layout:
    """A process per node, a track per GPU lane or CPU lane, named by ``M`` events."""
    groups: dict[tuple[str, str], dict[str, list[tuple[int, int, Slice]]]] = {}
    for s in done:
        ts, dur = s.start_ms * 1000, max(MIN_DUR_US, (s.end_ms - s.start_ms) * 1000)
        for key in resources(s):
            groups.setdefault((s.cell, s.node), {}).setdefault(key, []).append((ts, dur, s))
    layout = Layout(meta=[_meta("process_name", COUNTERS_PID, 0, "scheduler")])
    tid = 0
    for pid, (cell, node) in enumerate(sorted(groups), start=1):
        layout.meta.append(_meta("process_name", pid, 0, f"node {node} (cell {cell})"))
        layout.meta.append(_meta("process_sort_index", pid, 0, pid))
        for key in sorted(groups[(cell, node)], key=_resource_order):
            for n, lane in enumerate(lanes(groups[(cell, node)][key])):
                tid += 1
                layout.meta.append(_meta("thread_name", pid, tid, _track_name(key, n)))
                layout.meta.append(_meta("thread_sort_index", pid, tid, tid))
                for ts, dur, s in lane:
                    drawn = Drawn(s, pid, tid, ts, dur)
                    layout.drawn.append(drawn)
                    layout.by_job.setdefault(s.job_id, []).append(drawn)
    return layout


def _resource_order(key: str) -> tuple[int, int]:
    kind, _, index = key.partition(" ")
    return (0, int(index)) if kind == "gpu" else (1, 0)


def _track_name(key: str, lane: int) -> str:
    """``gpu 3`` (and ``gpu 3 · 2``, ... for tasks sharing it), ``cpu 1``, ``cpu 2``, ..."""
    if key == "cpu":
        return f"cpu {lane + 1}"
    return key if lane == 0 else f"{key} · {lane + 1}"


def _meta(kind: str, pid: int, tid: int, value: str | int) -> dict[str, Any]:
    arg = {"sort_index": value} if kind.endswith("sort_index") else {"name": value}
    return {"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": arg}


def preemption_flows(preemptions: Sequence[Preemption], layout: Layout) -> list[dict[str, Any]]:
    """A flow arrow per preemption, linking the victim's slice, where it ends, to the preemptor's
    slice that began at the preemption (on the victim's node when it has one there).

    A flow may not run back in time (Perfetto imports in time order and orients every flow from
    the earlier slice to the later), so it leaves just inside the victim's end and arrives just
    inside the preemptor's start; ``bp: e`` binds each end to the slice enclosing it."""
    out: list[dict[str, Any]] = []
    for n, p in enumerate(preemptions, start=1):
        victim = _victim(p, layout)
        preemptor = _preemptor(p, layout, victim)
        if victim is None or preemptor is None:
            continue
        common = {"cat": "preemption", "name": "preemption", "id": n}
        args = {"args": {"victim": p.job_id, "task": p.task, "preempted_by": p.by_job_id}}
        instant = victim.slice.end_ms == victim.slice.start_ms
        leave, arrive = (victim.ts + 1 if instant else victim.ts + victim.dur - 1), preemptor.ts + ARRIVE_US
        out.append({"ph": "s", "pid": victim.pid, "tid": victim.tid, "ts": leave} | common | args)
        out.append({"ph": "f", "bp": "e", "pid": preemptor.pid, "tid": preemptor.tid, "ts": arrive} | common)
    return out


def _victim(p: Preemption, layout: Layout) -> Drawn | None:
    """The victim task's slice that the preemption ended (the first of its GPUs)."""
    drawn = layout.by_job.get(p.job_id, [])
    ended = [d for d in drawn if d.slice.task == p.task and d.slice.end_ms == p.at_ms]
    return ended[0] if ended else None


def _preemptor(p: Preemption, layout: Layout, victim: Drawn | None) -> Drawn | None:
    """The preemptor's slice placed at the preemption, on the victim's node when there is one."""
    started = [d for d in layout.by_job.get(p.by_job_id, []) if d.slice.start_ms == p.at_ms]
    near = [d for d in started if victim is not None and d.pid == victim.pid]
    return next(iter(near or started), None)


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


def write_report(directory: Path, measures: Measures, quotas: Quotas | None = None) -> list[Path]:
    """PNG plots (allocation, queue depth, pending times, tenant shares against quota) and
    summary.json."""
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
    draw_pending(ax, pending_ecdf(measures))
    save("pending.png", fig)
    fig, ax = plt.subplots(figsize=(8, 3.5))
    draw_tenants(ax, tenant_bars(measures, quotas or Quotas()))
    save("tenants.png", fig)
    summary = directory / "summary.json"
    summary.write_text(json.dumps(measures.summary(), indent=2))
    return [*written, summary]
