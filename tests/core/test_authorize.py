"""The fold's gate (:func:`fleetlog.core.authorize.fold_checked`): a record carrying a principal
the log's policy does not allow is left out, exactly as if each record were checked one by one
against the state it would be folded into — however the log is cut into reads, with policy
changes, cancellations of jobs submitted in the same read and task reports of jobs placed (or
no longer placed) in the same read."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetlog.core.authorize import Refused, fold_checked, refusal
from fleetlog.core.decide import decide
from fleetlog.core.digest import digest
from fleetlog.core.fold import fold
from fleetlog.core.fold_batch import fold_fast, fold_lists
from fleetlog.core.invariants import check
from fleetlog.core.state import State
from fleetlog.events import (
    DecisionBatch,
    Event,
    JobCancelled,
    NodeDrained,
    PolicyGrant,
    PolicySet,
    TaskFailed,
    TaskFinished,
    TaskStarted,
)
from tests.core.budget import examples
from tests.core.builders import job, node, quota
from tests.core.test_fold_batch import BEATS, CHUNK_CONFIG, CHUNK_POLICY, NODES

PRINCIPALS = (None, None, "admin", "ta", "tb", "agent1", "agent2", "nobody")
OTHER_CELL = {name: node(name, gpus=8, cell="c2") for name in NODES[:2]}


def grants(revoke_a: bool = False, agents_swap: bool = False) -> PolicySet:
    roles = {
        "admin": ("policy-admin", "operator", "quota-admin"),
        "ta": () if revoke_a else ("tenant:a",),
        "tb": ("tenant:b", "reader"),
        "agent1": ("node-agent:c2",) if agents_swap else ("node-agent:c1",),
        "agent2": ("node-agent:c1",) if agents_swap else ("node-agent:c2",),
    }
    return PolicySet(grants=tuple(PolicyGrant(p, r) for p, r in roles.items()))


Log = list[tuple[Event, int, str | None]]


class GatedWriter:
    """A log as producers and the scheduler write it, and the one-by-one gate as reference:
    each input checked against the reference state it would be folded into, then folded (or
    not); decision batches decided on that state."""

    def __init__(self) -> None:
        self.ref, self.at, self.jobs = State(CHUNK_CONFIG), 1_000, 0
        self.log: Log = []
        self.refused: list[int] = []

    def put(self, event: Event, principal: str | None = None, step: int = 1) -> None:
        self.at += step
        if principal is not None and refusal(self.ref, principal, event) is not None:
            self.refused.append(len(self.log))
        else:
            fold(self.ref, event, self.at)
        self.log.append((event, self.at, principal))

    def decide(self) -> None:
        decisions = tuple(decide(self.ref, CHUNK_POLICY))
        self.put(DecisionBatch(as_of=self.ref.offset, digest=digest(self.ref), decisions=decisions))


def _input(draw: st.DrawFn, w: GatedWriter, kind: str) -> Event:
    name = draw(st.sampled_from(NODES))
    some_job = f"j{draw(st.integers(0, max(0, w.jobs - 1)))}"
    if kind == "b":
        return draw(st.sampled_from([BEATS[name], OTHER_CELL.get(name, BEATS[name])]))
    if kind == "J":
        w.jobs += 1
        tenant = draw(st.sampled_from(["a", "b"]))
        return job(f"j{w.jobs - 1}", tenant=tenant, gpus=draw(st.sampled_from([1, 8])))
    if kind == "c":
        return JobCancelled(job_id=some_job)
    if kind in "tfF":
        task = {"t": TaskStarted(job_id=some_job, task_index=0, node=name),
                "f": TaskFinished(job_id=some_job, task_index=0),
                "F": TaskFailed(job_id=some_job, task_index=0)}
        return task[kind]
    if kind == "q":
        return quota(draw(st.sampled_from(["a", "b"])), draw(st.integers(0, 16)))
    if kind == "N":
        return NodeDrained(cell="c1", node=name, drained=draw(st.booleans()), reason="ops")
    return draw(st.sampled_from([grants(), grants(revoke_a=True), grants(agents_swap=True),
                                 PolicySet(grants=(PolicyGrant("admin", ("policy-admin",)),))]))


@st.composite
def gated_logs(draw: st.DrawFn) -> tuple[GatedWriter, list[int]]:
    """A log whose inputs name principals (or none): heartbeats of two cells, submissions and
    cancellations of two tenants, task reports, quotas, drains, policy changes (also before the
    first policy, and revoking what an earlier one granted), decisions between them; cut points."""
    w = GatedWriter()
    if draw(st.booleans()):
        w.put(grants())
    for name in NODES:
        w.put(BEATS[name], draw(st.sampled_from(PRINCIPALS)))
    for _ in range(draw(st.integers(10, 100))):
        kind = draw(st.sampled_from("bbbbJJJcctfFqNAd"))
        if kind == "d":
            w.decide()
            continue
        w.put(_input(draw, w, kind), draw(st.sampled_from(PRINCIPALS)), draw(st.sampled_from([0, 1, 40])))
    w.decide()
    cuts = draw(st.lists(st.integers(1, len(w.log) - 1), max_size=12))
    return w, sorted(set(cuts))


def fold_as_the_loop_does(log: Log, cuts: list[int]) -> tuple[State, list[int]]:
    """Each chunk's runs of inputs through ``fold_checked`` (with ``fold_lists``), each decision
    batch with ``fold_fast``, as the loop and replay do; the places of the records refused."""
    state, refused = State(CHUNK_CONFIG), []
    for start, end in zip([0, *cuts], [*cuts, len(log)], strict=True):
        run: list[int] = []
        for i in [*range(start, end), None]:
            if i is None or isinstance(log[i][0], DecisionBatch):
                left = fold_checked(state, [log[k][0] for k in run], [log[k][1] for k in run],
                                    lambda run=run: [log[k][2] for k in run], fold_lists)
                refused += [run[r.at] for r in left]
                run = []
                if i is not None:
                    fold_fast(state, log[i][0], state.now_ms)
            else:
                run.append(i)
    return state, refused


@settings(max_examples=examples(80), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=gated_logs())
def test_the_gate_refuses_what_one_by_one_refuses_however_the_log_is_cut(
        case: tuple[GatedWriter, list[int]]) -> None:
    w, cuts = case
    for chunking in (cuts, [], list(range(1, len(w.log)))):  # drawn cuts, the whole log, chunks of 1
        state, refused = fold_as_the_loop_does(w.log, chunking)
        check(state)
        assert refused == w.refused
        assert digest(state) == digest(w.ref)
        assert (state.offset, state.now_ms, state.policy) == (w.ref.offset, w.ref.now_ms, w.ref.policy)


def _gate(events: list[Event], principals: list[str | None], state: State | None = None) -> list[Refused]:
    state = state or State(CHUNK_CONFIG)
    times = list(range(1_000, 1_000 + len(events)))
    return fold_checked(state, events, times, lambda: principals, fold_lists)


def test_before_any_policy_nothing_is_checked_and_a_policy_in_the_run_applies_from_its_place() -> None:
    cancel = JobCancelled(job_id="j0")
    events: list[Event] = [BEATS["n0"], job("j0", tenant="b"), cancel, grants(), cancel]
    refused = _gate(events, [None, "nobody", "ta", "admin", "ta"])
    assert [r.at for r in refused] == [4]  # the first cancel came before the log had a policy
    assert refused[0].message == "may not cancel job 'j0' of tenant 'b' (principal 'ta', roles: tenant:a)"
    assert refused[0].rule == "tenant:NAME cancels the jobs of tenant NAME; operator cancels any"


def test_a_cancel_sees_the_submission_before_it_in_the_same_read() -> None:
    state = State(CHUNK_CONFIG)
    fold(state, grants(), 1)
    refused = _gate([job("j9", tenant="a"), JobCancelled(job_id="j9"), job("j8", tenant="a"),
                     JobCancelled(job_id="j8")], ["ta", "tb", "ta", "ta"], state)
    assert [(r.at, r.message) for r in refused] == [
        (1, "may not cancel job 'j9' of tenant 'a' (principal 'tb', roles: reader, tenant:b)")]
    assert state.job_row("j9") >= 0
    assert state.job_row("j8") >= 0


def test_unnamed_principals_and_service_only_events_are_refused_with_their_rule() -> None:
    state = State(CHUNK_CONFIG)
    fold(state, grants(), 1)
    batch = DecisionBatch(as_of=0, digest="", decisions=())
    refused = _gate([BEATS["n0"], batch, PolicySet(grants=())], ["nobody", "admin", "tb"], state)
    assert [(r.at, r.rule) for r in refused] == [
        (0, "a principal the policy does not name may do nothing"),
        (1, "only the service's own parts append it"),
        (2, "policy-admin sets the policy (PolicySet)"),
    ]
    assert state.policy == grants()  # (the refused PolicySet changed nothing)
    assert state.offset == 1


def test_a_principal_is_checked_against_the_policy_the_log_holds_then() -> None:
    state = State(CHUNK_CONFIG)
    fold(state, grants(), 1)
    agent_c1 = BEATS["n0"]
    refused = _gate([agent_c1, grants(agents_swap=True), agent_c1, OTHER_CELL["n0"]],
                    ["agent1", "admin", "agent1", "agent1"], state)
    assert [r.at for r in refused] == [2]
    assert "may not report node 'n0' of cell 'c1'" in refused[0].message

