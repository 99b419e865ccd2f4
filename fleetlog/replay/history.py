"""``fleetlog history``: one accounting record per finished job, from the logs (Slurm's ``sacct``).

The logs are replayed once from the start of the retained history (the fold, as every replay
command runs it) and an observer follows each job through its own events, by the rules
:mod:`fleetlog.replay.jobend` walks them for ``fleetlog status`` (placed -> running; preempted
-> pending; a task that fails or exits non-zero fails the gang; the last task to exit 0
completes it; a cancel ends any unfinished job; a rejection ends a pending one).  The fold is
the truth where events alone cannot tell: a job requeued because its node was lost, turned
unhealthy, reshaped, removed or tainted has no event of its own, and the fold's requeue note
says when; a submission is a new job only if the fold made it one (a resend is a duplicate).
Only the jobs still pending or running are held in memory: a record is handed on (``emit``) at
the job's end, in the order the jobs ended.  (One thing the fold's state cannot tell afterwards:
a running job requeued by its node and cancelled at the same log time, with no other input of
it in between, ends cancelled as it should, but that requeue is not counted.)

Definitions (log times, in the fold's clock: an input's append time; a decision takes the time
of the last input folded before it, as ``placed_at_ms`` in ``fleetlog status``):

- ``submitted_at_ms``: the submission that created the job;
- ``placed_at_ms``: its first placement; ``started_at_ms``: the first ``TaskStarted`` of any of
  its tasks (the backend reporting it running), ``None`` if no task ever reported so;
- ``wait_ms`` = first placement - submission (the queue wait ``simulate`` and ``replay report``
  measure); ``elapsed_ms`` = end - first placement (so wait + elapsed = end - submission); both
  ``None`` for a job never placed;
- ``exit_code``: that of the event that ended the job, as ``fleetlog status`` gives it: 0 for a
  success, the exit code of the first task whose failure failed the gang (``None`` when it
  failed without one), ``None`` for a cancel or a rejection;
- ``preemptions``: the times the scheduler preempted it (one per decision batch, however many
  of its tasks); ``requeues``: every return to pending, preemptions included (the rest: its
  node was lost, unhealthy, reshaped, removed or tainted);
- ``gpu_hours`` (``cpu_hours``): the sum over its tasks and over every run, preempted or
  requeued ones included, of the task's GPUs (``gpu_count`` x ``gpu_milli`` / 1000; cores) x
  the time from its ``TaskStarted`` to its end — its own finish, or the end of its run (the gang
  failed, was cancelled, preempted or requeued). A task that never reported started counts 0.
- ``partial``: the job began before the retained history (its submission was pruned; replay
  starts from a snapshot): tenant, queue and submission come from the snapshot, ``placed_at_ms``
  is that of the run in progress at the cut (if one was), ``started_at_ms`` is ``None`` if a
  task had started before the cut, and counts and hours cover only the retained history.  A job
  that ended before the cut is not listed: its end is not in the retained logs.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final

import numpy as np

from fleetlog.api.history import ENDED, Finished
from fleetlog.core.state import JobState, State, TaskState
from fleetlog.events.model import (
    DecisionBatch,
    JobCancelled,
    JobPlaced,
    JobRejected,
    JobSubmitted,
    TaskFailed,
    TaskFinished,
    TaskPreempted,
    TaskStarted,
)
from fleetlog.log.base import INPUTS
from fleetlog.replay.engine import replay
from fleetlog.replay.jobend import _Walk as Walk
from fleetlog.replay.source import Chunk, Input, Progress, ReplayError, Source, end_offset
from fleetlog.replay.state_at import first_start
from fleetlog.replay.terminal import parse_point, progress_bar

__all__ = ["ENDED", "Finished"]  # (from fleetlog.api.history: the API describes the record, this folds it)

STATE_NAMES: Final = {JobState.SUCCEEDED: "succeeded", JobState.FAILED: "failed",
                      JobState.CANCELLED: "cancelled", JobState.REJECTED: "rejected"}
MILLI_MS_PER_HOUR: Final = 1000 * 3_600_000
"""GPU milli (CPU milli) x milliseconds in one GPU-hour (core-hour)."""
HOURS_DIGITS: Final = 6
"""``gpu_hours`` and ``cpu_hours`` are rounded to this many decimals (3.6 ms of one GPU)."""
_JOB_INPUTS: Final = frozenset({JobSubmitted, JobCancelled, TaskStarted, TaskFinished, TaskFailed})


def log_time_ms(text: str) -> int:
    """A log time (``--since``, ``--until``; ``since``, ``until`` of ``GET /v1/history``): ISO 8601
    (no zone: UTC) or epoch milliseconds with ``ms``; not an offset (a :class:`ReplayError`)."""
    point = parse_point(text)
    if point.time_ms is None:
        raise ReplayError(f"{text!r} is an offset; history takes a log time: epoch "
                          "milliseconds (1700000000000ms) or ISO 8601 (2026-11-30T01:00:00Z)")
    return point.time_ms


@dataclass(frozen=True)
class Filters:
    """Which records to keep: any of ``tenants`` (empty: all), of ``queues``, of ``states``, and
    ended in ``[since_ms, until_ms)`` of log time (``None``: unbounded)."""

    tenants: frozenset[str] = frozenset()
    queues: frozenset[str] = frozenset()
    states: frozenset[str] = frozenset()
    since_ms: int | None = None
    until_ms: int | None = None

    def keep(self, f: Finished) -> bool:
        return (
            (not self.tenants or f.tenant in self.tenants)
            and (not self.queues or f.queue in self.queues)
            and (not self.states or f.state in self.states)
            and (self.since_ms is None or f.ended_at_ms >= self.since_ms)
            and (self.until_ms is None or f.ended_at_ms < self.until_ms)
        )


@dataclass(eq=False)
class _Job:
    """A job still pending or running, as far as its events have gone."""

    job_id: str
    tenant: str
    queue: str
    priority: int
    submitted_at: int
    gpu: tuple[int, ...]
    """GPU milli of each task (by task index)."""
    cpu: tuple[int, ...]
    walk: Walk
    partial: bool = False
    placed_at: int | None = None
    started_at: int | None = None
    start_unknown: bool = False
    """A task had started before the retained history: the first start is not known."""
    cell: str | None = None
    starts: dict[int, int] = field(default_factory=dict)
    """Task index -> log time of its ``TaskStarted``, for the tasks running now."""
    gpu_ms: int = 0
    cpu_ms: int = 0
    preemptions: int = 0
    requeues: int = 0

    def close(self, task: int, now: int) -> None:
        """The task's time running, from its start to ``now``, into the totals."""
        began = self.starts.pop(task, None)
        if began is not None:
            self.gpu_ms += self.gpu[task] * (now - began)
            self.cpu_ms += self.cpu[task] * (now - began)

    def stop(self, now: int) -> None:
        """The run ends: every task still running stops at ``now``."""
        for task in sorted(self.starts):
            self.close(task, now)

    def record(self, ended: tuple[str, int | None, str], now: int) -> Finished:
        placed = self.placed_at
        return Finished(
            self.job_id, ended[0], self.tenant, self.queue, self.priority, len(self.gpu), self.cell,
            self.submitted_at, placed, self.started_at, now,
            None if placed is None else placed - self.submitted_at, None if placed is None else now - placed,
            ended[1], ended[2], self.preemptions, self.requeues,
            round(self.gpu_ms / MILLI_MS_PER_HOUR, HOURS_DIGITS),
            round(self.cpu_ms / MILLI_MS_PER_HOUR, HOURS_DIGITS), self.partial,
        )


