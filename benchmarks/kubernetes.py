"""Pods bound per second by fleetlog against a real kube-apiserver (+ etcd) with 1,000 nodes, alone
and side by side with the stock kube-scheduler (issue 20).

    python -m benchmarks.kubernetes --json [--quick | --smoke] [--repeats N]
                                    [--decide-after REV] [--decide-rounds N] [--no-decide-ratio]

**Against raw bindings**, median of ``--repeats`` runs:

* ``fleetlog_pods_bound_per_s``: ``PODS`` pending pods (``schedulerName: fleetlog``, 1 GPU,
  1 CPU, 1 GiB each) exist; a fresh file log, the real scheduler loop and the Kubernetes backend
  start; the clock runs from the backend's start (first list of nodes and pods included) until
  the backend has bound every pod (one ``pods/binding`` request each, 64 in flight). The loop
  and the backend share this process; etcd and the API server run beside it on the same cores.
  A first run of 200 pods warms up (numba compilation) and is not counted.
* ``raw_bindings_per_s`` (the baseline, same process, same client, same concurrency): the same
  number of pods of another scheduler name bound round-robin with bare binding requests and no
  scheduling at all — the rate at which this API server takes bindings here.
* ``ratio_vs_raw_bindings``: fleetlog / baseline (1.0 means the API server is the limit).

**Side by side with kube-scheduler** (then, on the same API server, its nodes replaced): a fleet
of 1,000 nodes, a third GPU nodes (8 GPUs, 96 CPUs, tainted ``nvidia.com/gpu=present:NoSchedule``,
``nvidia.com/gpu.product`` H100 or A100), the others CPU-only (64 CPUs), all labelled with a zone
(``topology.kubernetes.io/zone``, four) and a rack; ``SIDE_PODS`` pods (:func:`fleet_pods`):
CPU pods, 1-GPU pods tolerating the taint and selecting a GPU model, one pod in seven with a
required node affinity on two zones, and 8-pod gangs of 2-GPU pods (fleetlog: a gang by the
``scheduling.x-k8s.io/pod-group`` label and ``fleetlog.dev/pod-group-size`` annotation; for
kube-scheduler the same pods without them: plain pods). The fleet holds them all (60% of each
model's GPUs, under a third of the CPUs). Each run: the pods are created in a fresh namespace
with nobody placing them, then the scheduler starts — fleetlog's backend and loop, as above
(``schedulerName: fleetlog``), or a fresh kube-scheduler process (``tests.kube_apiserver
.KubeScheduler``: the same release as the API server, default profile and settings, leader
election off, client qps/burst 5,000, no ``schedulerName`` on the pods). **The clock runs from
that start** (the backend's ``start()`` call; kube-scheduler's spawn: its process start and
informer sync are counted as the backend's first lists are) **until the API server lists no pod
of the namespace without ``spec.nodeName``** — the same observer for both: this process polls
``fieldSelector=spec.nodeName=`` every 20 ms. ``*_first_bound_s`` is when a first pod had a node
(start-up), and ``*_bind_phase_pods_per_s`` the rate from then on; ``*_cpu_s`` the CPU seconds the
scheduler (fleetlog: this process; kube-scheduler: its process), the API server and etcd used
over the run (``/proc``), medians. The two alternate (ABBA over
the repeats) on the same nodes, the pods deleted between runs, so each starts on an empty fleet;
one warm-up run of each first, not counted (numba's constraint kernels; the kube-scheduler
binary in the page cache). Keys: ``fleetlog_pods_per_s``, ``kube_scheduler_pods_per_s``
(medians), ``ratio_vs_kube_scheduler`` (target >= 1.5).

**Placement agreement** after every run (warm-ups too), from the API server's final state (every
pod and node listed; :func:`placement_violations`): each bound pod's node meets its
``nodeSelector`` and required node affinity, and the pod tolerates each of the node's
``NoSchedule``/``NoExecute`` taints (and its cordon); no node holds more than its allocatable
``cpu``, ``memory``, ``nvidia.com/gpu`` or ``pods``. ``fleetlog_violations`` and
``kube_scheduler_violations`` are the counts over all of each one's runs.

``decide_unconstrained_ratio``: ``benchmarks.core``'s single-task best-fit placements per second
at 10,000 nodes (no constraints) at ``--decide-after`` (default ``HEAD``) over the same at
3dfbb13, the parent of cdf91a8, which added constraint support (and, in ``decide_unconstrained``,
cdf91a8 itself over 3dfbb13): each revision in a git worktree (``benchmarks.worktree``:
committed code only), a fresh process per measurement, ``--decide-rounds`` (5) rounds of one
process per revision, in turn forward and backward, after one warm-up process per tree (numba
compiles into the tree's cache); each process the median of five decides. About two minutes,
so only at full size (null at ``--quick``/``--smoke`` or with ``--no-decide-ratio``, the reason
under ``not_measured``).

``kube_scheduler_ci_floor``: kube-scheduler's own CI floor for its basic 5,000-node test, as the
pinned release's scheduler_perf configuration says (:data:`KUBE_SCHEDULER_CI_FLOOR`).

``--quick``: 1,000 pods in each part, one run each, no decide ratio (about a minute);
``--smoke``: 64 and 48 pods, one run — a test that it runs, kube-scheduler really started.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Iterable
from fractions import Fraction
from pathlib import Path
from typing import Any

from benchmarks.common import add_smoke, emit, machine
from fleetlog.backends.kubernetes import KubeApi, KubeBackendConfig, KubernetesBackend, KubeUnreachableError
from fleetlog.core.policy import policy_named
from fleetlog.log.file import FileLogStore
from fleetlog.service.loop import LoopConfig, SchedulerLoop
from tests.kube_apiserver import REPO, KubeControlPlane, KubeScheduler

NODES = 1_000
PODS = 5_000
QUICK_PODS = 1_000
SMOKE_PODS = 64
CONCURRENCY = 64
WARMUP_PODS = 200

SIDE_PODS = 5_000
QUICK_SIDE_PODS = 1_000
SMOKE_SIDE_PODS = 48  # one gang and 40 lone pods
SIDE_WARMUP_PODS = 200
GANG = 8
POLL_S = 0.02
RUN_TIMEOUT_S = 600
SLOW_S = 300  # requests the loaded machine made outlast the client's default 30 s
RATIO_TARGET = 1.5
CPU_OF = ("scheduler", "apiserver", "etcd")
GPU = "nvidia.com/gpu"
ZONE_LABEL = "topology.kubernetes.io/zone"
RACK_LABEL = "fleetlog.dev/rack"
MODEL_LABEL = "nvidia.com/gpu.product"
GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
GROUP_SIZE = "fleetlog.dev/pod-group-size"
ZONES = ("zone-a", "zone-b", "zone-c", "zone-d")
MODELS = ("H100", "A100")
GPU_TAINT = {"key": GPU, "value": "present", "effect": "NoSchedule"}
GPU_TOLERATION = {"key": GPU, "operator": "Exists", "effect": "NoSchedule"}

KUBE_SCHEDULER_CI_FLOOR = {
    "pods_per_s": 270,
    "test": "SchedulingBasic/5000Nodes_10000Pods (also its _QueueingHintsEnabled variant)",
    "source": "k8s.io/kubernetes v1.36.3 test/integration/scheduler_perf/misc/performance-config.yaml",
    "note": "the release pinned in infra/kubernetes/tools/go.mod, read from its module; master has "
    "since raised the 5000Nodes_10000Pods threshold to 680",
}

DECIDE_CHANGE = "cdf91a8"  # placement constraints in the core
DECIDE_BEFORE = "3dfbb13"  # its parent: no constraint support
DECIDE_ROUNDS = 5
DECIDE_REPEATS = 5  # decides per process, their median
DECIDE_CHILD = """
import json, statistics, sys
import fleetlog
from benchmarks.core import bench_single
bench_single(1_000, "best-fit")  # loads (or compiles) the kernels, warms the caches
rates = [bench_single(10_000, "best-fit") for _ in range(int(sys.argv[1]))]
print(json.dumps({"fleetlog": fleetlog.__file__, "rates": rates}))
"""


# --- part 1: fleetlog against raw bindings -----------------------------------------------------


def node_body(i: int) -> dict[str, Any]:
    alloc = {"cpu": "96", "memory": "768Gi", "pods": "110", "nvidia.com/gpu": "8"}
    labels = {"fleetlog.dev/rack": f"rack-{i // 16}", "fleetlog.dev/block": f"block-{i // 256}",
              "nvidia.com/gpu.product": "H100"}  # fmt: skip
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": f"node-{i:04d}", "labels": labels},
        "status": {
            "capacity": alloc,
            "allocatable": alloc,
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def pod_body(name: str, scheduler: str) -> dict[str, Any]:
    resources = {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"nvidia.com/gpu": "1"}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": scheduler,
            "containers": [{"name": "main", "image": "x", "resources": resources}],
        },
    }


async def gather_limited(calls: list[Any], limit: int = CONCURRENCY) -> None:
    gate = asyncio.Semaphore(limit)

    async def one(call: Any) -> None:
        async with gate:
            await call

    await asyncio.gather(*(one(c) for c in calls))


async def create_nodes(api: KubeApi, bodies: Iterable[dict[str, Any]] | None = None) -> None:
    nodes = bodies if bodies is not None else (node_body(i) for i in range(NODES))
    await gather_limited([api.request("POST", "/api/v1/nodes", body=b) for b in nodes])


async def create_pods(api: KubeApi, namespace: str, count: int, scheduler: str) -> list[str]:
    names = [f"p-{i:05d}" for i in range(count)]
    await post_pods(api, namespace, [pod_body(n, scheduler) for n in names])
    return names


async def post_pods(api: KubeApi, namespace: str, bodies: list[dict[str, Any]]) -> None:
    path = f"/api/v1/namespaces/{namespace}/pods"
    await gather_limited([api.request("POST", path, body=b) for b in bodies])


async def make_namespace(api: KubeApi, name: str) -> None:
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    await api.request("POST", "/api/v1/namespaces", body=body)


@contextlib.asynccontextmanager
async def fleetlog_running(kube: KubeControlPlane, cell: str) -> AsyncIterator[KubernetesBackend]:
    """A fresh file log, the real scheduler loop driven in the background and a Kubernetes
    backend for ``cell`` (not started: the caller times its start); all stopped and removed after."""
    directory = Path(tempfile.mkdtemp(prefix="fleetlog-kube-bench-"))
    store = FileLogStore(directory)
    await store.open()
    api = await KubeApi.connect(str(kube.kubeconfig))
    loop = SchedulerLoop(store, policy_named("default"), LoopConfig())
    backend = KubernetesBackend(store, api, KubeBackendConfig(cell=cell, bind_concurrency=CONCURRENCY))
    driver = asyncio.create_task(drive(loop))
    try:
        yield backend
    finally:
        driver.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await driver
        await backend.stop()
        await api.close()
        await store.close()
        shutil.rmtree(directory, ignore_errors=True)


async def fleetlog_run(kube: KubeControlPlane, admin: KubeApi, run: int, pods: int) -> float:
    """Pods bound per second by fleetlog, from the backend's start until all are bound."""
    namespace = f"bench-{run}" if run >= 0 else "warmup"
    await make_namespace(admin, namespace)
    await create_pods(admin, namespace, pods, "fleetlog")
    async with fleetlog_running(kube, namespace) as backend:
        start = time.perf_counter()
        await backend.start()
        assert backend.actuator is not None
        while backend.actuator.counts["bound"] < pods:
            if time.perf_counter() - start > RUN_TIMEOUT_S:
                raise RuntimeError(f"only {backend.actuator.counts['bound']} of {pods} pods bound in 600 s")
            await asyncio.sleep(0.01)
        elapsed = time.perf_counter() - start
    await clear(admin, namespace)
    return pods / elapsed


