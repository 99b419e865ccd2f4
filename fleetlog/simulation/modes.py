"""The two simulation modes: when each job arrives, and how long it runs.

- ``inflate`` — the protocol of the FGD paper (USENIX ATC'23): the workload's jobs plus
  copies of randomly drawn (seeded) jobs until the GPU requested reaches ``ratio`` (130%)
  of the cluster's GPUs, in seeded random order (``order=shuffle``, as the paper's artifact
  does) or in file order; they arrive one by one (``batch`` per scheduling step), are
  placed or rejected on arrival, and never leave.
- ``replay`` — arrivals at their trace times divided by ``speed``, tasks run for their
  durations, and the run ends ``drain_h`` hours after the last arrival at the latest.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Final, Literal

import msgspec

from fleetlog.backends.simulated.cluster import Cluster
from fleetlog.simulation.spec import SpecError, parse_spec
from fleetlog.simulation.workload import JobSpec, Workload

MODES: Final = ("inflate", "replay")
INFLATE_PARAMS: Final = ("ratio", "order", "batch")
REPLAY_PARAMS: Final = ("speed", "drain_h", "tick_ms")
MAX_COPIES: Final = 10_000_000
MAX_TICK_MS: Final = 10_000
"""Heartbeats are rounded up to the tick too: period + tick must stay under the scheduler's 60 s
node timeout (heartbeat periods are at most 45 s)."""


@dataclass(frozen=True)
class Mode:
    """A parsed ``--mode`` spec. Times in milliseconds of virtual time."""

    name: Literal["inflate", "replay"] = "replay"
    ratio: float = 1.3
    order: str = "shuffle"
    batch: int = 1
    speed: float = 1.0
    drain_ms: int = 3_600_000
    tick_ms: int = 1000
    """Replay: observations and arrivals are rounded up to this grid, so those in one tick
    are appended, and scheduled, together (inflate: one arrival instant per millisecond)."""

    @property
    def text(self) -> str:
        if self.name == "inflate":
            return f"inflate?batch={self.batch}&order={self.order}&ratio={self.ratio:g}"
        return f"replay?drain_h={self.drain_ms / 3_600_000:g}&speed={self.speed:g}&tick_ms={self.tick_ms}"


def parse_mode(text: str) -> Mode:
    """``inflate[?ratio=1.3&order=shuffle|file&batch=N]`` or ``replay[?speed=S&drain_h=H&tick_ms=T]``."""
    spec = parse_spec(text)
    if spec.kind == "inflate":
        spec.check_known(INFLATE_PARAMS)
        return Mode(
            "inflate",
            ratio=spec.number("ratio", 1.3, 0.01, 100.0),
            order=spec.choice("order", "shuffle", ("shuffle", "file")),
            batch=spec.integer("batch", 1, 1, 1_000_000),
            tick_ms=1,
        )
    if spec.kind == "replay":
        spec.check_known(REPLAY_PARAMS)
        return Mode(
            "replay",
            speed=spec.number("speed", 1.0, 1e-3, 1e9),
            drain_ms=round(spec.number("drain_h", 1.0, 0.0, 1e5) * 3_600_000),
            tick_ms=spec.integer("tick_ms", 1000, 1, MAX_TICK_MS),
        )
    raise SpecError(f"--mode {text!r}: choose inflate or replay")


def arrivals(mode: Mode, workload: Workload, cluster: Cluster, seed: int) -> tuple[JobSpec, ...]:
    """The jobs of ``workload`` as ``mode`` submits them, with their arrival times."""
    if mode.name == "inflate":
        return inflate(mode, workload, cluster, seed)
    return replay(mode, workload)


def inflate(mode: Mode, workload: Workload, cluster: Cluster, seed: int) -> tuple[JobSpec, ...]:
    """Jobs plus seeded copies up to ``ratio`` of the GPU capacity, ordered, cut at the target."""
    rng = random.Random(f"fleetlog-sim/{seed}/inflate")
    target = mode.ratio * cluster.gpu_milli
    jobs = list(workload.jobs) + copies(rng, workload, target - workload.gpu_milli)
    if mode.order == "shuffle":
        rng.shuffle(jobs)
    out, demand = [], 0
    for i, job in enumerate(jobs):
        if demand >= target:
            break
        demand += job.gpu_milli
        out.append(replace(job, arrival_ms=i // mode.batch, duration_ms=None))
    return tuple(out)


def copies(rng: random.Random, workload: Workload, missing: float) -> list[JobSpec]:
    """Copies of uniformly drawn jobs of ``workload`` until they add ``missing`` milli-GPUs."""
    if missing <= 0:
        return []
    if not any(j.gpu_milli for j in workload.jobs):
        raise SpecError(f"{workload.source}: no job requests a GPU, so it cannot be inflated")
    taken = {j.job_id for j in workload.jobs}
    out: list[JobSpec] = []
    while missing > 0 and len(out) < MAX_COPIES:
        job = rng.choice(workload.jobs)
        name = f"{job.job_id}~{len(out)}"[-253:]
        while name in taken:
            name = f"{name}~"[-253:]
        taken.add(name)
        out.append(replace(job, event=msgspec.structs.replace(job.event, job_id=name)))
        missing -= job.gpu_milli
    return out


def replay(mode: Mode, workload: Workload) -> tuple[JobSpec, ...]:
    """Jobs at their trace times (from the first arrival) divided by ``speed``, in time order."""
    if not workload.timed:
        raise SpecError(
            f"{workload.source}: replay needs arrival times (creation_time, deletion_time, "
            "scheduled_time columns); use --mode inflate"
        )
    start = min(j.arrival_ms for j in workload.jobs)
    timed = [replace(j, arrival_ms=round((j.arrival_ms - start) / mode.speed)) for j in workload.jobs]
    return tuple(sorted(timed, key=lambda j: j.arrival_ms))  # stable: file order within a millisecond
