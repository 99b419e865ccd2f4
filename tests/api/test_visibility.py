"""What a reader may see (fleetlog.api.visibility, issue 46), as pure functions of roles, a state
and events: lists and job details keep to the viewer's jobs; the watch's events leave out other
tenants' jobs and redact ``payload.env`` for all but the job's tenant and its cell's backend."""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Mapping

import msgspec
import pytest

from fleetlog.api.detail import job_detail
from fleetlog.api.dryrun import DryRun, DryRunJob, dry_run
from fleetlog.api.history import Finished, history_page
from fleetlog.api.resources import list_jobs
from fleetlog.api.routes import answer_list
from fleetlog.api.visibility import (
    EVERYTHING,
    HIDDEN_JOB,
    REDACTED,
    JobWhere,
    Viewer,
    may_see,
    on_owner,
    redact_dry_run,
    redact_event,
    state_lookup,
    view_of,
    viewer_for,
)
from fleetlog.core.authorize import Roles
from fleetlog.core.policy import Policy
from fleetlog.core.state import Requeue
from fleetlog.events.model import (
    DecisionBatch,
    JobCancelled,
    JobDispatched,
    JobPayload,
    JobPending,
    JobPlaced,
    JobSubmitted,
    PolicyGrant,
    PolicySet,
    TaskPlacement,
    TaskPreempted,
    TaskStarted,
)
from tests.core.builders import Driver, job, node

ALICE = viewer_for(Roles.of(["tenant:a"]))
READER = viewer_for(Roles.of(["reader"]))
OPS = viewer_for(Roles.of(["operator"]))
BACKEND_C2 = viewer_for(Roles.of(["backend:c2"]))
AGENT_C1 = viewer_for(Roles.of(["node-agent:c1"]))
ADMINS = viewer_for(Roles.of(["quota-admin", "policy-admin"]))
KEY = "sk-0123456789"


def secret_job(job_id: str, tenant: str, cells: tuple[str, ...] = ()) -> JobSubmitted:
    return msgspec.structs.replace(job(job_id, tenant=tenant, cells=cells), labels={"team": tenant},
                                   payload=JobPayload(command=("run",), env={"WANDB_API_KEY": KEY, "N": "1"}))


@pytest.fixture
def driver() -> Driver:
    """a1 (tenant a) placed in c1, b1 (tenant b) placed in c2, b2 (tenant b) waiting."""
    d = Driver()
    d.feed(node("n1", gpus=1, cell="c1"), node("n2", gpus=1, cell="c2"))
    d.feed(secret_job("a1", "a", ("c1",)), secret_job("b1", "b", ("c2",)), secret_job("b2", "b", ("c2",)))
    d.decide()
    return d


def test_roles_make_viewers_and_no_policy_sees_everything() -> None:
    assert viewer_for(None) == EVERYTHING
    assert READER.sees_all
    assert OPS.sees_all
    assert not READER.sees_env
    assert not OPS.sees_env
    assert not ALICE.sees_all
    assert ALICE.tenants == {"a"}
    assert BACKEND_C2.env_cells == {"c2"}
    assert AGENT_C1.cells == {"c1"}
    assert not AGENT_C1.env_cells
    assert not ADMINS.sees_all
    assert ADMINS.reads_policy
    assert not ALICE.reads_policy
    assert may_see(ALICE, "a")
    assert not may_see(ALICE, "b")
    assert may_see(BACKEND_C2, "b", ("c2",))


def test_a_tenant_lists_only_its_jobs_whatever_it_filters(driver: Driver) -> None:
    state = driver.state
    page = list_jobs(state, {}, ALICE)
    assert [i.job_id for i in page.items] == ["a1"]
    assert page.total == 1
    for query in ({"tenant": ["b"]}, {"label": ["team=b"]}, {"cell": ["c2"]}, {"state": ["pending"]}):
        assert list_jobs(state, query, ALICE).total == 0, query
    assert {i.job_id for i in list_jobs(state, {}, READER).items} == {"a1", "b1", "b2"}
    assert [i.job_id for i in list_jobs(state, {}, BACKEND_C2).items] == ["b1"]  # (placed in its cell)
    assert answer_list(state, "/v1/jobs", {}, ALICE) == page
    assert answer_list(state, "/v1/jobs", {}) == list_jobs(state, {}, READER)  # (no viewer: everything)


@pytest.mark.parametrize("seed", range(5))
def test_a_tenants_list_is_the_list_filtered_by_its_tenants(seed: int) -> None:
    rng = random.Random(seed)
    d = Driver()
    d.feed(*(node(f"n{i}", gpus=4, cell=f"c{i % 2}") for i in range(3)))
    d.feed(*(job(f"j{i}", tenant=rng.choice("abc"), gpus=rng.choice([1, 4])) for i in range(40)))
    d.decide()
    mine = frozenset(rng.sample("abc", rng.randint(0, 2)))
    viewer = Viewer(sees_all=False, tenants=mine)
    for limit in ("1", "7", "500"):
        got = list_jobs(d.state, {"limit": [limit]}, viewer)
        want = list_jobs(d.state, {"tenant": sorted(mine), "limit": [limit]}) if mine else None
        assert got.total == (want.total if want else 0)
        assert got.items == (want.items if want else [])


