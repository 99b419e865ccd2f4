"""``GET /v1/jobs/{job_id}``: one job as :func:`~fleetlog.core.views.job_status` shows it (the
fields ``fleetlog status`` prints, unchanged), with its queue position, labels and annotations, and
its story: its life as far as the folded state can tell, in log time (``docs/api.md``, "A job's
story"). A pure function of the state, like the lists: the live service and ``fleetlog replay
serve`` answer alike. It reads no log (the API may not, and one answer costs the job's tasks,
never a scan); ``fleetlog explain`` reads the logs for the whole history.
"""

from __future__ import annotations

import re
from typing import Any, Final

import msgspec

from fleetlog.api.resources import queue_positions
from fleetlog.api.visibility import EVERYTHING, Viewer, sees_row
from fleetlog.core.fold import CAUSE_CODES
from fleetlog.core.observations import Observation
from fleetlog.core.state import JobState, Requeue, State
from fleetlog.core.views import job_status, pending_reason, tasks_started


class TaskNode(msgspec.Struct, frozen=True):
    task: int
    state: str
    """``pending``, ``placed``, ``started`` or ``finished``."""
    node: str | None


class StoryStep(msgspec.Struct, frozen=True, omit_defaults=True):
    """One step of a job's story."""

    what: str
    """``submitted``, ``preempted``, ``requeued``, ``placed``, ``tasks``, ``waiting``, or how it
    ended: ``succeeded``, ``failed``, ``cancelled``, ``rejected``, ``returned``."""
    detail: str
    """What happened (``""``: nothing more to say)."""
    at_ms: int | None = None
    """Log time of the step (``None``: the state does not keep it, e.g. each task's start)."""
    inputs_offset: int | None = None
    """The input it was folded at, where the state keeps it (the submission, a requeue)."""


class JobDetail(msgspec.Struct, frozen=True, omit_defaults=True):
    job_id: str
    state: str
    tenant: str
    queue: str
    priority: int
    submitted_at_ms: int
    tasks: int
    tasks_started: int
    tasks_done: int
    task_nodes: list[TaskNode]
    story: list[StoryStep]
    labels: dict[str, str]
    annotations: dict[str, str]
    """Its submission's labels and annotations (``{}``: none)."""
    pending_reason: str | None = None
    pending_message: str | None = None
    """A pending job's reason code and its message (the constraint exclusions included: "0/600
    up nodes ... are eligible: 600 with an untolerated taint ...")."""
    requeued: Requeue | None = None
    """Why a pending job was last requeued, while it waits again."""
    placed_at_ms: int | None = None
    queue_position: int | None = None
    """A pending job's place among its queue's pending jobs (as in ``GET /v1/jobs``)."""
    ignored_observations: list[Observation] = []
    """The latest task reports naming it that the fold did not apply as written, and why
    (:mod:`fleetlog.core.observations`; ``[]``, left out: none)."""


_CAUSES: Final = {code: cause for cause, code in CAUSE_CODES.items()}


def job_detail(state: State, job_id: str, viewer: Viewer = EVERYTHING) -> JobDetail | None:
    """What ``GET /v1/jobs/{job_id}`` answers; ``None`` if the state has no such job, or
    ``viewer`` may not see it (:mod:`fleetlog.api.visibility`: the same 404, so another tenant's
    job ids do not show by their answer)."""
    row = state.job_row(job_id)
    if row < 0 or not sees_row(state, viewer, row):
        return None
    found = job_status(state, job_id)
    if found is None:
        return None
    position = int(queue_positions(state)[row])
    labels, annotations = state.job_meta.get(row, ({}, {}))
    extra: dict[str, Any] = {"story": story(state, row), "queue_position": position or None,
                             "labels": dict(labels), "annotations": dict(annotations)}
    detail = msgspec.convert(found | extra, JobDetail)
    return detail if viewer.sees_all else _without_preemptor(state, viewer, detail)


_PREEMPTOR: Final = re.compile(r"preempted by job (\S+) \(")


