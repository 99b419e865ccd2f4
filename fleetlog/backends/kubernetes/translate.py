"""Kubernetes objects → fleetlog events: pure functions, no I/O.

Identity rules (written down in docs/kubernetes.md):

- a lone pod is the one-task job ``pod/<namespace>/<name>/<uid[:8]>`` (a pod recreated under the
  same name, as a StatefulSet does, is a new job);
- the pods labelled ``scheduling.x-k8s.io/pod-group: <group>`` form the gang job
  ``group/<namespace>/<group>``; its task ``i`` is the ``i``-th member by pod name.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

import msgspec

from fleetlog.backends.kubernetes.config import KubeBackendConfig
from fleetlog.backends.kubernetes.objects import (
    LabelSelector,
    Node,
    Pod,
    PodAffinityTerm,
    PreferredSchedulingTerm,
    SelectorRequirement,
    SelectorTerm,
    count,
    mib,
    milli,
)
from fleetlog.events import (
    InputEvent,
    JobSubmitted,
    NodeHeartbeat,
    TaskFailed,
    TaskFinished,
    TaskGroup,
    TaskStarted,
)
from fleetlog.events.model import (
    MAX_ANNOTATION_CHARS,
    MAX_CONSTRAINT_ITEMS,
    MAX_GPUS_PER_NODE,
    MAX_JOB_ANNOTATIONS,
    MAX_JOB_LABELS,
    MAX_JOB_METADATA_BYTES,
    NOT_PRINTABLE,
    TAINT_EFFECTS,
    TOPOLOGY_LEVELS,
    NodeLabel,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    PreferredTerm,
    SpreadLevel,
    Taint,
    Toleration,
    TopologyLevel,
    metadata_bytes,
)
from fleetlog.numerals import whole

MAX_PRIORITY: Final = 1_000_000
MAX_NAME: Final = 253
_UNPRINTABLE: Final = re.compile(f"[{NOT_PRINTABLE}]").search
HOSTNAME_LABEL: Final = "kubernetes.io/hostname"
"""The label a ``matchFields`` requirement on ``metadata.name`` is read against (the kubelet
sets it to the node's name)."""


def never(key: str) -> NodeSelectorTerm:
    """A term no node meets (``key`` both exists and does not), which the pending reason names:
    "0/N up nodes ... are eligible: N not matching node affinity <key> Exists"."""
    return NodeSelectorTerm(
        match_expressions=(
            NodeSelectorRequirement(key=key, operator="Exists"),
            NodeSelectorRequirement(key=key, operator="DoesNotExist"),
        )
    )


NEVER: Final = never("fleetlog.dev/unsupported")
"""What a node-affinity term fleetlog cannot read (``Gt``, ``Lt``, a ``matchFields`` other than
``metadata.name``) becomes, so the pod waits with a reason instead of landing where its own
scheduler would not put it."""
UNSUPPORTED_POD_AFFINITY: Final = never("fleetlog.dev/unsupported-pod-affinity")
UNSUPPORTED_POD_ANTI_AFFINITY: Final = never("fleetlog.dev/unsupported-pod-anti-affinity")
"""A pod's whole required node affinity when it has a required pod affinity term, or a
required pod anti-affinity term fleetlog cannot keep (:func:`pod_affinity_reading`): the pod
waits, its ``PodScheduled`` condition naming the key, rather than land where kube-scheduler
would not put it."""
PREFERRED: Final = "spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution"
MIN_WEIGHT, MAX_WEIGHT = 1, 100
Shape = tuple[int, int, int]
"""A pod's request: (cpu milli, memory MiB, whole GPUs)."""


def node_heartbeat(node: Node, cfg: KubeBackendConfig, foreign: Shape = (0, 0, 0)) -> NodeHeartbeat:
    """What the API server says about ``node``: allocatable capacity, GPU model, topology,
    labels, taints, cordon and health; ``foreign``: what the pods on it that other schedulers
    placed request (DaemonSets, kube-scheduler's pods), at most what the node has."""
    alloc, labels = node.status.allocatable, node.metadata.labels
    gpus = min(count(alloc.get(cfg.gpu_resource, "0")), MAX_GPUS_PER_NODE)
    model = labels.get(cfg.gpu_model_label, "unknown") if gpus else ""
    cpu, mem = milli(alloc.get("cpu", "0")), mib(alloc.get("memory", "0"))
    return NodeHeartbeat(
        cell=cfg.cell,
        node=node.metadata.name,
        cpu_milli=cpu,
        mem_mib=mem,
        foreign_cpu_milli=min(foreign[0], cpu),
        foreign_mem_mib=min(foreign[1], mem),
        foreign_gpus=min(foreign[2], gpus),
        gpu_count=gpus,
        gpu_model=model,
        topology=topology(node, cfg),
        labels=node_labels(labels, cfg),
        healthy=node_healthy(node),
        taints=tuple(
            Taint(key=t.key, value=t.value, effect=t.effect)
            for t in node.spec.taints[:MAX_CONSTRAINT_ITEMS]
            if t.effect in TAINT_EFFECTS and t.key
        ),
        unschedulable=node.spec.unschedulable,
    )


def node_labels(labels: dict[str, str], cfg: KubeBackendConfig) -> dict[str, str]:
    """The node's labels a heartbeat carries: the topology and GPU-model labels first, then the
    rest by key, at most 64 (a heartbeat's bound; real nodes carry 20-40)."""
    wanted = (cfg.gpu_model_label, cfg.zone_label, cfg.block_label, cfg.rack_label)
    keys = [k for k in wanted if labels.get(k)]
    keys += sorted(k for k in labels if k not in wanted)
    return {k: labels[k] for k in keys[:MAX_CONSTRAINT_ITEMS]}


def topology(node: Node, cfg: KubeBackendConfig) -> tuple[str, str, str]:
    """(block, rack, host): the block label or else the zone, the rack label, the node's name."""
    labels = node.metadata.labels
    block = labels.get(cfg.block_label) or labels.get(cfg.zone_label) or "default"
    return (block, labels.get(cfg.rack_label) or "default", node.metadata.name)


def node_healthy(node: Node) -> bool:
    """Ready. (Taints and a cordon are not health: they reach the core as they are, and only
    the pods they concern stay off the node.)"""
    return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)


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
    """Task groups for ``pods`` (already in task order): runs of identical shape and
    constraints become one group."""
    groups: list[TaskGroup] = []
    for pod in pods:
        cpu, mem, gpus = pod_shape(pod, cfg)
        gpus, share = gpu_share(pod, gpus, cfg)
        model = pod.spec.node_selector.get(cfg.gpu_model_label)
        group = TaskGroup(
            count=1,
            cpu_milli=cpu,
            mem_mib=mem,
            gpu_count=gpus,
            gpu_milli=share,
            gpu_models=(model,) if model and gpus else (),
            name=pod.metadata.name,
            **pod_constraints(pod),  # type: ignore[arg-type]
        )
        last = groups[-1] if groups else None
        if last is not None and same_shape(last, group):
            groups[-1] = msgspec.structs.replace(last, count=last.count + 1)
        else:
            groups.append(group)
    return tuple(groups)


