"""A placement the backend withdraws (``TaskFailed`` with ``requeue``: Slurm kept the pinned job
pending behind its own work, issue 47) requeues the gang instead of failing it, says why, and
holds at once the foreign work the node reports — so the job is not pinned to that node again,
and the books never hold more GPUs than the node has.  Without ``requeue`` (old logs) the job
fails as before."""

from __future__ import annotations

import msgspec

from fleetlog.api.detail import job_detail
from fleetlog.core.state import JobState, State
from fleetlog.events import TaskFailed
from tests.core.builders import Driver, job, node

WHY = "Slurm left it PENDING for 30 s: Resources (node n1 holds Slurm job 123)"


def state_of(d: Driver, job_id: str) -> JobState:
    return JobState(int(d.state.jobs.cols["state"][d.state.job_row(job_id)]))


def booked_gpus(state: State, name: str) -> int:
    """GPUs of ``name`` the books hold: not free (fleetlog's tasks and the foreign work held)."""
    row = state.node_row("c1", name)
    return int(state.nodes.cols["gpu_free"][row, : int(state.nodes.cols["gpu_count"][row])].tolist().count(0))


def test_a_withdrawn_placement_is_requeued_with_its_reason_and_placed_elsewhere() -> None:
    d = Driver()
    d.feed(node("n1", gpus=4), node("n2", gpus=4, foreign=(0, 0, 4)))
    d.feed(job("pinned", gpus=4))
    assert d.placed(d.decide())["pinned"].tasks[0].node == "n1"
    d.feed(node("n1", gpus=4, foreign=(0, 0, 4)))  # Slurm ran its own job there: held only once free
    assert booked_gpus(d.state, "n1") == 4
    d.feed(TaskFailed(job_id="pinned", task_index=0, reason=WHY, requeue=True))
    assert state_of(d, "pinned") == JobState.PENDING  # requeued, not failed
    assert booked_gpus(d.state, "n1") == 4  # the foreign job's, at once: the placement's are gone
    detail = job_detail(d.state, "pinned")
    assert detail is not None
    assert detail.requeued is not None
    assert (detail.requeued.cause, detail.requeued.node, detail.requeued.message) == ("withdrawn", "n1", WHY)
    assert any(step.detail == f"withdrawn: {WHY}" for step in detail.story)
    assert "pinned" not in d.placed(d.decide())  # not pinned to the busy node again
    d.feed(node("n2", gpus=4))  # n2 frees
    assert d.placed(d.decide())["pinned"].tasks[0].node == "n2"
    assert booked_gpus(d.state, "n1") == booked_gpus(d.state, "n2") == 4


def test_without_requeue_a_failed_task_still_fails_the_job() -> None:
    d = Driver()
    d.feed(node("n1", gpus=4))
    d.feed(job("j", gpus=4))
    d.decide()
    d.feed(TaskFailed(job_id="j", task_index=0, reason="exit 1"))
    assert state_of(d, "j") == JobState.FAILED


def test_requeue_is_left_out_of_old_records_and_read_as_false() -> None:
    """Old logs hold no ``requeue``: they decode (and fold) as before; a new record carries it."""
    old = b'{"type":"TaskFailed","job_id":"j","task_index":0,"reason":"x"}'
    assert msgspec.json.decode(old, type=TaskFailed).requeue is False
    assert b"requeue" not in msgspec.json.encode(TaskFailed(job_id="j", task_index=0))
    assert b'"requeue":true' in msgspec.json.encode(TaskFailed(job_id="j", task_index=0, requeue=True))
