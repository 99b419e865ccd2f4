"""Kubernetes objects → fleetlog events: pure functions, no I/O.

Identity rules (written down in docs/kubernetes.md):

- a lone pod is the one-task job ``pod/<namespace>/<name>/<uid[:8]>`` (a pod recreated under the
  same name, as a StatefulSet does, is a new job);
- the pods labelled ``scheduling.x-k8s.io/pod-group: <group>`` form the gang job
  ``group/<namespace>/<group>``; its task ``i`` is the ``i``-th member by pod name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import msgspec

from fleetlog.backends.kubernetes.config import KubeBackendConfig
from fleetlog.backends.kubernetes.objects import Node, Pod, count, mib, milli
from fleetlog.events import (
    InputEvent,
    JobSubmitted,
    NodeHeartbeat,
    TaskFailed,
    TaskFinished,
    TaskGroup,
    TaskStarted,
)
from fleetlog.events.model import MAX_GPUS_PER_NODE, TOPOLOGY_LEVELS, TopologyLevel

MAX_PRIORITY: Final = 1_000_000
UNHEALTHY_TAINT_EFFECTS: Final = ("NoSchedule", "NoExecute")
Shape = tuple[int, int, int]
"""A pod's request: (cpu milli, memory MiB, whole GPUs)."""


def node_heartbeat(node: Node, cfg: KubeBackendConfig) -> NodeHeartbeat:
    """What the API server says about ``node``: allocatable capacity, GPU model, topology, health."""
    alloc, labels = node.status.allocatable, node.metadata.labels
    gpus = min(count(alloc.get(cfg.gpu_resource, "0")), MAX_GPUS_PER_NODE)
    model = labels.get(cfg.gpu_model_label, "unknown") if gpus else ""
    wanted = (cfg.gpu_model_label, cfg.zone_label, cfg.block_label, cfg.rack_label)
    return NodeHeartbeat(
        cell=cfg.cell,
        node=node.metadata.name,
        cpu_milli=milli(alloc.get("cpu", "0")),
        mem_mib=mib(alloc.get("memory", "0")),
        gpu_count=gpus,
        gpu_model=model,
        topology=topology(node, cfg),
        labels={k: labels[k] for k in wanted if labels.get(k)},
        healthy=node_healthy(node),
    )


def topology(node: Node, cfg: KubeBackendConfig) -> tuple[str, str, str]:
    """(block, rack, host): the block label or else the zone, the rack label, the node's name."""
    labels = node.metadata.labels
    block = labels.get(cfg.block_label) or labels.get(cfg.zone_label) or "default"
    return (block, labels.get(cfg.rack_label) or "default", node.metadata.name)


def node_healthy(node: Node) -> bool:
    """Ready, schedulable, and no NoSchedule/NoExecute taint."""
    ready = any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)
    tainted = any(t.effect in UNHEALTHY_TAINT_EFFECTS for t in node.spec.taints)
    return ready and not tainted and not node.spec.unschedulable


# --- pods -----------------------------------------------------------------------------------


def group_of(pod: Pod, cfg: KubeBackendConfig) -> str:
    """The pod group a pod belongs to, or "" for a lone pod."""
    return pod.metadata.labels.get(cfg.pod_group_label, "")


def job_id_of(pod: Pod, cfg: KubeBackendConfig) -> str:
    meta = pod.metadata
    group = group_of(pod, cfg)
    if group:
        return f"group/{meta.namespace}/{group}"
    return f"pod/{meta.namespace}/{meta.name}/{meta.uid[:8]}"


def pod_key(pod: Pod) -> str:
    return f"{pod.metadata.namespace}/{pod.metadata.name}"