def gpu_share(pod: Pod, gpus: int, cfg: KubeBackendConfig) -> tuple[int, int]:
    """(GPU count, thousandths of each) a pod takes: whole GPUs, or with the annotation
    ``cfg.gpu_milli_annotation`` a share of one GPU (a pod asking for none or one). A share on
    a pod of several GPUs, or not an integer 1..1000, is refused naming the annotation."""
    text = pod.metadata.annotations.get(cfg.gpu_milli_annotation)
    if text is None:
        return gpus, 1000 if gpus else 0
    share = whole(text.strip(), 9) or 0
    if not 1 <= share <= 1000:
        raise ValueError(f"annotation {cfg.gpu_milli_annotation}={text!r}: thousandths of a GPU, 1..1000")
    if gpus > 1:
        name = cfg.gpu_milli_annotation
        raise ValueError(f"annotation {name}: a share of one GPU, but {gpus} are asked for")
    return 1, share


def pod_constraints(pod: Pod) -> dict[str, tuple[object, ...]]:
    """A pod's ``nodeSelector``, required and preferred node affinity, tolerations and what
    its required pod (anti-)affinity cannot be kept as a task group's fields
    (docs/kubernetes.md: what is read and what is not)."""
    spec = pod.spec
    out: dict[str, tuple[object, ...]] = {}
    if spec.node_selector:
        out["node_selector"] = tuple(NodeLabel(key=k, value=v) for k, v in sorted(spec.node_selector.items()))
    affinity = spec.affinity.node_affinity if spec.affinity else None
    terms = affinity.required_during_scheduling_ignored_during_execution if affinity else None
    if terms is not None and terms.node_selector_terms:
        out["node_affinity"] = tuple(
            selector_term(t) for t in terms.node_selector_terms[:MAX_CONSTRAINT_ITEMS]
        )
    unsupported = pod_affinity_reading(pod)
    if isinstance(unsupported, NodeSelectorTerm):
        out["node_affinity"] = (unsupported,)  # (alone: another term would OR it away)
    if affinity is not None and affinity.preferred_during_scheduling_ignored_during_execution:
        preferred = preferred_terms(affinity.preferred_during_scheduling_ignored_during_execution)
        if preferred:
            out["preferred_affinity"] = preferred
    if spec.tolerations:
        out["tolerations"] = tuple(
            Toleration(
                key=t.key,
                operator="Exists" if t.operator == "Exists" else "Equal",
                value="" if t.operator == "Exists" else t.value,
                effect=t.effect if t.effect in TAINT_EFFECTS else "",
            )
            for t in spec.tolerations[:MAX_CONSTRAINT_ITEMS]
            if t.key or t.operator == "Exists"
        )
    return out


