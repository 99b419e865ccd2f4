"""How a finished job ended, for ``fleetlog status``: when, after how long, with which exit code.

The state keeps what a job *is* (succeeded, failed, cancelled, rejected), not when it got there:
that is in the logs.  Like ``explain``, this scans both logs but decodes only the records whose
bytes hold the job id, then walks the job's own events in the order the scheduler folded them
(a decision batch just before the input at its ``as_of``), with the fold's rules for one job:
placed -> running; preempted -> pending; while running, a task that fails or exits non-zero fails
the job, and the last task to finish with exit 0 completes it; a cancel ends any unfinished job;
a rejection ends a pending one.  The first event that takes the job to the state the fold ended
in is its end.  (A job requeued because its node was lost shows no event of its own; should the
walk miss the end for that reason, the last event of the right kind is taken.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fleetlog.core.state import State
from fleetlog.events.model import (
    JobCancelled,
    JobPlaced,
    JobRejected,
    JobSubmitted,
    TaskFailed,
    TaskFinished,
    TaskPreempted,
)
from fleetlog.replay.source import Source, batches, mentioning

_INPUTS = (JobCancelled, TaskFinished, TaskFailed)
_DECISIONS = (JobPlaced, TaskPreempted, JobRejected)


@dataclass(frozen=True)
class Seen:
    """One event of the job, where the fold met it."""

    position: tuple[int, int, int]
    time_ms: int
    event: Any


@dataclass(frozen=True)
class End:
    """How the job ended: when, the exit code (``None``: it had none), and what ended it."""

    at_ms: int
    exit_code: int | None
    what: str
    running: bool
    """Whether the job was running (placed) when it ended: only then has it a run time."""


async def job_events(source: Source, job_id: str, inputs: tuple[type, ...] = _INPUTS) -> list[Seen]:
    """The events that can move ``job_id`` between pending, running and an end, in fold order
    (``inputs``: the input types taken, its submissions too if asked)."""
    needle = job_id.encode()
    out: list[Seen] = []
    async for d in mentioning(source.store, job_id):
        event = d.envelope.event
        if isinstance(event, inputs) and getattr(event, "job_id", None) == job_id:
            out.append(Seen((d.offset, 1, d.offset), d.timestamp_ms, event))
    async for offset, record, batch in batches(source.store):
        if batch.parts == 1 and needle not in record.value:
            continue
        for index, decision in enumerate(batch.decisions):
            if isinstance(decision, _DECISIONS) and decision.job_id == job_id:
                out.append(Seen((batch.as_of, 0, offset * 1_000_000 + index), record.timestamp_ms, decision))
    out.sort(key=lambda s: s.position)
    return out


class _Walk:
    """One job through its own events, by the fold's rules (see the module's docstring)."""

    def __init__(self, tasks: int) -> None:
        self.tasks, self.state, self.done = tasks, "pending", set[int]()

    def step(self, event: Any) -> tuple[str, int | None, str] | None:
        """The end ``event`` brings, as (state, exit code, what), or ``None``."""
        match event:
            case JobPlaced():
                self.state, self.done = "running", set()
            case TaskPreempted() if self.state == "running":
                self.state = "pending"
            case JobRejected() if self.state == "pending":
                why = f" ({event.message})" if event.message else ""
                return "rejected", None, f"rejected: {event.reason}{why}"
            case JobCancelled():
                return "cancelled", None, f"cancelled: {event.reason}" if event.reason else "cancelled"
            case TaskFailed(requeue=True) if self._runs(event.task_index):
                self.state = "pending"  # (the backend withdrew the placement: requeued, not ended)
            case TaskFailed() if self._runs(event.task_index):
                why = f": {event.reason}" if event.reason else ""
                return "failed", event.exit_code, f"task {event.task_index} failed{why}"
            case TaskFinished() if self._runs(event.task_index) and event.task_index not in self.done:
                if event.exit_code != 0:
                    return "failed", event.exit_code, f"task {event.task_index} exited {event.exit_code}"
                self.done.add(event.task_index)
                if len(self.done) == self.tasks:
                    return "succeeded", 0, "every task exited 0"
        return None

    def _runs(self, task: int) -> bool:
        return self.state == "running" and task < self.tasks


def job_end(events: list[Seen], final_state: str, tasks: int) -> End | None:
    """The end of a job the fold left in ``final_state`` (a terminal state), from its events."""
    walk = _Walk(tasks)
    for seen in events:
        ended = walk.step(seen.event)
        if ended is not None and ended[0] == final_state:
            return End(seen.time_ms, ended[1], ended[2], walk.state == "running")
    for seen in reversed(events):  # the walk missed it (a requeue it could not see)
        walk = _Walk(tasks if final_state != "succeeded" else 1)
        walk.state = "pending" if final_state == "rejected" else "running"
        ended = walk.step(seen.event)
        if ended is not None and ended[0] == final_state:
            return End(seen.time_ms, ended[1], ended[2], walk.state == "running")
    return None


async def retired_status(source: Source, job_id: str) -> dict[str, Any] | None:
    """The status of a job the state no longer holds (it retired: docs/retention.md), from the
    logs: its last ``JobSubmitted`` and how its own events ended it (the fold's rules, as
    :func:`job_end` walks them). ``None``: no submission of it in the retained inputs (never
    submitted, or pruned)."""
    events = await job_events(source, job_id, (*_INPUTS, JobSubmitted))
    submissions = [i for i, s in enumerate(events) if isinstance(s.event, JobSubmitted)]
    if not submissions:
        return None
    last = submissions[-1]  # (an earlier job of the same id came before the dedup window let it be new)
    at_ms, job = events[last].time_ms, events[last].event
    tasks = sum(g.count for g in job.task_groups)
    walk, ended, placed = _Walk(tasks), None, None
    for seen in events[last + 1 :]:
        if isinstance(seen.event, JobPlaced):
            placed = seen.time_ms
        end = walk.step(seen.event)
        if end is not None:
            ended = (seen.time_ms, *end, walk.state == "running")
            break
    out: dict[str, Any] = {
        "job_id": job_id, "state": ended[1] if ended else "unknown", "retired": True, "tenant": job.tenant,
        "queue": job.queue, "priority": job.priority, "submitted_at_ms": at_ms, "tasks": tasks,
    }
    if ended is None:  # retired, yet its end is not among its events (a requeue the walk cannot see)
        return out | {"ended_at_ms": None, "exit_code": None, "end": "unknown"}
    end_ms, _, code, what, running = ended
    return out | {"placed_at_ms": placed, "ended_at_ms": end_ms,
                  "elapsed_ms": end_ms - placed if running and placed is not None else None,
                  "exit_code": code, "end": what}


async def with_run_facts(source: Source, state: State, found: dict[str, Any]) -> dict[str, Any]:
    """``found`` (a job's status) with :func:`run_facts` after its placement (or submission)."""
    anchor = "placed_at_ms" if "placed_at_ms" in found else "submitted_at_ms"
    return after(found, anchor, await run_facts(source, state, found))


def after(facts: dict[str, Any], key: str, more: dict[str, Any]) -> dict[str, Any]:
    """``facts`` with ``more`` placed after ``key`` (or at the end when it has no ``key``)."""
    keys = list(facts)
    at = keys.index(key) + 1 if key in facts else len(keys)
    return {k: facts[k] for k in keys[:at]} | more | {k: facts[k] for k in keys[at:]}


async def run_facts(source: Source, state: State, found: dict[str, Any]) -> dict[str, Any]:
    """``elapsed_ms`` of a running job (to the log time of the state); ``ended_at_ms``,
    ``elapsed_ms`` (its last run, if it ran), ``exit_code`` and ``end`` of a job that ended."""
    placed: int | None = found.get("placed_at_ms")
    if found["state"] in ("pending", "placed", "running"):
        running = found["state"] != "pending"
        return {"elapsed_ms": state.now_ms - placed} if running and placed is not None else {}
    ended = job_end(await job_events(source, found["job_id"]), found["state"], found["tasks"])
    if ended is None:  # not from its own events (the log was cut?): say so rather than guess
        return {"ended_at_ms": None, "elapsed_ms": None, "exit_code": None, "end": "unknown"}
    return {
        "ended_at_ms": ended.at_ms,
        "elapsed_ms": ended.at_ms - placed if ended.running and placed is not None else None,
        "exit_code": ended.exit_code,
        "end": ended.what,
    }
