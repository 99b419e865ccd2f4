"""One job across the dispatcher and the cells: ``fleetlog status JOB`` and ``replay explain JOB``
of a deployment with a ``[cells]`` map.

The dispatcher's side comes from the global partition: its inputs (the submission, the cells'
returns, a cancel) and its step records, each computed again (:class:`DispatchReplay`) so the
state a dispatch was chosen on is at hand — which cells the job could go to, and how much room
each had. The cell's side is today's single-shard story of the partition that held the job,
folded with its shard's ``CoreConfig``.
"""

from __future__ import annotations

import heapq
import re
from dataclasses import dataclass, field
from typing import Any

import msgspec

from fleetlog.core.dispatch import (
    HELD,
    DispatchState,
    Spread,
    candidates,
    in_flight,
    kind_of,
    room_for,
    rooms,
    take,
)
from fleetlog.core.dispatch_log import StepRecord
from fleetlog.core.views import job_status
from fleetlog.events.model import INPUT_TYPES, SHARD_TYPES, JobCancelled, JobReturned, JobSubmitted
from fleetlog.log.base import DECISIONS, INPUTS, LogError, LogStore, Shard
from fleetlog.log.consumer import parked_for_job
from fleetlog.replay.dispatcher import DispatchReplay
from fleetlog.replay.explain import Step, explain
from fleetlog.replay.fleet import Opened
from fleetlog.replay.jobend import with_run_facts
from fleetlog.replay.source import Progress, ReplayError, end_offset, mentioning, read
from fleetlog.replay.state_at import Point, state_at

GLOBAL_TYPES = (*INPUT_TYPES, *SHARD_TYPES)


@dataclass
class Story:
    """What the global partition says of one job: its steps, and the dispatcher's state at the end."""

    steps: list[Step] = field(default_factory=list)
    dispatches: list[dict[str, Any]] = field(default_factory=list)
    returns: list[dict[str, Any]] = field(default_factory=list)
    state: DispatchState | None = None


async def global_story(opened: Opened, job_id: str, progress: Progress | None = None) -> Story:
    """The job's steps in the global partition (inputs and recomputed step records)."""
    store = (await opened.get(Shard.GLOBAL)).store
    story = Story()
    async for d in mentioning(store, job_id, progress, GLOBAL_TYPES):
        step = _global_input(d.envelope.event, d.offset, d.timestamp_ms, job_id)
        if step is not None:
            story.steps.append(msgspec.structs.replace(step, position=d.offset))
            if isinstance(d.envelope.event, JobReturned):
                e = d.envelope.event
                story.returns.append({"returned": e.cell, "attempt": e.attempt, "reason": e.reason,
                                      "message": e.message, "returned_at_ms": d.timestamp_ms})
    replay = DispatchReplay(store, opened.topology.cells)
    async for offset, recorded in replay.steps():
        if _mentions(recorded, job_id):
            await replay.fold_until(recorded.as_of)
            why = _why(replay.state, job_id, recorded)  # (before the step: the room it was chosen on)
            at_ms = (await read(store, DECISIONS, offset, 1))[0].timestamp_ms
            lines = _step_lines(recorded, job_id, offset, at_ms, why, story.dispatches)
            story.steps += [msgspec.structs.replace(s, position=recorded.as_of) for s in lines]
        await replay.redo(recorded)
    await replay.fold_to_end()
    story.state = replay.state
    return story


def _mentions(recorded: StepRecord, job_id: str) -> bool:
    return (any(s.job_id == job_id for s in recorded.dispatched)
            or any(w.job_id == job_id for w in recorded.waiting)
            or any(c.job_id == job_id for c in recorded.cancels))


def _global_input(event: object, offset: int, at_ms: int, job_id: str) -> Step | None:
    log = "global/inputs"
    match event:
        case JobSubmitted() if event.job_id == job_id:
            cells = ", ".join(event.allowed_cells) or "any cell of the map"
            detail = f"tenant {event.tenant}, priority {event.priority}, allowed cells: {cells}"
            return Step(log, offset, at_ms, "submitted", detail)
        case JobReturned() if event.job_id == job_id:
            detail = f"attempt {event.attempt}: {event.reason}"
            detail += f" ({event.message})" if event.message else ""
            return Step(log, offset, at_ms, f"returned by cell {event.cell}", detail)
        case JobCancelled() if event.job_id == job_id:
            return Step(log, offset, at_ms, "cancelled", event.reason)
    return None