def selector_term(term: SelectorTerm) -> NodeSelectorTerm:
    """One ``nodeSelectorTerm``: its ``matchExpressions``, and ``matchFields`` on
    ``metadata.name`` read against the hostname label; anything else makes it :data:`NEVER`."""
    reqs: list[NodeSelectorRequirement] = []
    for r in term.match_expressions:
        if r.operator not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return NEVER  # (Gt, Lt: label values as integers, not read)
        reqs.append(NodeSelectorRequirement(key=r.key, operator=r.operator, values=tuple(r.values)))  # type: ignore[arg-type]
    for r in term.match_fields:
        if r.key != "metadata.name" or r.operator not in ("In", "NotIn"):
            return NEVER
        reqs.append(NodeSelectorRequirement(key=HOSTNAME_LABEL, operator=r.operator, values=tuple(r.values)))  # type: ignore[arg-type]
    if not reqs or len(reqs) > MAX_CONSTRAINT_ITEMS:
        return NEVER  # (an empty term matches no node, as Kubernetes says)
    return NodeSelectorTerm(match_expressions=tuple(reqs))


def preferred_terms(terms: Sequence[PreferredSchedulingTerm]) -> tuple[PreferredTerm, ...]:
    """``preferredDuringSchedulingIgnoredDuringExecution`` as soft affinity terms, each read as
    a required term is (:func:`selector_term`). A weight outside 1..100 (the API server's own
    bound) is refused naming the field; a term that matches no node — an empty preference, as
    Kubernetes says, or one fleetlog cannot read (``Gt``, ``Lt``, another ``matchFields``) —
    is left out: it would add its weight to no node."""
    out: list[PreferredTerm] = []
    for i, t in enumerate(terms):
        if not MIN_WEIGHT <= t.weight <= MAX_WEIGHT:
            raise ValueError(f"{PREFERRED}[{i}].weight={t.weight}: {MIN_WEIGHT}..{MAX_WEIGHT}")
        term = selector_term(t.preference) if t.preference is not None else NEVER
        if term != NEVER:
            out.append(PreferredTerm(weight=t.weight, preference=term))
    return tuple(out[:MAX_CONSTRAINT_ITEMS])


def pod_affinity_reading(pod: Pod) -> SpreadLevel | NodeSelectorTerm | None:
    """What a pod's required pod (anti-)affinity makes of it (the preferred terms are not read:
    a preference never makes a placement wrong).

    - ``"host"``: a ``podAntiAffinity`` term on ``kubernetes.io/hostname``, over the pod's own
      namespace, whose ``labelSelector`` selects the pod itself (the pod-group label of its
      gang, say) — read as "the pods of this job on distinct nodes" (``JobSubmitted.spread``;
      for a one-pod job, nothing). Other jobs' pods the selector also selects are not kept away.
    - a term no node meets (:data:`UNSUPPORTED_POD_AFFINITY`,
      :data:`UNSUPPORTED_POD_ANTI_AFFINITY`): any ``podAffinity`` term; a ``podAntiAffinity``
      term on another topology key, over other namespaces, or whose selector does not select
      the pod itself. The pod waits, saying so.
    - None: nothing to keep (no such terms, or anti-affinity terms with no selector: they
      select no pod)."""
    affinity = pod.spec.affinity
    if affinity is None:
        return None
    together, apart = affinity.pod_affinity, affinity.pod_anti_affinity
    if together is not None and together.required_during_scheduling_ignored_during_execution:
        return UNSUPPORTED_POD_AFFINITY
    reading: SpreadLevel | None = None
    for term in apart.required_during_scheduling_ignored_during_execution if apart is not None else ():
        if term.label_selector is None:
            continue
        if not spreads_own_pods(term, pod):
            return UNSUPPORTED_POD_ANTI_AFFINITY
        reading = "host"
    return reading


