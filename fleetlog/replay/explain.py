"""``explain JOB``: a job's life from the logs — submitted, each pending reason as it changed,
placed where and why that node won, preempted by whom and why, started, finished — each step
with its log offset and log time.

Finding the job's records is a scan of both logs, but only records whose bytes contain the job
id are decoded.  For each placement the state the scheduler saw is rebuilt (through snapshots)
and the winning node is ranked against the other feasible nodes by the policy's own score.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from fleetlog.core import kernels
from fleetlog.core.eligibility import eligible
from fleetlog.core.fold import fold_decision
from fleetlog.core.policy import Policy, UnknownPolicyError, batch_policy
from fleetlog.core.scratch import policy_kernel, policy_shapes
from fleetlog.core.state import NodeStatus, State
from fleetlog.events.model import (
    INPUT_TYPES,
    DecisionBatch,
    JobCancelled,
    JobDispatched,
    JobPending,
    JobPlaced,
    JobRejected,
    JobSubmitted,
    TaskFailed,
    TaskFinished,
    TaskPreempted,
    TaskStarted,
)
from fleetlog.log.base import DECISIONS, INPUTS
from fleetlog.replay.source import InputReader, Progress, ReplayError, Source, batches, mentioning
from fleetlog.replay.state_at import state_before_batch

SHOWN_RIVALS = 3
_JOB_INPUTS = (JobSubmitted, JobCancelled, TaskStarted, TaskFinished, TaskFailed)


class Step(msgspec.Struct, frozen=True, omit_defaults=True):
    """One line of the timeline."""

    log: str
    offset: int
    time_ms: int
    what: str
    detail: str = ""
    why: dict[str, Any] | None = None
    position: int = 0
    """Order in the scheduler's history: an input's offset, a batch's ``as_of`` (before that input)."""


class Explanation(msgspec.Struct, frozen=True):
    job_id: str
    steps: tuple[Step, ...]


async def explain(
    source: Source, job_id: str, why: bool = True, progress: Progress | None = None
) -> Explanation:
    """The timeline of ``job_id``; a :class:`ReplayError` when no input ever submitted it."""
    steps = await _input_steps(source, job_id, progress)
    if not any(s.what in ("submitted", "dispatched here") for s in steps):
        raise ReplayError(f"unknown job {job_id!r}: no JobSubmitted for it in the inputs log")
    steps += await _decision_steps(source, job_id, why)
    steps.sort(key=_ORDER)
    steps += await _requeue_steps(source, job_id, steps)
    steps.sort(key=_ORDER)
    return Explanation(job_id, tuple(steps))


def _ORDER(s: Step) -> tuple[int, bool, int]:
    return (s.position, s.log == INPUTS, s.offset)


_REQUEUE_WHAT = {
    "node_lost": "node lost",
    "node_unhealthy": "node unhealthy",
    "node_reshaped": "node reshaped",
    "node_removed": "node removed",
    "node_tainted": "node tainted NoExecute",
}


async def _requeue_steps(source: Source, job_id: str, steps: list[Step]) -> list[Step]:
    """The steps no record names: a placed job the fold requeued because its node went down
    (lost its heartbeat, reported unhealthy or a new shape, was removed).  Seen as a decision
    about the job after its placement with no preemption or cancel between; the state that
    decision was computed on says why (``State.requeues``), at which input and log time."""
    out: list[Step] = []
    placed = False
    for step in steps:
        if step.log == DECISIONS and placed:  # (a decision about a placed job: it was requeued)
            if step.what != "preempted":
                out.extend(await _requeue_step(source, job_id, step))
            placed = False
        if step.what == "placed":
            placed = True
        elif step.what == "cancelled":
            placed = False
    return out


async def _requeue_step(source: Source, job_id: str, after: Step) -> list[Step]:
    state = await state_before_batch(source, after.offset, after.position)
    note = state.requeues.get(state.job_row(job_id))
    if note is None or note.cause not in _REQUEUE_WHAT:
        return []
    detail = f"{note.message}; the job was requeued"
    # The note counts inputs folded (not log offsets): the sweep that finds a node silent runs as
    # an input's time is taken, before that input is counted; the other causes are handled after.
    folded_before = note.inputs_offset if note.cause == "node_lost" else note.inputs_offset - 1
    at = await _folded_input_offset(source, after.position, state.offset - folded_before)
    return [Step(INPUTS, at, note.requeued_at_ms, _REQUEUE_WHAT[note.cause], detail, position=at)]


