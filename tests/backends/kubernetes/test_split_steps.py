"""The Kubernetes backend reads a step split over several decision records (issue 14, item 1) as
the whole step: every pod is bound once, across a backend restart."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable

from fleetlog.backends.kubernetes.config import KubeBackendConfig
from fleetlog.core.policy import policy_named
from fleetlog.events import JobPlaced, TaskFinished, TaskStarted
from fleetlog.log.base import LogStore
from fleetlog.service.loop import LoopConfig
from tests.backends.helpers import OneDecisionPerRecord, split_steps
from tests.backends.kubernetes.conftest import Rig, wipe
from tests.backends.kubernetes.manifests import items, node, pod
from tests.kube_apiserver import KubeControlPlane


def bound(rig: Rig, names: list[str]) -> dict[str, str]:
    found = {n: p["spec"].get("nodeName") for n, p in rig.snapshot.items() if n in names}
    return {n: where for n, where in found.items() if where}


async def test_a_split_step_binds_every_pod_once_across_a_backend_restart(
    kube: KubeControlPlane, store_maker: Callable[[], LogStore]
) -> None:
    wipe(kube)
    store = store_maker()
    await store.open()
    rig = Rig(kube, store, KubeBackendConfig(heartbeat_ms=2_000))
    rig.loop = OneDecisionPerRecord(store, policy_named("default"), LoopConfig(check_invariants=True))
    await rig.start()
    try:
        rig.apply(items(*(node(f"w{i}", cpu="16", mem="64Gi") for i in range(4))))
        first = [f"a-{i}" for i in range(12)]
        rig.apply(items(*(pod(n, run_ms=200) for n in first)))
        await rig.until("first pods bound", lambda: len(bound(rig, first)) == 12)
        await rig.stop_backend()
        second = [f"b-{i}" for i in range(12)]
        rig.apply(items(*(pod(n, run_ms=200) for n in second)))
        await rig.start_backend()
        await rig.until("second pods bound", lambda: len(bound(rig, second)) == 12)
        await rig.until(
            "all finished", lambda: all(p["status"]["phase"] == "Succeeded" for p in rig.snapshot.values())
        )
        assert len(await split_steps(store)) > 1  # the placements came in parts
        placed = Counter(d.job_id for d in await rig.decisions() if isinstance(d, JobPlaced))
        assert len(placed) == 24
        assert set(placed.values()) == {1}
        # every pod's end is reported (the emitter flushes on a period: wait for it); a pod that
        # ran and ended while the backend was stopped is reported ended without a start
        for _ in range(200):
            events = await rig.events()
            if len({e.job_id for e in events if isinstance(e, TaskFinished)}) == 24:
                break
            await asyncio.sleep(0.05)
        assert len({e.job_id for e in events if isinstance(e, TaskFinished)}) == 24
        started = Counter(e.job_id for e in events if isinstance(e, TaskStarted))
        assert set(started.values()) <= {1}, "a task reported started twice"
    finally:
        await rig.close()
        await store.close()