def _why(state: DispatchState, job_id: str, recorded: StepRecord) -> str:
    """Why the dispatcher would choose where it did: each candidate cell's share of the job's
    tenant at its turn in the step (the step's start plus the jobs the step dispatched before
    it: :class:`~fleetlog.core.dispatch.Spread`), its room for the job at the step's start (what
    breaks a tie of shares: :func:`~fleetlog.core.dispatch.room_for`, the most free slots in one
    row of its largest task's bucket) and what is left of it at the job's turn (where it must
    fit); among the cells it fits, the least share wins, then the most room, then the smaller
    id — and the cells it may not go to."""
    job = state.jobs.get(job_id)
    if job is None:
        return ""
    flying, kind, cells = in_flight(state), kind_of(job.spec), candidates(state, job)
    room, spread = rooms(state, flying), Spread.of(state, flying)
    start = {cell: room_for(r, kind) for cell, r in room.items()}
    for sent in recorded.dispatched:
        if sent.job_id == job_id:
            break
        earlier = state.jobs.get(sent.job_id)
        if earlier is not None and sent.cell in room:
            take(room[sent.cell], earlier.spec, commit=True)
            spread.add(sent.cell, earlier.tenant, earlier.demand)
    parts = []
    for cell in cells:
        if cell not in room:
            parts.append(f"{cell}: no summary")
            continue
        fits = take(room[cell], job.spec, commit=False)
        share = f"tenant's share {spread.share(cell, job.tenant) / 10**7:.1f}%"
        left = room_for(room[cell], kind)
        parts.append(f"{cell}: {f'{share}, room {start[cell]} ({left} left)' if fits else 'no room'}")
    waiting = [c for c in sorted(job.returned) if c not in cells]
    if waiting:
        parts.append("not asked again until a newer summary: " + ", ".join(waiting))
    return "; ".join(parts)


def _step_lines(recorded: StepRecord, job_id: str, offset: int, at_ms: int, why: str,
                dispatches: list[dict[str, Any]]) -> list[Step]:
    log, out = "global/decisions", []
    for sent in recorded.dispatched:
        if sent.job_id == job_id:
            dispatches.append({"dispatched": sent.cell, "attempt": sent.attempt, "seq": sent.seq,
                               "dispatched_at_ms": at_ms})
            detail = (f"attempt {sent.attempt} (seq {sent.seq}): the least share of its tenant, then the "
                      f"most room at the step's start, of the candidate cells it fits, at global as_of "
                      f"{recorded.as_of}, ties to the smaller id ({why})")
            out.append(Step(log, offset, at_ms, f"dispatched to cell {sent.cell}", detail,
                            why={"room": why, "as_of": recorded.as_of}))
    out += [Step(log, offset, at_ms, f"waiting: {w.code}", w.message)
            for w in recorded.waiting if w.job_id == job_id]
    out += [Step(log, offset, at_ms, f"cancel forwarded to cell {c.cell}")
            for c in recorded.cancels if c.job_id == job_id]
    return out


# --- explain -------------------------------------------------------------------------------------


async def explain_fleet(opened: Opened, job_id: str, why: bool = True, progress: Progress | None = None,
                        only_global: bool = False) -> dict[str, Any]:
    """The job's story across the dispatcher and every cell partition it was dispatched to, in
    log time order."""
    story = await global_story(opened, job_id, progress)
    if not any(s.what == "submitted" for s in story.steps):
        raise ReplayError(f"unknown job {job_id!r}: no JobSubmitted for it in the global partition")
    cells: list[list[Step]] = []
    for p in [] if only_global else _partitions(opened, story):
        shard = Shard.cell(p)
        found = await explain(await opened.get(shard), job_id, why=why)
        cells.append([msgspec.structs.replace(s, log=f"{shard}/{s.log}") for s in found.steps])
    glob = sorted(story.steps, key=lambda s: (s.position, s.log == "global/inputs", s.offset))
    steps = _merged(glob, list(heapq.merge(*cells, key=lambda s: s.time_ms)))
    return {"job_id": job_id, "steps": [msgspec.to_builtins(s) for s in steps]}


