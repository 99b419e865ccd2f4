"""Kubernetes objects → events, and the ledger's deduplication: pure functions, no server."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from fleetlog.backends.kubernetes.config import KubeBackendConfig
from fleetlog.backends.kubernetes.ledger import Ledger
from fleetlog.backends.kubernetes.objects import NODE as NODE_DECODER
from fleetlog.backends.kubernetes.objects import POD, BadQuantityError, Node, Pod, mib, milli
from fleetlog.backends.kubernetes.translate import (
    NEVER,
    UNSUPPORTED_POD_AFFINITY,
    UNSUPPORTED_POD_ANTI_AFFINITY,
    job_id_of,
    job_submitted,
    node_heartbeat,
    observation,
    pod_shape,
)
from fleetlog.events import (
    JobCancelled,
    JobSubmitted,
    TaskFailed,
    TaskFinished,
    TaskGroup,
    TaskStarted,
    decode,
    encode,
    envelope,
)
from fleetlog.events.model import NodeSelectorTerm
from tests.backends.kubernetes.manifests import node, pod

CFG = KubeBackendConfig()


def as_node(manifest: dict[str, Any]) -> Node:
    return NODE_DECODER.decode(json.dumps(manifest))


def as_pod(manifest: dict[str, Any], **status: Any) -> Pod:
    manifest = {**manifest, "metadata": {**manifest["metadata"], "uid": "0123456789abcdef"}, "status": status}
    return POD.decode(json.dumps(manifest))


@pytest.mark.parametrize(
    ("text", "want_milli", "want_mib"),
    [("250m", 250, 1), ("2", 2000, 1), ("1.5", 1500, 1), ("1Gi", 2**30 * 1000, 1024), ("1e9", 10**12, 954)],
)
def test_quantities(text: str, want_milli: int, want_mib: int) -> None:
    assert milli(text) == want_milli
    assert mib(text) == want_mib


def test_a_bad_quantity_is_named() -> None:
    with pytest.raises(BadQuantityError, match="12Zi"):
        milli("12Zi")


def test_node_heartbeat_reads_capacity_model_topology_and_health() -> None:
    beat = node_heartbeat(as_node(node("n1", gpus=8, rack="r7", block="b2", cpu="96", mem="1Ti")), CFG)
    assert (beat.cell, beat.node, beat.cpu_milli, beat.mem_mib) == ("kubernetes", "n1", 96_000, 2**20)
    assert (beat.gpu_count, beat.gpu_model, beat.topology, beat.healthy) == (
        8,
        "H100",
        ("b2", "r7", "n1"),
        True,
    )
    assert beat.labels["fleetlog.dev/rack"] == "r7"


def test_not_ready_nodes_are_unhealthy_and_taints_and_cordons_are_reported_as_they_are() -> None:
    """A taint or a cordon is not health (a GPU node's usual taint would otherwise take every
    GPU node down): they reach the core as taints and ``unschedulable``."""
    assert node_heartbeat(as_node(node("n1", ready=False)), CFG).healthy is False
    taints = [
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
        {"key": "maintenance", "effect": "NoExecute"},
        {"key": "spot", "effect": "PreferNoSchedule"},
        {"key": "odd", "effect": "SomethingNew"},  # (an effect fleetlog does not know: left out)
    ]
    beat = node_heartbeat(
        as_node(node("n2", gpus=4, taints=taints, unschedulable=True, labels={"zone": "a"})), CFG
    )
    assert beat.healthy is True
    assert beat.unschedulable is True
    assert [(t.key, t.value, t.effect) for t in beat.taints] == [
        ("nvidia.com/gpu", "present", "NoSchedule"),
        ("maintenance", "", "NoExecute"),
        ("spot", "", "PreferNoSchedule"),
    ]
    assert beat.labels["zone"] == "a"
    assert beat.labels["kubernetes.io/hostname"] == "n2"
    assert list(beat.labels)[:1] == ["nvidia.com/gpu.product"]  # (the labels fleetlog reads first)
    many = node("n3", labels={f"l{i:03d}": "v" for i in range(100)})
    assert len(node_heartbeat(as_node(many), CFG).labels) == 64
    assert "fleetlog.dev/rack" in node_heartbeat(as_node(many), CFG).labels


def test_a_pods_selector_affinity_and_tolerations_become_its_task_groups_constraints() -> None:
    affinity = [
        [
            {"key": "zone", "operator": "In", "values": ["a", "b"]},
            {"key": "spot", "operator": "DoesNotExist"},
        ],
        [{"key": "big", "operator": "Gt", "values": ["3"]}],  # (not read: a term no node meets)
    ]
    tolerations = [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Equal", "value": "ml"},
        {"operator": "Exists"},
    ]
    manifest = pod("p", gpus=1, node_selector={"disk": "ssd"}, affinity=affinity, tolerations=tolerations)
    manifest["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ].append({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n7"]}]})
    (group,) = job_submitted("pod/default/p/01234567", [as_pod(manifest)], CFG).task_groups
    assert [(label.key, label.value) for label in group.node_selector] == [("disk", "ssd")]
    first, never, by_name = group.node_affinity
    assert [(r.key, r.operator, r.values) for r in first.match_expressions] == [
        ("zone", "In", ("a", "b")), ("spot", "DoesNotExist", ()),
    ]  # fmt: skip
    assert never == NEVER
    assert [(r.key, r.operator, r.values) for r in by_name.match_expressions] == [
        ("kubernetes.io/hostname", "In", ("n7",))
    ]
    assert [(t.key, t.operator, t.value, t.effect) for t in group.tolerations] == [
        ("nvidia.com/gpu", "Exists", "", "NoSchedule"),
        ("dedicated", "Equal", "ml", ""),
        ("", "Exists", "", ""),
    ]
    plain = job_submitted("pod/default/q/01234567", [as_pod(pod("q"))], CFG).task_groups[0]
    assert (plain.node_selector, plain.node_affinity, plain.tolerations) == ((), (), ())


def requirements(term: NodeSelectorTerm) -> list[tuple[str, str, tuple[str, ...]]]:
    return [(r.key, r.operator, r.values) for r in term.match_expressions]


def round_trip(job: JobSubmitted) -> JobSubmitted:
    """``job`` through the codec, which checks every field's bounds (as the service does)."""
    got = decode(encode(envelope(job, "test"))).event
    assert isinstance(got, JobSubmitted)
    return got


