"""The simulated cell: a backend that acts only through the logs.

It reads decision batches from the decisions log and turns them into effects on its nodes,
and it reports what it observes as input events: a ``NodeHeartbeat`` from every live node
each period, ``TaskStarted`` a seeded delay after a placement, ``TaskFinished`` when a task
has run for its duration, and seeded node failures (an unhealthy heartbeat; the node's
gangs die) and recoveries (healthy heartbeats again).  It never decides anything.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Protocol

from fleetlog.backends.simulated.clock import Agenda, Emitted, Timers
from fleetlog.backends.simulated.cluster import Cluster, NodeSpec
from fleetlog.events import (
    Event,
    JobPending,
    JobPlaced,
    JobRejected,
    JobSubmitted,
    NodeHeartbeat,
    TaskFinished,
    TaskPlacement,
    TaskPreempted,
    TaskStarted,
    encode,
    envelope,
)
from fleetlog.events.model import Decision
from fleetlog.log.base import DECISIONS, LogStore, Message
from fleetlog.log.consumer import decision_batches

PRODUCER: Final = "fleetlog-sim-cell"

Runtime = tuple[int | None, tuple[int, ...]]
"""What the cell knows of a submitted job: how long its tasks run (``None``: until the end),
and the milli-GPUs of each task."""
TaskRef = tuple[str, int, int]
"""(job id, incarnation, task index): a task of one incarnation, as its timers name it."""
UNKNOWN: Final[Runtime] = (None, ())
"""A job never registered: runs until the end, holds its whole GPUs."""


@dataclass(slots=True)
class Gang:
    """One incarnation of a placed job: its tasks' nodes and GPU shares, and what is still running."""

    incarnation: int
    tasks: dict[int, tuple[str, int]]
    """task index -> (node, milli-GPUs held)."""
    running: set[int]  # task indices not finished (ints: order-free)


def message(event: Event) -> Message:
    return Message(encode(envelope(event, PRODUCER)))


class Observer(Protocol):
    """What the cell tells of each job as it acts, for a simulation's measures (the harness's
    :class:`fleetlog.simulation.metrics.Recorder`): a port, so the cell never imports its harness."""

    node_failures: int
    node_recoveries: int

    def placed(self, job_id: str, now_ms: int, allocated_milli: int) -> None: ...
    def rejected(self, job_id: str, allocated_milli: int) -> None: ...
    def stopped(self, job_id: str, preempted: bool) -> None: ...
    def finished(self, job_id: str) -> None: ...


