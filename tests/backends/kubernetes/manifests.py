"""Builders of the manifests the tests apply with kubectl (JSON is YAML, so no YAML library)."""

from __future__ import annotations

import json
from typing import Any

from tests.backends.kubernetes.kubelet import EXIT_CODE, RUN_MS


def node(name: str, *, gpus: int = 0, rack: str = "r1", block: str = "b1", cpu: str = "64",
         mem: str = "512Gi", model: str = "H100", ready: bool = True,
         labels: dict[str, str] | None = None, taints: list[dict[str, str]] | None = None,
         unschedulable: bool = False) -> dict[str, Any]:  # fmt: skip
    extra = labels or {}
    labels = {"fleetlog.dev/rack": rack, "fleetlog.dev/block": block, "kubernetes.io/hostname": name}
    labels |= extra
    allocatable = {"cpu": cpu, "memory": mem, "pods": "110"}
    if gpus:
        labels["nvidia.com/gpu.product"] = model
        allocatable["nvidia.com/gpu"] = str(gpus)
    spec: dict[str, Any] = {}
    if taints:
        spec["taints"] = taints
    if unschedulable:
        spec["unschedulable"] = True
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": spec,
        "status": {
            "capacity": allocatable,
            "allocatable": allocatable,
            "conditions": [
                {"type": "Ready", "status": "True" if ready else "False", "reason": "KubeletReady"}
            ],
        },
    }


def pod(name: str, *, namespace: str = "default", gpus: int = 0, cpu: str = "1", mem: str = "1Gi",
        group: str = "", group_size: int | None = None, topology: str = "", priority_class: str = "",
        run_ms: int | None = None, exit_code: int = 0, tenant: str = "",
        node_selector: dict[str, str] | None = None, affinity: list[list[dict[str, Any]]] | None = None,
        tolerations: list[dict[str, str]] | None = None,
        preferred: list[tuple[int, list[dict[str, Any]]]] | None = None,
        anti_affinity: list[dict[str, Any]] | None = None,
        labels: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """A pod; ``affinity``: required node-affinity terms, each a list of ``matchExpressions``;
    ``preferred``: preferred node-affinity terms, (weight, ``matchExpressions``) each;
    ``anti_affinity``: required ``podAntiAffinity`` terms as they are; ``labels``: more labels."""
    labels = dict(labels or {})
    notes: dict[str, str] = {}
    if group:
        labels["scheduling.x-k8s.io/pod-group"] = group
    if group_size is not None:
        notes["fleetlog.dev/pod-group-size"] = str(group_size)
    if topology:
        notes["fleetlog.dev/required-topology"] = topology
    if tenant:
        labels["fleetlog.dev/tenant"] = tenant
    if run_ms is not None:
        notes[RUN_MS] = str(run_ms)
        notes[EXIT_CODE] = str(exit_code)
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    spec: dict[str, Any] = {
        "schedulerName": "fleetlog",
        "containers": [
            {"name": "main", "image": "fleetlog/test", "resources": {"requests": {"cpu": cpu, "memory": mem},
                                                                    "limits": limits}}
        ],
    }  # fmt: skip
    if priority_class:
        spec["priorityClassName"] = priority_class
    if node_selector:
        spec["nodeSelector"] = node_selector
    if affinity:
        terms = [{"matchExpressions": term} for term in affinity]
        spec["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
        }
    if preferred:
        soft = [{"weight": w, "preference": {"matchExpressions": term}} for w, term in preferred]
        node_affinity = spec.setdefault("affinity", {}).setdefault("nodeAffinity", {})
        node_affinity["preferredDuringSchedulingIgnoredDuringExecution"] = soft
    if anti_affinity:
        apart = {"requiredDuringSchedulingIgnoredDuringExecution": anti_affinity}
        spec.setdefault("affinity", {})["podAntiAffinity"] = apart
    if tolerations:
        spec["tolerations"] = tolerations
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels, "annotations": notes},
        "spec": spec,
    }


def priority_class(name: str, value: int) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name, "labels": {"fleetlog.test": "true"}},
        "value": value,
    }


def pod_group_crd() -> dict[str, Any]:
    """The part of scheduler-plugins' PodGroup CRD that fleetlog reads (``spec.minMember``)."""
    schema = {
        "type": "object",
        "properties": {
            "spec": {"type": "object", "properties": {"minMember": {"type": "integer", "minimum": 1}}},
            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "podgroups.scheduling.x-k8s.io"},
        "spec": {
            "group": "scheduling.x-k8s.io",
            "scope": "Namespaced",
            "names": {
                "plural": "podgroups",
                "singular": "podgroup",
                "kind": "PodGroup",
                "shortNames": ["pg"],
            },
            "versions": [
                {"name": "v1alpha1", "served": True, "storage": True, "schema": {"openAPIV3Schema": schema}}
            ],
        },
    }


def pod_group(name: str, min_member: int, namespace: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"minMember": min_member},
    }


def items(*objects: dict[str, Any]) -> str:
    """One manifest (a v1 List) holding ``objects``, for a single ``kubectl apply``."""
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)})
