"""Why the fold did not apply a task report as written (:mod:`fleetlog.core.observations`).

Called by the fold's task handlers (``on_task_started``, ``on_task_finished``, ``on_task_failed``)
after they decided what to do, as they always did: these functions read the state and record, they
never change what the fold does, and nothing they write is digested.
"""

from __future__ import annotations

from fleetlog.core.observations import Observation
from fleetlog.core.state import JobState, State, TaskState
from fleetlog.events.model import TaskFailed, TaskFinished, TaskStarted

TaskReport = TaskStarted | TaskFinished | TaskFailed


def ignored(state: State, e: TaskReport, task: int) -> None:
    """Record why ``e`` was ignored (``task``: its row, -1 when the job is not running or has no
    such task)."""
    node = e.node if isinstance(e, TaskStarted) else _placed_on(state, task)
    _record(state, e, _why(state, e, task), node, False)


def started_on(state: State, e: TaskStarted, task: int) -> None:
    """A start the fold applied: record it if the node it names is not where the task is placed
    (``wrong_node``), or is no node of the job's cell at all (``unknown_node``)."""
    placed = int(state.tasks.cols["node"][task])
    if placed < 0 or state.node_name(placed) == e.node:
        return
    cell = state.names["cell"].names[int(state.nodes.cols["cell"][placed])]
    reason = "unknown_node" if state.node_row(cell, e.node) < 0 else "wrong_node"
    _record(state, e, reason, e.node, True)


def _why(state: State, e: TaskReport, task: int) -> str:
    job = state.job_row(e.job_id)
    if job < 0:
        return "already_finished" if e.job_id in state.retired else "unknown_job"
    cols = state.jobs.cols
    if e.task_index >= int(cols["ntasks"][job]):
        return "unknown_task"
    status = int(cols["state"][job])
    if status in (JobState.PENDING, JobState.RETURNED):
        return "not_placed"
    if status != JobState.RUNNING or task < 0:
        return "already_finished"
    done = int(state.tasks.cols["state"][task])
    return "already_started" if done == TaskState.STARTED else (
        "already_finished" if done == TaskState.FINISHED else "not_placed")


def _placed_on(state: State, task: int) -> str:
    node = int(state.tasks.cols["node"][task]) if task >= 0 else -1
    return state.node_name(node) if node >= 0 else ""


def _record(state: State, e: TaskReport, reason: str, node: str, folded: bool) -> None:
    state.observations.record(Observation(
        type(e).__name__, reason, e.job_id, e.task_index, node, state.offset - 1, state.now_ms, folded))
