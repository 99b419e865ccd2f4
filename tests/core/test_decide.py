"""decide, step by step, on small readable fleets."""

from __future__ import annotations

import pytest

from fleetlog.core import scratch as scratch_module
from fleetlog.core.policy import Policy
from fleetlog.core.state import JobState
from fleetlog.events import JobCancelled, JobPending, JobRejected, TaskFinished, TaskPreempted
from tests.core.builders import Driver, job, node, quota


def test_places_a_single_gpu_job_and_records_gpu_indices() -> None:
    d = Driver()
    d.feed(node("n1", gpus=2), job("j1", gpus=1))
    placed = d.placed(d.decide())
    assert placed["j1"].cell == "c1"
    (task,) = placed["j1"].tasks
    assert task.node == "n1"
    assert task.gpu_indices == (0,)
    assert d.state.jobs.cols["state"][d.state.job_row("j1")] == JobState.RUNNING


def test_gang_is_all_or_nothing() -> None:
    d = Driver(Policy(reserve=False))  # (three nodes: it would fit the empty fleet: not never_fits)
    d.feed(node("n1", gpus=8), node("n2", gpus=8), node("n3", gpus=8), job("busy", gpus=8))
    assert d.placed(d.decide())["busy"].tasks[0].node == "n1"
    d.feed(job("gang", tasks=3, gpus=8))
    decisions = d.decide()
    assert d.placed(decisions) == {}
    assert d.reasons(decisions) == {"gang": "gang_does_not_fit"}
    assert (d.state.nodes.cols["gpu_free"][1:3, :8] == 1000).all()


def test_gang_with_rack_topology_lands_in_one_rack() -> None:
    d = Driver()
    d.feed(
        node("a1", rack="ra"),
        node("b1", rack="rb"),
        node("b2", rack="rb"),
        job("gang", tasks=2, gpus=8, topology="rack"),
    )
    (placed,) = d.placed(d.decide()).values()
    assert sorted(t.node for t in placed.tasks) == ["b1", "b2"]


def test_topology_failure_explains_the_best_rack() -> None:
    d = Driver(Policy(reserve=False))
    d.feed(node("a1", rack="ra"), node("b1", rack="rb"), node("b2", rack="rb"), job("busy", gpus=8))
    assert d.placed(d.decide())["busy"].tasks[0].node == "a1"
    d.feed(job("busy2", gpus=8, cpu=96_000))  # (fits only b1 or b2, whole)
    assert d.placed(d.decide())["busy2"].tasks[0].node in ("b1", "b2")
    d.feed(job("gang", tasks=2, gpus=8, topology="rack"))
    decisions = d.decide()
    (pending,) = [x for x in decisions if isinstance(x, JobPending)]
    assert pending.reason == "gang_does_not_fit_topology"
    assert "no rack in cell c1 has room for all 2 tasks" in pending.message
    assert "the best rack fits 1" in pending.message


def test_pending_reason_is_emitted_only_when_it_changes() -> None:
    d = Driver()
    d.feed(node("n1", gpus=1), job("busy", gpus=1))
    assert "busy" in d.placed(d.decide())
    d.feed(job("big", gpus=1))
    assert d.reasons(d.decide()) == {"big": "insufficient_capacity"}
    assert d.decide() == []


def test_gpu_model_restriction_and_no_eligible_nodes() -> None:
    d = Driver()
    d.feed(
        node("t4", model="T4"),
        node("a100", model="A100"),
        job("j1", models=("A100",)),
        job("j2", models=("H100",)),
    )
    decisions = d.decide()
    assert d.placed(decisions)["j1"].tasks[0].node == "a100"
    assert d.reasons(decisions) == {"j2": "no_eligible_nodes"}


def test_fractional_gpus_share_one_gpu() -> None:
    d = Driver()
    d.feed(node("n1", gpus=2), job("a", milli=500), job("b", milli=500), job("c", milli=300))
    placed = d.placed(d.decide())
    gpu_of = {j: p.tasks[0].gpu_indices for j, p in placed.items()}
    assert gpu_of["a"] == gpu_of["b"]
    assert len(placed) == 3


def test_priority_first_then_fifo() -> None:
    d = Driver()
    d.feed(node("n1", gpus=1), job("low", priority=0), job("high", priority=10))
    decisions = d.decide()
    assert set(d.placed(decisions)) == {"high"}
    assert d.reasons(decisions) == {"low": "insufficient_capacity"}


def test_drf_alternates_between_tenants() -> None:
    d = Driver()
    d.feed(
        node("n1", gpus=4),
        *[job(f"a{i}", tenant="a") for i in range(4)],
        *[job(f"b{i}", tenant="b") for i in range(4)],
    )
    placed = list(d.placed(d.decide()))
    assert sorted(placed) == ["a0", "a1", "b0", "b1"]


def test_quota_blocks_and_cohort_lends() -> None:
    d = Driver()
    d.feed(
        node("n1", gpus=8),
        quota("a", gpus=2, cohort="co"),
        quota("b", gpus=4, cohort="co", borrow=0),
        *[job(f"a{i}", tenant="a") for i in range(8)],
    )
    decisions = d.decide()
    # a has 2 of its own and may borrow b's 4 idle GPUs (a has no borrowing limit)
    assert len(d.placed(decisions)) == 6
    reasons = d.reasons(decisions)
    assert set(reasons.values()) == {"quota_exhausted"}
    pending = next(x for x in decisions if isinstance(x, JobPending))
    assert "cohort can lend 4000" in pending.message


