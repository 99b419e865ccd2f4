"""Placement constraints against a real kube-apiserver (kubectl-applied manifests): taints and
tolerations, node selectors, required and preferred affinity, host anti-affinity of pod groups,
cordons and ``NoExecute`` evictions."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fleetlog.events import JobPending, JobSubmitted, NodeHeartbeat, TaskFinished
from tests.backends.kubernetes.conftest import Rig
from tests.backends.kubernetes.manifests import items, node, pod
from tests.backends.kubernetes.test_backend import bound, pods, until_event

pytestmark = pytest.mark.timeout(300)

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
TOLERATE_GPU = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


async def beats_of(rig: Rig, n: int) -> None:
    ledger = rig.backend.observer.emitter.ledger  # type: ignore[union-attr]
    await rig.until(f"heartbeats of {n} nodes", lambda: len(ledger.nodes) == n)


async def test_a_tainted_gpu_node_is_used_only_by_pods_that_tolerate_it(rig: Rig) -> None:
    """The managed-Kubernetes shape: GPU nodes tainted ``nvidia.com/gpu=present:NoSchedule``,
    GPU pods tolerating it. A CPU pod goes to the CPU node; a GPU pod without the toleration
    waits, and says which taint kept it off how many nodes."""
    rig.apply(
        items(
            node("gpu-1", gpus=4, taints=[GPU_TAINT]),
            node("gpu-2", gpus=4, taints=[GPU_TAINT]),
            node("cpu-1", cpu="16", mem="64Gi"),
        )
    )
    await beats_of(rig, 3)
    rig.apply(
        items(
            pod("trainer", gpus=2, tolerations=TOLERATE_GPU),
            pod("web-0"),
            pod("web-1"),
            pod("rogue", gpus=1),
        )
    )
    names = ["trainer", "web-0", "web-1", "rogue"]
    await rig.until("three bound", lambda: len(bound(rig, names)) == 3, timeout_s=60)
    where = bound(rig, names)
    assert where["trainer"] in ("gpu-1", "gpu-2")
    assert where["web-0"] == where["web-1"] == "cpu-1"
    assert "rogue" not in where
    _, kind, message = await until_event(rig, "trainer", "Scheduled")
    assert kind == "Normal"
    assert message.split(" (")[0] == f"Successfully assigned default/trainer to {where['trainer']}"

    def explained() -> bool:
        conditions = pods(rig)["rogue"]["status"].get("conditions", [])
        return any(c["type"] == "PodScheduled" and c["reason"] == "NoEligibleNodes" for c in conditions)

    await rig.until("rogue says why", explained, timeout_s=60)
    (why,) = [c["message"] for c in pods(rig)["rogue"]["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert "0/3 up nodes" in why
    assert "2 untolerated taint nvidia.com/gpu=present:NoSchedule" in why
    beats = [e for e in await rig.events() if isinstance(e, NodeHeartbeat) and e.node == "gpu-1"]
    assert (
        beats[-1].healthy is True
    )  # (a taint is not a fault: the node stays up for the pods that tolerate it)


async def test_required_affinity_lands_on_a_matching_node_or_waits_naming_the_term(rig: Rig) -> None:
    rig.apply(
        items(
            node("a-1", labels={"topology.kubernetes.io/zone": "a", "disk": "ssd"}),
            node("b-1", labels={"topology.kubernetes.io/zone": "b"}),
        )
    )
    await beats_of(rig, 2)
    zone_b = [[{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["b"]}]]
    nowhere = [[{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["z"]}]]
    rig.apply(
        items(
            pod("in-b", affinity=zone_b),
            pod("on-ssd", node_selector={"disk": "ssd"}),
            pod("in-z", affinity=nowhere),
        )
    )
    await rig.until("two bound", lambda: len(bound(rig, ["in-b", "on-ssd"])) == 2, timeout_s=60)
    assert bound(rig, ["in-b", "on-ssd", "in-z"]) == {"in-b": "b-1", "on-ssd": "a-1"}

    async def said() -> bool:
        why = [d for d in await rig.decisions() if isinstance(d, JobPending) and "in-z" in d.job_id]
        return bool(why) and why[-1].reason == "no_eligible_nodes"

    await rig.until_async("in-z pending with its reason", said)
    (last, *_) = [
        d for d in reversed(await rig.decisions()) if isinstance(d, JobPending) and "in-z" in d.job_id
    ]
    assert "2 not matching node affinity topology.kubernetes.io/zone In [z]" in last.message


async def test_a_cordoned_node_keeps_its_pods_and_gets_no_new_ones(rig: Rig) -> None:
    rig.apply(items(node("only", cpu="8", mem="32Gi")))
    await beats_of(rig, 1)
    rig.apply(items(pod("before")))
    await rig.until(
        "before running", lambda: pods(rig).get("before", {}).get("status", {}).get("phase") == "Running"
    )
    rig.kube.kubectl("cordon", "only")
    ledger = rig.backend.observer.emitter.ledger  # type: ignore[union-attr]

    async def cordon_seen() -> bool:
        beats = [e for e in await rig.events() if isinstance(e, NodeHeartbeat) and e.node == "only"]
        return beats[-1].unschedulable

    await rig.until_async("the cordon reported", cordon_seen)
    assert "only" in ledger.nodes
    rig.apply(items(pod("after")))
    await rig.until("after seen", lambda: "after" in pods(rig))
    await rig.until_async(
        "after pending",
        lambda: _pending(rig, "after"),
    )
    await rig.refresh()
    assert bound(rig, ["before", "after"]) == {"before": "only"}
    assert pods(rig)["before"]["status"]["phase"] == "Running"
    rig.kube.kubectl("uncordon", "only")
    await rig.until("after bound once uncordoned", lambda: "after" in bound(rig, ["after"]), timeout_s=60)


async def _pending(rig: Rig, name: str) -> bool:
    return any(isinstance(d, JobPending) and f"/{name}/" in d.job_id for d in await rig.decisions())


async def test_a_no_execute_taint_evicts_the_pods_that_do_not_tolerate_it(rig: Rig) -> None:
    rig.apply(items(node("n1", cpu="8", mem="32Gi")))
    await beats_of(rig, 1)
    tough = [{"key": "maintenance", "operator": "Exists", "effect": "NoExecute"}]
    rig.apply(items(pod("fragile"), pod("tough", tolerations=tough)))
    running = lambda: all(  # noqa: E731
        pods(rig).get(n, {}).get("status", {}).get("phase") == "Running" for n in ("fragile", "tough")
    )
    await rig.until("both running", running)
    taint = {"spec": {"taints": [{"key": "maintenance", "effect": "NoExecute"}]}}
    rig.kube.kubectl("patch", "node", "n1", "--type=merge", "-p", json.dumps(taint))
    await rig.until("fragile evicted", lambda: "fragile" not in pods(rig), timeout_s=60)
    assert rig.backend.actuator.counts["evicted"] == 1  # type: ignore[union-attr]
    _, _, message = await until_event(rig, "fragile", "TaintManagerEviction")
    assert message == "Marking for deletion Pod default/fragile: node n1 has taint maintenance:NoExecute"
    await rig.refresh()
    assert pods(rig)["tough"]["status"]["phase"] == "Running"
    assert bound(rig, ["tough"]) == {"tough": "n1"}


async def test_pods_other_schedulers_placed_hold_their_nodes(rig: Rig) -> None:
    """A DaemonSet-like pod and a pod kube-scheduler bound take capacity fleetlog does not own:
    the backend reports what they request as foreign, fleetlog places around it, and what they
    held is free again once they are gone."""

    def foreign(name: str, on: str, gpus: int, cpu: str = "1") -> dict[str, object]:
        body = pod(name, gpus=gpus, cpu=cpu)
        body["spec"] |= {"schedulerName": "default-scheduler", "nodeName": on}  # type: ignore[operator]
        return body

    rig.apply(items(node("g-1", gpus=8), node("g-2", gpus=8)))
    await beats_of(rig, 2)
    rig.apply(items(foreign("theirs", "g-1", gpus=8), foreign("agent", "g-2", gpus=0, cpu="2")))

    async def reported() -> bool:
        beats = {e.node: e for e in await rig.events() if isinstance(e, NodeHeartbeat)}
        return {n: (b.foreign_gpus, b.foreign_cpu_milli) for n, b in beats.items()} == {
            "g-1": (8, 1000), "g-2": (0, 2000)}  # fmt: skip

    await rig.until_async("the foreign pods reported", reported)
    rig.apply(items(pod("ours-1", gpus=8), pod("ours-2", gpus=8)))
    await rig.until("one bound", lambda: len(bound(rig, ["ours-1", "ours-2"])) == 1, timeout_s=60)
    await rig.refresh()
    (where,) = bound(rig, ["ours-1", "ours-2"]).values()
    assert where == "g-2"  # (g-1's GPUs are kube-scheduler's pod's)
    rig.kube.kubectl("delete", "pod", "theirs", "--grace-period=0", "--force")
    await rig.until("both bound", lambda: len(bound(rig, ["ours-1", "ours-2"])) == 2, timeout_s=60)
    assert sorted(bound(rig, ["ours-1", "ours-2"]).values()) == ["g-1", "g-2"]


async def test_pods_sharing_a_gpu_by_annotation_pack_onto_one_device(rig: Rig) -> None:
    """``fleetlog.dev/gpu-milli: 500`` on one-GPU pods: two share node g's only GPU, a third waits."""

    def half(name: str) -> dict[str, object]:
        body = pod(name, gpus=1, cpu="1")
        body["metadata"]["annotations"]["fleetlog.dev/gpu-milli"] = "500"  # type: ignore[index]
        return body

    rig.apply(items(node("g", gpus=1)))
    await beats_of(rig, 1)
    rig.apply(items(half("a"), half("b"), half("c")))
    await rig.until("two bound", lambda: len(bound(rig, ["a", "b", "c"])) == 2, timeout_s=60)
    assert bound(rig, ["a", "b", "c"]) == {"a": "g", "b": "g"}
    await rig.until_async("c pending", lambda: _pending(rig, "c"))
    state = rig.loop.state
    assert state.nodes.cols["gpu_free"][state.node_row(rig.cfg.cell, "g"), 0] == 0  # (2 x 500 of 1000)
    assert sorted(int(state.jobs.cols["req_gpu"][r]) for r in range(state.jobs.size)) == [500, 500, 500]