class SimulatedCell:
    """One simulated cell. ``register`` tells it how long a job runs; ``consume`` reads decisions."""

    def __init__(self, cluster: Cluster, timers: Timers, seed: int, recorder: Observer) -> None:
        self.cluster, self.timers, self.recorder = cluster, timers, recorder
        self.behaviour = cluster.behaviour
        self.starts = random.Random(f"fleetlog-sim/{seed}/starts")
        self.start_span = self.behaviour.max_start_delay_ms + 1
        self.starting: Agenda[TaskRef] = Agenda(timers, self._start)
        self.finishing: Agenda[TaskRef] = Agenda(timers, self._finish)
        self.failures = random.Random(f"fleetlog-sim/{seed}/failures")
        self.nodes = {n.name: n for n in cluster.nodes}
        self.up = dict.fromkeys(self.nodes, True)
        self.beats = {n.name: message(heartbeat(cluster.cell, n, True)) for n in cluster.nodes}
        self.live_beats: tuple[Message, ...] | None = None
        """The heartbeats of a round while no node fails or recovers (``None``: to be rebuilt)."""
        self.jobs: dict[str, Runtime] = {}
        """job id -> (how long its tasks run, milli-GPUs of each task)."""
        self.gangs: dict[str, Gang] = {}
        self.on_node: dict[str, dict[str, None]] = {name: {} for name in self.nodes}  # insertion-ordered
        self.incarnations = 0
        self.allocated_milli = 0
        self.decisions_offset = 0
        self.decisions_seen = 0

    # --- lifecycle ---------------------------------------------------------------------

    def start(self) -> Emitted:
        """The first heartbeat of every node now; later rounds and failures on the timers."""
        self.timers.at(self.timers.clock.now_ms + self.behaviour.heartbeat_ms, self._heartbeat_round)
        if self.behaviour.mtbf_ms:
            for name in self.nodes:
                self._schedule_failure(name)
        return Emitted([self.beats[n] for n in self.nodes], True)

    def register(self, job: JobSubmitted, duration_ms: int | None) -> None:
        """A job was submitted: how long its tasks will run once started (``None``: until the end)."""
        self.jobs[job.job_id] = runtime(job, duration_ms)

    def register_many(self, runtimes: Mapping[str, Runtime]) -> None:
        """Jobs were submitted, their runtimes prepared by :func:`runtime` ahead of the run (a
        driver submitting a known workload need not rebuild them at each arrival)."""
        self.jobs.update(runtimes)

    async def consume(self, store: LogStore) -> int:
        """Apply every decision batch appended since the last call; how many decisions."""
        log, count = store.log(DECISIONS), 0
        end = await log.end_offset()
        while self.decisions_offset < end:
            records = await log.read(self.decisions_offset, 1000)
            if not records:
                break
            for _, batch in decision_batches(records):
                self._apply_all(batch.decisions)
                count += len(batch.decisions)
            self.decisions_offset = records[-1].offset + 1
        self.decisions_seen += count
        return count

    def _apply_all(self, decisions: tuple[Decision, ...]) -> None:
        """The effects of one batch, in order: placements (nearly all of a batch) without the
        dispatch of :meth:`apply`, and their tasks' starts scheduled together at the end (a start
        checks its gang's incarnation when it fires, so a later decision of the batch that
        preempts a gang needs no care here)."""
        starts: list[TaskRef] = []
        place, place_single, apply = self._place, self._place_single, self.apply
        cell, up = self.cluster.cell, self.up
        for decision in decisions:
            if type(decision) is not JobPlaced:
                apply(decision)
            elif len(decision.tasks) == 1 and decision.cell == cell and up.get(decision.tasks[0].node, False):
                place_single(decision.job_id, decision.tasks[0], starts)
            elif (gang := place(decision)) is not None:
                add_refs(starts, decision.job_id, gang)
        if starts:
            self._schedule_starts(starts)

    def apply(self, decision: Decision) -> None:
        """The effect of one decision on the cell."""
        match decision:
            case JobPlaced():
                gang = self._place(decision)
                if gang is not None:
                    self._schedule_starts(add_refs([], decision.job_id, gang))
            case TaskPreempted():
                if decision.job_id in self.gangs:
                    self._kill(decision.job_id)
                    self.recorder.stopped(decision.job_id, preempted=True)
            case JobRejected():
                self.recorder.rejected(decision.job_id, self.allocated_milli)
            case JobPending():
                pass  # the job waits: nothing to do in the cell

    # --- placements --------------------------------------------------------------------

    def _place(self, d: JobPlaced) -> Gang | None:
        """Run ``d``'s gang (``None``: it cannot start: a node is down, or another cell's)."""
        job_id = d.job_id
        if job_id in self.gangs:
            self._kill(job_id)  # placed again: the previous incarnation is gone
        now = self.timers.clock.now_ms
        if d.cell != self.cluster.cell or not self._all_up(d.tasks):
            self.recorder.placed(job_id, now, self.allocated_milli)
            self.recorder.stopped(job_id, preempted=False)  # cannot start; requeued on the failure
            return None
        gang = self._new_gang(d)
        self.recorder.placed(job_id, now, self.allocated_milli)
        return gang

    def _place_single(self, job_id: str, task: TaskPlacement, starts: list[TaskRef]) -> None:
        """:meth:`_place` and :meth:`_new_gang` for a one-task gang on a live node of this cell
        (every pod of a trace: nearly every decision of a run), in one frame; its start is
        appended to ``starts``."""
        if job_id in self.gangs:
            self._kill(job_id)  # placed again: the previous incarnation is gone
        index, node = task.task_index, task.node
        share = task_share(self.jobs.get(job_id, UNKNOWN)[1], task)
        self.incarnations = incarnation = self.incarnations + 1
        self.gangs[job_id] = Gang(incarnation, {index: (node, share)}, {index})
        self.on_node[node][job_id] = None
        self.allocated_milli += share
        self.recorder.placed(job_id, self.timers.clock.now_ms, self.allocated_milli)
        starts.append((job_id, incarnation, index))

    def _schedule_starts(self, tasks: list[TaskRef]) -> None:
        """Each task starts after a seeded delay, uniform over 0..max, drawn in ``tasks`` order
        (``random()`` scaled: one C call per task where ``randint`` took four Python frames)."""
        draw, span = self.starts.random, self.start_span
        self.starting.add_after(self.timers.clock.now_ms, [int(draw() * span) for _ in tasks], tasks)

    def _all_up(self, tasks: tuple[TaskPlacement, ...]) -> bool:
        if len(tasks) == 1:  # one task (every pod of a trace): no generator
            return self.up.get(tasks[0].node, False)
        return all(self.up.get(t.node, False) for t in tasks)

    def _new_gang(self, d: JobPlaced) -> Gang:
        """Take the placement's GPU shares and remember which nodes the gang is on."""
        job_id = d.job_id
        shares = self.jobs.get(job_id, UNKNOWN)[1]
        self.incarnations += 1
        tasks = {t.task_index: (t.node, task_share(shares, t)) for t in d.tasks}
        gang = Gang(self.incarnations, tasks, set(tasks))
        self.gangs[job_id] = gang
        for node, milli in tasks.values():
            self.on_node[node][job_id] = None
            self.allocated_milli += milli
        return gang

    def _start(self, now: int, due: list[TaskRef]) -> Emitted:
        """The tasks due to start now report it; those of an incarnation since gone do not.
        A task that runs for a known time is due to finish then."""
        out: list[Message] = []
        gangs, jobs = self.gangs, self.jobs
        for job_id, incarnation, index in due:
            gang = gangs.get(job_id)
            if gang is None or gang.incarnation != incarnation:
                continue
            duration = jobs.get(job_id, UNKNOWN)[0]
            if duration is not None:
                self.finishing.add(now + duration, (job_id, incarnation, index))
            out.append(message(TaskStarted(job_id=job_id, task_index=index, node=gang.tasks[index][0])))
        return Emitted(out)

    def _finish(self, now: int, due: list[TaskRef]) -> Emitted:
        """The tasks due to finish now report it (a trigger: their GPUs are free); a gang whose
        last task finished is done."""
        out: list[Message] = []
        for job_id, incarnation, index in due:
            gang = self.gangs.get(job_id)
            if gang is None or gang.incarnation != incarnation:
                continue
            gang.running.discard(index)
            self.allocated_milli -= gang.tasks[index][1]
            if not gang.running:
                self._forget(job_id, gang)
                self.recorder.finished(job_id)
            out.append(message(TaskFinished(job_id=job_id, task_index=index)))
        return Emitted(out, bool(out))

    def _kill(self, job_id: str) -> None:
        """Stop every running task of ``job_id``'s current incarnation (its timers become no-ops)."""
        gang = self.gangs[job_id]
        for index in gang.running:
            self.allocated_milli -= gang.tasks[index][1]
        self._forget(job_id, gang)

    def _forget(self, job_id: str, gang: Gang) -> None:
        del self.gangs[job_id]
        for node, _ in gang.tasks.values():
            self.on_node[node].pop(job_id, None)

    # --- heartbeats, failures, recoveries ----------------------------------------------

    def _heartbeat_round(self, now: int) -> Emitted:
        self.timers.at(now + self.behaviour.heartbeat_ms, self._heartbeat_round)
        if self.live_beats is None:  # a node failed or recovered since the last round
            self.live_beats = tuple(self.beats[n] for n, up in self.up.items() if up)
        return Emitted(self.live_beats)

    def _schedule_failure(self, name: str) -> None:
        gap = round(self.failures.expovariate(1.0 / self.behaviour.mtbf_ms))
        self.timers.at(self.timers.clock.now_ms + max(1, gap), lambda now: self.fail(name))

    def fail(self, name: str) -> Emitted:
        """Node ``name`` dies now: its gangs are lost, the cell reports it unhealthy (no more
        heartbeats), and its repair is scheduled. Called by the seeded failure process, or by a
        scenario on the timers."""
        if not self.up[name]:
            return Emitted()
        self.up[name] = False
        self.live_beats = None
        self.recorder.node_failures += 1
        for job_id in list(self.on_node[name]):
            self._kill(job_id)
            self.recorder.stopped(job_id, preempted=False)
        repair = round(self.failures.expovariate(1.0 / max(1, self.behaviour.mttr_ms)))
        repair = max(self.behaviour.heartbeat_ms, repair)
        self.timers.at(self.timers.clock.now_ms + repair, lambda now: self.recover(name))
        return Emitted([message(heartbeat(self.cluster.cell, self.nodes[name], False))], True)

    def recover(self, name: str) -> Emitted:
        """Node ``name`` is repaired: healthy heartbeats again (it comes back empty)."""
        if self.up[name]:
            return Emitted()
        self.up[name] = True
        self.live_beats = None
        self.recorder.node_recoveries += 1
        if self.behaviour.mtbf_ms:
            self._schedule_failure(name)
        return Emitted([self.beats[name]], True)