def _submitted(e: JobSubmitted, now: int) -> _Job:
    gpu: list[int] = []
    cpu: list[int] = []
    for g in e.task_groups:  # (task indices run group by group, as the fold numbers them)
        gpu += [g.gpu_count * g.gpu_milli] * g.count
        cpu += [g.cpu_milli] * g.count
    return _Job(e.job_id, e.tenant, e.queue, e.priority, now, tuple(gpu), tuple(cpu), Walk(len(gpu)))


class Enough(Exception):
    """Raised by :class:`Accounting` to stop the replay: nothing later can be listed."""


class Accounting:
    """The replay observer that keeps the jobs in progress and hands on each finished one.

    ``check``: after every part of the inputs and every decision batch, compare the jobs it
    holds pending and running with the fold's (a full scan: for tests)."""

    per_instant: ClassVar[bool] = True
    """Inputs come one log time at a time: every event of a job in one part has its time."""

    def __init__(self, emit: Callable[[Finished], None], filters: Filters | None = None,
                 limit: int | None = None, check: bool = False) -> None:
        self.emit, self.filters, self.limit, self.check = emit, filters or Filters(), limit, check
        self.jobs: dict[str, _Job] = {}
        self.pending = 0
        """How many of ``jobs`` are pending (the fold's ``pending_count`` when in step)."""
        self.listed = 0
        self.ended = 0

    # --- the replay's calls --------------------------------------------------------------

    def inputs(self, state: State, events: Sequence[Input]) -> None:
        found = events.events if isinstance(events, Chunk) else [e for _, e, _ in events]
        base = state.offset - len(found)  # (the fold index of the part's first input)
        touched: dict[str, list[Any]] = {}
        for k, e in enumerate(found):
            if type(e) in _JOB_INPUTS:
                self._job_input(state, touched, e, base + k)
        for job_id, (_, _, requeue_at) in touched.items():
            job = self.jobs.get(job_id)
            if job is not None and requeue_at is not None:  # (no input of it after the requeue)
                self._requeue(job, state.now_ms)
        if state.pending_count > self.pending:
            self._requeued_quietly(state, touched)
        self._checked(state)
        until = self.filters.until_ms
        if until is not None and state.now_ms >= until:
            raise Enough  # (every later end is at or after ``until``)

    def decided(self, state: State, batch: DecisionBatch) -> None:
        now = state.now_ms
        for d in batch.decisions:
            kind = type(d)
            if kind is JobPlaced or kind is TaskPreempted or kind is JobRejected:
                job = self.jobs.get(d.job_id)
                if job is not None:
                    self._decision(job, d, now)
        self._checked(state)

    # --- one job ------------------------------------------------------------------------

    def _job_input(self, state: State, touched: dict[str, list[Any]], e: Any, index: int) -> None:
        """One input of a job (the ``index``-th the fold folded), with what the fold made of the
        job's inputs in this part: a requeue it did (its note's offset says before which input)
        and the state it left the job in."""
        seen = touched.get(e.job_id)
        if seen is None:
            seen = touched[e.job_id] = self._touch(state, e.job_id)
        row, final, requeue_at = seen
        job = self.jobs.get(e.job_id)
        if job is not None and requeue_at is not None and index >= requeue_at:
            self._requeue(job, state.now_ms)
            seen[2] = None
        if job is not None:
            self._input(job, e, state.now_ms, final)
        elif type(e) is JobSubmitted and row >= 0 and int(state.jobs.cols["seq"][row]) == index:
            self.jobs[e.job_id] = _submitted(e, state.now_ms)  # (else a duplicate: the fold made no job)
            self.pending += 1

    def _touch(self, state: State, job_id: str) -> list[Any]:
        """[row, state the fold left the job in, fold index of a requeue in this part or None]."""
        row = state.job_row(job_id)
        final = int(state.jobs.cols["state"][row]) if row >= 0 else None
        job = self.jobs.get(job_id)
        requeue_at = None
        if job is not None and job.walk.state == "running" and final == JobState.PENDING:
            note = state.requeues.get(row)
            requeue_at = -1 if note is None else note.inputs_offset
        return [row, final, requeue_at]

    def _input(self, job: _Job, e: Any, now: int, final: int | None) -> None:
        """Apply one input of ``job`` (``final``: the state the fold left it in)."""
        walk = job.walk
        if type(e) is TaskStarted:
            i = e.task_index
            if walk.state == "running" and i < walk.tasks and i not in walk.done and i not in job.starts:
                job.starts[i] = now
                if job.started_at is None and not job.start_unknown:
                    job.started_at = now
            return
        if type(e) is JobSubmitted:
            return  # (a resend of a job in progress: a duplicate)
        was = walk.state
        ended = walk.step(e)
        if ended is None:
            if type(e) is TaskFinished and e.task_index in walk.done:
                job.close(e.task_index, now)
        elif final in STATE_NAMES and STATE_NAMES[JobState(final)] != ended[0]:
            # the fold ended it otherwise: it was requeued (a note a cancel then removed) before
            # this input, which the fold ignored; the cancel that follows ends it
            walk.state = was
            self._requeue(job, now)
        else:
            self._end(job, ended, now, was)

    def _decision(self, job: _Job, d: Any, now: int) -> None:
        walk = job.walk
        if type(d) is JobPlaced:
            walk.step(d)
            self.pending -= 1
            job.cell = d.cell
            if job.placed_at is None:
                job.placed_at = now
        elif type(d) is TaskPreempted:
            if walk.state == "running":  # (else an earlier task of the batch requeued the gang)
                job.preemptions += 1
                self._requeue(job, now)
        else:
            ended = walk.step(d)
            if ended is not None:
                self._end(job, ended, now, "pending")

    def _requeue(self, job: _Job, now: int) -> None:
        job.stop(now)
        job.walk.state = "pending"
        job.requeues += 1
        self.pending += 1

    def _end(self, job: _Job, ended: tuple[str, int | None, str], now: int, was: str) -> None:
        job.stop(now)
        del self.jobs[job.job_id]
        self.pending -= was == "pending"
        self.ended += 1
        found = job.record(ended, now)
        if self.filters.keep(found):
            self.emit(found)
            self.listed += 1
            if self.limit is not None and self.listed >= self.limit:
                raise Enough

    def _requeued_quietly(self, state: State, touched: dict[str, Any]) -> None:
        """Running jobs with no input in this part that the fold requeued (their node went down):
        the fold holds more jobs pending than we do. Their requeue notes say when."""
        names = state.names["job"].names
        for row, note in list(state.requeues.items()):
            job = self.jobs.get(names[row])
            if job is not None and job.walk.state == "running" and job.job_id not in touched:
                self._requeue(job, note.requeued_at_ms)

    # --- a replay from a snapshot ---------------------------------------------------------

    def seed(self, state: State) -> None:
        """Hold the jobs a snapshot start has in progress (``partial``: their start was cut)."""
        codes = state.jobs.view("state")
        for row in np.flatnonzero((codes == JobState.PENDING) | (codes == JobState.RUNNING)).tolist():
            running = int(codes[row]) == JobState.RUNNING
            job = self._seeded(state, row, running)
            self.jobs[job.job_id] = job
            self.pending += not running

    def _seeded(self, state: State, row: int, running: bool) -> _Job:
        cols, tc, names = state.jobs.cols, state.tasks.cols, state.names
        tasks = state.job_tasks(row)
        gpu = tuple(int(tc["gpus"][t]) * int(tc["milli"][t]) for t in tasks)
        cpu = tuple(int(tc["cpu"][t]) for t in tasks)
        job = _Job(names["job"].names[row], names["tenant"].names[int(cols["tenant"][row])],
                   names["queue"].names[int(cols["queue"][row])], int(cols["priority"][row]),
                   int(cols["submitted_at"][row]), gpu, cpu, Walk(len(gpu)), partial=True)
        if running:
            job.walk.state = "running"
            job.placed_at = int(cols["placed_at_ms"][row])
            job.cell = names["cell"].names[int(cols["cell"][row])]
            for i, t in enumerate(tasks):
                task_state = int(tc["state"][t])
                if task_state == TaskState.FINISHED:
                    job.walk.done.add(i)
                elif task_state == TaskState.STARTED:
                    job.starts[i] = state.now_ms
                    job.start_unknown = True
        return job

    # --- the check tests switch on ------------------------------------------------------

    def _checked(self, state: State) -> None:
        if not self.check:
            return
        names, codes = state.names["job"].names, state.jobs.view("state").tolist()
        fold = {names[row]: "pending" if code == JobState.PENDING else "running"
                for row, code in enumerate(codes) if code in (JobState.PENDING, JobState.RUNNING)}
        ours = {job_id: job.walk.state for job_id, job in self.jobs.items()}
        if fold != ours or self.pending != state.pending_count:
            differ = sorted(set(fold.items()) ^ set(ours.items()))[:5]
            raise AssertionError(f"history is out of step with the fold at offset {state.offset}: {differ}")