async def drive(loop: SchedulerLoop) -> None:
    await loop.recover()
    while True:
        await loop.step(20)


async def raw_run(admin: KubeApi, run: int, pods: int) -> float:
    """Bindings per second with no scheduler at all: the API server's own rate here."""
    namespace = f"raw-{run}"
    await make_namespace(admin, namespace)
    names = await create_pods(admin, namespace, pods, "nobody")
    start = time.perf_counter()
    await gather_limited(
        [bind(admin, namespace, name, f"node-{i % NODES:04d}") for i, name in enumerate(names)]
    )
    elapsed = time.perf_counter() - start
    await clear(admin, namespace)
    return pods / elapsed


async def bind(api: KubeApi, namespace: str, name: str, node: str) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name, "namespace": namespace},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
    await api.request("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/binding", body=body)


async def clear(api: KubeApi, namespace: str) -> None:
    """Delete the run's pods (one collection delete; no kubelet needs to agree), and wait until
    they are gone, so that the next run starts on an empty fleet."""
    await delete_all(api, f"/api/v1/namespaces/{namespace}/pods", [("gracePeriodSeconds", "0")])


async def delete_all(api: KubeApi, path: str, query: list[tuple[str, str]]) -> None:
    """``DELETE path`` (a collection), then wait until it lists nothing. A collection delete of
    5,000 pods outlasted the client's 30 s on the loaded machine: it gets ``SLOW_S``, and a
    request that times out is followed by the wait all the same (the server goes on deleting)."""
    with contextlib.suppress(KubeUnreachableError):
        await api.request("DELETE", path, query=query, timeout_s=SLOW_S)
    deadline = time.perf_counter() + SLOW_S
    while await listed(api, path):
        if time.perf_counter() > deadline:
            raise RuntimeError(f"{path} still lists objects {SLOW_S} s after their collection delete")
        await asyncio.sleep(0.1)