async def _finished(rig: Rig, name: str) -> bool:
    return any(isinstance(e, TaskFinished) and f"/{name}/" in e.job_id for e in await rig.events())


async def test_preferred_affinity_breaks_a_tie_against_the_node_order(rig: Rig) -> None:
    """Two empty one-GPU nodes tie for a one-GPU pod, and the tie goes to the node fleetlog heard
    of first (the lower row). A pod preferring zone b goes to the other one; a pod whose terms
    weigh 50 on zone a but 30 + 30 on zone b's node with an SSD goes there too (weights sum)."""
    rig.apply(items(node("pa-1", gpus=1, labels={"topology.kubernetes.io/zone": "a"})))
    await beats_of(rig, 1)
    rig.apply(items(node("pa-2", gpus=1, labels={"topology.kubernetes.io/zone": "b", "disk": "ssd"})))
    await beats_of(rig, 2)
    await rig.until_async("both nodes folded", lambda: _rows(rig, 2))
    state = rig.loop.state
    assert state.node_row(rig.cfg.cell, "pa-1") < state.node_row(rig.cfg.cell, "pa-2")
    zone = "topology.kubernetes.io/zone"
    in_a = [{"key": zone, "operator": "In", "values": ["a"]}]
    in_b = [{"key": zone, "operator": "In", "values": ["b"]}]
    ssd = [{"key": "disk", "operator": "Exists"}]
    where = {
        "plain": await placed_then_finished(rig, "plain", None),
        "wants-b": await placed_then_finished(rig, "wants-b", [(50, in_b)]),
        "sums": await placed_then_finished(rig, "sums", [(50, in_a), (30, in_b), (30, ssd)]),
    }
    assert where == {"plain": "pa-1", "wants-b": "pa-2", "sums": "pa-2"}
    submitted = {e.job_id.split("/")[2]: e for e in await rig.events() if isinstance(e, JobSubmitted)}
    assert [p.weight for p in submitted["sums"].task_groups[0].preferred_affinity] == [50, 30, 30]
    assert submitted["plain"].task_groups[0].preferred_affinity == ()


