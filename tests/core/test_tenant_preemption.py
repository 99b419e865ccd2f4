"""Priority across tenants (issue 46): under ``Policy.priority_within_tenant`` (the service's
policy) a job's priority preempts its own tenant's lower jobs alone; another tenant's running
job is evicted only by reclaim, when that tenant borrows past its nominal quota and the
preemptor's tenant stays within its own.  A bare policy name decides as before (old logs)."""

from __future__ import annotations

from fleetlog.core.policy import Policy, policy_named, service_policy
from fleetlog.core.state import JobState
from fleetlog.events import JobPending, TaskPreempted
from tests.core.builders import Driver, job, node, quota

GUARDED = service_policy("default")


def evicted(decisions: list[object]) -> dict[str, str]:
    return {x.job_id: x.cause for x in decisions if isinstance(x, TaskPreempted)}


def test_a_million_priority_preempts_none_of_another_tenants_jobs_inside_equal_quotas() -> None:
    d = Driver(GUARDED)
    d.feed(node("n1", gpus=8), quota("a", gpus=8, cohort="co"), quota("b", gpus=8, cohort="co"),
           *[job(f"b{i}", tenant="b", gpus=1) for i in range(8)])
    assert len(d.placed(d.decide())) == 8  # (b inside its nominal 8; a uses none of its 8)
    d.feed(job("vip", tenant="a", priority=1_000_000, gpus=1))
    decisions = d.decide()
    assert evicted(decisions) == {}
    assert d.reasons(decisions) == {"vip": "insufficient_capacity"}
    running = d.state.jobs.cols["state"][[d.state.job_row(f"b{i}") for i in range(8)]]
    assert (running == JobState.RUNNING).all()


def test_a_high_priority_preempts_its_own_tenants_job_not_the_younger_one_of_another() -> None:
    d = Driver(GUARDED)
    d.feed(node("n1", gpus=8), quota("a", gpus=8, cohort="co"), quota("b", gpus=8, cohort="co"),
           *[job(f"a{i}", tenant="a", gpus=1) for i in range(2)],
           *[job(f"b{i}", tenant="b", gpus=1) for i in range(6)])
    assert len(d.placed(d.decide())) == 8
    d.feed(job("vip", tenant="a", priority=1_000_000, gpus=1))
    decisions = d.decide()
    assert evicted(decisions) == {"a1": "priority"}  # (b5 is younger, but b's)
    assert "vip" in d.placed(decisions)


def test_without_quotas_priority_never_crosses_tenants() -> None:
    d = Driver(GUARDED)
    d.feed(node("n1", gpus=8), *[job(f"b{i}", tenant="b", gpus=1) for i in range(8)])
    assert len(d.placed(d.decide())) == 8
    d.feed(job("vip", tenant="a", priority=1_000_000, gpus=1))
    decisions = d.decide()
    assert evicted(decisions) == {}
    assert d.reasons(decisions) == {"vip": "insufficient_capacity"}
    pending = next(x for x in decisions if isinstance(x, JobPending))
    assert "preempt" not in pending.message  # (truthful: it waits for capacity, nothing was evicted)


def test_same_tenant_priority_preemption_still_works() -> None:
    d = Driver(GUARDED)
    d.feed(node("n1", gpus=4), job("old", priority=1, gpus=2), job("young", priority=1, gpus=2))
    d.decide()
    d.feed(job("vip", priority=9, gpus=2))
    decisions = d.decide()
    assert evicted(decisions) == {"young": "priority"}
    assert "vip" in d.placed(decisions)


def test_fair_share_reclaim_of_a_borrowing_tenant_still_works() -> None:
    d = Driver(GUARDED)
    d.feed(node("n1", gpus=4), quota("a", gpus=2, cohort="co"), quota("b", gpus=2, cohort="co"),
           *[job(f"b{i}", tenant="b") for i in range(4)])
    assert len(d.placed(d.decide())) == 4  # (b borrows a's 2 idle GPUs)
    d.feed(job("a0", tenant="a", priority=1_000_000))
    decisions = d.decide()
    causes = evicted(decisions)
    assert len(causes) == 1
    assert set(causes.values()) == {"reclaim"}
    assert "a0" in d.placed(decisions)
    message = next(x.message for x in decisions if isinstance(x, TaskPreempted))
    assert message == "reclaim preemption for job a0"


def test_a_bare_policy_name_preempts_across_tenants_as_logs_before_it_recorded() -> None:
    d = Driver(policy_named("default"))
    d.feed(node("n1", gpus=8), *[job(f"b{i}", tenant="b", gpus=1) for i in range(8)])
    d.decide()
    d.feed(job("vip", tenant="a", priority=1_000_000, gpus=1))
    assert set(evicted(d.decide()).values()) == {"priority"}


def test_the_service_policy_names_the_guard_so_a_batch_records_it() -> None:
    assert GUARDED.priority_within_tenant
    assert GUARDED.name == "default?priority_within_tenant=true"
    assert policy_named(GUARDED.name) == GUARDED  # (replay rebuilds it from the batch's name)
    assert not service_policy("fgd?priority_within_tenant=false").priority_within_tenant
    assert service_policy("best-fit?thrash_window_ms=0").priority_within_tenant
    assert not Policy().priority_within_tenant