async def _folded_input_offset(source: Source, as_of: int, back: int) -> int:
    """The log offset of the input ``back`` folded inputs before ``as_of`` (``back`` >= 1): the
    inputs log also holds records the scheduler parked (undecodable, refused), which the state's
    count of folded inputs leaves out, so the offset is found by reading back from ``as_of``."""
    lo = max(0, as_of - back)
    while True:
        reader = InputReader(source.store, lo, source.core.cells if source.core is not None else ())
        folded = [offset async for chunk in reader.until(as_of) for offset in chunk.offsets]
        if len(folded) >= back or lo == 0:
            return folded[-back] if len(folded) >= back else lo
        lo = max(0, lo - max(back, as_of - lo))


async def _input_steps(source: Source, job_id: str, progress: Progress | None) -> list[Step]:
    out: list[Step] = []
    cell_shard = source.core is not None and bool(source.core.cells)  # its inputs hold JobDispatched
    accepts = (*INPUT_TYPES, JobDispatched) if cell_shard else None
    async for d in mentioning(source.store, job_id, progress, accepts):
        event = d.envelope.event
        if isinstance(event, JobDispatched):
            step = _dispatched_step(event, d.offset, d.timestamp_ms, job_id)
        else:
            step = _input_step(event, d.offset, d.timestamp_ms, job_id)
        if step is not None:
            out.append(_duplicate(msgspec.structs.replace(step, position=d.offset), out))
    return out


def _duplicate(step: Step, before: list[Step]) -> Step:
    """A submission after the first: the fold ignores it (a job id is submitted once)."""
    first = next((s for s in before if s.what == "submitted"), None)
    if step.what != "submitted" or first is None:
        return step
    detail = (
        f"{step.detail}; the job was first submitted at inputs@{first.offset}: the scheduler ignores this one"
    )
    return msgspec.structs.replace(step, what="submitted (duplicate, ignored)", detail=detail)


def _dispatched_step(event: JobDispatched, offset: int, at_ms: int, job_id: str) -> Step | None:
    """A cell partition's ``JobDispatched``: the job arrived in this shard (a cell shard's explain)."""
    if event.job.job_id != job_id:
        return None
    detail = f"cell {event.cell}, attempt {event.attempt} (seq {event.seq}, global as_of {event.as_of})"
    return Step(INPUTS, offset, at_ms, "dispatched here", detail)


def _input_step(event: object, offset: int, at_ms: int, job_id: str) -> Step | None:
    if not isinstance(event, _JOB_INPUTS) or event.job_id != job_id:
        return None
    match event:
        case JobSubmitted():
            groups = ", ".join(
                f"{g.count} x ({g.gpu_count} GPU x {g.gpu_milli} milli, {g.cpu_milli} mCPU)"
                for g in event.task_groups
            )
            detail = f"tenant {event.tenant}, queue {event.queue}, priority {event.priority}: {groups}"
            return Step(INPUTS, offset, at_ms, "submitted", detail)
        case JobCancelled():
            return Step(INPUTS, offset, at_ms, "cancelled", event.reason)
        case TaskStarted():
            return Step(INPUTS, offset, at_ms, "task started", f"task {event.task_index} on {event.node}")
        case TaskFinished():
            return Step(
                INPUTS, offset, at_ms, "task finished", f"task {event.task_index}, exit {event.exit_code}"
            )
        case TaskFailed():
            what = "placement withdrawn" if event.requeue else "task failed"
            return Step(INPUTS, offset, at_ms, what, f"task {event.task_index}: {event.reason}")
    return None


async def _decision_steps(source: Source, job_id: str, why: bool) -> list[Step]:
    needle, out = job_id.encode(), []
    placements: list[tuple[int, int, DecisionBatch, int]] = []
    async for offset, record, batch in batches(source.store):
        if batch.parts == 1 and needle not in record.value:  # ``record``: a split step's first part
            continue
        for index, decision in enumerate(batch.decisions):
            step = _decision_step(decision, job_id, offset, record.timestamp_ms)
            if step is not None:
                out.append(msgspec.structs.replace(step, position=batch.as_of))
                if isinstance(decision, JobPlaced) and why:
                    placements.append((len(out) - 1, offset, batch, index))
    for position, offset, batch, index in placements:
        reasons = await why_placed(source, offset, batch, index)
        out[position] = msgspec.structs.replace(out[position], why=reasons)
    return out