def test_reclaim_preempts_borrowers_when_the_lender_needs_its_quota() -> None:
    d = Driver()
    d.feed(
        node("n1", gpus=4),
        quota("a", gpus=2, cohort="co"),
        quota("b", gpus=2, cohort="co"),
        *[job(f"b{i}", tenant="b") for i in range(4)],
    )
    assert len(d.placed(d.decide())) == 4
    d.feed(job("a0", tenant="a"))
    decisions = d.decide()
    evicted = {x.job_id for x in decisions if isinstance(x, TaskPreempted)}
    assert len(evicted) == 1
    assert all(x.cause == "reclaim" for x in decisions if isinstance(x, TaskPreempted))
    assert "a0" in d.placed(decisions)


def test_priority_preemption_takes_the_youngest_lowest_priority_whole_gang() -> None:
    d = Driver()
    d.feed(node("n1", gpus=4), job("old", priority=1, gpus=2), job("young", priority=1, gpus=2))
    d.decide()
    d.feed(job("vip", priority=9, gpus=2))
    decisions = d.decide()
    assert {x.job_id for x in decisions if isinstance(x, TaskPreempted)} == {"young"}
    assert "vip" in d.placed(decisions)
    assert d.state.jobs.cols["state"][d.state.job_row("young")] == JobState.PENDING


def test_no_thrashing_within_the_window() -> None:
    d = Driver(Policy(thrash_window_ms=1_000_000))
    d.feed(node("n1", gpus=1), job("victim", priority=1))
    d.decide()
    d.feed(job("p1", priority=5))
    assert any(isinstance(x, TaskPreempted) for x in d.decide())
    d.feed(TaskFinished(job_id="p1", task_index=0))
    assert "victim" in d.placed(d.decide())
    d.feed(job("p2", priority=5))
    assert not any(isinstance(x, TaskPreempted) for x in d.decide())


def test_fail_unplaced_rejects_on_arrival() -> None:
    d = Driver(Policy(fail_unplaced=True))
    d.feed(node("n1", gpus=1), job("a"), job("b"))
    decisions = d.decide()
    assert [x.job_id for x in decisions if isinstance(x, JobRejected)] == ["b"]
    assert d.state.jobs.cols["state"][d.state.job_row("b")] == JobState.REJECTED


def test_multi_cell_job_goes_where_it_fits() -> None:
    d = Driver()
    d.feed(node("x", gpus=1, cell="c1"), node("y", gpus=8, cell="c2"), job("j", gpus=4, cells=("c1", "c2")))
    assert d.placed(d.decide())["j"].cell == "c2"


def test_reservation_holds_a_rack_and_backfill_uses_it_only_when_short() -> None:
    d = Driver()
    d.feed(node("a1", rack="ra"), node("a2", rack="ra"), job("filler", gpus=4, expected_ms=10_000))
    d.decide()
    d.feed(
        job("gang", tasks=2, gpus=8, topology="rack"),
        job("long", gpus=4),
        job("short", gpus=2, expected_ms=5_000),
    )
    decisions = d.decide()
    reasons = d.reasons(decisions)
    assert reasons["gang"] == "waiting_for_reservation"
    assert "short" in d.placed(decisions)
    assert "long" not in d.placed(decisions)


def test_cancel_frees_resources() -> None:
    d = Driver()
    d.feed(node("n1", gpus=1), job("a"))
    d.decide()
    d.feed(JobCancelled(job_id="a"), job("b"))
    assert "b" in d.placed(d.decide())


def test_node_timeout_requeues_its_gang() -> None:
    d = Driver()
    d.feed(node("n1", gpus=8), node("n2", gpus=8), job("gang", tasks=2, gpus=8))
    d.decide()
    d.feed(node("n1", gpus=8), step_ms=61_000)  # n2 missed heartbeats for over a minute
    assert d.state.jobs.cols["state"][d.state.job_row("gang")] == JobState.PENDING
    assert d.reasons(d.decide()) == {"gang": "gang_does_not_fit"}


def fractional_fleet() -> Driver:
    """Six nodes and jobs of many shapes (fractional and whole GPUs, several CPU sizes) pending."""
    d = Driver()
    d.feed(*(node(f"n{i}", gpus=(2, 4, 8)[i % 3], cpu=(16_000, 64_000)[i % 2]) for i in range(6)))
    shapes = [(1, milli, cpu) for milli in (250, 500, 700) for cpu in (2_000, 6_000)] + [(2, 1000, 8_000)]
    d.feed(*(job(f"j{k}", gpus=g, milli=m, cpu=c) for k, (g, m, c) in enumerate(shapes * 3)))
    return d


def test_remembered_node_scores_do_not_change_decisions(monkeypatch: pytest.MonkeyPatch) -> None:
    """decide remembers node scores per task shape (at most MAX_MEMOS shapes at once): with room
    for one shape only, the same 21 jobs of 7 shapes land exactly where they land otherwise."""
    roomy = fractional_fleet().decide()
    monkeypatch.setattr(scratch_module, "MAX_MEMOS", 1)
    tight = fractional_fleet().decide()
    assert len(Driver().placed(roomy)) == 21
    assert tight == roomy