def test_another_tenants_job_has_no_detail(driver: Driver) -> None:
    state = driver.state
    assert job_detail(state, "b1", ALICE) is None
    assert job_detail(state, "b1", READER) is not None
    assert job_detail(state, "b1", BACKEND_C2) is not None
    assert job_detail(state, "b2", BACKEND_C2) is None  # (held to c2, not placed: its tenant's, a reader's)
    assert job_detail(state, "a1", ALICE) == job_detail(state, "a1", EVERYTHING)


def test_a_preemption_by_another_tenants_job_does_not_name_it(driver: Driver) -> None:
    state, bob = driver.state, viewer_for(Roles.of(["tenant:b"]))
    row = state.job_row("b2")  # (waiting: its detail says why it was requeued)
    state.requeues[row] = Requeue("preempted", 5, 3, "preempted by job a1 (priority)", by_job_id="a1",
                                  preempt_cause="priority")
    seen = job_detail(state, "b2", bob)
    assert seen is not None
    assert "a1" not in msgspec.json.encode(seen).decode()
    assert seen.requeued is not None
    assert seen.requeued.message == "preempted by another tenant's job (priority)"
    assert "a1" in msgspec.json.encode(job_detail(state, "b2", READER)).decode()


def test_history_keeps_to_the_viewers_tenants() -> None:
    def record(job_id: str, tenant: str) -> Finished:
        return Finished(job_id, "succeeded", tenant, "q", 0, 1, None, 0, None, None, 1, None, None, 0, "",
                        0, 0, 0.0, 0.0, False)
    records = [record("a1", "a"), record("b1", "b"), record("a2", "a")]
    page = history_page(records, 0, 10, ALICE)
    assert [r.job_id for r in page.items] == ["a1", "a2"]
    assert page.total == 2
    assert history_page(records, 0, 10, READER).total == 3
    assert history_page(records, 0, 10).total == 3


def test_the_watch_leaves_out_other_tenants_jobs_and_redacts_env(driver: Driver) -> None:
    lookup = state_lookup(driver.state)
    bobs = secret_job("b1", "b", ("c2",))
    redacted = {"WANDB_API_KEY": REDACTED, "N": REDACTED}
    assert redact_event(bobs, ALICE, lookup) is None
    assert redact_event(bobs, EVERYTHING, lookup) is bobs
    for viewer in (READER, OPS):
        seen = redact_event(bobs, viewer, lookup)
        assert isinstance(seen, JobSubmitted)
        assert seen.payload is not None
        assert seen.payload.env == redacted
        assert msgspec.structs.replace(seen, payload=bobs.payload) == bobs  # (only the env's values change)
    assert redact_event(bobs, viewer_for(Roles.of(["tenant:b"])), lookup) == bobs
    assert redact_event(bobs, BACKEND_C2, lookup) == bobs  # (its backend runs it)
    # the backend of the cell a job was placed in, not held to: lookup says where it is
    placed = msgspec.structs.replace(bobs, allowed_cells=())
    assert redact_event(placed, BACKEND_C2, lookup) == placed
    dispatched = JobDispatched(job=bobs, cell="c2", attempt=1, seq=1, as_of=0)
    assert redact_event(dispatched, ALICE, lookup) is None
    seen_dispatch = redact_event(dispatched, READER, lookup)
    assert isinstance(seen_dispatch, JobDispatched)
    assert seen_dispatch.job.payload is not None
    assert seen_dispatch.job.payload.env == redacted
    for event in (JobCancelled(job_id="b1"), TaskStarted(job_id="b1", task_index=0, node="n2"),
                  TaskStarted(job_id="gone", task_index=0, node="n2")):
        assert redact_event(event, ALICE, lookup) is None
        assert redact_event(event, READER, lookup) is event
    assert redact_event(TaskStarted(job_id="a1", task_index=0, node="n1"), ALICE, lookup) is not None
    policy = PolicySet(grants=(PolicyGrant("x", ("policy-admin",)),))
    assert redact_event(policy, ALICE, lookup) is None
    assert redact_event(policy, READER, lookup) is None
    assert redact_event(policy, OPS, lookup) is policy
    assert redact_event(policy, ADMINS, lookup) is policy
    beat = node("n9", cell="c9")
    assert redact_event(beat, ALICE, lookup) is beat


