"""The Kubernetes backend against a real kube-apiserver (+ etcd), with kubectl applying manifests.

Each test runs the real scheduler loop and the backend over a log store (the file log; some also
over a real Kafka broker), a fake kubelet moving bound pods along, and asserts what the API
server and the logs say.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import pytest

from fleetlog.backends.kubernetes import KubeApi, KubeApiError
from fleetlog.backends.kubernetes.watch import GoneError
from fleetlog.events import (
    JobCancelled,
    JobPending,
    JobPlaced,
    JobRejected,
    JobSubmitted,
    NodeHeartbeat,
    NodeRemoved,
    TaskFailed,
    TaskFinished,
    TaskPreempted,
    TaskStarted,
)
from tests.backends.kubernetes.conftest import BOTH_LOGS, Rig
from tests.backends.kubernetes.manifests import items, node, pod, pod_group, pod_group_crd, priority_class

pytestmark = pytest.mark.timeout(300)


def pods(rig: Rig) -> dict[str, dict[str, Any]]:
    """Pod name -> pod object, as the API server had them at the last refresh (each ``until`` step)."""
    return rig.snapshot


def bound(rig: Rig, names: list[str]) -> dict[str, str]:
    """Pod name -> node, for those of ``names`` that are bound."""
    now = pods(rig)
    return {n: now[n]["spec"]["nodeName"] for n in names if n in now and now[n]["spec"].get("nodeName")}


def gpu_rack_nodes() -> list[dict[str, Any]]:
    """Two racks of two 4-GPU nodes: 8 GPUs per rack."""
    return [node(f"{rack}-n{i}", gpus=4, rack=rack) for rack in ("rack-a", "rack-b") for i in range(2)]


@BOTH_LOGS
async def test_pod_group_binds_all_or_nothing_within_one_rack(rig: Rig) -> None:
    rig.apply(items(*gpu_rack_nodes(), pod_group_crd()))
    rig.apply(items(pod_group("train", 8)))
    names = [f"train-{i}" for i in range(8)]
    rig.apply(items(*(pod(n, gpus=1, group="train", topology="rack") for n in names[:7])))
    await rig.until("7 pods seen", lambda: len(rig.backend.observer.pods) == 7)  # type: ignore[union-attr]
    await rig.until("heartbeats of 4 nodes", lambda: len(rig.backend.observer.emitter.ledger.nodes) == 4)  # type: ignore[union-attr]
    await asyncio.sleep(1)  # time enough for a wrong binding
    await rig.refresh()
    assert bound(rig, names) == {}, "an incomplete gang must not bind"
    assert not [e for e in await rig.events() if isinstance(e, JobSubmitted)]

    rig.apply(items(pod(names[7], gpus=1, group="train", topology="rack")))
    await rig.until("all 8 bound", lambda: len(bound(rig, names)) == 8)
    where = bound(rig, names)
    racks = {n.split("-n")[0] for n in where.values()}
    assert len(racks) == 1, f"the gang spans racks: {where}"
    assert Counter(where.values()) == Counter({f"{next(iter(racks))}-n0": 4, f"{next(iter(racks))}-n1": 4})
    await rig.until(
        "8 tasks started", lambda: all(p["status"]["phase"] == "Running" for p in pods(rig).values())
    )
    events = await rig.events()
    submitted = [e for e in events if isinstance(e, JobSubmitted)]
    assert [s.job_id for s in submitted] == ["group/default/train"]
    assert submitted[0].required_topology == "rack"
    assert sum(g.count for g in submitted[0].task_groups) == 8
    await rig.until_async("8 TaskStarted", lambda: has(rig, TaskStarted, 8))


async def has(rig: Rig, kind: type, n: int) -> bool:
    return await rig.count(kind) == n


async def test_gang_too_big_for_any_rack_waits_and_says_it_never_fits(rig: Rig) -> None:
    """16 GPUs in one rack of a fleet whose racks hold 8: pending, ``NeverFits`` (the scheduler
    tells it apart from a gang that waits for room), as ``kubectl describe`` shows it."""
    rig.apply(items(*gpu_rack_nodes()))
    ledger = rig.backend.observer.emitter.ledger  # type: ignore[union-attr]
    await rig.until("heartbeats of 4 nodes", lambda: len(ledger.nodes) == 4)
    names = [f"big-{i}" for i in range(8)]
    rig.apply(items(*(pod(n, gpus=2, group="big", group_size=8, topology="rack") for n in names)))

    def explained() -> bool:
        conditions = [
            c
            for p in pods(rig).values()
            for c in p["status"].get("conditions", [])
            if c["type"] == "PodScheduled"
        ]
        never = [c for c in conditions if c["status"] == "False" and c["reason"] == "NeverFits"]
        return len(never) == 8

    await rig.until("every pod carries PodScheduled=False", explained, timeout_s=60)
    assert bound(rig, names) == {}
    why = [d for d in await rig.decisions() if isinstance(d, JobPending | JobRejected)]
    assert why, "the scheduler explained nothing"
    seen: list[str] = []

    def event_posted() -> bool:  # (the Event is posted apart from the condition: it may come later)
        seen[:] = [rig.kube.kubectl("describe", "pod", "big-3")]
        return "FailedScheduling" in seen[0]

    await rig.until("the FailedScheduling event of big-3", event_posted, timeout_s=30)
    described = seen[0]
    reason = why[-1].reason
    assert reason == "never_fits", why[-1]
    assert "FailedScheduling" in described
    assert "".join(p.capitalize() for p in reason.split("_")) in described
    assert "fleetlog" in described


@BOTH_LOGS
async def test_single_pods_run_finish_and_fail(rig: Rig) -> None:
    rig.apply(items(node("cpu-1", cpu="8", mem="32Gi"), node("cpu-2", cpu="8", mem="32Gi")))
    rig.apply(items(pod("ok", run_ms=300), pod("bad", run_ms=300, exit_code=3), pod("long")))
    await rig.until("3 bound", lambda: len(bound(rig, ["ok", "bad", "long"])) == 3)

    def ended() -> bool:
        now = pods(rig)
        return now["ok"]["status"]["phase"] == "Succeeded" and now["bad"]["status"]["phase"] == "Failed"

    await rig.until("ok succeeded and bad failed", ended)
    await rig.backend.observer.emitter.flush()  # type: ignore[union-attr]
    events = await rig.events()
    ok_id = next(
        e.job_id for e in events if isinstance(e, JobSubmitted) and e.job_id.startswith("pod/default/ok/")
    )
    bad_id = next(e.job_id for e in events if isinstance(e, JobSubmitted) and "/bad/" in e.job_id)
    await rig.until_async("two ends reported", lambda: has_ends(rig, 2))
    finished = [e for e in await rig.events() if isinstance(e, TaskFinished | TaskFailed)]
    assert any(isinstance(e, TaskFinished) and e.job_id == ok_id and e.exit_code == 0 for e in finished)
    assert any(isinstance(e, TaskFailed) and e.job_id == bad_id and e.exit_code == 3 for e in finished)
    started = [e for e in events if isinstance(e, TaskStarted)]
    assert Counter(e.job_id for e in started).most_common(1)[0][1] == 1, "a task was reported started twice"


async def has_ends(rig: Rig, n: int) -> bool:
    return await rig.count(TaskFinished) + await rig.count(TaskFailed) == n


async def pod_events(rig: Rig, name: str) -> list[tuple[str, str, str]]:
    """(reason, type, message) of the Events on pod ``name`` of namespace ``default``."""
    assert rig.admin is not None
    listed = json.loads(await rig.admin.request("GET", "/api/v1/namespaces/default/events"))
    ours = [e for e in listed["items"] if e["source"].get("component") == "fleetlog"]
    return [(e["reason"], e["type"], e["message"]) for e in ours if e["involvedObject"]["name"] == name]


async def until_event(rig: Rig, name: str, reason: str) -> tuple[str, str, str]:
    """Wait for fleetlog's Event ``reason`` on pod ``name`` (posted in the background); it."""

    async def posted() -> bool:
        return any(e[0] == reason for e in await pod_events(rig, name))

    await rig.until_async(f"a {reason} event on {name}", posted)
    return next(e for e in await pod_events(rig, name) if e[0] == reason)


