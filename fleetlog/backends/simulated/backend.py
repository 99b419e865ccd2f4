"""The simulated cell: a backend that acts only through the logs.

It reads decision batches from the decisions log and turns them into effects on its nodes,
and it reports what it observes as input events: a ``NodeHeartbeat`` from every live node
each period, ``TaskStarted`` a seeded delay after a placement, ``TaskFinished`` when a task
has run for its duration, and seeded node failures (an unhealthy heartbeat; the node's
gangs die) and recoveries (healthy heartbeats again).  It never decides anything.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Final

from fleetlog.backends.simulated.clock import Action, Emitted, Timers
from fleetlog.backends.simulated.cluster import Cluster, NodeSpec
from fleetlog.backends.simulated.metrics import Recorder
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


@dataclass
class Gang:
    """One incarnation of a placed job: its tasks' nodes and GPU shares, and what is still running."""

    incarnation: int
    tasks: dict[int, tuple[str, int]]
    """task index -> (node, milli-GPUs held)."""
    running: set[int] = field(default_factory=set)  # task indices not finished (ints: order-free)


def message(event: Event) -> Message:
    return Message(encode(envelope(event, PRODUCER)))


class SimulatedCell:
    """One simulated cell. ``register`` tells it how long a job runs; ``consume`` reads decisions."""

    def __init__(self, cluster: Cluster, timers: Timers, seed: int, recorder: Recorder) -> None:
        self.cluster, self.timers, self.recorder = cluster, timers, recorder
        self.behaviour = cluster.behaviour
        self.starts = random.Random(f"fleetlog-sim/{seed}/starts")
        self.failures = random.Random(f"fleetlog-sim/{seed}/failures")
        self.nodes = {n.name: n for n in cluster.nodes}
        self.up = dict.fromkeys(self.nodes, True)
        self.beats = {n.name: message(heartbeat(cluster.cell, n, True)) for n in cluster.nodes}
        self.jobs: dict[str, tuple[int | None, tuple[int, ...]]] = {}
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
        groups = job.task_groups
        if len(groups) == 1 and groups[0].count == 1:  # one task (every pod of a trace): no generator
            milli: tuple[int, ...] = (groups[0].gpu_count * groups[0].gpu_milli,)
        else:
            milli = tuple(g.gpu_count * g.gpu_milli for g in groups for _ in range(g.count))
        self.jobs[job.job_id] = (duration_ms, milli)

    async def consume(self, store: LogStore) -> int:
        """Apply every decision batch appended since the last call; how many decisions."""
        log, count = store.log(DECISIONS), 0
        end = await log.end_offset()
        while self.decisions_offset < end:
            records = await log.read(self.decisions_offset, 1000)
            if not records:
                break
            for _, batch in decision_batches(records):
                for decision in batch.decisions:
                    self.apply(decision)
                count += len(batch.decisions)
            self.decisions_offset = records[-1].offset + 1
        self.decisions_seen += count
        return count

    def apply(self, decision: Decision) -> None:
        """The effect of one decision on the cell."""
        match decision:
            case JobPlaced():
                self._place(decision)
            case TaskPreempted():
                if decision.job_id in self.gangs:
                    self._kill(decision.job_id)
                    self.recorder.stopped(decision.job_id, preempted=True)
            case JobRejected():
                self.recorder.rejected(decision.job_id, self.allocated_milli)
            case JobPending():
                pass  # the job waits: nothing to do in the cell

    # --- placements --------------------------------------------------------------------

    def _place(self, d: JobPlaced) -> None:
        if d.job_id in self.gangs:
            self._kill(d.job_id)  # placed again: the previous incarnation is gone
        now = self.timers.clock.now_ms
        if d.cell != self.cluster.cell or not self._all_up(d.tasks):
            self.recorder.placed(d.job_id, now, self.allocated_milli)
            self.recorder.stopped(d.job_id, preempted=False)  # cannot start; requeued on the failure
            return
        gang = self._new_gang(d)
        self.recorder.placed(d.job_id, now, self.allocated_milli)
        for index in sorted(gang.tasks):
            delay = self.starts.randint(0, self.behaviour.max_start_delay_ms)
            self.timers.at(now + delay, self._starter(d.job_id, gang.incarnation, index))

    def _all_up(self, tasks: tuple[TaskPlacement, ...]) -> bool:
        if len(tasks) == 1:  # one task (every pod of a trace): no generator
            return self.up.get(tasks[0].node, False)
        return all(self.up.get(t.node, False) for t in tasks)

    def _new_gang(self, d: JobPlaced) -> Gang:
        """Take the placement's GPU shares and remember which nodes the gang is on."""
        shares = self.jobs[d.job_id][1] if d.job_id in self.jobs else ()
        self.incarnations += 1
        gang = Gang(self.incarnations, {t.task_index: (t.node, task_share(shares, t)) for t in d.tasks})
        gang.running.update(gang.tasks)
        self.gangs[d.job_id] = gang
        for node, milli in gang.tasks.values():
            self.on_node[node][d.job_id] = None
            self.allocated_milli += milli
        return gang

    def _starter(self, job_id: str, incarnation: int, index: int) -> Action:
        def start(now: int) -> Emitted:
            gang = self.gangs.get(job_id)
            if gang is None or gang.incarnation != incarnation:
                return Emitted()
            duration = self.jobs[job_id][0] if job_id in self.jobs else None
            if duration is not None:
                self.timers.at(now + duration, self._finisher(job_id, incarnation, index))
            return Emitted([message(TaskStarted(job_id=job_id, task_index=index, node=gang.tasks[index][0]))])

        return start

    def _finisher(self, job_id: str, incarnation: int, index: int) -> Action:
        def finish(now: int) -> Emitted:
            gang = self.gangs.get(job_id)
            if gang is None or gang.incarnation != incarnation:
                return Emitted()
            gang.running.discard(index)
            self.allocated_milli -= gang.tasks[index][1]
            if not gang.running:
                self._forget(job_id, gang)
                self.recorder.finished(job_id)
            return Emitted([message(TaskFinished(job_id=job_id, task_index=index))], True)

        return finish

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
        return Emitted([self.beats[n] for n, up in self.up.items() if up])

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
        self.recorder.node_recoveries += 1
        if self.behaviour.mtbf_ms:
            self._schedule_failure(name)
        return Emitted([self.beats[name]], True)


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
