"""``placed`` is not ``running``: a placed job shows as placed until the backends saw each of its
tasks start (a bound pod still Pending, a Slurm job still PENDING), then as running."""

from __future__ import annotations

from fleetlog.core.views import job_status, jobs_table
from fleetlog.events import TaskFinished, TaskStarted
from tests.core.builders import Driver, job, node


def phase(d: Driver, job_id: str) -> tuple[str, int]:
    found = job_status(d.state, job_id)
    assert found is not None
    (row,) = [r for r in jobs_table(d.state) if r["job_id"] == job_id]
    assert row["state"] == found["state"]
    return found["state"], found["tasks_started"]


def test_a_gang_is_placed_until_every_task_started_then_running() -> None:
    d = Driver()
    d.feed(node("n1"), node("n2"), job("gang", tasks=2, gpus=8), job("later", gpus=1))
    d.decide()
    assert phase(d, "gang") == ("placed", 0)
    assert phase(d, "later") == ("pending", 0)
    d.feed(TaskStarted(job_id="gang", task_index=1, node="n2"))
    assert phase(d, "gang") == ("placed", 1)  # (one pod of two is up: the gang is not running yet)
    d.feed(TaskStarted(job_id="gang", task_index=0, node="n1"))
    assert phase(d, "gang") == ("running", 2)
    d.feed(TaskFinished(job_id="gang", task_index=0))
    assert phase(d, "gang") == ("running", 2)  # (a task that ended had started)
    d.feed(TaskFinished(job_id="gang", task_index=1))
    assert phase(d, "gang") == ("succeeded", 2)


def test_a_task_that_ended_unseen_counts_as_started() -> None:
    """A backend that saw the task only after it ended (a short job between two polls)."""
    d = Driver()
    d.feed(node("n1"), job("quick", tasks=2, gpus=1))
    d.decide()
    d.feed(TaskFinished(job_id="quick", task_index=0))
    assert phase(d, "quick") == ("placed", 1)
    d.feed(TaskStarted(job_id="quick", task_index=1, node="n1"))
    assert phase(d, "quick") == ("running", 2)