async def test_higher_priority_pod_preempts(rig: Rig) -> None:
    rig.apply(items(priority_class("low", 10), priority_class("high", 1000), node("g1", gpus=4)))
    low = [f"low-{i}" for i in range(4)]
    rig.apply(items(*(pod(n, gpus=1, priority_class="low") for n in low)))
    await rig.until(
        "low pods running", lambda: sum(p["status"]["phase"] == "Running" for p in pods(rig).values()) == 4
    )
    rig.apply(items(pod("urgent", gpus=2, priority_class="high")))
    await rig.until("urgent bound", lambda: "urgent" in bound(rig, ["urgent"]), timeout_s=90)
    await rig.until("two low pods evicted", lambda: len([n for n in low if n in pods(rig)]) == 2)
    assert rig.backend.actuator.counts["deferred"] == 1, "the preemptor must wait for its room"  # type: ignore[union-attr]
    decisions = await rig.decisions()
    preempted = [d for d in decisions if isinstance(d, TaskPreempted)]
    assert {d.cause for d in preempted} == {"priority"}
    assert {d.by_job_id.split("/")[2] for d in preempted} == {"urgent"}
    await rig.backend.observer.emitter.flush()  # type: ignore[union-attr]
    cancelled = {e.job_id for e in await rig.events() if isinstance(e, JobCancelled)}
    assert {d.job_id for d in preempted} == cancelled
    # as kube-scheduler says it: Preempted on each victim, Scheduled on the preemptor
    for victim in sorted(n for n in low if n not in pods(rig)):
        _, kind, message = await until_event(rig, victim, "Preempted")
        assert kind == "Normal"
        assert message.startswith("Preempted by fleetlog job pod/default/urgent/")
        assert message.endswith(" on node g1 (priority)")
    _, kind, message = await until_event(rig, "urgent", "Scheduled")
    assert message.startswith("Successfully assigned default/urgent to g1 (fleetlog job ")