def add_refs(refs: list[TaskRef], job_id: str, gang: Gang) -> list[TaskRef]:
    """``refs`` with the tasks of ``gang`` appended, by task index."""
    if len(gang.tasks) == 1:  # one task (every pod of a trace): no sort
        refs.extend((job_id, gang.incarnation, index) for index in gang.tasks)
    else:
        refs.extend((job_id, gang.incarnation, index) for index in sorted(gang.tasks))
    return refs


def runtime(job: JobSubmitted, duration_ms: int | None) -> Runtime:
    """What the cell keeps of a submitted job: its true duration and each task's milli-GPUs."""
    groups = job.task_groups
    if len(groups) == 1 and groups[0].count == 1:  # one task (every pod of a trace): no generator
        return (duration_ms, (groups[0].gpu_count * groups[0].gpu_milli,))
    return (duration_ms, tuple(g.gpu_count * g.gpu_milli for g in groups for _ in range(g.count)))


def task_share(shares: tuple[int, ...], task: TaskPlacement) -> int:
    """Milli-GPUs a placed task holds: as registered, or its whole GPUs for a job never registered."""
    return shares[task.task_index] if task.task_index < len(shares) else 1000 * len(task.gpu_indices)


def heartbeat(cell: str, node: NodeSpec, healthy: bool) -> NodeHeartbeat:
    return NodeHeartbeat(
        cell=cell,
        node=node.name,
        cpu_milli=node.cpu_milli,
        mem_mib=node.mem_mib,
        gpu_count=node.gpu_count,
        gpu_model=node.gpu_model,
        topology=node.topology,
        healthy=healthy,
    )
