"""The Slurm backend: fleetlog decides placement, Slurm runs the work.  It acts only through the logs.

Each :meth:`SlurmBackend.step`:

1. catches up with the logs in the order the scheduler folds them (the inputs before a decision
   batch's ``as_of``, then the batch): ``JobSubmitted`` gives the job's shape, ``JobPlaced`` makes a
   *run* (one placement of a job; its incarnation is the offset of the batch that placed it),
   ``TaskPreempted``, ``JobCancelled``, a re-placement, a failed task and an unhealthy heartbeat of
   one of its nodes end a run — exactly when the scheduler's own state would;
2. observes Slurm (``sinfo --json``, ``squeue --json``) and appends ``NodeHeartbeat``,
   ``TaskStarted``, ``TaskFinished`` and ``TaskFailed`` to the inputs log for the runs that are live;
3. withdraws the placement of a task whose Slurm job stayed PENDING past ``pending_bound_s`` (Slurm
   gave its node to other work): ``TaskFailed`` with ``requeue`` and the reason;
4. reconciles: every live run's task that Slurm does not know by name is submitted with ``sbatch``
   pinned to its node; every active Slurm job of ours that belongs to no live run is cancelled.

Because the runs are rebuilt from the logs and Slurm is looked up by job name before anything is
submitted, a backend restarted after a crash submits nothing twice and reports nothing twice
(its observations carry idempotency keys, read back from the inputs log).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Final

import msgspec
from tenacity import RetryCallState

from fleetlog import retry
from fleetlog.backends.follow import DecisionFollower
from fleetlog.backends.slurm.client import (
    SlurmClient,
    SlurmError,
    SlurmJob,
    SlurmNode,
    SlurmRejectedError,
)
from fleetlog.backends.slurm.mapping import (
    ACTIVE_STATES,
    RUNNING_STATES,
    Held,
    Kind,
    PayloadError,
    SubmitSettings,
    Workload,
    event_key,
    heartbeat,
    held_by,
    job_name,
    outcome,
    parse_name,
    sleep_for_expected_duration,
    submission,
)
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
    TaskPlacement,
    TaskPreempted,
    TaskStarted,
    encode,
    envelope,
)
from fleetlog.events.model import INPUT_TYPES
from fleetlog.log import errorpolicy
from fleetlog.log.base import INPUTS, LogStore, Message
from fleetlog.log.consumer import CorruptDecisionsError, Delivered, EventConsumer
from fleetlog.waiting import event_or_timeout

log = logging.getLogger("fleetlog.backends.slurm")
TaskEvent = TaskStarted | TaskFinished | TaskFailed
MAX_ENDED: Final = 10_000  # why runs ended, kept for the scancel log lines


class SlurmConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    cell: str = "slurm"
    """The fleetlog cell this Slurm cluster is: heartbeats name it, placements in it are ours."""
    prefix: str = "fleetlog"
    """Slurm job names start with ``<prefix>:``; unique per (logs, Slurm cluster) pair."""
    producer_id: str = "fleetlog-slurm"
    slurm_conf: str = ""
    """``SLURM_CONF`` for the client commands ("" = the environment's)."""
    gpu_model: str = "gpu"
    """The GPU model reported for GRES without a type (``gpu:4``)."""
    submit: SubmitSettings = SubmitSettings()
    heartbeat_ms: int = 5_000
    """Every node's heartbeat is resent at least this often (and at once when it changes)."""
    poll_ms: int = 500
    command_timeout_s: float = 30.0
    backoff_initial_ms: int = 250
    backoff_max_ms: int = 30_000
    submit_concurrency: int = 4
    pending_bound_s: float = 30.0
    """A task's Slurm job left PENDING this long is cancelled and its placement withdrawn
    (``TaskFailed`` with ``requeue``: the scheduler requeues the job and decides again), so a node
    Slurm gave to its own work is not booked twice.  0: never."""


@dataclass
class Run:
    """One placement of a job in this cell: which task went where, what Slurm did with it."""

    incarnation: int
    placement: JobPlaced
    started: set[int] = field(default_factory=set)
    done: set[int] = field(default_factory=set)

    def nodes(self) -> set[str]:
        return {t.node for t in self.placement.tasks}


@dataclass
class Stats:
    steps: int = 0
    submitted: int = 0
    cancelled: int = 0
    events: int = 0
    reported: dict[str, int] = field(default_factory=dict)
    """Task observations appended, by kind (started, finished, failed)."""
    failures: int = 0
    last_error: str = ""
    delays_s: list[float] = field(default_factory=list)
    """The backoff delays slept after failed steps (the last 100)."""
    stalled: str = ""
    """Why the backend stands by (a record it cannot read ...), until a step succeeds again."""


class Backoff:
    """Capped exponential backoff: initial, doubled after each failure up to the cap; reset on
    success (the delays of :class:`fleetlog.retry.Backoff`, from the start again on reset)."""

    def __init__(self, initial_s: float, max_s: float) -> None:
        self.schedule = retry.Backoff(initial_s, max_s=max_s)
        self.reset()

    def next(self) -> float:
        self.current_s = next(self._delays)
        return self.current_s

    def reset(self) -> None:
        self._delays, self.current_s = self.schedule.delays(), 0.0


class SlurmBackend(DecisionFollower):
    """Decisions in (from the decisions log), Slurm effects out, observations back (to the inputs log)."""

    def __init__(
        self,
        store: LogStore,
        config: SlurmConfig | None = None,
        workload: Workload = sleep_for_expected_duration,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store, self.config, self.workload, self.clock = store, config or SlurmConfig(), workload, clock
        self.client = SlurmClient(self.config.slurm_conf or None, self.config.command_timeout_s)
        self.consumer = EventConsumer(store, accepts=(*INPUT_TYPES, JobDispatched))
        """With a ``[cells]`` map the cell's partition holds the dispatched jobs, not their submissions."""
        self.specs: dict[str, JobSubmitted] = {}
        self.runs: dict[str, Run] = {}
        self.emitted: set[str] = set()
        self.health: dict[str, bool] = {}  # node -> health last reported in the inputs log
        self.unhealthy_at: dict[str, int] = {}  # node -> inputs offset of its last healthy->unhealthy report
        self.cancelled_at: dict[str, int] = {}  # job -> inputs offset of its JobCancelled
        self.inputs_offset = self.decisions_offset = 0
        self.submitted: dict[str, int] = {}  # name -> Slurm id, until squeue lists it
        self.cancelling: set[int] = set()
        self.beats: dict[str, NodeHeartbeat] = {}
        self.ended: dict[str, str] = {}  # job id -> why its last run ended (the newest MAX_ENDED)
        self.ours_held: dict[str, Held] = {}  # (CPUs, MiB, GPUs) our live jobs hold per node
        self.beat_at = -float("inf")
        self.pending_since: dict[str, float] = {}  # name -> when a live task's job was first seen PENDING
        self.backoff = Backoff(self.config.backoff_initial_ms / 1000, self.config.backoff_max_ms / 1000)
        self.stats = Stats()

    # --- the loop ----------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Step every ``poll_ms`` until ``stop`` is set, never raising: Slurm or log trouble is
        retried with capped exponential backoff; a decision record it cannot read (or any other
        error an operator must look at) keeps the backend at that record, said once, re-checked
        every few seconds (the policy every log reader shares: :mod:`fleetlog.log.errorpolicy`)."""

        async def sleep(seconds: float) -> None:
            await event_or_timeout(stop, seconds)

        while not stop.is_set():
            stepped = await errorpolicy.persist(
                self.step, self.failed, stopped=stop.is_set, sleep=sleep, retryable=(SlurmError,),
                retry_wait=lambda _: self.backoff.next(),
            )
            if not stepped:
                break
            self.resumed()
            await sleep(self.config.poll_ms / 1000)

    def failed(self, state: RetryCallState, status: str, action: str) -> None:
        """Count and say why a step failed: every retry as a warning; a stall once, as an error
        naming the log, the offset and the error (re-checks repeat it only in the debug log)."""
        error = state.outcome.exception() if state.outcome is not None else None
        delay = state.upcoming_sleep
        self.stats.failures += 1
        self.stats.last_error = str(error)
        self.stats.delays_s = [*self.stats.delays_s[-99:], delay]
        if status == "retrying":
            log.warning("slurm backend step failed (retry in %.2fs): %s", delay, error)
            return
        repeat = self.stats.stalled == str(error)
        self.stats.stalled = str(error)
        name, offset = errorpolicy.where(error) if error is not None else ("", None)
        (log.debug if repeat else log.error)(
            "slurm_backend_stalled log=%s offset=%s error_type=%s error=%r action=%r recheck_s=%.2f",
            name or "-", "-" if offset is None else offset, type(error).__name__, str(error)[:2000],
            action, delay,
        )

    def resumed(self) -> None:
        self.backoff.reset()
        if self.stats.stalled:
            log.info("slurm_backend_resumed decisions_offset=%d", self.decisions_offset)
            self.stats.stalled = ""

    async def step(self) -> None:
        """Catch up with the logs, observe Slurm, report, then submit and cancel what differs.

        Stalled at a decision record it cannot read, it still reports its nodes' heartbeats (at
        each re-check): they do not depend on decisions, and without them the scheduler would
        take every node down after its node timeout and requeue what runs there."""
        try:
            await self.catch_up()
        except CorruptDecisionsError:
            await self.append(self.observe_nodes(await self.client.nodes()))
            raise
        nodes, jobs = await asyncio.gather(self.client.nodes(), self.client.jobs())
        ours = self.our_jobs(jobs)
        # (a job of ours from a run that ended is still Slurm's until cancelled: foreign meanwhile)
        self.ours_held = held_by(j for name, j in ours.items() if self.is_live(name))
        events = self.observe_nodes(nodes)
        events += self.observe_jobs(ours)
        events += self.withdraw_stuck(ours, jobs)
        await self.append(events)
        await self.append(await self.reconcile(ours))
        self.stats.steps += 1

    # --- 1. the logs, in the scheduler's fold order -------------------------------------

    # (catch_up and read_inputs: fleetlog.backends.follow.DecisionFollower)

    def apply_input(self, d: Delivered) -> None:
        event = d.envelope.event
        match event:
            case JobSubmitted():  # the first: the fold ignores a resend, whatever its payload
                self.specs.setdefault(event.job_id, event)
            case JobDispatched(job=job):  # a cell partition's: the whole submission, as dispatched
                self.specs[job.job_id] = job
            case JobCancelled():
                self.cancelled_at[event.job_id] = d.offset
                self.specs.pop(event.job_id, None)
                self.end_run(event.job_id, f"cancelled (JobCancelled at inputs@{d.offset})")
            case NodeHeartbeat() if event.cell == self.config.cell:
                self.apply_health(event.node, event.healthy, d.offset)
            case NodeRemoved() if event.cell == self.config.cell:
                self.apply_health(event.node, False, d.offset)
            case TaskStarted() | TaskFinished() | TaskFailed():
                if d.envelope.producer_id == self.config.producer_id and d.envelope.key:
                    self.read_back(event, d.envelope.key)
            case _:
                pass

    def apply_health(self, node: str, healthy: bool, offset: int) -> None:
        """A healthy -> unhealthy (or removed) report makes the scheduler requeue every run on the
        node: so do we."""
        if not healthy and self.health.get(node, True):
            self.unhealthy_at[node] = offset
            for job_id in sorted(j for j, r in self.runs.items() if node in r.nodes()):
                self.end_run(job_id, f"node {node} reported unhealthy or removed")
        self.health[node] = healthy

    def read_back(self, event: TaskEvent, key: str) -> None:
        """Our own observation, read back from the log (after a restart): remember and apply it once."""
        if key in self.emitted:
            return
        self.emitted.add(key)
        run = self.runs.get(event.job_id)
        if run is None:
            return
        kind = task_kind(event)
        if isinstance(event, TaskFailed) and event.requeue:  # a withdrawal: requeued, not failed
            if key == event_key(self.name(run, event.task_index), kind):
                self.end_run(event.job_id, f"withdrawn: {event.reason}")
            return
        if key == event_key(self.name(run, event.task_index), kind):
            self.apply_task(event.job_id, run, event.task_index, kind, task_exit(event))

    def apply_batch(self, offset: int, batch: DecisionBatch) -> None:
        for decision in batch.decisions:
            match decision:
                case JobPlaced():
                    self.end_run(decision.job_id, f"placed again (JobPlaced at decisions@{offset})")
                    if decision.cell == self.config.cell and self.will_run(decision, batch.as_of):
                        self.runs[decision.job_id] = Run(offset, decision)
                case TaskPreempted():
                    by, cause = decision.by_job_id, decision.cause
                    why = f"preempted by {by} ({cause}; TaskPreempted at decisions@{offset})"
                    self.end_run(decision.job_id, why)
                case JobRejected():  # it will never run: a later submission of its id is a new job
                    self.specs.pop(decision.job_id, None)
                case _:
                    pass

    def will_run(self, placed: JobPlaced, as_of: int) -> bool:
        """Whether the scheduler keeps this placement: not undone by a cancellation or an unhealthy
        node it folds after the placement (inputs at or after ``as_of`` already read)."""
        if self.cancelled_at.get(placed.job_id, -1) >= as_of:
            return False
        return all(self.unhealthy_at.get(t.node, -1) < as_of for t in placed.tasks)

    def end_run(self, job_id: str, why: str) -> None:
        """Forget the job's live run; reconcile cancels whatever of it Slurm still runs."""
        if self.runs.pop(job_id, None) is not None:
            log.info("run of %s ended: %s", job_id, why)
            if len(self.ended) >= MAX_ENDED:
                del self.ended[next(iter(self.ended))]
            self.ended[job_id] = why

    # --- 2. observations ---------------------------------------------------------------

    def observe_nodes(self, nodes: list[SlurmNode]) -> list[Message]:
        """Every node's heartbeat when one changed or the heartbeat period passed, else nothing;
        ``NodeRemoved`` for a node Slurm no longer lists."""
        held = self.ours_held
        beats = {n.name: heartbeat(self.config.cell, n, self.config.gpu_model, held.get(n.name, (0, 0, 0)))
                 for n in nodes}
        now = self.clock()
        if beats == self.beats and now - self.beat_at < self.config.heartbeat_ms / 1000:
            return []
        gone = sorted(set(self.beats) - set(beats))
        self.beats, self.beat_at = beats, now
        removed = [self.message(NodeRemoved(cell=self.config.cell, node=name)) for name in gone]
        return removed + [self.message(beats[name]) for name in sorted(beats)]

    def our_jobs(self, jobs: list[SlurmJob]) -> dict[str, SlurmJob]:
        """Slurm's jobs that carry our prefix, by name (the newest when a name repeats)."""
        ours = {
            j.name: j for j in sorted(jobs, key=lambda j: j.job_id) if parse_name(self.config.prefix, j.name)
        }
        for name in [n for n in self.submitted if n in ours]:
            del self.submitted[name]
        return ours

    def observe_jobs(self, ours: dict[str, SlurmJob]) -> list[Message]:
        events: list[Message] = []
        for name, job in ours.items():
            task = parse_name(self.config.prefix, name)
            run = self.runs.get(task.job_id) if task else None
            if task is None or run is None or run.incarnation != task.incarnation:
                continue
            events += self.observe_task(task.job_id, run, task.task_index, job)
        return events

    def observe_task(self, job_id: str, run: Run, index: int, job: SlurmJob) -> list[Message]:
        seen = outcome(job)
        name = self.name(run, index)
        events: list[Message] = []
        if seen.started and index not in run.started:
            node = job.nodes or placed_node(run, index)
            started = TaskStarted(job_id=job_id, task_index=index, node=node)
            events.append(self.report(run, name, "started", started))
        if index in run.done:
            return events  # reported when it ended; squeue keeps listing it until MinJobAge
        if seen.ended == "finished":
            finished = TaskFinished(job_id=job_id, task_index=index, exit_code=seen.exit_code or 0)
            events.append(self.report(run, name, "finished", finished))
        elif seen.ended == "failed":
            failed = TaskFailed(job_id=job_id, task_index=index, reason=seen.reason, exit_code=seen.exit_code)
            events.append(self.report(run, name, "failed", failed))
        return events

    def report(self, run: Run, name: str, kind: Kind, event: TaskEvent) -> Message:
        """The message for an observation of ``run``'s task, keyed for idempotency; applied at once."""
        key = event_key(name, kind)
        self.emitted.add(key)
        self.stats.reported[kind] = self.stats.reported.get(kind, 0) + 1
        self.apply_task(event.job_id, run, event.task_index, kind, task_exit(event))
        return self.message(event, key)

    def apply_task(self, job_id: str, run: Run, index: int, kind: Kind, exit_code: int) -> None:
        """What the scheduler does with the observation: a failure ends the gang, the last finish the run."""
        if kind == "started":
            run.started.add(index)
            return
        run.started.add(index)
        if kind == "failed" or exit_code != 0:  # the scheduler fails the job: it never runs again
            self.end_run(job_id, f"task {index} {kind} (exit code {exit_code})")
            self.specs.pop(job_id, None)
            return
        run.done.add(index)
        if len(run.done) == len(run.placement.tasks):
            self.end_run(job_id, "finished")
            self.specs.pop(job_id, None)

    def withdraw_stuck(self, ours: dict[str, SlurmJob], jobs: list[SlurmJob]) -> list[Message]:
        """Withdraw every live task whose Slurm job has been PENDING for ``pending_bound_s``: Slurm
        gave its pinned node to other work (a user's ``sbatch`` that started after our last
        heartbeat), and the scheduler's books would hold the node twice until Slurm ran ours."""
        now, bound = self.clock(), self.config.pending_bound_s
        stuck = {n: j for n, j in ours.items() if j.job_state == "PENDING" and self.is_live(n)}
        self.pending_since = {n: self.pending_since.get(n, now) for n in stuck}
        if bound <= 0:
            return []
        late = [n for n in stuck if now - self.pending_since[n] >= bound]
        # (one withdrawal per gang: the first ends the run, its other tasks are no longer live)
        return [self.withdraw(n, stuck[n], jobs) for n in late if self.is_live(n)]

    def withdraw(self, name: str, job: SlurmJob, jobs: list[SlurmJob]) -> Message:
        """``TaskFailed`` with ``requeue`` for one stuck task, saying what Slurm runs on its node;
        the run ends here (reconcile cancels its Slurm jobs), the job's spec is kept for the next."""
        task = parse_name(self.config.prefix, name)
        assert task is not None  # (a live name)
        run = self.runs[task.job_id]
        node = placed_node(run, task.task_index)
        reason = stuck_reason(self.config.pending_bound_s, job, node, jobs, self.is_live)
        del self.pending_since[name]
        key = event_key(name, "failed")
        self.emitted.add(key)
        self.stats.reported["withdrawn"] = self.stats.reported.get("withdrawn", 0) + 1
        self.end_run(task.job_id, f"withdrawn: {reason}")
        failed = TaskFailed(job_id=task.job_id, task_index=task.task_index, reason=reason, requeue=True)
        return self.message(failed, key)

    # --- 3. reconcile ------------------------------------------------------------------

    async def reconcile(self, ours: dict[str, SlurmJob]) -> list[Message]:
        await self.cancel_stale(ours)
        todo = [(job_id, run, t) for job_id, run in self.runs.items() for t in run.placement.tasks]
        todo = [(j, r, t) for j, r, t in todo if self.needs_submit(r, t.task_index, ours)]
        events = [self.vanished(j, r, t.task_index) for j, r, t in todo if t.task_index in r.started]
        todo = [(j, r, t) for j, r, t in todo if t.task_index not in r.started]
        events += await self.submit_all(todo)
        return events

    def needs_submit(self, run: Run, index: int, ours: dict[str, SlurmJob]) -> bool:
        name = self.name(run, index)
        return index not in run.done and name not in ours and name not in self.submitted

    async def cancel_stale(self, ours: dict[str, SlurmJob]) -> None:
        """Cancel every active job of ours that belongs to no live run (once per Slurm job id)."""
        stale = [j.job_id for n, j in ours.items() if j.job_state in ACTIVE_STATES and not self.is_live(n)]
        stale += [i for n, i in self.submitted.items() if not self.is_live(n)]
        self.cancelling &= {j.job_id for j in ours.values() if j.job_state in ACTIVE_STATES}
        stale = sorted(set(stale) - self.cancelling)
        if stale:
            names = {j.job_id: n for n, j in ours.items()} | {i: n for n, i in self.submitted.items()}
            for slurm_id in stale:
                task = parse_name(self.config.prefix, names.get(slurm_id, ""))
                why = self.ended.get(task.job_id, "its run ended") if task else "its run ended"
                log.info("scancel %d: %s task %s, placed at decisions@%s: %s", slurm_id,
                         task.job_id if task else "?", task.task_index if task else "?",
                         task.incarnation if task else "?", why)  # fmt: skip
            await self.client.cancel(stale)
            self.cancelling.update(stale)
            self.stats.cancelled += len(stale)

    def is_live(self, name: str) -> bool:
        task = parse_name(self.config.prefix, name)
        run = self.runs.get(task.job_id) if task else None
        return task is not None and run is not None and run.incarnation == task.incarnation

    def vanished(self, job_id: str, run: Run, index: int) -> Message:
        """A task we saw start that Slurm no longer knows (it forgot the job while we were down)."""
        reason = "the Slurm job vanished (ended while the backend was down, forgotten after MinJobAge)"
        failed = TaskFailed(job_id=job_id, task_index=index, reason=reason)
        return self.report(run, self.name(run, index), "failed", failed)

    async def submit_all(self, todo: Iterable[tuple[str, Run, TaskPlacement]]) -> list[Message]:
        gate = asyncio.Semaphore(self.config.submit_concurrency)
        results = await asyncio.gather(
            *(self.submit_one(gate, j, r, t) for j, r, t in todo), return_exceptions=True
        )
        unavailable = [r for r in results if isinstance(r, BaseException)]
        events = [r for r in results if r is not None and not isinstance(r, BaseException)]
        if unavailable:
            await self.append(events)
            raise unavailable[0]
        return events

    async def submit_one(
        self, gate: asyncio.Semaphore, job_id: str, run: Run, task: TaskPlacement
    ) -> Message | None:
        spec, name = self.specs.get(job_id), self.name(run, task.task_index)
        if spec is None:
            reason = "the Slurm backend never read this job's JobSubmitted"
            failed = TaskFailed(job_id=job_id, task_index=task.task_index, reason=reason)
            return self.report(run, name, "failed", failed)
        try:
            sbatch = submission(name, spec, task, self.workload, self.config.submit)
        except PayloadError as e:
            failed = TaskFailed(job_id=job_id, task_index=task.task_index, reason=str(e)[:4000])
            return self.report(run, name, "failed", failed)
        async with gate:
            try:
                slurm_id = await self.client.submit(sbatch)
            except SlurmRejectedError as e:
                failed = TaskFailed(job_id=job_id, task_index=task.task_index, reason=str(e)[:4000])
                return self.report(run, name, "failed", failed)
        self.submitted[name] = slurm_id
        self.stats.submitted += 1
        log.info("sbatch: slurm job %d runs %s task %d on %s (JobPlaced at decisions@%d)", slurm_id, job_id,
                 task.task_index, task.node, run.incarnation)  # fmt: skip
        return None

    # --- helpers -----------------------------------------------------------------------

    def name(self, run: Run, index: int) -> str:
        return job_name(self.config.prefix, run.incarnation, index, run.placement.job_id)

    async def append(self, messages: list[Message]) -> None:
        if messages:
            await self.store.log(INPUTS).append(messages)
            self.stats.events += len(messages)

    def message(self, event: InputEvent, key: str | None = None) -> Message:
        return Message(encode(envelope(event, self.config.producer_id, key=key)))


def task_kind(event: TaskEvent) -> Kind:
    return (
        "started"
        if isinstance(event, TaskStarted)
        else "finished"
        if isinstance(event, TaskFinished)
        else "failed"
    )


def task_exit(event: TaskEvent) -> int:
    return 0 if isinstance(event, TaskStarted) else (event.exit_code or 0)


def stuck_reason(
    bound_s: float, job: SlurmJob, node: str, jobs: list[SlurmJob], ours: Callable[[str], bool]
) -> str:
    """Why a task was withdrawn: how long Slurm kept it pending, Slurm's reason, and the other
    Slurm jobs that run on its node (``Slurm left it PENDING for 30 s: Resources (node n1 holds
    Slurm job 123)``)."""
    holders = sorted(
        j.job_id for j in jobs
        if j.job_state in RUNNING_STATES and node in j.nodes.split(",") and not ours(j.name)
    )  # fmt: skip
    held = f"holds Slurm job{'s' if len(holders) > 1 else ''} {', '.join(map(str, holders))}"
    where = f"node {node} {held}" if holders else f"node {node}"
    return f"Slurm left it PENDING for {bound_s:g} s: {job.state_reason or 'no reason given'} ({where})"


def placed_node(run: Run, index: int) -> str:
    return next(t.node for t in run.placement.tasks if t.task_index == index)