async def listed(api: KubeApi, path: str, field_selector: str = "") -> bool:
    """Whether ``GET path`` (with that field selector) lists any object (asks for one)."""
    query = [("limit", "1"), *([("fieldSelector", field_selector)] if field_selector else [])]
    return bool(json.loads(await api.request("GET", path, query=query, timeout_s=SLOW_S))["items"])


async def measure(
    kube: KubeControlPlane, repeats: int, pods: int, warm_up: int = WARMUP_PODS
) -> dict[str, Any]:
    admin = await KubeApi.connect(str(kube.kubeconfig), max_connections=CONCURRENCY)
    try:
        started = time.perf_counter()
        await create_nodes(admin)
        setup_nodes_s = time.perf_counter() - started
        await fleetlog_run(kube, admin, -1, warm_up)  # compiles the numba kernels, warms the server
        fleet, raw = [], []
        for run in range(repeats):
            fleet.append(await fleetlog_run(kube, admin, run, pods))
            raw.append(await raw_run(admin, run, pods))
    finally:
        await admin.close()
    return {
        "fleetlog_pods_bound_per_s": round(statistics.median(fleet), 1),
        "raw_bindings_per_s": round(statistics.median(raw), 1),
        "ratio_vs_raw_bindings": round(statistics.median(fleet) / statistics.median(raw), 3),
        "fleetlog_runs": [round(r, 1) for r in fleet],
        "raw_runs": [round(r, 1) for r in raw],
        "create_1000_nodes_s": round(setup_nodes_s, 2),
    }


