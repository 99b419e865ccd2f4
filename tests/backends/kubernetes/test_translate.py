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
    job_id_of,
    job_submitted,
    node_heartbeat,
    observation,
    pod_shape,
)
from fleetlog.events import JobCancelled, JobSubmitted, TaskFailed, TaskFinished, TaskGroup, TaskStarted
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
