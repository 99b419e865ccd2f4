"""Status tells the truth: why a requeued job waits (preempted by whom, node lost), and a job
that can never fit on the fleet says so (``core/never_fits.py``)."""

from __future__ import annotations

import pytest

from fleetlog.core.digest import digest, restore, snapshot
from fleetlog.core.policy import Policy
from fleetlog.core.state import CoreConfig
from fleetlog.core.views import job_status, jobs_table
from fleetlog.events import NodeRemoved, TaskPreempted
from tests.core.builders import Driver, job, node


def _preempted() -> Driver:
    d = Driver()
    d.feed(node("n1", gpus=8), job("low", gpus=8))
    assert "low" in d.placed(d.decide())
    d.feed(job("high", gpus=8, priority=10))
    decisions = d.decide()
    assert [x.job_id for x in decisions if isinstance(x, TaskPreempted)] == ["low"]
    return d


def test_a_preempted_job_says_by_whom_and_why_from_the_batch_that_preempted_it() -> None:
    d = _preempted()
    found = job_status(d.state, "low")
    assert found is not None
    assert found["state"] == "pending"
    assert found["pending_reason"] == "preempted"
    assert found["pending_message"] == "preempted by job high (priority)"
    assert found["requeued"] == {
        "cause": "preempted",
        "requeued_at_ms": d.now_ms,
        "inputs_offset": d.batches[-1].as_of,
        "message": "preempted by job high (priority)",
        "by_job_id": "high",
        "preempt_cause": "priority",
    }
    assert "placed_at_ms" not in found  # its last placement is no longer true
    assert [r["reason"] for r in jobs_table(d.state) if r["job_id"] == "low"] == ["preempted"]
    restored = restore(snapshot(d.state))  # a restarted service still knows
    assert job_status(restored, "low") == found


def test_the_requeue_note_never_changes_the_digest() -> None:
    d = _preempted()
    before = digest(d.state)
    d.state.requeues.clear()
    assert digest(d.state) == before


def test_the_next_decide_explains_the_wait_and_the_requeue_stays_until_placed() -> None:
    d = _preempted()
    reasons = d.reasons(d.decide())
    assert reasons == {"low": "insufficient_capacity"}
    found = job_status(d.state, "low")
    assert found is not None
    assert found["pending_reason"] == "insufficient_capacity"
    assert found["requeued"]["by_job_id"] == "high"
    d.feed(node("n2", gpus=8))
    assert "low" in d.placed(d.decide())
    found = job_status(d.state, "low")
    assert found is not None
    assert "requeued" not in found
    assert found["placed_at_ms"] == d.now_ms
    assert d.state.requeues == {}


def test_a_job_whose_node_stopped_heartbeating_says_node_lost() -> None:
    d = Driver(config=CoreConfig(node_timeout_ms=3_000))
    d.feed(node("n1"), node("n2"), job("j1", gpus=8))
    placed = d.placed(d.decide())["j1"].tasks[0].node
    other = "n2" if placed == "n1" else "n1"
    last_beat = {"n1": 1_001, "n2": 1_002}[placed]  # (the Driver folds at 1 ms steps from 1001)
    for _ in range(5):  # only the other node keeps beating, once a second
        d.feed(node(other), step_ms=1_000)
    found = job_status(d.state, "j1")
    assert found is not None
    assert found["state"] == "pending"
    silent = found["requeued"]["silent_ms"]
    assert 3_000 < silent <= 4_000
    assert silent == found["requeued"]["requeued_at_ms"] - last_beat
    assert found["pending_reason"] == "node_lost"
    seconds = f"{silent / 1000:.3f}".rstrip("0").rstrip(".")
    assert found["pending_message"] == f"node {placed} lost (no heartbeat for {seconds} s)"
    assert found["requeued"]["node"] == placed


