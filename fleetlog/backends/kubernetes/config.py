"""Settings of the Kubernetes backend: which pods are fleetlog's, and which labels mean what."""

from __future__ import annotations

from typing import Annotated

import msgspec


class KubeBackendConfig(msgspec.Struct, frozen=True, kw_only=True):
    cell: str = "kubernetes"
    """The fleetlog cell this cluster is; ``JobPlaced`` decisions for other cells are not ours."""
    scheduler_name: str = "fleetlog"
    """Pods with this ``spec.schedulerName`` are fleetlog's to place."""
    producer_id: str = "fleetlog-kubernetes"
    gpu_resource: str = "nvidia.com/gpu"
    gpu_model_label: str = "nvidia.com/gpu.product"
    zone_label: str = "topology.kubernetes.io/zone"
    block_label: str = "fleetlog.dev/block"
    """The topology block of a node; nodes without it take their zone as block."""
    rack_label: str = "fleetlog.dev/rack"
    pod_group_label: str = "scheduling.x-k8s.io/pod-group"
    group_size_annotation: str = "fleetlog.dev/pod-group-size"
    """A gang's size when no PodGroup object (``scheduling.x-k8s.io/v1alpha1``) says ``minMember``."""
    topology_annotation: str = "fleetlog.dev/required-topology"
    """``block``, ``rack`` or ``host``: every pod of the gang in one such domain."""
    duration_annotation: str = "fleetlog.dev/expected-duration-ms"
    tenant_label: str = "fleetlog.dev/tenant"
    """The tenant of a pod; the pod's namespace when the label is absent."""
    queue_label: str = "fleetlog.dev/queue"
    gpu_milli_annotation: str = "fleetlog.dev/gpu-milli"
    """A fractional GPU: thousandths of one GPU (1..1000) a pod asking for at most one GPU takes
    in fleetlog's accounting (``gpu_milli``), so pods sharing a GPU pack onto one device; the
    share itself is the cluster's to enforce (time-slicing, MPS)."""
    heartbeat_ms: int = 10_000
    """Every node the API server lists is re-reported this often (the core's node timeout is 60 s)."""
    heartbeat_slices: Annotated[int, msgspec.Meta(ge=1, le=1_000)] = 10
    """A round of re-reports is sent in this many slices, ``heartbeat_ms / heartbeat_slices``
    apart, each node in the slice its name hashes to (``observer.heartbeat_slice``): each node
    is still re-reported every ``heartbeat_ms``, and the inputs log sees a steady trickle, not
    every node of the cell at once (a round of 10,000 at once held submissions behind it in the
    latency benchmark, benchmarks/README.md "shards"). 1: every node at once."""
    bind_concurrency: int = 64
    """Requests (bindings, evictions, status patches) in flight at once."""
    flush_ms: int = 5
    """Observations are gathered this long into one append to the inputs log."""
    watch_timeout_s: int = 300
    """Each watch request asks the API server to end it after this long; it is then resumed."""