def test_a_decision_batch_keeps_the_viewers_decisions(driver: Driver) -> None:
    lookup = state_lookup(driver.state)
    batch = DecisionBatch(as_of=5, digest="d", decisions=(
        JobPlaced(job_id="a1", cell="c1", tasks=(TaskPlacement(0, "n1"),)),
        JobPlaced(job_id="b1", cell="c2", tasks=(TaskPlacement(0, "n2"),)),
        JobPending(job_id="b2", reason="insufficient_gpus"),
        TaskPreempted(job_id="a1", task_index=0, by_job_id="b2", cause="priority", message="by b2"),
    ))
    seen = redact_event(batch, ALICE, lookup)
    assert isinstance(seen, DecisionBatch)
    assert (seen.as_of, seen.digest) == (5, "d")
    assert seen.decisions == (batch.decisions[0], TaskPreempted(job_id="a1", task_index=0, by_job_id="",
                                                                cause="priority"))
    assert redact_event(batch, READER, lookup) is batch
    here = redact_event(batch, BACKEND_C2, lookup)
    assert isinstance(here, DecisionBatch)
    assert [d.job_id for d in here.decisions] == ["b1"]
    nobody = redact_event(batch, ADMINS, lookup)
    assert isinstance(nobody, DecisionBatch)
    assert nobody.decisions == ()


def test_the_watchs_lookup_hops_to_the_owner_once_per_event_and_only_when_needed(driver: Driver) -> None:
    hops: list[int] = []

    def call(fn: Callable[[], Mapping[str, JobWhere]]) -> Mapping[str, JobWhere]:
        hops.append(1)
        return fn()
    lookup = on_owner(lambda: state_lookup(driver.state), call)
    batch = DecisionBatch(as_of=5, digest="d", decisions=tuple(
        JobPending(job_id=j, reason="insufficient_gpus") for j in ("a1", "b1", "b2", "a1")))
    seen = redact_event(batch, ALICE, lookup)
    assert isinstance(seen, DecisionBatch)
    assert [d.job_id for d in seen.decisions] == ["a1", "a1"]
    assert len(hops) == 1
    for viewer in (READER, OPS, ADMINS):  # (they see all, or no job: nothing to look up)
        redact_event(batch, viewer, lookup)
        redact_event(secret_job("b1", "b"), viewer, lookup)
        redact_event(TaskStarted(job_id="b1", task_index=0, node="n2"), viewer, lookup)
    redact_event(secret_job("a1", "a"), ALICE, lookup)  # (its own: its tenant says so)
    assert len(hops) == 1
    assert view_of(EVERYTHING, lookup) is None
    view = view_of(ALICE, lookup)
    assert view is not None
    assert view(secret_job("b1", "b")) is None


def test_a_dry_run_names_no_job_nor_spec_of_another_tenant(driver: Driver) -> None:
    state, lookup = driver.state, state_lookup(driver.state)
    other = dry_run(state, Policy(), [msgspec.structs.replace(job("b1", tenant="a", gpus=0), priority=5)])
    assert other.items[0].reason == "job_id_taken"  # (alice's job under bob's id: nothing compared)
    assert redact_dry_run(other, ALICE, lookup) == other
    # alice dry-runs bob's jobs, guessed under his tenant: what differs, or that it is exact, is not hers
    asked = [msgspec.structs.replace(secret_job("b1", "b", ("c2",)), priority=5),
             secret_job("b2", "b", ("c2",)), msgspec.structs.replace(job("a1", tenant="a"), priority=3)]
    whole = dry_run(state, Policy(), asked)
    assert "priority" in whole.items[0].message
    assert whole.items[1].outcome == "duplicate"
    seen = redact_dry_run(whole, ALICE, lookup)
    for item in seen.items[:2]:
        assert (item.outcome, item.reason) == ("refused", "job_id_taken")
        assert "priority" not in item.message
    assert seen.items[2] == whole.items[2]  # (her own a1: the spec compared, as ever)
    assert "priority" in seen.items[2].message
    assert redact_dry_run(whole, READER, lookup) is whole
    victims = DryRun(at_ms=0, items=[DryRunJob("a9", "placed", "", "placed", preempts=["a1", "b1", "b2"])])
    hidden = redact_dry_run(victims, ALICE, lookup)
    assert hidden.items[0].preempts == ["a1", HIDDEN_JOB, HIDDEN_JOB]
    assert redact_dry_run(victims, viewer_for(Roles.of(["tenant:a", "tenant:b"])), lookup) == victims


def test_a_watchers_view_knows_the_jobs_it_met_before_the_state_does() -> None:
    asked: list[list[str]] = []

    def nothing_folded(job_ids: Collection[str]) -> Mapping[str, JobWhere]:
        asked.append(sorted(job_ids))
        return {}  # (the watcher reads ahead of the scheduler's fold: the state knows no job yet)
    view = view_of(ALICE, nothing_folded)
    assert view is not None
    assert view(secret_job("a5", "a")) is not None
    assert view(secret_job("b5", "b")) is None
    assert view(JobCancelled(job_id="a5")) == JobCancelled(job_id="a5")  # (her cancel, read before the fold)
    assert view(JobCancelled(job_id="b5")) is None
    for _ in range(3):
        assert view(TaskStarted(job_id="a5", task_index=0, node="n1")) is not None
    assert asked == []  # (tenants met are remembered: no lookup)
    assert view(TaskStarted(job_id="zz", task_index=0, node="n1")) is None
    assert asked == [["zz"]]
