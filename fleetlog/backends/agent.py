"""A fake node agent: the nodes of one cell that exist only as heartbeats, for trying fleetlog
on one machine without a cluster (``fleetlog agent``, :mod:`fleetlog.agent_cli`).

It acts only through the logs, as the Slurm and Kubernetes backends do, but on the wall clock and
with nothing to run.  Each :meth:`FakeAgent.step`:

1. catches up with the logs in the order the scheduler folds them (the inputs before a decision
   batch's ``as_of``, then the batch): ``JobSubmitted`` gives the job's expected duration,
   ``JobPlaced`` in its cell makes a *run* (its incarnation is the offset of the batch that placed
   it), and ``TaskPreempted``, ``JobCancelled``, a re-placement or the removal of one of its nodes
   ends the run — when the scheduler's own state would;
2. reports every node's ``NodeHeartbeat`` every ``heartbeat_ms`` (well within the node timeout);
3. starts every task of a live run it has not started (``TaskStarted`` at once: the tasks it finds
   placed on its nodes after a restart included), and finishes each once the job's expected
   duration has passed since it started (``TaskFinished``, or ``TaskFailed`` for the share
   ``fail_rate`` picks).

Its observations carry idempotency keys, and a restarted agent reads its own back (with their
append times): a task it started before goes on from its recorded start, and nothing is reported
twice.  Why a fake and not the simulated cell: that one runs on a virtual clock inside
``fleetlog simulate``; this one runs beside a real ``fleetlog run``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import msgspec
from tenacity import RetryCallState

from fleetlog.backends.follow import DecisionFollower
from fleetlog.backends.shared_log import RefusedError
from fleetlog.events import (
    DecisionBatch,
    InputEvent,
    JobCancelled,
    JobDispatched,
    JobPlaced,
    JobRejected,
    JobSubmitted,
    NodeHeartbeat,
    NodeRemoved,
    TaskFailed,
    TaskFinished,
    TaskPreempted,
    TaskStarted,
    encode,
    envelope,
)
from fleetlog.events.model import INPUT_TYPES
from fleetlog.log import errorpolicy
from fleetlog.log.base import INPUTS, LogStore, Message
from fleetlog.log.consumer import Delivered, EventConsumer
from fleetlog.waiting import event_or_timeout

log = logging.getLogger("fleetlog.backends.agent")
MAX_KEY: Final = 253
TaskEvent = TaskStarted | TaskFinished | TaskFailed
KINDS: Final = ("started", "finished", "failed")
NOT_ALLOWED: Final = frozenset({"unauthenticated", "forbidden"})
"""Refusals for who the agent is, not for a passing fault: they stop it."""


class NotAllowedError(Exception):
    """The service does not let this agent report its nodes (a token missing, unknown, or without
    ``node-agent:CELL``): retrying cannot mend it, so the agent stops and says why."""


class AgentConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The fake cell: its nodes (all alike) and how it behaves; times in wall-clock milliseconds."""

    cell: str = "local"
    nodes: int = 4
    gpus: int = 8
    gpu_model: str = "A100"
    cpu_milli: int = 64_000
    mem_mib: int = 512 * 1024
    heartbeat_ms: int = 5_000
    """Every node's heartbeat is sent this often: keep it well within the service's node timeout."""
    default_duration_ms: int = 30_000
    """How long a task of a job without ``expected_duration_ms`` runs."""
    fail_rate: float = 0.0
    """The share of tasks that end with ``TaskFailed`` instead of finishing (picked by a hash of the
    task, so a restarted agent picks the same ones)."""
    poll_ms: int = 200

    @property
    def producer_id(self) -> str:
        return f"fleetlog-agent-{self.cell}"

    def node_names(self) -> list[str]:
        """``CELL-1`` … ``CELL-N``."""
        return [f"{self.cell}-{i}" for i in range(1, self.nodes + 1)]


@dataclass
class Task:
    node: str
    started_ms: int | None = None
    """Wall-clock epoch milliseconds of its ``TaskStarted`` (``None``: not started yet)."""
    ended: bool = False


@dataclass
class Run:
    """One placement of a job on this agent's nodes."""

    incarnation: int
    job_id: str
    duration_ms: int
    tasks: dict[int, Task] = field(default_factory=dict)


Say = Callable[[str, str, int, str, int | None], None]
"""What the command prints per observation: (kind, job id, task index, node, exit code)."""


def _quiet(kind: str, job_id: str, index: int, node: str, exit_code: int | None) -> None:
    """No lines (a library user)."""


