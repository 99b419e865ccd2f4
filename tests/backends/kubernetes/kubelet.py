"""A fake kubelet for every node at once: there are no kubelets next to the test API server.

It watches fleetlog's pods and plays the part a kubelet plays after a binding:

- a bound ``Pending`` pod → ``Running`` (unless its node is "dead": ``kill_node``);
- a running pod with the annotation ``fleetlog.test/run-ms`` → ``Succeeded`` after that long, or
  ``Failed`` with the exit code in ``fleetlog.test/exit-code`` if it is not 0;
- a bound pod being deleted (an eviction) → deleted for good (``gracePeriodSeconds=0``), as a
  kubelet does once its containers have stopped.

It talks to the real API server, through the same client as the backend.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Final

from fleetlog.backends.kubernetes.api import JSON, MERGE_PATCH, KubeApi, KubeApiError, KubeUnreachableError
from fleetlog.backends.kubernetes.objects import Pod
from fleetlog.backends.kubernetes.observer import pods_kind
from fleetlog.backends.kubernetes.watch import Handlers, Watcher

RUN_MS: Final = "fleetlog.test/run-ms"
EXIT_CODE: Final = "fleetlog.test/exit-code"


class FakeKubelet:
    def __init__(self, api: KubeApi, scheduler_name: str = "fleetlog") -> None:
        self.api = api
        self.dead: set[str] = set()
        self.started: dict[str, str] = {}  # pod key -> node it was started on
        self.finishing: set[str] = set()
        self.watcher = Watcher(api, pods_kind(scheduler_name), Handlers(self._relisted, self._changed), 60)
        self.task: asyncio.Task[None] | None = None
        self.pending: set[asyncio.Task[None]] = set()
        self.errors: list[str] = []

    def start(self) -> None:
        self.task = asyncio.create_task(self.watcher.run(), name="fake-kubelet")

    async def stop(self) -> None:
        self.watcher.running = False
        for task in [self.task, *self.pending]:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def kill_node(self, node: str) -> None:
        """This node's kubelet is gone: its pods are left as they are."""
        self.dead.add(node)

    async def _relisted(self, pods: list[Pod]) -> None:
        for pod in pods:
            await self._changed("MODIFIED", pod)

    async def _changed(self, kind: str, pod: Pod) -> None:
        node, meta = pod.spec.node_name, pod.metadata
        key = f"{meta.namespace}/{meta.name}"
        if kind == "DELETED" or not node or node in self.dead:
            return
        if meta.deletion_timestamp is not None:
            self._spawn(self._delete(pod))
        elif pod.status.phase == "Pending" and key not in self.started:
            self.started[key] = node
            self._spawn(self._run(pod))

    def _spawn(self, work: Any) -> None:
        task = asyncio.create_task(work)
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def _run(self, pod: Pod) -> None:
        await self._status(pod, {"phase": "Running", "conditions": [ready("True")]})
        run_ms = pod.metadata.annotations.get(RUN_MS)
        if run_ms is None:
            return
        await asyncio.sleep(int(run_ms) / 1000)
        if pod.spec.node_name in self.dead:
            return
        code = int(pod.metadata.annotations.get(EXIT_CODE, "0"))
        await self._status(pod, terminated(pod, code))

    async def _status(self, pod: Pod, status: dict[str, Any]) -> None:
        path = f"/api/v1/namespaces/{pod.metadata.namespace}/pods/{pod.metadata.name}/status"
        await self._send("PATCH", path, {"status": status}, MERGE_PATCH)

    async def _delete(self, pod: Pod) -> None:
        path = f"/api/v1/namespaces/{pod.metadata.namespace}/pods/{pod.metadata.name}"
        await self._send("DELETE", path, {"gracePeriodSeconds": 0}, JSON)

    async def _send(self, method: str, path: str, body: dict[str, Any], content_type: str) -> None:
        """Send until the API server answers, as a kubelet keeps syncing; a 404 means the pod is gone."""
        while self.watcher.running:
            try:
                await self.api.request(method, path, body=body, content_type=content_type)
                return
            except KubeApiError as e:
                if e.status != 404:
                    self.errors.append(f"{method} {path}: {e}")
                return
            except KubeUnreachableError:
                await asyncio.sleep(0.5)


def ready(status: str) -> dict[str, str]:
    return {"type": "Ready", "status": status}


def terminated(pod: Pod, code: int) -> dict[str, Any]:
    states = [
        {
            "name": c.name,
            "image": "fleetlog/test",
            "imageID": "",
            "ready": False,
            "restartCount": 0,
            "state": {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}},
        }
        for c in pod.spec.containers
    ]
    phase = "Succeeded" if code == 0 else "Failed"
    return {"phase": phase, "conditions": [ready("False")], "containerStatuses": states}