# --- part 2: side by side with kube-scheduler --------------------------------------------------


def fleet_node(i: int) -> dict[str, Any]:
    """Node ``i`` of the side-by-side fleet: one in three a tainted GPU node (the models
    alternating among them), the others CPU-only; zones in four contiguous quarters, racks of 20."""
    name = f"node-{i:04d}"
    labels = {"kubernetes.io/hostname": name, ZONE_LABEL: ZONES[i * len(ZONES) // NODES],
              RACK_LABEL: f"rack-{i // 20:02d}"}  # fmt: skip
    spec: dict[str, Any] = {}
    if i % 3 == 0:
        labels[MODEL_LABEL] = MODELS[(i // 3) % 2]
        alloc = {"cpu": "96", "memory": "768Gi", "pods": "110", GPU: "8"}
        spec["taints"] = [GPU_TAINT]
    else:
        alloc = {"cpu": "64", "memory": "256Gi", "pods": "110"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": spec,
        "status": {
            "capacity": alloc,
            "allocatable": alloc,
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def fleet_pod(
    name: str,
    requests: dict[str, str],
    gpus: int = 0,
    model: str = "",
    zones: tuple[str, ...] = (),
    group: str = "",
    scheduler: str = "",
) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": requests}
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "x", "resources": resources}]}
    metadata: dict[str, Any] = {"name": name}
    if scheduler:
        spec["schedulerName"] = scheduler
    if gpus:
        resources["limits"] = {GPU: str(gpus)}
        spec["tolerations"] = [GPU_TOLERATION]
        spec["nodeSelector"] = {MODEL_LABEL: model}
    if zones:
        term = {"matchExpressions": [{"key": ZONE_LABEL, "operator": "In", "values": list(zones)}]}
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [term]}}}  # fmt: skip
    if group:
        metadata["labels"] = {GROUP_LABEL: group}
        metadata["annotations"] = {GROUP_SIZE: str(GANG)}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def fleet_pods(count: int, scheduler: str) -> list[dict[str, Any]]:
    """``count`` pods: a gang of 8 for each 625 (at least one), each pod 2 GPUs of one model
    (fleetlog's: a gang by label and annotation; kube-scheduler's: plain pods); of the others,
    three in ten 1-GPU pods (4 CPUs, 16 GiB; tolerating the GPU taint, selecting a model), the
    rest CPU pods of 1, 1.5 or 2 CPUs; one in seven of those with a required node affinity on
    two of the four zones. At 5,000: 64 gang pods, 1,481 GPU pods, 3,455 CPU pods."""
    gang = scheduler == "fleetlog"
    pods = []
    for g in range(max(1, count // 625)):
        for k in range(GANG):
            requests = {"cpu": "8", "memory": "32Gi"}
            group = f"g{g:02d}" if gang else ""
            pods.append(
                fleet_pod(f"g{g:02d}-{k}", requests, 2, MODELS[g % 2], group=group, scheduler=scheduler)
            )
    for i in range(count - len(pods)):
        zones = (ZONES[i % 4], ZONES[(i + 1) % 4]) if i % 7 == 3 else ()
        name = f"p-{i:05d}"
        if i % 10 < 3:
            requests = {"cpu": "4", "memory": "16Gi"}
            pods.append(fleet_pod(name, requests, 1, MODELS[(i // 10) % 2], zones, scheduler=scheduler))
        else:
            cpu, memory = (("1", "2Gi"), ("1500m", "3072Mi"), ("2", "4Gi"))[i % 3]
            pods.append(fleet_pod(name, {"cpu": cpu, "memory": memory}, zones=zones, scheduler=scheduler))
    return pods


async def replace_nodes(api: KubeApi) -> float:
    """Delete every node, create the side-by-side fleet; the seconds it took to create it."""
    await delete_all(api, "/api/v1/nodes", [])
    started = time.perf_counter()
    await create_nodes(api, (fleet_node(i) for i in range(NODES)))
    return time.perf_counter() - started


async def until_bound(api: KubeApi, namespace: str, start: float) -> tuple[float, float, float]:
    """Seconds from ``start`` until a first pod of ``namespace`` had a node, and until none had
    none (each when the poll that saw it returned); and the slowest poll's seconds (a stalled API
    server shows there)."""
    path = f"/api/v1/namespaces/{namespace}/pods"
    first, slowest = None, 0.0
    while True:
        asked = time.perf_counter()
        if first is None and await listed(api, path, "spec.nodeName!="):
            first = time.perf_counter() - start
        if first is not None and not await listed(api, path, "spec.nodeName="):
            return first, time.perf_counter() - start, max(slowest, time.perf_counter() - asked)
        slowest = max(slowest, time.perf_counter() - asked)
        if time.perf_counter() - start > RUN_TIMEOUT_S:
            raise RuntimeError(f"pods of {namespace} still unbound after {RUN_TIMEOUT_S} s")
        await asyncio.sleep(POLL_S)


async def fleetlog_side(kube: KubeControlPlane, admin: KubeApi, namespace: str, count: int) -> dict[str, Any]:
    await make_namespace(admin, namespace)
    await post_pods(admin, namespace, fleet_pods(count, "fleetlog"))
    async with fleetlog_running(kube, namespace) as backend:
        servers, mine = server_cpu(kube), time.process_time()
        start = time.perf_counter()
        poll = asyncio.create_task(until_bound(admin, namespace, start))
        await backend.start()
        first, total, slowest = await poll
        cpu = {"scheduler": time.process_time() - mine} | cpu_since(kube, servers)
    return await finish(admin, namespace, count, first, total) | {"cpu_s": cpu, "slowest_poll_s": slowest}


async def kube_scheduler_side(
    kube: KubeControlPlane, admin: KubeApi, namespace: str, count: int
) -> dict[str, Any]:
    await make_namespace(admin, namespace)
    await post_pods(admin, namespace, fleet_pods(count, ""))
    scheduler = KubeScheduler(kube)
    try:
        servers = server_cpu(kube)
        start = time.perf_counter()
        poll = asyncio.create_task(until_bound(admin, namespace, start))
        pid = await asyncio.to_thread(scheduler.start, False)  # spawned; the poll says when it is done
        first, total, slowest = await poll
        cpu = {"scheduler": cpu_seconds(pid)} | cpu_since(kube, servers)
        attempts = await asyncio.to_thread(schedule_attempts, kube)
    finally:
        await asyncio.to_thread(scheduler.stop)
    more = {"attempts": attempts, "cpu_s": cpu, "slowest_poll_s": slowest}
    return await finish(admin, namespace, count, first, total) | more


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process ``pid`` has used (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_cpu(kube: KubeControlPlane) -> dict[str, float]:
    return {name: cpu_seconds(int((kube.dir / f"{name}.pid").read_text())) for name in ("apiserver", "etcd")}


def cpu_since(kube: KubeControlPlane, before: dict[str, float]) -> dict[str, float]:
    """The CPU seconds the API server and etcd used since ``before`` (:func:`server_cpu`)."""
    return {name: used - before[name] for name, used in server_cpu(kube).items()}


def schedule_attempts(kube: KubeControlPlane) -> dict[str, float]:
    """kube-scheduler's ``scheduler_schedule_attempts_total`` by result, from its /metrics (open
    on 127.0.0.1): more attempts than pods would mean retries."""
    port = re.search(r"^SCHED_PORT=(\d+)$", (kube.dir / "ports").read_text(), re.M)
    assert port, "no SCHED_PORT in the control plane's ports file"
    context = ssl.create_default_context(cafile=str(kube.dir / "certs" / "ca.crt"))
    with urllib.request.urlopen(f"https://127.0.0.1:{port[1]}/metrics", context=context, timeout=10) as r:
        text = r.read().decode()
    found = re.findall(r'^scheduler_schedule_attempts_total\{[^}]*result="(\w+)"[^}]*\} (\S+)$', text, re.M)
    out: dict[str, float] = {}
    for result, value in found:
        out[result] = out.get(result, 0) + float(value)
    return out


async def finish(admin: KubeApi, namespace: str, count: int, first: float, total: float) -> dict[str, Any]:
    """A run's numbers and the placement check of the API server's final state; then the pods go."""
    pods = json.loads(await admin.request("GET", "/api/v1/pods"))["items"]
    nodes = json.loads(await admin.request("GET", "/api/v1/nodes"))["items"]
    found = placement_violations(pods, nodes)
    mine = [p for p in pods if p["metadata"]["namespace"] == namespace]
    await clear(admin, namespace)
    return {
        "pods_per_s": count / total,
        "seconds": total,
        "first_bound_s": first,
        "bind_phase_pods_per_s": count / (total - first) if total > first else None,
        "bound": sum(1 for p in mine if p["spec"].get("nodeName")),
        "violations": found,
    }


async def side_by_side(kube: KubeControlPlane, repeats: int, count: int, warm_up: int) -> dict[str, Any]:
    admin = await KubeApi.connect(str(kube.kubeconfig), max_connections=CONCURRENCY)
    runs: dict[str, list[dict[str, Any]]] = {"fleetlog": [], "kube_scheduler": []}
    warm: dict[str, dict[str, Any]] = {}
    sides = {"fleetlog": fleetlog_side, "kube_scheduler": kube_scheduler_side}
    try:
        nodes_s = await replace_nodes(admin)
        for name, run in sides.items():
            warm[name] = await run(kube, admin, f"{name.replace('_', '-')}-warmup", warm_up)
        for r in range(repeats):
            for name in ("fleetlog", "kube_scheduler") if r % 2 == 0 else ("kube_scheduler", "fleetlog"):
                runs[name].append(await sides[name](kube, admin, f"{name.replace('_', '-')}-{r}", count))
    finally:
        await admin.close()
    out: dict[str, Any] = {}
    for name, done in runs.items():
        out[f"{name}_pods_per_s"] = round(statistics.median(r["pods_per_s"] for r in done), 1)
        found = [v for r in [warm[name], *done] for v in r["violations"]]
        out[f"{name}_violations"] = len(found)
        if found:
            out[f"{name}_violation_examples"] = found[:10]
        bound = [r["bound"] for r in [warm[name], *done]]
        assert bound == [warm_up] + [count] * len(done), (name, bound)  # (until_bound saw it)
    out["ratio_vs_kube_scheduler"] = round(out["fleetlog_pods_per_s"] / out["kube_scheduler_pods_per_s"], 3)
    out["ratio_target"] = RATIO_TARGET
    out["ratio_target_met"] = out["ratio_vs_kube_scheduler"] >= RATIO_TARGET
    pods = fleet_pods(count, "")
    detail: dict[str, Any] = {
        "pods": count,
        "gang_pods": sum(1 for p in pods if p["metadata"]["name"].startswith("g")),
        "gpu_pods": sum(1 for p in pods if "limits" in p["spec"]["containers"][0]["resources"]),
        "zone_affinity_pods": sum(1 for p in pods if "affinity" in p["spec"]),
        "nodes": NODES,
        "gpu_nodes": sum(1 for i in range(NODES) if i % 3 == 0),
        "create_nodes_s": round(nodes_s, 2),
        "warm_up_pods": warm_up,
        "order": "a warm-up run of each, then ABBA: fleetlog first in even repeats, kube-scheduler in odd",
        "clock": "from the scheduler's start (backend.start() / kube-scheduler's spawn) until the API "
        f"server lists no pod of the run's namespace without spec.nodeName (polled every {POLL_S} s)",
        "kube_scheduler_config": "default profile; leaderElect false; clientConnection qps=burst=5000",
        "violations_counted_over": "every run of each, warm-up included",
    }
    for name, done in runs.items():
        detail[f"{name}_runs_pods_per_s"] = [round(r["pods_per_s"], 1) for r in done]
        detail[f"{name}_seconds"] = [round(r["seconds"], 3) for r in done]
        detail[f"{name}_first_bound_s"] = [round(r["first_bound_s"], 3) for r in done]
        detail[f"{name}_slowest_poll_s"] = [round(r["slowest_poll_s"], 3) for r in done]
        phase = [r["bind_phase_pods_per_s"] for r in done if r["bind_phase_pods_per_s"]]
        detail[f"{name}_bind_phase_pods_per_s"] = round(statistics.median(phase), 1) if phase else None
        detail[f"{name}_warm_up_pods_per_s"] = round(warm[name]["pods_per_s"], 1)
        detail[f"{name}_cpu_s"] = {
            k: round(statistics.median(r["cpu_s"][k] for r in done), 2) for k in CPU_OF
        }
    detail["kube_scheduler_attempts"] = [r["attempts"] for r in runs["kube_scheduler"]]
    out["side_by_side"] = detail
    return out


# --- placement agreement -----------------------------------------------------------------------

UNITS: dict[str, Fraction | int] = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50,
    "Ei": 2**60, "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "": 1,
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}  # fmt: skip
QUANTITY = re.compile(r"^([+-]?[0-9]*\.?[0-9]+)(?:[eE]([+-]?[0-9]+))?(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?$")
CHECKED = ("cpu", "memory", GPU, "pods")


def quantity(text: str) -> Fraction:
    """A Kubernetes resource quantity (``500m``, ``1.5``, ``768Gi``, ``1e3``) as an exact number."""
    match = QUANTITY.match(str(text).strip())
    if not match:
        raise ValueError(f"not a quantity: {text!r}")
    number, exponent, unit = match.groups()
    return Fraction(number) * Fraction(10) ** int(exponent or 0) * UNITS[unit or ""]


def pod_requests(pod: dict[str, Any]) -> dict[str, Fraction]:
    """The pod's effective request as the scheduler and the kubelet count it: per resource the sum
    over its containers, or its largest init container if more, plus the pod overhead; a
    container's request is its ``requests`` entry, else its ``limits`` one (as defaulting sets it);
    and one ``pods``."""
    spec = pod["spec"]

    def one(container: dict[str, Any], name: str) -> Fraction:
        resources = container.get("resources") or {}
        value = (resources.get("requests") or {}).get(name, (resources.get("limits") or {}).get(name))
        return quantity(value) if value is not None else Fraction(0)

    out = {}
    for name in CHECKED[:3]:
        main = sum((one(c, name) for c in spec.get("containers") or []), Fraction(0))
        init = max((one(c, name) for c in spec.get("initContainers") or []), default=Fraction(0))
        overhead = quantity((spec.get("overhead") or {}).get(name, "0"))
        out[name] = max(main, init) + overhead
    out["pods"] = Fraction(1)
    return out


def tolerates(toleration: dict[str, Any], taint: dict[str, Any]) -> bool:
    """Kubernetes' rule: an empty effect matches every effect; an empty key with ``Exists`` every
    taint; ``Exists`` any value of its key; ``Equal`` (the default) that value."""
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    operator = toleration.get("operator") or "Equal"
    if not toleration.get("key"):
        return operator == "Exists"
    if toleration["key"] != taint.get("key"):
        return False
    return operator == "Exists" or (
        operator == "Equal" and toleration.get("value", "") == taint.get("value", "")
    )


def expression_holds(expression: dict[str, Any], value: str | None) -> bool:
    operator, values = expression.get("operator"), expression.get("values") or []
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and len(values) == 1:
        try:
            mine, theirs = int(value), int(values[0])
        except ValueError:
            return False
        return mine > theirs if operator == "Gt" else mine < theirs
    return False


def term_holds(term: dict[str, Any], node: dict[str, Any]) -> bool:
    """A node selector term: every expression and field holds; an empty term matches no node."""
    labels = node["metadata"].get("labels") or {}
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False
    fields_hold = all(
        f.get("key") == "metadata.name" and expression_holds(f, node["metadata"]["name"]) for f in fields
    )
    return fields_hold and all(expression_holds(e, labels.get(e.get("key", ""))) for e in expressions)


def placement_violations(pods: list[dict[str, Any]], nodes: list[dict[str, Any]]) -> list[str]:
    """Every way the bound pods break their own specs or their nodes' capacity, one line each:
    ``node`` (bound to a node that does not exist), ``selector``, ``affinity`` (required node
    affinity), ``taint`` (a ``NoSchedule``/``NoExecute`` taint it does not tolerate), ``cordon``
    (an unschedulable node, unless it tolerates ``node.kubernetes.io/unschedulable``) and
    ``capacity`` (a node's summed requests over its allocatable ``cpu``, ``memory``,
    ``nvidia.com/gpu`` or ``pods``; one line per node and resource)."""
    by_name = {n["metadata"]["name"]: n for n in nodes}
    used: dict[str, dict[str, Fraction]] = {}
    out = []
    for pod in pods:
        spec = pod["spec"]
        where = spec.get("nodeName")
        if not where or pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            continue
        who = f"pod {pod['metadata'].get('namespace', '')}/{pod['metadata']['name']} on {where}"
        node = by_name.get(where)
        if node is None:
            out.append(f"node: {who}: no such node")
            continue
        labels = node["metadata"].get("labels") or {}
        for key, value in (spec.get("nodeSelector") or {}).items():
            if labels.get(key) != value:
                out.append(f"selector: {who}: {key}={value} but the node has {labels.get(key)!r}")
        required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                    .get("requiredDuringSchedulingIgnoredDuringExecution"))  # fmt: skip
        if required is not None and not any(
            term_holds(t, node) for t in required.get("nodeSelectorTerms") or []
        ):
            out.append(f"affinity: {who}: no required node selector term holds")
        tolerations = spec.get("tolerations") or []
        for taint in (node.get("spec") or {}).get("taints") or []:
            if taint.get("effect") in ("NoSchedule", "NoExecute") and not any(
                tolerates(t, taint) for t in tolerations
            ):
                out.append(f"taint: {who}: {taint.get('key')}={taint.get('value', '')}:{taint['effect']}")
        cordon = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
        if (node.get("spec") or {}).get("unschedulable") and not any(
            tolerates(t, cordon) for t in tolerations
        ):
            out.append(f"cordon: {who}: the node is cordoned")
        total = used.setdefault(where, {})
        for name, amount in pod_requests(pod).items():
            total[name] = total.get(name, Fraction(0)) + amount
    for where, total in sorted(used.items()):
        allocatable = by_name[where].get("status", {}).get("allocatable") or {}
        for name in CHECKED:
            if total.get(name, 0) > quantity(allocatable.get(name, "0")):
                have = allocatable.get(name, "0")
                out.append(
                    f"capacity: node {where}: {name} requested {float(total[name]):g} > allocatable {have}"
                )
    return out


# --- decide: unconstrained single-task rate before and after constraint support -----------------


def decide_ratio(after: str, rounds: int) -> dict[str, Any]:
    """``benchmarks.core``'s ``bench_single(10_000, "best-fit")`` at ``after`` over the same at
    :data:`DECIDE_BEFORE`, each revision's own code in its own worktree and processes; and at
    :data:`DECIDE_CHANGE` (the constraint commit itself, without what came after it)."""
    from benchmarks.worktree import checkouts, resolve

    revs = (DECIDE_BEFORE, after, DECIDE_CHANGE)
    commits = [resolve(r) for r in revs]
    runs: list[list[float]] = [[] for _ in revs]
    seconds: list[float] = []
    with checkouts(*revs) as trees:
        for tree in trees:
            decide_child(tree, 0)  # numba compiles into the tree's own cache: not timed
        for round_ in range(1, rounds + 1):
            for side in range(len(revs)) if round_ % 2 else reversed(range(len(revs))):
                started = time.perf_counter()
                runs[side].append(statistics.median(decide_child(trees[side], DECIDE_REPEATS)))
                seconds.append(time.perf_counter() - started)
    rates = [statistics.median(r) for r in runs]

    def summary(i: int) -> dict[str, Any]:
        return {
            "rev": revs[i],
            "commit": commits[i],
            "per_s": round(rates[i]),
            "rounds": [round(r) for r in runs[i]],
        }

    return {
        "decide_unconstrained_ratio": round(rates[1] / rates[0], 3),
        "decide_unconstrained": {
            "measure": "benchmarks.core bench_single(10_000, 'best-fit'): 20,000 one-task 1-GPU jobs "
            "placed in one decide on 10,000 nodes, no constraints; placements per second",
            "before": summary(0),
            "after": summary(1),
            "at_change": summary(2) | {"ratio": round(rates[2] / rates[0], 3)},
            "order": "one warm-up process per tree (not timed), then rounds of one process per tree, "
            f"in turn forward and backward (ABCCBA...); each process the median of {DECIDE_REPEATS} decides",
            "process_seconds": [round(s, 1) for s in seconds],
        },
    }


def decide_child(tree: Path, repeats: int) -> list[float]:
    """``bench_single(10_000, "best-fit")`` ``repeats`` times in a fresh process on ``tree``'s code."""
    from benchmarks.worktree import tree_env

    done = subprocess.run(
        [sys.executable, "-c", DECIDE_CHILD, str(repeats)],
        cwd=tree,
        env=tree_env(tree),
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"decide in {tree} exited {done.returncode}: {done.stderr[-2000:]}")
    result = json.loads(lines[-1])
    if not Path(result["fleetlog"]).resolve().is_relative_to(tree.resolve()):
        raise RuntimeError(f"the child in {tree} imported {result['fleetlog']}, not the tree's fleetlog")
    return [float(r) for r in result["rates"]]


# --- entry point -------------------------------------------------------------------------------


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="fleetlog pods bound per second against a real kube-apiserver, and beside kube-scheduler",
        allow_abbrev=False,
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quick", action="store_true", help="1,000 pods, one run, no decide ratio")
    parser.add_argument("--repeats", type=int, default=5, help="repetitions; the median is reported")
    parser.add_argument("--decide-after", default="HEAD", help="the revision of decide_unconstrained_ratio")
    parser.add_argument(
        "--decide-rounds", type=int, default=DECIDE_ROUNDS, help="its rounds (a process per revision)"
    )
    parser.add_argument("--no-decide-ratio", action="store_true", help="skip decide_unconstrained_ratio")
    add_smoke(parser)
    return parser.parse_args()


def main() -> None:
    args = parse()
    small = args.quick or args.smoke
    pods = SMOKE_PODS if args.smoke else QUICK_PODS if args.quick else PODS
    side_pods = SMOKE_SIDE_PODS if args.smoke else QUICK_SIDE_PODS if args.quick else SIDE_PODS
    repeats = 1 if small else args.repeats
    kube = KubeControlPlane(REPO / "var" / f"kube-bench-{os.getpid()}")  # (its own: tests may run beside)
    kube.start(fresh=True)
    try:
        result = asyncio.run(measure(kube, repeats, pods, SMOKE_PODS // 4 if args.smoke else WARMUP_PODS))
        side_warm = SMOKE_SIDE_PODS // 2 if args.smoke else SIDE_WARMUP_PODS
        result |= asyncio.run(side_by_side(kube, repeats, side_pods, side_warm))
    finally:
        kube.close()
    result["kube_scheduler_ci_floor"] = KUBE_SCHEDULER_CI_FLOOR
    if small or args.no_decide_ratio:
        result["decide_unconstrained_ratio"] = None
        why = "--no-decide-ratio" if args.no_decide_ratio else "--quick" if args.quick else "--smoke"
        result["not_measured"] = {
            "decide_unconstrained_ratio": f"skipped ({why}): three git worktrees, numba compiled in each, "
            f"{args.decide_rounds} rounds of processes: minutes; the full run (python -m "
            "benchmarks.kubernetes --json) measures it"
        }
    else:
        result |= decide_ratio(args.decide_after, args.decide_rounds)
    result |= {"nodes": NODES, "pods": pods, "repeats": repeats, "machine": machine()}
    emit(result, args.json)


if __name__ == "__main__":
    main()