def pod_shape(pod: Pod, cfg: KubeBackendConfig) -> Shape:
    """The pod's effective request, as the kubelet computes it: the sum over its containers, or
    the largest init container if that is more."""
    total = [0, 0, 0]
    for c in pod.spec.containers:
        for i, v in enumerate(container_request(c.resources.requests, c.resources.limits, cfg)):
            total[i] += v
    for c in pod.spec.init_containers:
        for i, v in enumerate(container_request(c.resources.requests, c.resources.limits, cfg)):
            total[i] = max(total[i], v)
    return (total[0], total[1], total[2])


def container_request(requests: dict[str, str], limits: dict[str, str], cfg: KubeBackendConfig) -> Shape:
    gpu = requests.get(cfg.gpu_resource) or limits.get(cfg.gpu_resource) or "0"
    return (
        milli(requests.get("cpu", "0")),
        mib(requests.get("memory", "0")),
        count(gpu),
    )


def gang_groups(pods: Sequence[Pod], cfg: KubeBackendConfig) -> tuple[TaskGroup, ...]:
    """Task groups for ``pods`` (already in task order): runs of identical shape become one group."""
    groups: list[TaskGroup] = []
    for pod in pods:
        cpu, mem, gpus = pod_shape(pod, cfg)
        model = pod.spec.node_selector.get(cfg.gpu_model_label)
        group = TaskGroup(
            count=1,
            cpu_milli=cpu,
            mem_mib=mem,
            gpu_count=gpus,
            gpu_milli=1000 if gpus else 0,
            gpu_models=(model,) if model and gpus else (),
            name=pod.metadata.name,
        )
        last = groups[-1] if groups else None
        if last is not None and same_shape(last, group):
            groups[-1] = msgspec.structs.replace(last, count=last.count + 1)
        else:
            groups.append(group)
    return tuple(groups)


def same_shape(a: TaskGroup, b: TaskGroup) -> bool:
    return (a.cpu_milli, a.mem_mib, a.gpu_count, a.gpu_models) == (
        b.cpu_milli,
        b.mem_mib,
        b.gpu_count,
        b.gpu_models,
    )


def job_submitted(job_id: str, pods: Sequence[Pod], cfg: KubeBackendConfig) -> JobSubmitted:
    """The job ``pods`` form (``pods`` in task order; the first speaks for the gang's settings)."""
    first = pods[0]
    labels, notes = first.metadata.labels, first.metadata.annotations
    level = notes.get(cfg.topology_annotation, "")
    duration = notes.get(cfg.duration_annotation, "")
    return JobSubmitted(
        job_id=job_id,
        tenant=labels.get(cfg.tenant_label) or first.metadata.namespace or "default",
        task_groups=gang_groups(pods, cfg),
        queue=labels.get(cfg.queue_label) or "default",
        priority=min(max(first.spec.priority, 0), MAX_PRIORITY),
        allowed_cells=(cfg.cell,),
        required_topology=topology_level(level),
        expected_duration_ms=int(duration) if duration.isdigit() else None,
    )


def topology_level(text: str) -> TopologyLevel | None:
    for level in TOPOLOGY_LEVELS:
        if text == level:
            return level
    return None


def observation(job_id: str, index: int, pod: Pod) -> InputEvent | None:
    """What a bound pod's phase reports: started, finished (with its exit code) or failed."""
    match pod.status.phase:
        case "Running" if pod.spec.node_name:
            return TaskStarted(job_id=job_id, task_index=index, node=pod.spec.node_name)
        case "Succeeded":
            return TaskFinished(job_id=job_id, task_index=index, exit_code=exit_code(pod) or 0)
        case "Failed":
            reason = pod.status.reason or pod.status.message or "pod failed"
            return TaskFailed(job_id=job_id, task_index=index, reason=reason[:4096], exit_code=exit_code(pod))
    return None


def exit_code(pod: Pod) -> int | None:
    """The first non-zero exit code of a terminated container, else 0 if one terminated, else None."""
    codes = [s.state.terminated.exit_code for s in pod.status.container_statuses if s.state.terminated]
    nonzero = [c for c in codes if c != 0]
    if nonzero:
        return nonzero[0]
    return 0 if codes else None