ZONE_B = [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["b"]}]


def test_preferred_node_affinity_becomes_the_task_groups_soft_affinity() -> None:
    """Each term as a required one is read (``matchFields`` on ``metadata.name`` against the
    hostname label); a term that matches no node — an empty preference, or one with ``Gt`` — is
    left out, as it would weigh on no node."""
    preferred = [
        (50, ZONE_B),
        (7, [{"key": "disk", "operator": "Exists"}, {"key": "spot", "operator": "NotIn", "values": ["yes"]}]),
        (30, [{"key": "cores", "operator": "Gt", "values": ["8"]}]),
        (100, []),
    ]
    manifest = pod("p", gpus=1, preferred=preferred, affinity=[ZONE_B])
    soft = manifest["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    soft.append({"weight": 9, "preference": {"matchFields": [{"key": "metadata.name", "operator": "In",
                                                               "values": ["n7"]}]}})  # fmt: skip
    soft.append({"weight": 1, "preference": {}})
    job = round_trip(job_submitted("j", [as_pod(manifest)], CFG))
    (group,) = job.task_groups
    assert [(p.weight, requirements(p.preference)) for p in group.preferred_affinity] == [
        (50, [("topology.kubernetes.io/zone", "In", ("b",))]),
        (7, [("disk", "Exists", ()), ("spot", "NotIn", ("yes",))]),
        (9, [("kubernetes.io/hostname", "In", ("n7",))]),
    ]
    assert [requirements(t) for t in group.node_affinity] == [[("topology.kubernetes.io/zone", "In", ("b",))]]
    assert job.spread is None
    plain = job_submitted("j", [as_pod(pod("q"))], CFG).task_groups[0]
    assert plain.preferred_affinity == ()
    nothing = job_submitted("j", [as_pod(pod("e", preferred=[(100, [])]))], CFG).task_groups[0]
    assert nothing.preferred_affinity == ()  # (Kubernetes: an empty preference matches no node)