class FakeAgent(DecisionFollower):
    """Decisions in (from the decisions log), pretend effects, observations back (to the inputs log)."""

    def __init__(self, store: LogStore, config: AgentConfig | None = None, *,
                 clock: Callable[[], float] = time.time, say: Say = _quiet,
                 ready: Callable[[], None] = lambda: None) -> None:
        self.store, self.config, self.clock, self.say = store, config or AgentConfig(), clock, say
        self.ready: Callable[[], None] | None = ready
        """Called once, after the first heartbeats were appended (the nodes are up from then on)."""
        self.consumer = EventConsumer(store, accepts=(*INPUT_TYPES, JobDispatched))
        self.nodes = frozenset(self.config.node_names())
        self.durations: dict[str, int] = {}
        self.runs: dict[str, Run] = {}
        self.cancelled_at: dict[str, int] = {}
        self.removed_at: dict[str, int] = {}
        self.emitted: set[str] = set()
        self.inputs_offset = self.decisions_offset = 0
        self.beat_at = -float("inf")
        self.reported: dict[str, int] = {}
        self.stalled = ""

    # --- the loop ----------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Step every ``poll_ms`` until ``stop`` (an :class:`asyncio.Event`) is set; log trouble is
        retried with back-off, anything else stalls and is re-checked (the policy every log reader
        shares: :mod:`fleetlog.log.errorpolicy`)."""

        async def sleep(seconds: float) -> None:
            await event_or_timeout(stop, seconds)

        while not stop.is_set():
            stepped = await errorpolicy.persist(self.step, self.failed, stopped=stop.is_set, sleep=sleep,
                                                fatal=(NotAllowedError,))
            if not stepped:
                break
            if self.stalled:
                log.info("fake agent resumed at decisions@%d", self.decisions_offset)
                self.stalled = ""
            await sleep(self.config.poll_ms / 1000)

    def failed(self, state: RetryCallState, status: str, action: str) -> None:
        """Say why a step failed: a retry as a warning, a stall once as an error."""
        error = state.outcome.exception() if state.outcome is not None else None
        if status == "retrying":
            log.warning("fake agent step failed (retry in %.2fs): %s", state.upcoming_sleep, error)
            return
        repeat, self.stalled = self.stalled == str(error), str(error)
        (log.debug if repeat else log.error)("fake agent stalled: %s (%s)", error, action)

    async def step(self) -> None:
        """Catch up with the logs, then report heartbeats and the tasks' starts and ends."""
        await self.catch_up()
        now_ms = int(self.clock() * 1000)
        messages = self.heartbeats(now_ms) + self.observe(now_ms)
        if messages:
            try:
                await self.store.log(INPUTS).append(messages)
            except RefusedError as exc:
                if exc.reason in NOT_ALLOWED:
                    raise NotAllowedError(str(exc)) from None
                raise
        if self.ready is not None:
            ready, self.ready = self.ready, None
            ready()

    # --- 1. the logs, in the scheduler's fold order -------------------------------------

    # (catch_up and read_inputs: fleetlog.backends.follow.DecisionFollower)

    def apply_input(self, d: Delivered) -> None:
        event = d.envelope.event
        match event:
            case JobSubmitted():  # the first: the fold ignores a resend
                self.durations.setdefault(event.job_id, self.duration(event))
            case JobDispatched(job=job):  # a cell partition's: the whole submission, as dispatched
                self.durations[job.job_id] = self.duration(job)
            case JobCancelled():
                self.cancelled_at[event.job_id] = d.offset
                self.end_run(event.job_id, "cancelled")
            case NodeRemoved() if event.cell == self.config.cell:
                self.removed_at[event.node] = d.offset
                for job_id in sorted(j for j, r in self.runs.items() if any(
                        t.node == event.node for t in r.tasks.values())):
                    self.end_run(job_id, f"node {event.node} removed")
            case NodeHeartbeat() if event.cell == self.config.cell and event.node in self.nodes:
                self.removed_at.pop(event.node, None)  # our own heartbeats bring a removed node back
            case TaskStarted() | TaskFinished() | TaskFailed():
                if d.envelope.producer_id == self.config.producer_id and d.envelope.key:
                    self.read_back(event, d.envelope.key, d.timestamp_ms)
            case _:
                pass

    def duration(self, job: JobSubmitted) -> int:
        found = job.expected_duration_ms
        return self.config.default_duration_ms if found is None else found

    def read_back(self, event: TaskEvent, key: str, at_ms: int) -> None:
        """One of our own observations, read back (after a restart): a started task goes on from
        when it started; an ended one is not reported again."""
        run = self.runs.get(event.job_id)
        task = run.tasks.get(event.task_index) if run is not None else None
        if run is None or task is None or key != self.key(run, event.task_index, kind_of(event)):
            return  # of a run that ended: nothing to remember
        self.emitted.add(key)
        if isinstance(event, TaskStarted):
            task.started_ms = at_ms
        else:
            task.ended = True
            if all(t.ended for t in run.tasks.values()):
                self.end_run(run.job_id, "ended")

    def apply_batch(self, offset: int, batch: DecisionBatch) -> None:
        for decision in batch.decisions:
            match decision:
                case JobPlaced():
                    self.end_run(decision.job_id, f"placed again at decisions@{offset}")
                    if decision.cell == self.config.cell and self.will_run(decision, batch.as_of):
                        duration = self.durations.get(decision.job_id, self.config.default_duration_ms)
                        tasks = {t.task_index: Task(t.node) for t in decision.tasks}
                        self.runs[decision.job_id] = Run(offset, decision.job_id, duration, tasks)
                case TaskPreempted():
                    self.end_run(decision.job_id, f"preempted by {decision.by_job_id}")
                case JobRejected():
                    self.durations.pop(decision.job_id, None)
                case _:
                    pass

    def will_run(self, placed: JobPlaced, as_of: int) -> bool:
        """Whether the scheduler keeps this placement: on nodes of ours, not undone by a
        cancellation or a node removal it folds after the placement (inputs before ``as_of`` read)."""
        if self.cancelled_at.get(placed.job_id, -1) >= as_of:
            return False
        return all(t.node in self.nodes and self.removed_at.get(t.node, -1) < as_of for t in placed.tasks)

    def end_run(self, job_id: str, why: str) -> None:
        """Forget the job's live run and its observations' keys (a new run has new keys): what the
        agent holds stays as large as what runs on its nodes."""
        run = self.runs.pop(job_id, None)
        if run is None:
            return
        log.info("run of %s ended: %s", job_id, why)
        self.emitted -= {self.key(run, i, kind) for i in run.tasks for kind in KINDS}
        if why == "ended":  # it never runs again
            self.durations.pop(job_id, None)
            self.cancelled_at.pop(job_id, None)

    # --- 2. and 3. observations ---------------------------------------------------------

    def heartbeats(self, now_ms: int) -> list[Message]:
        """Every node's heartbeat, when the period has passed since the last ones."""
        if now_ms - self.beat_at < self.config.heartbeat_ms:
            return []
        self.beat_at = now_ms
        c = self.config
        return [self.message(NodeHeartbeat(cell=c.cell, node=name, cpu_milli=c.cpu_milli, mem_mib=c.mem_mib,
                                           gpu_count=c.gpus, gpu_model=c.gpu_model if c.gpus else ""))
                for name in sorted(self.nodes)]

    def observe(self, now_ms: int) -> list[Message]:
        """Start what is placed and not started; end what has run its duration."""
        messages: list[Message] = []
        for job_id in sorted(self.runs):
            run = self.runs[job_id]
            for index in sorted(run.tasks):
                messages += self.advance(run, index, now_ms)
            if all(t.ended for t in run.tasks.values()):
                self.end_run(job_id, "ended")
        return messages

    def advance(self, run: Run, index: int, now_ms: int) -> list[Message]:
        task = run.tasks[index]
        if task.ended:
            return []
        if task.started_ms is None:
            task.started_ms = now_ms
            started = TaskStarted(job_id=run.job_id, task_index=index, node=task.node)
            return self.report(run, index, started, None)
        if now_ms - task.started_ms < run.duration_ms:
            return []
        task.ended = True
        if self.fails(run, index):
            reason = f"the fake agent failed it (--fail-rate {self.config.fail_rate:g})"
            return self.report(run, index, TaskFailed(job_id=run.job_id, task_index=index, reason=reason,
                                                      exit_code=1), 1)
        return self.report(run, index, TaskFinished(job_id=run.job_id, task_index=index, exit_code=0), 0)

    def fails(self, run: Run, index: int) -> bool:
        """Whether this task is one of the ``fail_rate`` share (the same after a restart)."""
        if self.config.fail_rate <= 0:
            return False
        digest = hashlib.sha256(f"{run.incarnation}/{index}/{run.job_id}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64 < self.config.fail_rate

    def report(self, run: Run, index: int, event: TaskEvent, exit_code: int | None) -> list[Message]:
        """The keyed message of one observation, unless a run before a restart sent it already."""
        kind = kind_of(event)
        key = self.key(run, index, kind)
        if key in self.emitted:
            return []
        self.emitted.add(key)
        self.reported[kind] = self.reported.get(kind, 0) + 1
        self.say(kind, run.job_id, index, run.tasks[index].node, exit_code)
        return [self.message(event, key)]

    def key(self, run: Run, index: int, kind: str) -> str:
        """The idempotency key of an observation of one task of one placement (hashed if long)."""
        key = f"{self.config.cell}/{run.incarnation}/{index}/{kind}/{run.job_id}"
        return key if len(key) <= MAX_KEY else f"{key[:180]}#{hashlib.sha256(key.encode()).hexdigest()}"

    def message(self, event: InputEvent, key: str | None = None) -> Message:
        return Message(encode(envelope(event, self.config.producer_id, key=key)))


def kind_of(event: TaskEvent) -> str:
    return "started" if isinstance(event, TaskStarted) else "finished" if isinstance(event, TaskFinished) \
        else "failed"
