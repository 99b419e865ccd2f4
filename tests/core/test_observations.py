"""Task reports the fold does not apply as written are recorded with their reason (issue 47):
counted per reason, the latest kept per job and per node, bounded, snapshotted and never digested
(so the fold decides, and old logs digest, exactly as before)."""

from __future__ import annotations

from fleetlog.core.digest import digest, restore, snapshot
from fleetlog.core.observations import MAX_NAMES, PER_NAME, Observations
from fleetlog.events import JobPlaced, TaskFailed, TaskFinished, TaskStarted
from tests.core.builders import Driver, job, node


def _fleet() -> tuple[Driver, dict[str, str]]:
    """Two 8-GPU nodes, jobs ``one`` and ``two`` placed (one node each), ``wait`` pending (16
    GPUs in one task: it never fits). Returns the driver and where each placed job went."""
    d = Driver()
    d.feed(node("n0"), node("n1"), job("one", gpus=8), job("two", gpus=8), job("wait", gpus=16))
    placed = {p.job_id: p.tasks[0].node for p in d.decide() if isinstance(p, JobPlaced)}
    assert sorted(placed) == ["one", "two"]
    return d, placed


def test_each_ignored_report_is_counted_with_its_reason_and_kept_by_job_and_node() -> None:
    d, placed = _fleet()
    other = {"n0": "n1", "n1": "n0"}
    ignored_before = d.state.ignored
    d.feed(
        TaskStarted(job_id="ghost", task_index=0, node="n0"),  # no such job
        TaskStarted(job_id="one", task_index=5, node=placed["one"]),  # a 1-task job has no task 5
        TaskStarted(job_id="wait", task_index=0, node="n0"),  # pending: on no node
        TaskStarted(job_id="one", task_index=0, node=placed["one"]),  # applied
        TaskStarted(job_id="one", task_index=0, node=placed["one"]),  # twice
        TaskFinished(job_id="one", task_index=0),  # applied: "one" succeeded
        TaskFinished(job_id="one", task_index=0),  # after it ended
        TaskFailed(job_id="ghost", task_index=0),
        TaskStarted(job_id="two", task_index=0, node="nowhere"),  # applied, but no such node
    )
    seen = d.state.observations
    assert seen.counts == {"unknown_job": 2, "unknown_task": 1, "not_placed": 1, "already_started": 1,
                           "already_finished": 1, "unknown_node": 1}
    assert d.state.ignored - ignored_before == 6  # (what the fold ignores is what it ignored before)
    assert [(o.ignored, o.reason) for o in seen.by_job["ghost"]] == [
        ("TaskStarted", "unknown_job"), ("TaskFailed", "unknown_job")]
    assert [o.reason for o in seen.by_job["one"]] == ["unknown_task", "already_started", "already_finished"]
    assert seen.by_job["one"][-1].node == ""  # (a finished task is on no node any more)
    nowhere = seen.by_node["nowhere"]
    assert [(o.job_id, o.reason, o.folded) for o in nowhere] == [("two", "unknown_node", True)]
    assert [o.inputs_offset for o in seen.by_job["ghost"]] == [5, 12]  # (2 beats and 3 jobs before)
    d.feed(TaskFinished(job_id="two", task_index=0))
    d.feed(job("three", gpus=8))
    three = {p.job_id: p.tasks[0].node for p in d.decide() if isinstance(p, JobPlaced)}["three"]
    d.feed(TaskStarted(job_id="three", task_index=0, node=other[three]))  # an existing node, not its own
    assert seen.by_node[other[three]][-1].reason == "wrong_node"
    assert seen.counts["wrong_node"] == 1


def test_the_record_is_not_digested_and_survives_a_snapshot() -> None:
    d, _ = _fleet()
    d.feed(TaskStarted(job_id="ghost", task_index=3, node="n9"), TaskFinished(job_id="wait", task_index=0))
    state = d.state
    assert state.observations.seq == 2
    kept, state.observations = state.observations, Observations()
    without = digest(state)
    state.observations = kept
    assert digest(state) == without  # no decision reads it: the digest leaves it out
    again = restore(snapshot(state))
    assert again.observations.to_builtins() == state.observations.to_builtins()
    assert again.observations.by_node["n9"][0].reason == "unknown_job"


def test_a_snapshot_without_a_record_restores_with_an_empty_one() -> None:
    d, _ = _fleet()
    assert b"observations" not in snapshot(d.state)  # (no key: a snapshot's bytes are those of before)
    again = restore(snapshot(d.state))
    assert not again.observations
    assert again.observations.counts == {}


def test_the_record_is_bounded_however_many_ids_a_producer_invents() -> None:
    d, _ = _fleet()
    d.feed(*(TaskStarted(job_id=f"ghost-{i}", task_index=i, node=f"x{i % 3}") for i in range(MAX_NAMES + 50)),
           check_each=False)
    seen = d.state.observations
    assert seen.counts == {"unknown_job": MAX_NAMES + 50}
    assert len(seen.by_job) == MAX_NAMES
    assert "ghost-0" not in seen.by_job  # the least recently named went first
    assert sorted(seen.by_node) == ["x0", "x1", "x2"]
    assert all(len(kept) == PER_NAME for kept in seen.by_node.values())
    assert seen.by_node["x2"][-1].job_id == f"ghost-{max(i for i in range(MAX_NAMES + 50) if i % 3 == 2)}"