def test_pods_preferring_differently_are_different_task_groups() -> None:
    members = [as_pod(pod(f"t-{i}", group="t", preferred=[(10 if i < 2 else 20, ZONE_B)])) for i in range(3)]
    job = job_submitted("group/default/t", members, CFG)
    assert [(g.count, g.preferred_affinity[0].weight) for g in job.task_groups] == [(2, 10), (1, 20)]


@pytest.mark.parametrize("weight", [0, 101, -5])
def test_a_preference_weight_outside_1_to_100_is_refused_naming_the_field(weight: int) -> None:
    manifest = pod("p", preferred=[(40, ZONE_B), (weight, ZONE_B)])
    field = "spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[1].weight"
    with pytest.raises(ValueError, match=re.escape(f"{field}={weight}: 1..100")):
        job_submitted("j", [as_pod(manifest)], CFG)


GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
HOST = "kubernetes.io/hostname"


def host_apart(selector: dict[str, Any] | None, **more: Any) -> dict[str, Any]:
    term: dict[str, Any] = {"topologyKey": HOST, **more}
    if selector is not None:
        term["labelSelector"] = selector
    return term


def gang(anti: list[dict[str, Any]] | None, size: int = 3, **more: Any) -> list[Pod]:
    return [as_pod(pod(f"t-{i}", gpus=1, group="t", anti_affinity=anti, **more)) for i in range(size)]


@pytest.mark.parametrize(
    "selector",
    [
        {"matchLabels": {GROUP_LABEL: "t"}},
        {"matchExpressions": [{"key": GROUP_LABEL, "operator": "In", "values": ["t"]}]},
        {"matchLabels": {GROUP_LABEL: "t", "app": "train"}, "matchExpressions": [
            {"key": "role", "operator": "DoesNotExist"}, {"key": "app", "operator": "Exists"}]},
        {"matchLabels": {"app": "train"}},
    ],
)  # fmt: skip
def test_host_anti_affinity_among_a_gangs_pods_spreads_it_one_a_node(selector: dict[str, Any]) -> None:
    anti = [host_apart(selector, namespaces=["default"], matchLabelKeys=[GROUP_LABEL])]
    job = round_trip(job_submitted("group/default/t", gang(anti, labels={"app": "train"}), CFG))
    assert job.spread == "host"
    (group,) = job.task_groups
    assert (group.count, group.node_affinity) == (3, ())
    assert job_submitted("group/default/t", gang(None), CFG).spread is None


def test_one_pod_with_the_term_spreads_the_whole_gang() -> None:
    """A pod with the term keeps off its gang's other pods, and they (by Kubernetes' symmetry)
    off it: fleetlog spreads the whole gang, which is never looser."""
    members = gang(None)
    apart = [host_apart({"matchLabels": {GROUP_LABEL: "t"}})]
    members[1] = as_pod(pod("t-1", gpus=1, group="t", anti_affinity=apart))
    assert job_submitted("group/default/t", members, CFG).spread == "host"


def test_a_one_pod_job_with_host_anti_affinity_among_its_own_pods_needs_nothing() -> None:
    lone = pod("solo", labels={"app": "solo"}, anti_affinity=[host_apart({"matchLabels": {"app": "solo"}})])
    job = job_submitted("pod/default/solo/01234567", [as_pod(lone)], CFG)
    assert job.spread is None
    assert job.task_groups[0].node_affinity == ()
    (single,) = gang([host_apart({"matchLabels": {GROUP_LABEL: "t"}})], size=1)
    assert job_submitted("group/default/t", [single], CFG).spread is None


