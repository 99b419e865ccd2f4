"""Pods bound per second by fleetlog against a real kube-apiserver (+ etcd) with 1,000 nodes.

What it measures, median of ``--repeats`` runs:

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

kube-scheduler's CI threshold for its basic 5,000-node test is 270 pods/s; the target here is
≥ 1,000 pods/s, where the API server and not fleetlog is the limit.

Run: ``python -m benchmarks.kubernetes --json`` (``--quick``: 1,000 pods, one run, < 120 s;
``--smoke``: 64 pods after a 16-pod warm-up, one run — a test that it runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import emit, machine, parse
from fleetlog.backends.kubernetes import KubeApi, KubeBackendConfig, KubernetesBackend
from fleetlog.core.policy import policy_named
from fleetlog.log.file import FileLogStore
from fleetlog.service.loop import LoopConfig, SchedulerLoop
from tests.kube_apiserver import REPO, KubeControlPlane

NODES = 1_000
PODS = 5_000
QUICK_PODS = 1_000
SMOKE_PODS = 64
CONCURRENCY = 64
WARMUP_PODS = 200


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


async def create_nodes(api: KubeApi) -> None:
    await gather_limited([api.request("POST", "/api/v1/nodes", body=node_body(i)) for i in range(NODES)])


async def create_pods(api: KubeApi, namespace: str, count: int, scheduler: str) -> list[str]:
    path = f"/api/v1/namespaces/{namespace}/pods"
    names = [f"p-{i:05d}" for i in range(count)]
    await gather_limited([api.request("POST", path, body=pod_body(n, scheduler)) for n in names])
    return names


async def make_namespace(api: KubeApi, name: str) -> None:
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    await api.request("POST", "/api/v1/namespaces", body=body)


async def fleetlog_run(kube: KubeControlPlane, admin: KubeApi, run: int, pods: int) -> float:
    """Pods bound per second by fleetlog, from the backend's start until all are bound."""
    namespace = f"bench-{run}" if run >= 0 else "warmup"
    await make_namespace(admin, namespace)
    await create_pods(admin, namespace, pods, "fleetlog")
    directory = Path(tempfile.mkdtemp(prefix="fleetlog-kube-bench-"))
    store = FileLogStore(directory)
    await store.open()
    api = await KubeApi.connect(str(kube.kubeconfig))
    loop = SchedulerLoop(store, policy_named("default"), LoopConfig())
    backend = KubernetesBackend(store, api, KubeBackendConfig(cell=namespace, bind_concurrency=CONCURRENCY))
    driver = asyncio.create_task(drive(loop))
    try:
        start = time.perf_counter()
        await backend.start()
        assert backend.actuator is not None
        while backend.actuator.counts["bound"] < pods:
            if time.perf_counter() - start > 600:
                raise RuntimeError(f"only {backend.actuator.counts['bound']} of {pods} pods bound in 600 s")
            await asyncio.sleep(0.01)
        elapsed = time.perf_counter() - start
    finally:
        driver.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await driver
        await backend.stop()
        await api.close()
        await store.close()
        shutil.rmtree(directory, ignore_errors=True)
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
    """Delete the run's pods (one collection delete; no kubelet needs to agree)."""
    await api.request("DELETE", f"/api/v1/namespaces/{namespace}/pods", query=[("gracePeriodSeconds", "0")])


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


def main() -> None:
    args = parse("fleetlog pods bound per second against a real kube-apiserver")
    pods = SMOKE_PODS if args.smoke else QUICK_PODS if args.quick else PODS
    repeats = 1 if args.quick or args.smoke else args.repeats
    kube = KubeControlPlane(REPO / "var" / f"kube-bench-{os.getpid()}")  # (its own: tests may run beside)
    kube.start(fresh=True)
    try:
        result = asyncio.run(measure(kube, repeats, pods, SMOKE_PODS // 4 if args.smoke else WARMUP_PODS))
    finally:
        kube.close()
    result |= {"nodes": NODES, "pods": pods, "repeats": repeats, "machine": machine()}
    emit(result, args.json)


if __name__ == "__main__":
    main()
