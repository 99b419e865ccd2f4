"""Observations: nodes and fleetlog's pods, as the API server lists and watches them → input events.

- a node → ``NodeHeartbeat`` when what it says changes, and again every ``heartbeat_ms``;
  a deleted node → ``NodeRemoved``;
- an unbound pod → ``JobSubmitted`` (a lone pod at once; a pod group once its ``minMember``
  pods exist); a bound pod's phase → ``TaskStarted`` / ``TaskFinished`` / ``TaskFailed``;
  a deleted pod → ``JobCancelled``.

Everything goes through the :class:`Emitter`, which drops what the inputs log already says.
"""

from __future__ import annotations

import logging
import zlib

from fleetlog.backends.kubernetes.api import KubeApi, KubeApiError, KubeUnreachableError
from fleetlog.backends.kubernetes.config import KubeBackendConfig
from fleetlog.backends.kubernetes.emitter import Emitter
from fleetlog.backends.kubernetes.objects import (
    NODE,
    NODE_LIST,
    POD,
    POD_LIST,
    ListMeta,
    Node,
    ObjectMeta,
    Pod,
)
from fleetlog.backends.kubernetes.podgroups import group_size
from fleetlog.backends.kubernetes.translate import (
    Shape,
    group_of,
    job_id_of,
    job_submitted,
    node_heartbeat,
    observation,
    pod_key,
    pod_shape,
)
from fleetlog.backends.kubernetes.watch import Handlers, Kind, Watcher
from fleetlog.events import JobCancelled, NodeRemoved

log = logging.getLogger("fleetlog.backends.kubernetes")


def node_list(data: bytes) -> tuple[list[Node], ListMeta]:
    decoded = NODE_LIST.decode(data)
    return decoded.items, decoded.metadata


def pod_list(data: bytes) -> tuple[list[Pod], ListMeta]:
    decoded = POD_LIST.decode(data)
    return decoded.items, decoded.metadata


NODES: Kind[Node] = Kind("/api/v1/nodes", node_list, NODE.decode, lambda n: n.metadata.resource_version)


def pods_kind(scheduler_name: str) -> Kind[Pod]:
    return Kind(
        "/api/v1/pods",
        pod_list,
        POD.decode,
        lambda p: p.metadata.resource_version,
        field_selector=f"spec.schedulerName={scheduler_name}",
    )


def foreign_pods_kind(scheduler_name: str) -> Kind[Pod]:
    """The bound pods other schedulers placed (or the kubelet and DaemonSets), while they hold
    their node: what fleetlog must not place on (a pod that ends leaves the selector: DELETED)."""
    return Kind(
        "/api/v1/pods",
        pod_list,
        POD.decode,
        lambda p: p.metadata.resource_version,
        field_selector=f"spec.schedulerName!={scheduler_name},spec.nodeName!=,"
        "status.phase!=Succeeded,status.phase!=Failed",
    )