@dataclass(frozen=True)
class Outcome:
    """What a history run did: records listed, jobs ended in the replayed history, jobs still in
    progress at the point it stopped, and whether it stopped early (``--limit``, ``--until``)."""

    listed: int
    ended: int
    in_progress: int
    stopped_early: bool


async def account(source: Source, emit: Callable[[Finished], None], filters: Filters | None = None,
                  limit: int | None = None, progress: Progress | None = None,
                  check: bool = False, stop: int | None = None) -> Outcome:
    """Replay the retained history once (to inputs offset ``stop``; ``None``: the end of the
    log), calling ``emit`` with each finished job's record that ``filters`` keeps (at most
    ``limit``), in the order the jobs ended."""
    start = await first_start(source)
    accounting = Accounting(emit, filters, limit, check)
    if start.snapshot is not None:
        accounting.seed(start.state)
    early = False
    try:
        await replay(source, start, stop, observers=(accounting,), progress=progress)
    except Enough:
        early = True
    return Outcome(accounting.listed, accounting.ended, len(accounting.jobs), early)


async def command(args: Any, source: Source) -> int:
    """The ``history`` replay handler: the CLI hands the filters (``args.history_filters``),
    where each record goes (``args.history_emit``) and whether to show progress
    (``args.history_progress``); the outcome lands in ``args.history_outcome``."""
    total = await end_offset(source.store, INPUTS)
    bar = progress_bar("history", total) if args.history_progress else contextlib.nullcontext(None)
    with bar as tick:
        args.history_outcome = await account(source, args.history_emit, args.history_filters,
                                             args.limit, tick)
    sys.stdout.flush()
    return 0