async def test_node_not_ready_requeues_its_jobs(rig: Rig) -> None:
    rig.apply(items(node("n1", gpus=2), node("n2", gpus=2)))
    rig.apply(items(pod("victim", gpus=2)))
    await rig.until("victim running", lambda: pods(rig)["victim"]["status"]["phase"] == "Running")
    first = bound(rig, ["victim"])["victim"]
    rig.kubelet.kill_node(first)  # type: ignore[union-attr]
    patch = {"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "NodeStatusUnknown"}]}}
    rig.kube.kubectl(
        "patch", "node", first, "--subresource=status", "--type=strategic", "-p", json.dumps(patch)
    )

    async def placements() -> list[JobPlaced]:
        return [d for d in await rig.decisions() if isinstance(d, JobPlaced)]

    placed: list[JobPlaced] = []

    async def requeued() -> bool:
        placed[:] = await placements()
        return len(placed) == 2

    await rig.until_async("the job placed again", requeued)
    assert placed[0].job_id == placed[1].job_id
    assert placed[1].tasks[0].node != first
    beats = [e for e in await rig.events() if isinstance(e, NodeHeartbeat) and e.node == first]
    assert beats[-1].healthy is False
    await rig.backend.observer.emitter.flush()  # type: ignore[union-attr]
    await rig.until_async("the lost task reported", lambda: has(rig, TaskFailed, 1))
    failed = [e for e in await rig.events() if isinstance(e, TaskFailed)]
    assert [f.reason.split(":")[0] for f in failed] == ["node_lost"]
    await rig.refresh()
    assert bound(rig, ["victim"])["victim"] == first, "a pod never moves"


@BOTH_LOGS
async def test_backend_restarted_mid_run_binds_nothing_twice(rig: Rig) -> None:
    rig.apply(items(*(node(f"w{i}", cpu="16", mem="64Gi") for i in range(4))))
    first = [f"a-{i}" for i in range(20)]
    rig.apply(items(*(pod(n, run_ms=200) for n in first)))
    await rig.until("first pods bound", lambda: len(bound(rig, first)) == 20)
    actuator = rig.backend.actuator  # type: ignore[union-attr]
    await rig.until("the backend saw its 20 bindings answered", lambda: actuator.counts["bound"] == 20)  # type: ignore[union-attr]
    before = actuator.counts["bound"]  # type: ignore[union-attr]
    await rig.stop_backend()
    second = [f"b-{i}" for i in range(20)]
    rig.apply(items(*(pod(n, run_ms=200) for n in second)))
    rig.kube.kubectl("delete", "pod", "a-0", "--grace-period=0", "--force")
    backend = await rig.start_backend()
    await rig.until("second pods bound", lambda: len(bound(rig, second)) == 20)
    await rig.until(
        "all finished", lambda: all(p["status"]["phase"] == "Succeeded" for p in pods(rig).values())
    )
    await backend.observer.emitter.flush()  # type: ignore[union-attr]
    assert before + backend.actuator.counts["bound"] == 40  # type: ignore[union-attr]
    events = await rig.events()
    submitted = Counter(e.job_id for e in events if isinstance(e, JobSubmitted))
    assert len(submitted) == 40
    assert set(submitted.values()) == {1}
    started = Counter(e.job_id for e in events if isinstance(e, TaskStarted))
    assert set(started.values()) == {1}
    placed = Counter(d.job_id for d in await rig.decisions() if isinstance(d, JobPlaced))
    assert set(placed.values()) == {1}


async def test_api_server_away_and_back_loses_nothing(rig: Rig) -> None:
    rig.apply(items(node("s1", cpu="16", mem="64Gi")))
    rig.apply(items(*(pod(f"x-{i}") for i in range(5))))
    await rig.until("x bound", lambda: len(bound(rig, [f"x-{i}" for i in range(5)])) == 5)
    # refused at once; its open watch streams are cut when it is SIGKILLed 3 s later (it waits on
    # them until killed: kube.sh's default 30 s grace changes nothing but the wait)
    rig.kube.stop_apiserver(grace_s=3)
    await asyncio.sleep(2)
    rig.kube.start()
    rig.apply(items(*(pod(f"y-{i}") for i in range(5))))
    names = [f"{p}-{i}" for p in "xy" for i in range(5)]
    await rig.until("x and y bound", lambda: len(bound(rig, names)) == 10, timeout_s=90)
    await rig.until("all running", lambda: all(p["status"]["phase"] == "Running" for p in pods(rig).values()))
    observer = rig.backend.observer  # type: ignore[union-attr]

    async def all_started() -> bool:  # the observer's watch may still be backing off: it reports late
        await observer.emitter.flush()
        return await rig.count(TaskStarted) >= 10

    await rig.until_async("the backend reported all ten running", all_started)
    pod_watch = observer.pod_watch
    relister = pod_watch.__class__(observer.api, pod_watch.kind, pod_watch.handlers)
    await relister.relist()  # what a reconnect does: it must add nothing now
    await observer.emitter.flush()
    events = await rig.events()
    assert Counter(type(e).__name__ for e in events if not isinstance(e, NodeHeartbeat)) == Counter(
        {"JobSubmitted": 10, "TaskStarted": 10}
    )


async def test_watch_from_a_compacted_version_is_gone_and_relist_adds_nothing(rig: Rig) -> None:
    rig.apply(items(node("c1", cpu="16", mem="64Gi")))
    rig.apply(items(*(pod(f"z-{i}") for i in range(3))))
    await rig.until("z bound", lambda: len(bound(rig, [f"z-{i}" for i in range(3)])) == 3)
    observer = rig.backend.observer  # type: ignore[union-attr]
    await rig.until("z running", lambda: all(p["status"]["phase"] == "Running" for p in pods(rig).values()))
    await observer.emitter.flush()
    watcher = observer.pod_watch.__class__(observer.api, observer.pod_watch.kind, observer.pod_watch.handlers)
    watcher.resource_version = "1"
    with pytest.raises(GoneError):
        await watcher.watch_once()
    appended = observer.emitter.appended
    await watcher.relist()
    await observer.emitter.flush()
    assert observer.emitter.appended == appended, "a relist of an unchanged cluster reported something"


async def test_backend_user_has_only_the_documented_rights(rig: Rig) -> None:
    api = await KubeApi.connect(str(rig.kube.scheduler_kubeconfig))
    try:
        with pytest.raises(KubeApiError) as refused:
            await api.request("DELETE", "/api/v1/namespaces/default/pods/anything")
        assert refused.value.status == 403
    finally:
        await api.close()


async def test_a_deleted_node_is_removed_once(rig: Rig) -> None:
    rig.apply(items(node("gone-1", gpus=4, model="A100"), node("stays-1")))
    ledger = rig.backend.observer.emitter.ledger  # type: ignore[union-attr]
    await rig.until("both nodes reported", lambda: len(ledger.nodes) == 2)
    assert ledger.nodes["gone-1"].gpu_model == "A100"
    rig.kube.kubectl("delete", "node", "gone-1")
    await rig.until_async("NodeRemoved", lambda: has(rig, NodeRemoved, 1))
    await rig.backend.observer.node_watch.relist()  # type: ignore[union-attr]
    await rig.backend.observer.emitter.flush()  # type: ignore[union-attr]
    assert await rig.count(NodeRemoved) == 1, "a relist must not remove the node again"
