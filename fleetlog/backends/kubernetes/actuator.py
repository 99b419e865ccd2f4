"""Effects: decision batches from the decisions log → Kubernetes.

- ``JobPlaced`` → one Binding per pod (``pods/binding``); a pod already bound there is skipped,
  so replaying the decisions log after a restart binds nothing twice.  A pod already bound to
  another node cannot move (Kubernetes never moves a pod): that task is reported failed.
- ``TaskPreempted`` → an eviction through the Eviction API.
- ``JobPending`` / ``JobRejected`` → each waiting pod's ``PodScheduled=False`` condition with
  fleetlog's reason, and an Event, so ``kubectl describe pod`` shows why it waits.  A pod whose
  condition already says so is left alone.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Final

from tenacity import RetryCallState

from fleetlog.backends.kubernetes.api import (
    STRATEGIC_PATCH,
    KubeApi,
    KubeApiError,
    KubeUnreachableError,
)
from fleetlog.backends.kubernetes.config import KubeBackendConfig
from fleetlog.backends.kubernetes.objects import Pod
from fleetlog.backends.kubernetes.observer import Observer, waiting
from fleetlog.events import JobPending, JobPlaced, JobRejected, TaskFailed, TaskPreempted
from fleetlog.events.model import Decision
from fleetlog.events.spec import tolerates
from fleetlog.log import errorpolicy
from fleetlog.log.base import DECISIONS, LogStore
from fleetlog.log.consumer import CorruptDecisionsError, decision_batches
from fleetlog.retry import Backoff, poll

log = logging.getLogger("fleetlog.backends.kubernetes")
CONFLICT: Final = 409
NOT_FOUND: Final = 404
TOO_MANY: Final = 429
RETRY_S: Final = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
EVENTS_IN_FLIGHT: Final = 8
"""Kubernetes Events posted at once (beside, not through, the binding gate)."""
EVENTS_QUEUED: Final = 1_000
"""Events waiting to be posted at most; past it one is dropped and counted (``events_dropped``),
as kube-scheduler's event broadcaster drops when its queue is full: an Event tells people,
no decision depends on it."""


def camel(code: str) -> str:
    """``gang_does_not_fit`` → ``GangDoesNotFit`` (the form of Kubernetes condition reasons)."""
    return "".join(part.capitalize() for part in code.split("_"))


class Actuator:
    def __init__(self, api: KubeApi, cfg: KubeBackendConfig, observer: Observer) -> None:
        self.api, self.cfg, self.observer = api, cfg, observer
        self.emitter = observer.emitter
        self.offset = 0
        self.bound: dict[str, str] = {}
        """Pod key -> node, for bindings this process made (the watch may not have shown them yet)."""
        self.gate = asyncio.Semaphore(cfg.bind_concurrency)
        self.counts = {"bound": 0, "evicted": 0, "explained": 0, "failed": 0, "deferred": 0, "events": 0,
                       "events_dropped": 0}  # fmt: skip
        self.event_gate = asyncio.Semaphore(EVENTS_IN_FLIGHT)
        self.noting: set[asyncio.Task[None]] = set()
        """Events being posted (:meth:`note`)."""
        self.evicted: set[str] = set()
        """Keys of pods evicted for a ``NoExecute`` taint (each asked once)."""
        self.evicting: dict[str, set[str]] = {}
        """Node -> keys of pods evicted from it that may still be there (terminating)."""
        self.waiting: set[asyncio.Task[None]] = set()
        self.running = True  # cleared before the owner cancels (see Watcher.running)
        self.caught_up = False
        self.failures = 0
        self.stalled = ""
        """Why the actuator stands by (a decision record it cannot read ...), until it reads again."""

    # --- reading decisions ------------------------------------------------------------------

    async def catch_up(self, store: LogStore) -> int:
        """Apply the decisions log up to its current end, keeping per job only what still
        matters (its last placement or preemption, and its last reason); return how many.
        What precedes a record it cannot read is applied before the error is raised."""
        end = await store.log(DECISIONS).end_offset()
        latest: dict[tuple[str, bool], tuple[int, Decision]] = {}
        position, error = 0, None
        while self.offset < end:
            before = self.offset
            try:
                decisions = await self._read(store, 0)
            except CorruptDecisionsError as exc:
                error = exc
                break
            if self.offset == before:
                break  # only transaction markers are left (Kafka): nothing more to read
            for decision in decisions:
                explains = isinstance(decision, JobPending | JobRejected)
                latest[(decision.job_id, explains)] = (position, decision)
                position += 1
        await self.apply_all(d for _, d in sorted(latest.values(), key=lambda pd: pd[0]))
        if error is not None:
            raise error
        self.caught_up = True
        return len(latest)

    async def follow(self, store: LogStore, timeout_ms: int = 200) -> int:
        """Apply the decisions appended since the last call (waiting up to ``timeout_ms``)."""
        decisions = await self._read(store, timeout_ms)
        await self.apply_all(decisions)
        return len(decisions)

    async def _read(self, store: LogStore, timeout_ms: int) -> list[Decision]:
        """The decisions of the next records; the offset moves past what was read, and never
        past a record that cannot be read (that one raises once nothing before it is left)."""
        records = await store.log(DECISIONS).read(self.offset, 1000, timeout_ms)
        if not records:
            return []
        decisions: list[Decision] = []
        try:
            for offset, batch in decision_batches(records):
                decisions.extend(batch.decisions)
                self.offset = offset + 1
        except CorruptDecisionsError:
            if not decisions:
                raise
            return decisions  # the next read starts at the bad record, and raises
        self.offset = records[-1].offset + 1
        return decisions

    async def run(self, store: LogStore) -> None:
        """Follow the decisions log until stopped, never raising: a log that is away is retried
        with back-off; a record it cannot read keeps the actuator at that record, said once and
        re-checked every few seconds (:mod:`fleetlog.log.errorpolicy`, the service's policy)."""
        while self.running:
            stepped = await errorpolicy.persist(
                lambda: self.step(store), self.failed, stopped=lambda: not self.running
            )
            if stepped:
                self.resumed()

    async def step(self, store: LogStore) -> None:
        if self.caught_up:
            await self.follow(store)
        else:
            await self.catch_up(store)
        await self.evict_untolerated()
        await self.emitter.flush()

    async def evict_untolerated(self) -> None:
        """Evict, through the Eviction API, fleetlog's pods bound to a node with a ``NoExecute``
        taint they do not tolerate (the core requeued their gangs when it folded the taint; the
        pods themselves must go, as Kubernetes' taint manager would make them)."""
        tainted = self.observer.no_execute()
        if not tainted:
            return
        work = []
        for key, pod in sorted(self.observer.pods.items()):
            taints = tainted.get(pod.spec.node_name)
            if not taints or pod.metadata.deletion_timestamp is not None or key in self.evicted:
                continue
            tolerations = [(t.key, t.operator, t.value, t.effect) for t in pod.spec.tolerations]
            taint = next((t for t in taints if not tolerates(tolerations, t)), None)
            if taint is not None and self.observer.task_of.get(key) is not None:
                self.evicted.add(key)
                work.append(self._evict_untolerating(key, pod, taint))
        await asyncio.gather(*work)

    def failed(self, state: RetryCallState, status: str, action: str) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        assert error is not None
        self.report(error, status, action, state.upcoming_sleep)

    def report(self, error: BaseException, status: str, action: str, retry_s: float) -> None:
        """Every retry as a warning; a stall once, as an error naming the log, the offset and
        the error (its re-checks only in the debug log)."""
        self.failures += 1
        if status == "retrying":
            log.warning("kubernetes actuator: %s (retry in %.2fs)", error, retry_s)
            return
        repeat, self.stalled = self.stalled == str(error), str(error)
        name, offset = errorpolicy.where(error)
        (log.debug if repeat else log.error)(
            "kubernetes_actuator_stalled log=%s offset=%s error_type=%s error=%r action=%r recheck_s=%.2f",
            name or "-",
            "-" if offset is None else offset,
            type(error).__name__,
            str(error)[:2000],
            action,
            retry_s,
        )

    def resumed(self) -> None:
        if self.stalled:
            log.info("kubernetes_actuator_resumed decisions_offset=%d", self.offset)
            self.stalled = ""

    # --- effects ----------------------------------------------------------------------------

    async def apply_all(self, decisions: Iterable[Decision]) -> None:
        """Apply in order; consecutive placements go out together (their bindings are independent)."""
        placements: list[JobPlaced] = []
        for decision in decisions:
            if isinstance(decision, JobPlaced):
                placements.append(decision)
                continue
            await self.place(placements)
            placements = []
            await self.apply(decision)
        await self.place(placements)

    async def apply(self, decision: Decision) -> None:
        match decision:
            case JobPlaced():
                await self.place([decision])
            case TaskPreempted():
                await self.evict(decision)
            case JobPending() | JobRejected():
                await self.explain(decision)

    async def place(self, placements: list[JobPlaced]) -> None:
        """Bind now, or once the pods evicted to make room have left the target nodes (a kubelet
        admits a pod only when the node's resources are free)."""
        ours = [d for d in placements if d.cell == self.cfg.cell]
        for d in [d for d in ours if self._blocked(d)]:
            self.counts["deferred"] += 1
            task = asyncio.create_task(self._bind_when_free(d))
            self.waiting.add(task)
            task.add_done_callback(self.waiting.discard)
        await asyncio.gather(*(self._bind_job(d) for d in ours if not self._blocked(d)))

    def _blocked(self, d: JobPlaced) -> bool:
        pods = self.observer.pods
        for t in d.tasks:
            leaving = self.evicting.get(t.node)
            if leaving:
                leaving.intersection_update(pods)  # forget the pods already gone
                if leaving:
                    return True
        return False

    async def _bind_when_free(self, d: JobPlaced, patience_s: float = 120.0) -> None:
        async def free() -> bool:
            return not self._blocked(d)

        await poll(free, bool, within_s=patience_s, backoff=Backoff(0.05, factor=1))
        await self._bind_job(d)

    async def _bind_job(self, d: JobPlaced) -> None:
        binds = [
            self.bind(key, pod, d, t.task_index, t.node)
            for t in d.tasks
            for key, pod in self._pod(d.job_id, t.task_index)
        ]
        await asyncio.gather(*binds)

    def _pod(self, job_id: str, index: int) -> list[tuple[str, Pod]]:
        keys = self.observer.keys_of(job_id)
        key = keys[index] if index < len(keys) else ""
        pod = self.observer.pods.get(key)
        return [(key, pod)] if pod is not None else []

    async def bind(self, key: str, pod: Pod, d: JobPlaced, index: int, node: str) -> None:
        """Bind ``pod`` to ``node`` unless it is bound already."""
        where = self.bound.get(key) or pod.spec.node_name
        if where == node or pod.metadata.deletion_timestamp is not None:
            return
        if where:
            self._cannot_move(d.job_id, index, key, where, node)
            return
        meta = pod.metadata
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": meta.name, "namespace": meta.namespace, "uid": meta.uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        path = f"/api/v1/namespaces/{pod.metadata.namespace}/pods/{pod.metadata.name}/binding"
        if await self._post(path, body, f"bind {key} to {node}"):
            self.bound[key] = node
            self.counts["bound"] += 1
            where = f"{meta.namespace}/{meta.name}"
            self.note(pod, "Scheduled", f"Successfully assigned {where} to {node} (fleetlog job {d.job_id}, "
                                        f"task {index})")  # fmt: skip

    def _cannot_move(self, job_id: str, index: int, key: str, where: str, node: str) -> None:
        reason = f"node_lost: pod {key} is bound to {where} and cannot move to {node}; recreate it"
        if self.emitter.emit(TaskFailed(job_id=job_id, task_index=index, reason=reason)):
            self.counts["failed"] += 1

    async def evict(self, d: TaskPreempted) -> None:
        for key, pod in self._pod(d.job_id, d.task_index):
            if pod.metadata.deletion_timestamp is not None:
                continue
            why = f"preempted by {d.by_job_id}: {d.cause}"
            if await self._evict_pod(key, pod, why):
                self.note(pod, "Preempted", f"Preempted by fleetlog job {d.by_job_id} on node "
                                            f"{pod.spec.node_name} ({d.cause})")  # fmt: skip

    async def _evict_pod(self, key: str, pod: Pod, why: str) -> bool:
        """Evict ``pod`` through the Eviction API; whether it took effect."""
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": pod.metadata.name, "namespace": pod.metadata.namespace},
        }
        path = f"/api/v1/namespaces/{pod.metadata.namespace}/pods/{pod.metadata.name}/eviction"
        if not await self._post(path, body, f"evict {key} ({why})"):
            return False
        self.counts["evicted"] += 1
        self.evicting.setdefault(pod.spec.node_name, set()).add(key)
        return True

    async def _evict_untolerating(self, key: str, pod: Pod, taint: tuple[str, str, str]) -> None:
        if await self._evict_pod(key, pod, f"untolerated taint {taint[0]}:{taint[2]}"):
            where, node = f"{pod.metadata.namespace}/{pod.metadata.name}", pod.spec.node_name
            message = f"Marking for deletion Pod {where}: node {node} has taint {taint[0]}:{taint[2]}"
            self.note(pod, "TaintManagerEviction", message)

    def note(self, pod: Pod, reason: str, message: str, kind: str = "Normal") -> None:
        """Post a Kubernetes Event on ``pod`` in the background, as kube-scheduler does (best
        effort: not retried; at most ``EVENTS_QUEUED`` waiting)."""
        if len(self.noting) >= EVENTS_QUEUED:
            self.counts["events_dropped"] += 1
            return
        task = asyncio.create_task(self._note(pod, reason, message, kind))
        self.noting.add(task)
        task.add_done_callback(self.noting.discard)

    async def _note(self, pod: Pod, reason: str, message: str, kind: str) -> None:
        path = f"/api/v1/namespaces/{pod.metadata.namespace}/events"
        async with self.event_gate:
            try:
                await self.api.request("POST", path, body=event_body(pod, reason, message, kind))
            except (KubeApiError, KubeUnreachableError) as e:
                log.info("event %s on pod %s not posted: %s", reason, pod.metadata.name, e)
                return
        self.counts["events"] += 1

    async def explain(self, d: JobPending | JobRejected) -> None:
        verb = "rejected" if isinstance(d, JobRejected) else "pending"
        reason, message = camel(d.reason), f"fleetlog: {verb}: {d.reason}: {d.message}"[:4096]
        keys = self.observer.keys_of(d.job_id)
        pods = [(k, self.observer.pods[k]) for k in keys if k in self.observer.pods]
        work = [self.condition(k, p, reason, message) for k, p in pods if waiting(p) and k not in self.bound]
        await asyncio.gather(*work)

    async def condition(self, key: str, pod: Pod, reason: str, message: str) -> None:
        """Set ``PodScheduled=False`` with ``reason``, and record an Event, unless already said."""
        said = any(
            c.type == "PodScheduled" and c.status == "False" and c.reason == reason and c.message == message
            for c in pod.status.conditions
        )
        if said:
            return
        ns, name = pod.metadata.namespace, pod.metadata.name
        patch = {"status": {"conditions": [scheduled_false(reason, message)]}}
        path = f"/api/v1/namespaces/{ns}/pods/{name}/status"
        send = lambda: self.api.request("PATCH", path, body=patch, content_type=STRATEGIC_PATCH)  # noqa: E731
        if await self._call(send, key):
            events = f"/api/v1/namespaces/{ns}/events"
            await self._post(events, event_body(pod, "FailedScheduling", f"{reason}: {message}", "Warning"),
                             f"event {key}")
            self.counts["explained"] += 1

    # --- requests ---------------------------------------------------------------------------

    async def _post(self, path: str, body: dict[str, Any], what: str) -> bool:
        return await self._call(lambda: self.api.request("POST", path, body=body), what)

    async def _call(self, send: Callable[[], Awaitable[bytes]], what: str) -> bool:
        """Send with the concurrency gate, retrying while the API server is away or throttles.
        Whether it took effect; a 404 or 409 (gone, or done already) is not retried."""
        for delay in (*RETRY_S, *([RETRY_S[-1]] * 1000)):
            if not self.running:
                break
            try:
                async with self.gate:
                    await send()
                return True
            except KubeApiError as e:
                if e.status in (NOT_FOUND, CONFLICT) or (e.status < 500 and e.status != TOO_MANY):
                    log.info("%s: %s", what, e)
                    return False
                log.warning("%s: %s; retrying in %.1fs", what, e, delay)
            except KubeUnreachableError as e:
                log.warning("%s: %s; retrying in %.1fs", what, e, delay)
            await asyncio.sleep(delay)
        return False


def scheduled_false(reason: str, message: str) -> dict[str, str]:
    return {"type": "PodScheduled", "status": "False", "reason": reason, "message": message}


def event_body(pod: Pod, reason: str, message: str, kind: str) -> dict[str, Any]:
    """A core/v1 Event on ``pod`` (``kind``: ``Normal`` or ``Warning``), from component fleetlog."""
    meta = pod.metadata
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta.name}.", "namespace": meta.namespace},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": meta.name,
            "namespace": meta.namespace,
            "uid": meta.uid,
        },
        "reason": reason,
        "message": message[:1024],
        "type": kind,
        "source": {"component": "fleetlog"},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
