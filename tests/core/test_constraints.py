"""Placement constraints: the eligibility kernel against its plain-Python spec, and decide
honouring selectors, affinity, taints, tolerations and cordons (docs/scheduling.md)."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetlog.core.constraints import NO_ATTRS, Compiled, NodeAttrs, class_key, node_attrs_of, node_matches
from fleetlog.core.digest import digest, restore, snapshot
from fleetlog.core.fold_batch import fold_lists
from fleetlog.core.policy import Policy
from fleetlog.core.state import JobState, State
from fleetlog.events import JobPending, NodeHeartbeat, TaskGroup
from fleetlog.events.model import (
    JobSubmitted,
    NodeLabel,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    Taint,
    Toleration,
)
from tests.core.budget import examples
from tests.core.builders import Driver, job, node

GPU_TAINT = Taint(key="nvidia.com/gpu", value="present", effect="NoSchedule")
TOLERATE_GPU = Toleration(key="nvidia.com/gpu", operator="Exists")


def with_attrs(hb: NodeHeartbeat, **fields: Any) -> NodeHeartbeat:
    return msgspec.structs.replace(hb, **fields)


def constrained(j: JobSubmitted, **fields: Any) -> JobSubmitted:
    groups = tuple(msgspec.structs.replace(g, **fields) for g in j.task_groups)
    return msgspec.structs.replace(j, task_groups=groups)


def term(*reqs: tuple[str, str, tuple[str, ...]]) -> NodeSelectorTerm:
    return NodeSelectorTerm(tuple(NodeSelectorRequirement(k, op, vals) for k, op, vals in reqs))  # type: ignore[arg-type]


# --- the kernel equals the spec ---------------------------------------------------------------

KEYS = ["zone", "gpu", "rack", ""]
VALUES = ["a", "b", "c", ""]
EFFECTS = ["NoSchedule", "PreferNoSchedule", "NoExecute"]

labels_st = st.dictionaries(st.sampled_from(KEYS[:3]), st.sampled_from(VALUES[:3]), max_size=3)
taints_st = st.lists(
    st.builds(
        Taint, key=st.sampled_from(KEYS[:3]), value=st.sampled_from(VALUES), effect=st.sampled_from(EFFECTS)
    ),
    max_size=3,
)
requirement_st = st.one_of(
    st.builds(
        NodeSelectorRequirement,
        key=st.sampled_from(KEYS[:3]),
        operator=st.sampled_from(["In", "NotIn"]),
        values=st.lists(st.sampled_from(["a", "b", "c", "zz"]), min_size=1, max_size=3).map(tuple),
    ),
    st.builds(
        NodeSelectorRequirement,
        key=st.sampled_from(KEYS[:3]),
        operator=st.sampled_from(["Exists", "DoesNotExist"]),
    ),
)
term_st = st.lists(requirement_st, min_size=1, max_size=3).map(lambda rs: NodeSelectorTerm(tuple(rs)))


@st.composite
def toleration_st(draw: st.DrawFn) -> Toleration:
    op = draw(st.sampled_from(["Equal", "Exists"]))
    key = draw(st.sampled_from(KEYS)) if op == "Exists" else draw(st.sampled_from(KEYS[:3]))
    value = draw(st.sampled_from(VALUES)) if op == "Equal" else ""
    effect = draw(st.sampled_from(["", *EFFECTS]))
    return Toleration(key=key, operator=op, value=value, effect=effect)  # type: ignore[arg-type]


group_st = st.builds(
    TaskGroup,
    count=st.just(1),
    cpu_milli=st.just(1),
    mem_mib=st.just(1),
    node_selector=st.lists(
        st.builds(NodeLabel, key=st.sampled_from(KEYS[:3]), value=st.sampled_from(VALUES[:3])), max_size=2
    ).map(tuple),
    node_affinity=st.lists(term_st, max_size=3).map(tuple),
    tolerations=st.lists(toleration_st(), max_size=3).map(tuple),
)
node_st = st.builds(
    lambda labels, taints, cordoned: with_attrs(
        node("n", gpus=0), labels=labels, taints=tuple(taints), unschedulable=cordoned
    ),
    labels_st,
    taints_st,
    st.booleans(),
)


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(node_st, min_size=1, max_size=12), st.lists(group_st, min_size=1, max_size=4), st.data())
def test_the_eligibility_kernel_equals_the_plain_spec(
    nodes: list[NodeHeartbeat], groups: list[TaskGroup], data: st.DataObject
) -> None:
    """On random labels, terms, taints and tolerations (values no node has, empty keys, every
    effect, cordons), some rows without any attributes."""
    attrs: dict[int, NodeAttrs] = {}
    size = len(nodes) + data.draw(st.integers(0, 3))  # (rows past the listed ones: no attributes)
    for row, hb in enumerate(nodes):
        a = node_attrs_of(hb)
        if a != NO_ATTRS:
            attrs[row] = a
    compiled = Compiled(attrs, size, 0)
    for g in groups:
        cls = class_key(g)
        got = compiled.eligible(cls)
        want = [node_matches(cls, attrs.get(row, NO_ATTRS)) for row in range(size)]
        assert got.tolist() == want


def test_kubernetes_toleration_rules() -> None:
    """The cases the Kubernetes docs spell out."""
    taint: NodeAttrs = ((), (("k", "v", "NoSchedule"),), False)

    def ok(*tols: Toleration) -> bool:
        g = TaskGroup(count=1, cpu_milli=1, mem_mib=1, tolerations=tols)
        return node_matches(class_key(g), taint)

    assert not ok()
    assert ok(Toleration(key="k", value="v"))
    assert not ok(Toleration(key="k", value="w"))
    assert ok(Toleration(key="k", operator="Exists"))
    assert ok(Toleration(operator="Exists"))  # (empty key, Exists: every taint)
    assert not ok(Toleration(key="k", operator="Exists", effect="NoExecute"))
    assert ok(Toleration(key="k", operator="Exists", effect="NoSchedule"))
    soft: NodeAttrs = ((), (("k", "v", "PreferNoSchedule"),), False)
    assert node_matches(class_key(TaskGroup(count=1, cpu_milli=1, mem_mib=1)), soft)  # (advisory)


# --- decide honours them -------------------------------------------------------------------------


def gpu_fleet(d: Driver) -> None:
    """Two tainted GPU nodes in zone a and b, two CPU nodes."""
    d.feed(
        with_attrs(node("g1"), labels={"zone": "a"}, taints=(GPU_TAINT,)),
        with_attrs(node("g2"), labels={"zone": "b"}, taints=(GPU_TAINT,)),
        with_attrs(node("c1", gpus=0), labels={"zone": "a"}),
        with_attrs(node("c2", gpus=0), labels={"zone": "b"}),
    )


def test_a_tainted_gpu_node_takes_only_pods_that_tolerate_it() -> None:
    d = Driver()
    gpu_fleet(d)
    d.feed(job("plain-gpu", gpus=1), constrained(job("ok-gpu", gpus=1), tolerations=(TOLERATE_GPU,)))
    d.feed(*(job(f"cpu{i}", gpus=0, cpu=500) for i in range(4)))
    decisions = d.decide()
    placed = d.placed(decisions)
    assert placed["ok-gpu"].tasks[0].node in ("g1", "g2")
    assert "plain-gpu" not in placed
    assert {placed[f"cpu{i}"].tasks[0].node for i in range(4)} <= {"c1", "c2"}
    (pending,) = [x for x in decisions if isinstance(x, JobPending)]
    assert pending.job_id == "plain-gpu"
    assert pending.reason == "no_eligible_nodes"
    assert "0/4 up nodes in cells c1 are eligible" in pending.message
    assert "2 untolerated taint nvidia.com/gpu=present:NoSchedule" in pending.message


def test_a_required_affinity_term_and_a_selector_choose_the_node_or_say_which_term() -> None:
    d = Driver()
    gpu_fleet(d)
    d.feed(
        constrained(job("zone-b", gpus=0), node_affinity=(term(("zone", "In", ("b",))),)),
        constrained(job("sel-a", gpus=0), node_selector=(NodeLabel("zone", "a"),)),
        constrained(job("nowhere", gpus=0), node_affinity=(term(("zone", "In", ("z",))),)),
        constrained(
            job("tol-nowhere", gpus=1), tolerations=(TOLERATE_GPU,), node_selector=(NodeLabel("zone", "q"),)
        ),
    )
    decisions = d.decide()
    placed = d.placed(decisions)
    assert placed["zone-b"].tasks[0].node == "c2"
    assert placed["sel-a"].tasks[0].node == "c1"
    why = {x.job_id: x for x in decisions if isinstance(x, JobPending)}
    assert why["nowhere"].reason == "no_eligible_nodes"
    assert "2 not matching node affinity zone In [z]" in why["nowhere"].message
    assert "2 untolerated taint" in why["nowhere"].message
    assert "4 not matching node selector zone=q" in why["tol-nowhere"].message


def test_a_cordoned_node_keeps_its_work_and_gets_none_new() -> None:
    d = Driver()
    d.feed(node("n1"), job("before", gpus=1))
    assert d.placed(d.decide())["before"].tasks[0].node == "n1"
    d.feed(with_attrs(node("n1"), unschedulable=True), job("after", gpus=1))
    decisions = d.decide()
    assert d.placed(decisions) == {}
    assert d.reasons(decisions) == {"after": "no_eligible_nodes"}
    assert "1 cordoned" in next(x.message for x in decisions if isinstance(x, JobPending))
    assert d.state.jobs.cols["state"][d.state.job_row("before")] == JobState.RUNNING
    d.feed(node("n1"))  # (uncordoned: no attributes any more)
    assert d.placed(d.decide())["after"].tasks[0].node == "n1"


def test_a_no_execute_taint_evicts_the_gangs_that_do_not_tolerate_it() -> None:
    d = Driver(Policy(reserve=False))
    d.feed(node("n1"), node("n2"))
    d.feed(
        job("gang", tasks=2, gpus=8),
        constrained(job("tough", gpus=0), tolerations=(Toleration(operator="Exists"),)),
    )
    placed = d.placed(d.decide())
    assert sorted(t.node for t in placed["gang"].tasks) == ["n1", "n2"]
    on = placed["tough"].tasks[0].node
    d.feed(with_attrs(node(on), taints=(Taint(key="maintenance", effect="NoExecute"),)))
    rows = d.state.job_row
    assert d.state.jobs.cols["state"][rows("gang")] == JobState.PENDING  # (the whole gang)
    assert d.state.requeues[rows("gang")].cause == "node_tainted"
    assert "maintenance" in d.state.requeues[rows("gang")].message
    assert d.state.jobs.cols["state"][rows("tough")] == JobState.RUNNING
    decisions = d.decide()
    assert d.reasons(decisions) == {"gang": "gang_does_not_fit"}  # (one node left for 2 x 8 GPUs)


def test_a_gang_whose_groups_differ_lands_each_group_where_it_may() -> None:
    """A launcher that must stay off GPU nodes and GPU workers that tolerate the taint: one
    gang, two constraint classes (the kernels see node kinds)."""
    d = Driver()
    gpu_fleet(d)
    launcher = TaskGroup(count=1, cpu_milli=1000, mem_mib=1024, node_affinity=(term(("zone", "In", ("b",))),))
    workers = TaskGroup(
        count=2, cpu_milli=1000, mem_mib=1024, gpu_count=4, gpu_milli=1000, tolerations=(TOLERATE_GPU,)
    )
    d.feed(JobSubmitted(job_id="mpi", tenant="t1", task_groups=(launcher, workers)))
    (placed,) = d.placed(d.decide()).values()
    by_index = {t.task_index: t.node for t in placed.tasks}
    assert by_index[0] == "c2"  # (zone b, no GPU taint to tolerate)
    assert {by_index[1], by_index[2]} <= {"g1", "g2"}
    d.feed(
        JobSubmitted(
            job_id="mpi2",
            tenant="t1",
            task_groups=(launcher, msgspec.structs.replace(workers, tolerations=())),
        )
    )
    decisions = d.decide()
    assert d.reasons(decisions) == {"mpi2": "no_eligible_nodes"}
    assert "for some of its tasks" in next(x.message for x in decisions if isinstance(x, JobPending))


def test_constraints_survive_a_snapshot_and_the_batched_fold() -> None:
    d = Driver()
    gpu_fleet(d)
    d.feed(
        constrained(job("j", gpus=1), tolerations=(TOLERATE_GPU,), node_selector=(NodeLabel("zone", "b"),))
    )
    d.decide()
    again = restore(snapshot(d.state))
    assert digest(again) == digest(d.state)
    assert again.classes == d.state.classes
    assert again.node_attrs == d.state.node_attrs
    events = [
        with_attrs(node(f"n{i}"), labels={"zone": "ab"[i % 2]}, taints=(GPU_TAINT,) * (i % 3 == 0))
        for i in range(100)
    ]
    events += [constrained(job(f"j{i}", gpus=1), tolerations=(TOLERATE_GPU,) * (i % 2)) for i in range(100)]
    events += [with_attrs(node(f"n{i}"), unschedulable=True) for i in range(0, 100, 7)]
    one, batched = State(), State()
    driver = Driver()
    driver.state = one
    driver.feed(*events, check_each=False)
    fold_lists(batched, events, [1_001 + i for i in range(len(events))])
    assert digest(batched) == digest(one)
    assert np.array_equal(batched.tasks.view("cls"), one.tasks.view("cls"))