async def _rows(rig: Rig, n: int) -> bool:
    return rig.loop.state.nodes.size >= n


async def placed_then_finished(
    rig: Rig, name: str, preferred: list[tuple[int, list[dict[str, Any]]]] | None
) -> str:
    """Where a one-GPU pod ``name`` preferring ``preferred`` is bound, once it has finished
    (its GPU free again: the next pod sees the same tie)."""
    rig.apply(items(pod(name, gpus=1, run_ms=200, preferred=preferred)))
    await rig.until(f"{name} bound", lambda: name in bound(rig, [name]), timeout_s=60)
    await rig.until_async(f"{name} finished", lambda: _finished(rig, name))
    return bound(rig, [name])[name]


HOSTNAME = "kubernetes.io/hostname"
GROUP = "scheduling.x-k8s.io/pod-group"


async def test_host_anti_affinity_spreads_a_pod_group_one_pod_a_node(rig: Rig) -> None:
    """Four 4-GPU nodes, each able to hold a whole group of three one-GPU pods: a group without
    anti-affinity packs onto one node (best fit); the same group with anti-affinity on
    ``kubernetes.io/hostname`` among its own pods lands on three nodes. A lone pod with such a
    term is placed as it is; one with anti-affinity on the zone waits, saying fleetlog cannot
    keep it."""
    rig.apply(items(*(node(f"h-{i}", gpus=4) for i in range(4))))
    await beats_of(rig, 4)
    packed = [f"packed-{i}" for i in range(3)]
    rig.apply(items(*(pod(n, gpus=1, group="packed", group_size=3) for n in packed)))
    await rig.until("packed bound", lambda: len(bound(rig, packed)) == 3, timeout_s=60)
    assert len(set(bound(rig, packed).values())) == 1

    def apart(selector: dict[str, object], key: str = HOSTNAME) -> list[dict[str, object]]:
        return [{"topologyKey": key, "labelSelector": selector}]

    spread = [f"spread-{i}" for i in range(3)]
    own = apart({"matchLabels": {GROUP: "spread"}})
    rig.apply(items(*(pod(n, gpus=1, group="spread", group_size=3, anti_affinity=own) for n in spread)))
    await rig.until("spread bound", lambda: len(bound(rig, spread)) == 3, timeout_s=60)
    assert len(set(bound(rig, spread).values())) == 3, bound(rig, spread)
    submitted = {e.job_id: e for e in await rig.events() if isinstance(e, JobSubmitted)}
    assert submitted["group/default/packed"].spread is None
    assert submitted["group/default/spread"].spread == "host"

    alone = apart({"matchLabels": {"app": "solo"}})
    zoned = apart({"matchLabels": {"app": "zoned"}}, key="topology.kubernetes.io/zone")
    rig.apply(
        items(
            pod("solo", labels={"app": "solo"}, anti_affinity=alone),
            pod("zoned", labels={"app": "zoned"}, anti_affinity=zoned),
        )
    )
    await rig.until("solo bound", lambda: "solo" in bound(rig, ["solo"]), timeout_s=60)

    def explained() -> bool:
        conditions = pods(rig)["zoned"]["status"].get("conditions", [])
        return any(c["type"] == "PodScheduled" and c["reason"] == "NoEligibleNodes" for c in conditions)

    await rig.until("zoned says why", explained, timeout_s=60)
    (why,) = [c["message"] for c in pods(rig)["zoned"]["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert "4 not matching node affinity fleetlog.dev/unsupported-pod-anti-affinity Exists" in why
    assert "zoned" not in bound(rig, ["zoned"])