def _decision_step(decision: object, job_id: str, offset: int, at_ms: int) -> Step | None:
    match decision:
        case JobPlaced() if decision.job_id == job_id:
            nodes = ", ".join(f"{t.task_index}->{t.node}{list(t.gpu_indices) or ''}" for t in decision.tasks)
            return Step(DECISIONS, offset, at_ms, "placed", f"cell {decision.cell}: {nodes}")
        case JobPending() if decision.job_id == job_id:
            return Step(DECISIONS, offset, at_ms, f"pending: {decision.reason}", decision.message)
        case JobRejected() if decision.job_id == job_id:
            return Step(DECISIONS, offset, at_ms, f"rejected: {decision.reason}", decision.message)
        case TaskPreempted() if decision.job_id == job_id:
            detail = (
                f"task {decision.task_index} by {decision.by_job_id} ({decision.cause}) {decision.message}"
            )
            return Step(DECISIONS, offset, at_ms, "preempted", detail.strip())
        case TaskPreempted() if decision.by_job_id == job_id:
            detail = f"{decision.job_id} task {decision.task_index} ({decision.cause})"
            return Step(DECISIONS, offset, at_ms, "preempted another job", detail)
    return None


async def why_placed(source: Source, offset: int, batch: DecisionBatch, index: int) -> dict[str, Any]:
    """Rebuild the state the decision saw (inputs to ``as_of``, the batch's earlier decisions) and
    rank task 0's node against every feasible up node of the cell by the policy's score."""
    placed = batch.decisions[index]
    assert isinstance(placed, JobPlaced)
    state = await state_before_batch(source, offset, batch.as_of)
    for decision in batch.decisions[:index]:
        fold_decision(state, decision)
    try:
        policy = batch_policy(batch.policy, batch.typical_pods)
    except UnknownPolicyError as exc:
        return {"error": str(exc)}
    return rank_nodes(state, policy, placed)


RULES = {
    "fgd": "primary = fragmentation added (FGD)",
    "fgd-published": "primary = 100 - the published FGD score (ATC'23: 100 * sigmoid of the fragmentation "
    "removed, in GPUs, over the typical pods), secondary = the node's seeded tie key",
    "best-fit": "secondary = resources left (best fit)",
}


def rank_nodes(state: State, policy: Policy, placed: JobPlaced) -> dict[str, Any]:
    """Task 0's candidates in the placed cell, best first, by (primary, secondary, node) score: the
    up nodes of the cell its constraints allow (a taint it does not tolerate, a selector it does
    not match or a drain rules a node out, as for the placement itself) where it fits."""
    job = state.job_row(placed.job_id)
    if job < 0:
        return {"error": "the job is unknown at that point"}
    t = int(state.jobs.cols["first_task"][job])
    tc, nc, n = state.tasks.cols, state.nodes.cols, state.nodes.size
    cell = state.names["cell"].get(placed.cell)
    task = (int(tc["cpu"][t]), int(tc["mem"][t]), int(tc["gpus"][t]), int(tc["milli"][t]), tc["models"][t])
    free = (nc["cpu_free"][:n], nc["mem_free"][:n], nc["gpu_free"][:n], nc["gpu_count"][:n], nc["model"][:n])
    policy_id, shapes = policy_kernel(policy), policy_shapes(state, policy)
    up = np.flatnonzero((nc["status"][:n] == NodeStatus.UP) & (nc["cell"][:n] == cell)).tolist()
    allowed = eligible(state, int(tc["cls"][t]))  # (taints it does not tolerate, selectors, drains)
    scored = []
    for node in up:
        if (allowed is None or bool(allowed[node])) and kernels.fits(node, *free, *task):
            a, b = kernels.node_score(
                node, free[0], free[2], free[3], task[0], task[2], task[3], policy_id, shapes
            )
            scored.append((int(a), int(b), node))
    scored.sort()
    chosen = next((p.node for p in placed.tasks if p.task_index == 0), placed.tasks[0].node)
    ranked = [{"node": state.node_name(nd), "score": [a, b]} for a, b, nd in scored]
    rank = next((i + 1 for i, r in enumerate(ranked) if r["node"] == chosen), None)
    return {
        "policy": policy.name,
        "scoring": policy.scoring,
        "rule": "lowest (primary, secondary) score wins, then the lowest node row; " + RULES[policy.scoring],
        "node": chosen,
        "rank": rank,
        "feasible_nodes": len(ranked),
        "up_nodes_in_cell": len(up),
        "best": ranked[:SHOWN_RIVALS],
        "chosen_score": next((r["score"] for r in ranked if r["node"] == chosen), None),
    }