def _merged(glob: list[Step], cells: list[Step]) -> list[Step]:
    """The global steps and the cells' in log time, each in its own order; at the same
    millisecond the dispatcher's step comes first (a cell's step is its consequence: the dispatch
    arrives, the cancel is forwarded; a cell decides nothing about a job it returned). Shards'
    clocks are not one (Kafka stamps each partition's batches): a dispatch's arrival in its cell
    never comes before the dispatcher's step that sent it."""
    out: list[Step] = []
    i = j = 0
    while i < len(glob) or j < len(cells):
        if j == len(cells) or (i < len(glob) and (glob[i].time_ms <= cells[j].time_ms
                                                  or _sent_later(cells[j], glob[i:]))):
            out.append(glob[i])
            i += 1
        else:
            out.append(cells[j])
            j += 1
    return out


def _sent_later(step: Step, glob: list[Step]) -> bool:
    """Whether ``step`` is a cell's "dispatched here" whose dispatch is among the ``glob`` steps."""
    if step.what != "dispatched here":
        return False
    m = _ATTEMPT.search(step.detail)
    sent = f"attempt {m.group(1)} " if m else ""
    return any(g.what.startswith("dispatched to cell") and g.detail.startswith(sent) for g in glob)


_ATTEMPT = re.compile(r"attempt (\d+)")


def _partitions(opened: Opened, story: Story) -> list[int]:
    """The cell partitions the job was dispatched to, in the order it first went to each."""
    out: list[int] = []
    for d in story.dispatches:
        p = opened.topology.cells.partition_of(d["dispatched"])
        if p is not None and p not in out:
            out.append(p)
    return out


# --- status --------------------------------------------------------------------------------------


async def status_fleet(opened: Opened, job_id: str) -> dict[str, Any] | None:
    """The job as the dispatcher and its holding cell know it at the end of the logs (``None``:
    neither knows it)."""
    story = await global_story(opened, job_id)
    assert story.state is not None
    job = story.state.jobs.get(job_id)
    if job is None:
        return await _direct(opened, job_id)
    submitted = next((s.time_ms for s in story.steps if s.what == "submitted"), None)
    out: dict[str, Any] = {"job_id": job_id, "dispatcher": job.status, "submitted_at_ms": submitted}
    if job.status == HELD:
        p = opened.topology.cells.partition_of(job.cell)
        out |= {"held_by": job.cell, "shard": str(Shard.cell(p)) if p is not None else None,
                "attempt": job.attempt}
        if p is not None:
            cell = await _cell_status(opened, Shard.cell(p), job_id)
            out |= cell or {"state": "dispatched", "note": "not in the cell's log yet"}
    if job.status != HELD:
        out["state"] = job.status if job.status != "pending" else "waiting"
        code, _, message = job.reason.partition(": ")
        out |= {"pending_reason": code, "pending_message": message} if job.reason else {}
    out["dispatches"] = story.dispatches
    out["returns"] = story.returns
    return out


async def _cell_status(opened: Opened, shard: Shard, job_id: str) -> dict[str, Any] | None:
    source = await opened.get(shard)
    end = await end_offset(source.store, INPUTS)
    state = (await state_at(source, Point(offset=end))).state
    found = job_status(state, job_id)
    if found is None:
        return None
    found = await with_run_facts(source, state, found)  # (how long it ran, how it ended)
    found.pop("job_id")
    found["dispatched_at_ms"] = found.pop("submitted_at_ms")  # (the cell folds a dispatch as a submission)
    return found


async def _direct(opened: Opened, job_id: str) -> dict[str, Any] | None:
    """A job submitted straight to a cell partition (not through the dispatcher)."""
    for shard in opened.topology.shards()[1:]:
        found = await _cell_status(opened, shard, job_id)
        if found is not None:
            return {"job_id": job_id, "dispatcher": "unknown", "shard": str(shard), **found}
    return None


async def parked_anywhere(opened: Opened, job_id: str) -> tuple[str, Any] | None:
    """The first dead-lettered record of ``job_id`` in any shard: (shard, what was parked)."""
    for shard in opened.topology.shards():
        store: LogStore = (await opened.get(shard)).store
        try:
            parked = await parked_for_job(store, job_id)
        except LogError:
            parked = None
        if parked is not None:
            return str(shard), parked
    return None