class Observer:
    """The cluster as last seen, and the mapping of pods to fleetlog jobs and tasks."""

    def __init__(self, api: KubeApi, cfg: KubeBackendConfig, emitter: Emitter) -> None:
        self.api, self.cfg, self.emitter = api, cfg, emitter
        self.nodes: dict[str, Node] = {}
        self.pods: dict[str, Pod] = {}
        self.members: dict[str, list[str]] = {}
        """Submitted job id -> its pods' keys, in task order."""
        self.task_of: dict[str, tuple[str, int]] = {}
        """Pod key -> (job id, task index), for pods of submitted jobs."""
        self.groups: dict[str, set[str]] = {}
        """``namespace/group`` -> the keys of the pods labelled with it."""
        timeout = cfg.watch_timeout_s
        self.node_watch = Watcher(api, NODES, Handlers(self.nodes_relisted, self.node_changed), timeout)
        pods = pods_kind(cfg.scheduler_name)
        self.pod_watch = Watcher(api, pods, Handlers(self.pods_relisted, self.pod_changed), timeout)
        self.foreign: dict[str, tuple[str, Shape]] = {}
        """Pod key -> (node, request) of the bound pods fleetlog does not own."""
        self.foreign_on: dict[str, Shape] = {}
        """Node name -> what those pods request there in all (nodes with some only)."""
        held = Handlers(self.foreign_relisted, self.foreign_changed)
        self.foreign_watch = Watcher(api, foreign_pods_kind(cfg.scheduler_name), held, timeout)

    # --- nodes ------------------------------------------------------------------------------

    async def nodes_relisted(self, nodes: list[Node]) -> None:
        now = {n.metadata.name: n for n in nodes}
        for name in sorted(set(self.nodes) | set(self.emitter.ledger.nodes)):
            if name not in now:
                await self.node_changed("DELETED", self.nodes.get(name) or gone_node(name))
        for node in nodes:
            await self.node_changed("MODIFIED", node)

    async def node_changed(self, kind: str, node: Node) -> None:
        name = node.metadata.name
        if kind == "DELETED":
            self.nodes.pop(name, None)
            self.emitter.emit(NodeRemoved(cell=self.cfg.cell, node=name))
            return
        self.nodes[name] = node
        self.report_node(name)

    def report_node(self, name: str, repeat: bool = False) -> None:
        """``name``'s heartbeat with what foreign pods hold there (emitted if it changed, or again)."""
        try:
            beat = node_heartbeat(self.nodes[name], self.cfg, self.foreign_on.get(name, (0, 0, 0)))
        except ValueError as e:
            log.warning("node %s cannot be reported: %s", name, e)
            return
        if repeat:
            self.emitter.repeat(beat)
        else:
            self.emitter.emit(beat)

    # --- pods fleetlog does not own ----------------------------------------------------------

    async def foreign_relisted(self, pods: list[Pod]) -> None:
        before = dict(self.foreign_on)
        self.foreign, self.foreign_on = {}, {}
        for pod in pods:
            self.hold(pod_key(pod), pod)
        for name in sorted(set(before) | set(self.foreign_on)):
            if before.get(name) != self.foreign_on.get(name) and name in self.nodes:
                self.report_node(name)

    async def foreign_changed(self, kind: str, pod: Pod) -> None:
        key = pod_key(pod)
        old = self.foreign.get(key)
        if old is not None:
            self.release(key)
        if kind != "DELETED" and pod.spec.node_name and pod.status.phase not in ("Succeeded", "Failed"):
            self.hold(key, pod)
        for name in sorted({n for n in (old and old[0], pod.spec.node_name) if n}):
            if name in self.nodes:
                self.report_node(name)

    def hold(self, key: str, pod: Pod) -> None:
        shape, node = pod_shape(pod, self.cfg), pod.spec.node_name
        self.foreign[key] = (node, shape)
        cpu, mem, gpus = self.foreign_on.get(node, (0, 0, 0))
        self.foreign_on[node] = (cpu + shape[0], mem + shape[1], gpus + shape[2])

    def release(self, key: str) -> None:
        node, shape = self.foreign.pop(key)
        cpu, mem, gpus = self.foreign_on[node]
        left = (cpu - shape[0], mem - shape[1], gpus - shape[2])
        if any(left):
            self.foreign_on[node] = left
        else:
            del self.foreign_on[node]

    def no_execute(self) -> dict[str, list[tuple[str, str, str]]]:
        """Node name -> its ``NoExecute`` taints (key, value, effect), for the nodes that have any."""
        out: dict[str, list[tuple[str, str, str]]] = {}
        for name, node in self.nodes.items():
            taints = [(t.key, t.value, t.effect) for t in node.spec.taints if t.effect == "NoExecute"]
            if taints:
                out[name] = taints
        return out

    def heartbeat_round(self, part: int = 0, parts: int = 1) -> None:
        """Report the nodes of slice ``part`` of ``parts`` again (:func:`heartbeat_slice`;
        every node when ``parts`` is 1): the core takes a silent node for a dead one."""
        for name in sorted(self.nodes):
            if parts > 1 and heartbeat_slice(name, parts) != part:
                continue
            self.report_node(name, repeat=True)

    # --- pods -------------------------------------------------------------------------------

    async def pods_relisted(self, pods: list[Pod]) -> None:
        now = {pod_key(p) for p in pods}
        for key in sorted(set(self.pods) - now):
            await self.pod_changed("DELETED", self.pods[key])
        for pod in pods:
            self.remember(pod_key(pod), pod)
        for pod in sorted(pods, key=pod_key):
            await self.pod_changed("MODIFIED", pod)

    async def pod_changed(self, kind: str, pod: Pod) -> None:
        key = pod_key(pod)
        if kind == "DELETED":
            self.forget(key, pod)
            self.pod_gone(key, pod)
            return
        self.remember(key, pod)
        job_id = job_id_of(pod, self.cfg)
        if job_id in self.emitter.ledger.jobs:
            self.report_phase(job_id, key, pod)
        elif waiting(pod):
            await self.submit(job_id, pod)

    def remember(self, key: str, pod: Pod) -> None:
        self.pods[key] = pod
        group = group_of(pod, self.cfg)
        if group:
            self.groups.setdefault(f"{pod.metadata.namespace}/{group}", set()).add(key)

    def forget(self, key: str, pod: Pod) -> None:
        self.pods.pop(key, None)
        group = f"{pod.metadata.namespace}/{group_of(pod, self.cfg)}"
        members = self.groups.get(group)
        if members is not None:
            members.discard(key)
            if not members:
                del self.groups[group]

    def report_phase(self, job_id: str, key: str, pod: Pod) -> None:
        task = self.task(job_id, key)
        if task is not None and pod.spec.node_name:
            event = observation(job_id, task, pod)
            if event is not None:
                self.emitter.emit(event)

    def pod_gone(self, key: str, pod: Pod) -> None:
        job_id = job_id_of(pod, self.cfg)
        ledger = self.emitter.ledger
        if job_id in ledger.jobs and self.task(job_id, key) is not None and not ledger.finished(job_id):
            self.emitter.emit(JobCancelled(job_id=job_id, reason=f"pod {key} was deleted"))

    def task(self, job_id: str, key: str) -> int | None:
        """The task index of pod ``key`` in submitted job ``job_id``, or None if not a member."""
        if job_id not in self.members:
            self.members[job_id] = self.member_keys(job_id, key)
            for index, member in enumerate(self.members[job_id]):
                self.task_of[member] = (job_id, index)
        found = self.task_of.get(key)
        return found[1] if found is not None and found[0] == job_id else None

    def member_keys(self, job_id: str, key: str) -> list[str]:
        """A submitted job's pods in task order: its group's pods by name, as many as it has tasks."""
        pod = self.pods.get(key)
        if pod is None or not group_of(pod, self.cfg):
            return [key]
        return [pod_key(p) for p in self.group_pods(pod)][: self.emitter.ledger.jobs[job_id]]

    def group_pods(self, pod: Pod) -> list[Pod]:
        keys = self.groups.get(f"{pod.metadata.namespace}/{group_of(pod, self.cfg)}", set())
        return [self.pods[k] for k in sorted(keys)]

    async def submit(self, job_id: str, pod: Pod) -> None:
        """Submit the job ``pod`` belongs to, if all of it is there."""
        if not group_of(pod, self.cfg):
            self.submit_members(job_id, [pod])
            return
        size = await self.size(pod)
        if size is None:
            return
        members = [p for p in self.group_pods(pod) if waiting(p)]
        if len(members) >= size:
            self.submit_members(job_id, members[:size])

    def submit_members(self, job_id: str, pods: list[Pod]) -> None:
        try:
            event = job_submitted(job_id, pods, self.cfg)
        except ValueError as e:
            log.warning("job %s cannot be submitted: %s", job_id, e)
            return
        if self.emitter.emit(event):
            self.members[job_id] = [pod_key(p) for p in pods]
            for index, p in enumerate(pods):
                self.task_of[pod_key(p)] = (job_id, index)

    async def size(self, pod: Pod) -> int | None:
        try:
            return await group_size(self.api, pod, self.cfg)
        except (KubeApiError, KubeUnreachableError) as e:
            log.warning("size of pod group of %s unknown for now: %s", pod_key(pod), e)
            return None

    async def retry_incomplete_groups(self) -> None:
        """Look again at pod groups still waiting for their size or members."""
        for group in sorted(self.groups):
            pod = self.pods[min(self.groups[group])]
            job_id = job_id_of(pod, self.cfg)
            if job_id not in self.emitter.ledger.jobs and waiting(pod):
                await self.submit(job_id, pod)

    def keys_of(self, job_id: str) -> list[str]:
        return self.members.get(job_id, [])


def waiting(pod: Pod) -> bool:
    """An unbound, live pod that has not ended."""
    return (
        not pod.spec.node_name
        and pod.metadata.deletion_timestamp is None
        and pod.status.phase not in ("Succeeded", "Failed")
    )


def gone_node(name: str) -> Node:
    return Node(metadata=ObjectMeta(name=name))


def heartbeat_slice(node: str, parts: int) -> int:
    """The slice of a heartbeat round (``KubeBackendConfig.heartbeat_slices``) that re-reports
    ``node``: a hash of its name, so it stays in its slice as other nodes come and go, and so
    in every process (CRC-32, not Python's salted ``hash``)."""
    return zlib.crc32(node.encode()) % parts