def spreads_own_pods(term: PodAffinityTerm, pod: Pod) -> bool:
    """Is ``term`` an anti-affinity on the host level among pods like ``pod`` (its namespace, a
    selector that selects it)?"""
    namespace = pod.metadata.namespace
    return (
        term.topology_key == HOSTNAME_LABEL
        and term.namespace_selector is None
        and all(ns == namespace for ns in term.namespaces)
        and term.label_selector is not None
        and selects(term.label_selector, pod.metadata.labels)
        and not any(key in pod.metadata.labels for key in term.mismatch_label_keys)
    )  # (matchLabelKeys: the pod's own values, which it has; mismatchLabelKeys: other values only)


def selects(selector: LabelSelector, labels: dict[str, str]) -> bool:
    """A ``metav1.LabelSelector`` over ``labels`` (``{}`` selects every pod)."""
    return all(labels.get(k) == v for k, v in selector.match_labels.items()) and all(
        label_met(labels, r) for r in selector.match_expressions
    )


def label_met(labels: dict[str, str], r: SelectorRequirement) -> bool:
    match r.operator:
        case "In":
            return labels.get(r.key) in r.values
        case "NotIn":
            return labels.get(r.key) not in r.values
        case "Exists":
            return r.key in labels
        case "DoesNotExist":
            return r.key not in labels
    return False


def same_shape(a: TaskGroup, b: TaskGroup) -> bool:
    """Equal but for the count and the name."""
    return msgspec.structs.replace(a, count=1, name="") == msgspec.structs.replace(b, count=1, name="")


def job_submitted(job_id: str, pods: Sequence[Pod], cfg: KubeBackendConfig) -> JobSubmitted:
    """The job ``pods`` form (``pods`` in task order; the first speaks for the gang's settings)."""
    first = pods[0]
    labels, notes = first.metadata.labels, first.metadata.annotations
    spread: SpreadLevel | None = None
    if len(pods) > 1 and any(pod_affinity_reading(p) == "host" for p in pods):
        spread = "host"  # (a pod with the term keeps off every other pod of its job, and they off it)
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
        expected_duration_ms=whole(duration, 15),
        spread=spread,
        labels=(kept := kept_labels(labels)),
        annotations=kept_annotations(notes, metadata_bytes(kept, {})),
    )


def _is_name(text: str) -> bool:
    return 0 < len(text) <= MAX_NAME and _UNPRINTABLE(text) is None


def kept_labels(labels: dict[str, str]) -> dict[str, str]:
    """A pod's labels as its job carries them: in key order, the first 64 of those within a job
    label's bounds (a key of 1..253 characters: a prefixed Kubernetes key can be longer).  The
    rest are left out: a pod is never refused for its labels (docs/kubernetes.md)."""
    valid = [(k, v) for k, v in sorted(labels.items()) if _is_name(k) and (not v or _is_name(v))]
    kept: dict[str, str] = {}
    size = 0
    for key, value in valid[:MAX_JOB_LABELS]:  # (and within the job's metadata bytes)
        more = metadata_bytes({key: value}, {})
        if size + more <= MAX_JOB_METADATA_BYTES:
            kept[key], size = value, size + more
    return kept


def kept_annotations(notes: dict[str, str], used: int = 0) -> dict[str, str]:
    """A pod's annotations as its job carries them: in key order, each whose key is within
    bounds and that still fits the job's 64 entries, 16,384 characters and, with the ``used``
    bytes of its labels, 16,384 bytes; one that does not fit (a large
    ``kubectl.kubernetes.io/last-applied-configuration``) is left out, the next may fit."""
    kept: dict[str, str] = {}
    chars, size = 0, used
    for key, value in sorted(notes.items()):
        if len(kept) == MAX_JOB_ANNOTATIONS:
            break
        more = metadata_bytes({}, {key: value})
        if (_is_name(key) and chars + len(key) + len(value) <= MAX_ANNOTATION_CHARS
                and size + more <= MAX_JOB_METADATA_BYTES):
            kept[key] = value
            chars, size = chars + len(key) + len(value), size + more
    return kept


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