@pytest.mark.parametrize(
    "term",
    [
        host_apart({"matchLabels": {GROUP_LABEL: "t"}}) | {"topologyKey": "topology.kubernetes.io/zone"},
        host_apart({"matchLabels": {GROUP_LABEL: "other"}}),
        host_apart({"matchExpressions": [{"key": GROUP_LABEL, "operator": "NotIn", "values": ["t"]}]}),
        host_apart({"matchLabels": {"app": "db"}}),
        host_apart({"matchLabels": {GROUP_LABEL: "t"}}, namespaces=["default", "other"]),
        host_apart({"matchLabels": {GROUP_LABEL: "t"}}, namespaceSelector={}),
        host_apart({"matchLabels": {GROUP_LABEL: "t"}}, mismatchLabelKeys=[GROUP_LABEL]),
    ],
    ids=["zone", "another-group", "not-in-own-group", "other-pods", "other-namespaces", "all-namespaces",
         "mismatch-label-keys"],
)  # fmt: skip
def test_other_pod_anti_affinity_makes_the_pod_wait_naming_it(term: dict[str, Any]) -> None:
    """A required term fleetlog cannot keep becomes the pod's only node-affinity term, one no
    node meets (another term beside it would OR it away): the pod waits, and its
    ``PodScheduled`` reason names the key, rather than land where kube-scheduler would not put it."""
    members = gang([host_apart({"matchLabels": {GROUP_LABEL: "t"}}), term], affinity=[ZONE_B])
    job = round_trip(job_submitted("group/default/t", members, CFG))
    (group,) = job.task_groups
    assert group.node_affinity == (UNSUPPORTED_POD_ANTI_AFFINITY,)
    assert requirements(UNSUPPORTED_POD_ANTI_AFFINITY) == [
        ("fleetlog.dev/unsupported-pod-anti-affinity", "Exists", ()),
        ("fleetlog.dev/unsupported-pod-anti-affinity", "DoesNotExist", ()),
    ]
    lone = as_pod(pod("solo", anti_affinity=[term]))
    wait = () if "NotIn" in str(term) else (UNSUPPORTED_POD_ANTI_AFFINITY,)  # (NotIn [t] selects it: alone)
    assert job_submitted("j", [lone], CFG).task_groups[0].node_affinity == wait


def test_required_pod_affinity_makes_the_pod_wait_and_preferred_pod_terms_are_not_read() -> None:
    together = pod("p", labels={"app": "x"})
    together["spec"]["affinity"] = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        host_apart({"matchLabels": {"app": "x"}})]}}  # fmt: skip
    (group,) = job_submitted("j", [as_pod(together)], CFG).task_groups
    assert group.node_affinity == (UNSUPPORTED_POD_AFFINITY,)
    weighted = {"weight": 100, "podAffinityTerm": host_apart({"matchLabels": {"app": "db"}})}
    soft = {"preferredDuringSchedulingIgnoredDuringExecution": [weighted]}
    members = []
    for i in range(3):
        manifest = pod(f"t-{i}", gpus=1, group="t")
        manifest["spec"]["affinity"] = {"podAffinity": soft, "podAntiAffinity": soft}
        members.append(as_pod(manifest))
    job = job_submitted("group/default/t", members, CFG)
    assert (job.spread, job.task_groups[0].node_affinity) == (None, ())


def test_anti_affinity_terms_without_a_selector_select_no_pod_and_keep_nothing() -> None:
    anywhere = gang([host_apart(None, topologyKey="topology.kubernetes.io/zone")])
    job = job_submitted("group/default/t", anywhere, CFG)
    assert (job.spread, job.task_groups[0].node_affinity) == (None, ())


def test_pod_shape_sums_containers_and_takes_the_largest_init_container() -> None:
    manifest = pod("p", cpu="500m", mem="1Gi", gpus=2)
    manifest["spec"]["containers"].append({"name": "side", "resources": {"requests": {"cpu": "250m"}}})
    manifest["spec"]["initContainers"] = [
        {"name": "init", "resources": {"requests": {"cpu": "2", "memory": "1Mi"}}}
    ]
    assert pod_shape(as_pod(manifest), CFG) == (2000, 1024, 2)