def _without_preemptor(state: State, viewer: Viewer, detail: JobDetail) -> JobDetail:
    """``detail`` without the id of the job that preempted it when ``viewer`` may not see that
    job (another tenant's: its id is no business of this one)."""
    note = detail.requeued.message if detail.requeued is not None else ""
    texts = [note, *(step.detail for step in detail.story)]
    hidden = {m.group(1) for text in texts for m in _PREEMPTOR.finditer(text)}
    hidden = {job for job in hidden if (row := state.job_row(job)) < 0 or not sees_row(state, viewer, row)}
    if not hidden:
        return detail

    def hide(text: str) -> str:
        return _PREEMPTOR.sub(lambda m: "preempted by another tenant's job (" if m.group(1) in hidden
                              else m.group(0), text)
    requeued = detail.requeued
    if requeued is not None:
        requeued = msgspec.structs.replace(requeued, message=hide(requeued.message))
        if requeued.by_job_id in hidden:
            requeued = msgspec.structs.replace(requeued, by_job_id="")
    story_ = [msgspec.structs.replace(step, detail=hide(step.detail)) for step in detail.story]
    return msgspec.structs.replace(detail, requeued=requeued, story=story_)


def story(state: State, row: int) -> list[StoryStep]:
    """Job ``row``'s life as far as the state tells it, in the order it happened."""
    c, names = state.jobs.cols, state.names
    status = JobState(int(c["state"][row]))
    gpu = int(c["req_gpu"][row])
    steps = [StoryStep(
        "submitted", f"tenant {names['tenant'].names[int(c['tenant'][row])]}, queue "
        f"{names['queue'].names[int(c['queue'][row])]}, priority {int(c['priority'][row])}: "
        f"{int(c['ntasks'][row])} task(s), {gpu} GPU milli in all",
        int(c["submitted_at"][row]), int(c["seq"][row]))]
    placed = int(c["placed_at_ms"][row])  # (its last placement: the nodes while it holds them)
    placing = [StoryStep("placed", _where(state, row), placed)] if placed >= 0 else []
    # a waiting job was placed, then requeued; a placed or ended one last preempted, then placed again
    requeue = _requeues(state, row)
    steps += placing + requeue if status == JobState.PENDING else requeue + placing
    steps += _now(state, row, status)
    return steps


def _requeues(state: State, row: int) -> list[StoryStep]:
    """The last requeue the state keeps: a waiting job's note, else the last preemption."""
    note = state.requeues.get(row)
    if note is not None:
        what = "preempted" if note.cause == "preempted" else "requeued"
        return [StoryStep(what, f"{note.cause}: {note.message}", note.requeued_at_ms, note.inputs_offset)]
    at = int(state.jobs.cols["preempted_at_ms"][row])
    if at < 0:
        return []
    cause = _CAUSES.get(int(state.jobs.cols["preempt_cause"][row]), "")
    return [StoryStep("preempted", f"{cause or 'preempted'}: its last preemption (placed again since)", at)]


def _where(state: State, row: int) -> str:
    cell = int(state.jobs.cols["cell"][row])
    tasks = state.tasks.cols["node"]
    nodes = ", ".join(f"{t - state.job_tasks(row).start}->{state.node_name(int(tasks[t]))}"
                      for t in state.job_tasks(row) if int(tasks[t]) >= 0)
    if cell < 0:  # (requeued or ended: the nodes are history, in the logs)
        return ""
    where = f"cell {state.names['cell'].names[cell]}"
    return f"{where}: {nodes}" if nodes else where


def _now(state: State, row: int, status: JobState) -> list[StoryStep]:
    """Where it is now: waiting (why), its tasks while placed, or how it ended."""
    c = state.jobs.cols
    ntasks, done = int(c["ntasks"][row]), int(c["tasks_done"][row])
    if status == JobState.PENDING:
        code, message = pending_reason(state, row)
        return [StoryStep("waiting", f"{code}: {message}" if message else code)]
    if status == JobState.RUNNING:
        return [StoryStep("tasks", f"{tasks_started(state, row)} of {ntasks} started, {done} finished")]
    ended = int(c["ended_at_ms"][row])
    detail = {
        JobState.SUCCEEDED: f"all {ntasks} task(s) exited 0",
        JobState.FAILED: "a task failed or exited non-zero (which, and its exit code: fleetlog explain)",
    }.get(status, "")
    returned = state.returned.get(row)
    if returned is not None:
        detail = f"handed back to the dispatcher by cell {returned.cell}: {returned.reason}"
    return [StoryStep(status.name.lower(), detail, ended if ended >= 0 else None)]
