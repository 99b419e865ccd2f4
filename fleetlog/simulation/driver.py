"""The discrete-event driver: virtual time drives the real scheduling loop and the simulated cell.

Each turn jumps the virtual clock to the next timed action (an arrival, a heartbeat round,
a task start or finish, a node failure or repair), appends what those actions emit to the
inputs log in one batch (stamped with the virtual time by the log's injected clock), and —
when something happened that can change a decision — steps the scheduler until it has folded
every input, then lets the cell consume the decisions it published.  The scheduler is the
service loop itself (``fleetlog.service.loop.SchedulerLoop``), injected by the caller: the
backends never import the core.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from fleetlog.backends.simulated.backend import PRODUCER, Runtime, SimulatedCell, runtime
from fleetlog.backends.simulated.clock import Emitted, Timers, VirtualClock
from fleetlog.backends.simulated.cluster import Cluster
from fleetlog.events import encode, envelope
from fleetlog.log.base import INPUTS, LogStore, Message
from fleetlog.log.file import FileLogStore
from fleetlog.log.memory import MemoryLogStore
from fleetlog.simulation.metrics import PENDING, RUNNING, Recorder
from fleetlog.simulation.modes import Mode
from fleetlog.simulation.workload import JobSpec, Workload


class Scheduler(Protocol):
    """What the driver needs of the scheduling loop: ``step`` and the next inputs offset."""

    offset: int

    async def step(self, timeout_ms: int = 0) -> object: ...


SchedulerFactory = Callable[[LogStore], Scheduler]
Progress = Callable[[int, int, int], None]
"""Called with (jobs arrived, jobs in the run, virtual time in ms)."""
Stop = Callable[[], bool]
"""Asked between turns: ``True`` ends the run early (Ctrl-C), with the log folded to its end."""


@dataclass(frozen=True, slots=True)
class Arrivals:
    """The jobs submitted at one virtual time, made ready before the run: their encoded
    ``JobSubmitted`` messages and what the cell and the recorder are told of them depend only
    on the workload, so the run does not build them job by job."""

    at_ms: int
    messages: tuple[Message, ...]
    runtimes: dict[str, Runtime]
    job_ids: tuple[str, ...]
    gpu_milli: tuple[int, ...]


def plan_arrivals(jobs: tuple[JobSpec, ...]) -> list[Arrivals]:
    """``jobs`` (in arrival order) grouped by arrival time."""
    plan: list[Arrivals] = []
    start = 0
    while start < len(jobs):
        at, end = jobs[start].arrival_ms, start + 1
        while end < len(jobs) and jobs[end].arrival_ms == at:
            end += 1
        group = jobs[start:end]
        plan.append(
            Arrivals(
                at,
                tuple(message_of(j) for j in group),
                {j.job_id: runtime(j.event, j.duration_ms) for j in group},
                tuple(j.job_id for j in group),
                tuple(j.gpu_milli for j in group),
            )
        )
        start = end
    return plan


@dataclass(frozen=True)
class RunStats:
    """How much work a run did, and how fast (wall-clock, from the first append to the end)."""

    inputs: int
    decisions: int
    steps: int
    virtual_ms: int
    wall_s: float
    interrupted: bool = False
    """The run was stopped early (``Stop``): what it holds is what was simulated until then."""


class Simulation:
    """One seeded run of ``jobs`` on ``cluster`` through ``store``."""

    def __init__(
        self,
        cluster: Cluster,
        jobs: tuple[JobSpec, ...],
        mode: Mode,
        *,
        store: LogStore,
        clock: VirtualClock,
        seed: int,
        setup: tuple[Message, ...] = (),
    ) -> None:
        self.cluster, self.jobs, self.mode, self.store, self.clock = cluster, jobs, mode, store, clock
        self.timers = Timers(clock, mode.tick_ms)
        self.recorder = Recorder(cluster.gpu_milli)
        self.cell = SimulatedCell(cluster, self.timers, seed, self.recorder)
        self.setup = setup
        self.plan = plan_arrivals(jobs)
        self.next_group = 0
        self.next_job = 0
        self.steps = 0
        last_arrival = jobs[-1].arrival_ms if jobs else 0
        self.deadline_ms = last_arrival + (mode.drain_ms if mode.name == "replay" else 0)

    async def run(
        self, scheduler: Scheduler, progress: Progress | None = None, stop: Stop | None = None
    ) -> RunStats:
        """Run until every job has arrived and been decided (inflate), or every job is done or the
        drain deadline passed (replay) — or ``stop()`` says so between two turns."""
        with long_lived_frozen():
            return await self._run(scheduler, progress, stop or (lambda: False))

    async def _run(self, scheduler: Scheduler, progress: Progress | None, stop: Stop) -> RunStats:
        started = time.perf_counter()
        first = self.cell.start()
        await self._turn(scheduler, Emitted([*first.messages, *self.setup], True))
        if self.plan:
            self.timers.at(self.plan[0].at_ms, self._arrive)
        interrupted = False
        while not self._finished() and self.timers.next_time() is not None:
            if stop():
                interrupted = True
                break
            await self._turn(scheduler, self.timers.fire_next())
            if progress is not None:
                progress(self.next_job, len(self.jobs), self.clock.now_ms)
        await self._turn(scheduler, Emitted((), True))  # fold the tail: the log ends fully scheduled
        inputs = await self.store.log(INPUTS).end_offset()
        wall_s = time.perf_counter() - started
        return RunStats(inputs, self.cell.decisions_seen, self.steps, self.clock.now_ms, wall_s, interrupted)

    async def _turn(self, scheduler: Scheduler, emitted: Emitted) -> None:
        """Append what happened now; if it may change a decision, schedule and apply the decisions."""
        if emitted.messages:
            await self.store.log(INPUTS).append(emitted.messages)
        if not emitted.trigger:
            return
        end = await self.store.log(INPUTS).end_offset()
        while scheduler.offset < end:
            await scheduler.step(0)
            self.steps += 1
        await self.cell.consume(self.store)
        self.recorder.sample(self.clock.now_ms, self.cell.allocated_milli)

    def _arrive(self, now: int) -> Emitted:
        """Submit every job due now (the groups planned up to now); schedule the next arrival."""
        out: list[Message] = []
        plan = self.plan
        while self.next_group < len(plan) and plan[self.next_group].at_ms <= now:
            group = plan[self.next_group]
            self.cell.register_many(group.runtimes)
            self.recorder.arrived_many(group.job_ids, group.gpu_milli, now)
            out.extend(group.messages)
            self.next_job += len(group.job_ids)
            self.next_group += 1
        if self.next_group < len(plan):
            self.timers.at(plan[self.next_group].at_ms, self._arrive)
        return Emitted(out, True)

    def _finished(self) -> bool:
        if self.next_job < len(self.jobs):
            return False
        counts = self.recorder.counts
        if self.mode.name == "inflate":
            return counts[PENDING] == 0 or self.clock.now_ms >= self.deadline_ms + 60_000
        idle = counts[PENDING] == 0 and counts[RUNNING] == 0
        return idle or self.clock.now_ms >= self.deadline_ms


@contextmanager
def long_lived_frozen() -> Iterator[None]:
    """Keep the cyclic GC from re-scanning what already exists (the workload's jobs, the
    cluster, loaded modules) in every full collection during the run: on openb, two full
    collections took ~0.25 s of a 1.8 s run. Objects are unfrozen afterwards, unless the
    caller had frozen some itself (then it owns the permanent generation)."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def message_of(job: JobSpec) -> Message:
    return Message(encode(envelope(job.event, "fleetlog-sim-workload")))


def setup_messages(workload: Workload) -> tuple[Message, ...]:
    return tuple(Message(encode(envelope(e, PRODUCER))) for e in workload.setup)


def open_store(log_dir: Path | None, clock: VirtualClock) -> LogStore:
    """The embedded file log in ``log_dir`` (or memory when ``None``), stamped by the virtual clock.
    ``fsync="never"``: a simulation is re-run from its seed, not recovered after a power cut."""
    if log_dir is None:
        return MemoryLogStore(clock=clock)
    return FileLogStore(log_dir, clock=clock, fsync="never")