def test_a_gang_becomes_one_job_with_runs_of_equal_shapes() -> None:
    members = [
        as_pod(pod(f"t-{i}", gpus=1 if i < 3 else 2, group="t", topology="rack", tenant="vision"))
        for i in range(4)
    ]
    job = job_submitted(job_id_of(members[0], CFG), members, CFG)
    assert job.job_id == "group/default/t"
    assert job.tenant == "vision"
    assert job.required_topology == "rack"
    assert [(g.count, g.gpu_count, g.name) for g in job.task_groups] == [(3, 1, "t-0"), (1, 2, "t-3")]


@pytest.mark.parametrize(("gpus", "share", "want"), [(1, "250", (1, 250)), (0, "500", (1, 500)),
                                                      (1, "1000", (1, 1000)), (2, None, (2, 1000)),
                                                      (0, None, (0, 0))])  # fmt: skip
def test_the_gpu_milli_annotation_is_a_share_of_one_gpu(
    gpus: int, share: str | None, want: tuple[int, int]
) -> None:
    manifest = pod("p", gpus=gpus)
    if share is not None:
        manifest["metadata"]["annotations"][CFG.gpu_milli_annotation] = share
    (group,) = job_submitted("j", [as_pod(manifest)], CFG).task_groups
    assert (group.gpu_count, group.gpu_milli) == want


@pytest.mark.parametrize(("gpus", "share", "message"), [
    (1, "0", "fleetlog.dev/gpu-milli='0': thousandths of a GPU, 1..1000"),
    (1, "1001", "1..1000"), (1, "half", "'half'"), (1, "-5", "'-5'"),
    (2, "500", "a share of one GPU, but 2 are asked for"),
])  # fmt: skip
def test_a_bad_gpu_share_is_refused_naming_the_annotation(gpus: int, share: str, message: str) -> None:
    manifest = pod("p", gpus=gpus)
    manifest["metadata"]["annotations"][CFG.gpu_milli_annotation] = share
    with pytest.raises(ValueError, match=re.escape(message)):
        job_submitted("j", [as_pod(manifest)], CFG)


def test_a_lone_pod_is_a_job_named_by_its_uid() -> None:
    lone = as_pod(pod("solo"))
    assert job_id_of(lone, CFG) == "pod/default/solo/01234567"
    assert job_submitted("j", [lone], CFG).task_groups == (
        TaskGroup(count=1, cpu_milli=1000, mem_mib=1024, name="solo"),
    )


def test_phases_become_task_events() -> None:
    manifest = pod("p")
    manifest["spec"]["nodeName"] = "n1"
    assert observation("j", 0, as_pod(manifest)) is None
    assert observation("j", 0, as_pod(manifest, phase="Running")) == TaskStarted(
        job_id="j", task_index=0, node="n1"
    )
    ended = {"containerStatuses": [{"name": "main", "state": {"terminated": {"exitCode": 0}}}]}
    assert observation("j", 0, as_pod(manifest, phase="Succeeded", **ended)) == TaskFinished(
        job_id="j", task_index=0
    )
    crashed = {"containerStatuses": [{"name": "main", "state": {"terminated": {"exitCode": 137}}}]}
    failed = observation("j", 0, as_pod(manifest, phase="Failed", reason="OOMKilled", **crashed))
    assert failed == TaskFailed(job_id="j", task_index=0, reason="OOMKilled", exit_code=137)


def test_the_ledger_drops_what_the_log_already_says() -> None:
    ledger = Ledger("kubernetes")
    job = JobSubmitted(job_id="j", tenant="t", task_groups=(TaskGroup(count=2, cpu_milli=1, mem_mib=1),))
    assert ledger.novel(job)
    assert not ledger.novel(job)
    assert ledger.novel(TaskStarted(job_id="j", task_index=0, node="n"))
    assert not ledger.novel(TaskStarted(job_id="j", task_index=0, node="n"))
    assert ledger.novel(TaskFinished(job_id="j", task_index=0))
    assert ledger.novel(TaskFinished(job_id="j", task_index=1))
    assert not ledger.novel(JobCancelled(job_id="j")), "a job whose tasks all ended is not cancelled"
    assert not ledger.novel(JobCancelled(job_id="never-submitted"))
    beat = node_heartbeat(as_node(node("n1")), CFG)
    assert ledger.novel(beat)
    assert not ledger.novel(beat)