@pytest.mark.parametrize(
    ("silent_ms", "said"), [(80_000, "80"), (63_500, "63.5"), (4_001, "4.001"), (12_345_678_000, "12345678")]
)
def test_node_lost_says_the_silence_in_plain_seconds(silent_ms: int, said: str) -> None:
    d = Driver(config=CoreConfig(node_timeout_ms=4_000))
    d.feed(node("n1"), job("j1", gpus=8))
    d.decide()
    last = d.now_ms - 1  # (n1's heartbeat, just before j1)
    d.now_ms = last + silent_ms - 1
    d.feed(job("tick", gpus=0, cpu=1))  # any input moves log time; the sweep finds n1 silent
    found = job_status(d.state, "j1")
    assert found is not None
    assert found["pending_message"] == f"node n1 lost (no heartbeat for {said} s)"


def test_a_removed_node_requeues_with_its_own_reason() -> None:
    d = Driver()
    d.feed(node("n1"), job("j1", gpus=8))
    d.decide()
    d.feed(NodeRemoved(cell="c1", node="n1"))
    found = job_status(d.state, "j1")
    assert found is not None
    assert found["pending_reason"] == "node_removed"
    assert found["pending_message"] == "node n1 was removed"


# --- never fits ---------------------------------------------------------------------------


def test_a_host_gang_larger_than_any_host_never_fits() -> None:
    """The issue's case: 16 one-GPU tasks that must share a host, on 8-GPU hosts."""
    d = Driver()
    d.feed(node("n1"), node("n2"))
    d.feed(job("big", tasks=16, topology="host"), job("fits", tasks=8, topology="host"))
    decisions = d.decide()
    assert d.reasons(decisions) == {"big": "never_fits"}
    assert "fits" in d.placed(decisions)
    found = job_status(d.state, "big")
    assert found is not None
    assert found["pending_message"] == (
        "can never fit on the current fleet: no host can hold all 16 tasks even when empty (the best holds 8)"
    )


def test_never_fits_is_about_node_shapes_not_usage() -> None:
    """A gang that fits the empty fleet waits as gang_does_not_fit while the fleet is busy."""
    d = Driver(Policy(reserve=False))
    d.feed(node("n1"), node("n2"), job("busy", gpus=8))
    d.decide()
    d.feed(job("rack", tasks=16, topology="rack"), job("rack17", tasks=17, topology="rack"))
    assert d.reasons(d.decide()) == {"rack": "gang_does_not_fit_topology", "rack17": "never_fits"}


@pytest.mark.parametrize(
    ("tasks", "milli", "never"),
    [(2, 500, False), (3, 500, True), (3, 333, False), (4, 333, True), (1, 1000, False)],
)
def test_fractional_tasks_at_the_limit_of_one_gpu_host(tasks: int, milli: int, never: bool) -> None:
    d = Driver()
    d.feed(node("n1", gpus=1), job("j", tasks=tasks, milli=milli, topology="host"))
    reasons = d.reasons(d.decide())
    assert (reasons.get("j") == "never_fits") is never


def test_a_down_node_still_counts_as_fleet_a_removed_one_does_not() -> None:
    d = Driver()
    d.feed(node("small", gpus=8), node("big", gpus=16, rack="r2"))
    d.feed(node("big", gpus=16, rack="r2", healthy=False))
    d.feed(job("j", gpus=16))
    assert d.reasons(d.decide()) == {"j": "insufficient_capacity"}  # it may come back
    d.feed(NodeRemoved(cell="c1", node="big"), job("k", gpus=16))
    assert d.reasons(d.decide()) == {"j": "never_fits", "k": "never_fits"}


def test_a_run_of_placements_folded_at_once_clears_the_requeue_notes() -> None:
    """Eight or more placements in a batch take the batched path (``fold_fast``: ``on_placed_many``)."""
    d = Driver()
    d.feed(node("n1"), *[job(f"j{i}") for i in range(8)])
    assert len(d.placed(d.decide())) == 8
    d.feed(NodeRemoved(cell="c1", node="n1"))
    assert sorted(r.cause for r in d.state.requeues.values()) == ["node_removed"] * 8
    d.feed(node("n2"))
    assert len(d.placed(d.decide())) == 8
    assert d.state.requeues == {}
