"""A real etcd + kube-apiserver per session, and a rig per test: logs, scheduler loop, backend,
fake kubelet, all in the test's event loop."""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetlog.backends.kubernetes import KubeApi, KubeBackendConfig, KubernetesBackend
from fleetlog.backends.kubernetes.api import KubeUnreachableError
from fleetlog.core.policy import policy_named
from fleetlog.events import DecisionBatch, Event, decode
from fleetlog.events.model import Decision
from fleetlog.log.base import DECISIONS, INPUTS, LogStore
from fleetlog.log.file import FileLogStore
from fleetlog.log.kafka import KafkaConfig, KafkaLogStore
from fleetlog.service.loop import LoopConfig, SchedulerLoop
from tests.backends.kubernetes.kubelet import FakeKubelet
from tests.kube_apiserver import REPO, KubeControlPlane

DOC = REPO / "docs" / "kubernetes.md"


def doc_manifest(kind: str) -> str:
    """The YAML block of docs/kubernetes.md that defines ``kind`` (the docs are what we test)."""
    for block in re.findall(r"```yaml\n(.*?)```", DOC.read_text(), flags=re.S):
        if re.search(rf"^kind: {kind}$", block, flags=re.M):
            return str(block)
    raise AssertionError(f"docs/kubernetes.md has no {kind} manifest")


@pytest.fixture(scope="session")
def kube() -> Iterator[KubeControlPlane]:
    """The session's control plane, with the documented ClusterRole bound to the scheduler user."""
    plane = KubeControlPlane()
    plane.start(fresh=True)
    try:
        plane.kubectl("apply", "-f", "-", stdin=doc_manifest("ClusterRole"))
        plane.kubectl(
            "create", "clusterrolebinding", "fleetlog-scheduler",
            "--clusterrole=fleetlog-scheduler", "--user=fleetlog-scheduler",
        )  # fmt: skip
        yield plane
    finally:
        plane.close()


def wipe(kube: KubeControlPlane) -> None:
    """Remove the pods, nodes and namespaces earlier tests left (the API server is shared)."""
    kube.kubectl("delete", "pods", "--all", "--all-namespaces", "--grace-period=0", "--force")
    kube.kubectl("delete", "nodes", "--all")
    kube.kubectl("delete", "priorityclasses", "-l", "fleetlog.test=true", "--wait=false")


class Rig:
    """One scheduling world over the test API server: log store, scheduler loop, backend, kubelet."""

    def __init__(self, kube: KubeControlPlane, store: LogStore, cfg: KubeBackendConfig) -> None:
        self.kube, self.store, self.cfg = kube, store, cfg
        self.loop = SchedulerLoop(store, policy_named("default"), LoopConfig(check_invariants=True))
        self.backend: KubernetesBackend | None = None
        self.apis: list[KubeApi] = []
        self.kubelet: FakeKubelet | None = None
        self.driver: asyncio.Task[None] | None = None
        self.admin: KubeApi | None = None
        self.snapshot: dict[str, dict[str, Any]] = {}
        """Pod name -> pod (namespace ``default``), as of the last :meth:`refresh`."""

    async def start(self) -> None:
        await self.loop.recover()
        admin = self.admin = await self.api(self.kube.kubeconfig)
        self.kubelet = FakeKubelet(admin)
        self.kubelet.start()
        await self.start_backend()
        self.driver = asyncio.create_task(self._drive())

    async def api(self, kubeconfig: Path) -> KubeApi:
        api = await KubeApi.connect(str(kubeconfig))
        self.apis.append(api)
        return api

    async def start_backend(self) -> KubernetesBackend:
        """A new backend process (as far as state goes), running as the ``fleetlog-scheduler`` user."""
        api = await self.api(self.kube.scheduler_kubeconfig)
        self.backend = KubernetesBackend(self.store, api, self.cfg)
        await self.backend.start()
        return self.backend

    async def stop_backend(self) -> None:
        if self.backend is not None:
            await self.backend.stop()
            self.backend = None

    async def _drive(self) -> None:
        while True:
            await self.loop.step(50)

    async def close(self) -> None:
        await asyncio.wait_for(self._close(), 60)  # a teardown that hangs is a failure, not a stall

    async def _close(self) -> None:
        if self.driver is not None:
            self.driver.cancel()
            # asyncio.wait, not ``suppress(CancelledError): await``: close's own cancellation (its
            # 60 s) must not be swallowed here, or a driver that ignored its cancel is a silent stall
            await asyncio.wait({self.driver})
            if not self.driver.cancelled():
                self.driver.result()  # the loop died of an error: the test fails with it
        await self.stop_backend()
        if self.kubelet is not None:
            await self.kubelet.stop()
        for api in self.apis:
            await api.close()

    async def refresh(self) -> dict[str, dict[str, Any]]:
        """Read the pods of namespace ``default`` (through the API, not kubectl: never block the loop)."""
        assert self.admin is not None
        listed = json.loads(await self.admin.request("GET", "/api/v1/namespaces/default/pods"))
        self.snapshot = {p["metadata"]["name"]: p for p in listed["items"]}
        return self.snapshot

    def apply(self, manifest: str) -> None:
        self.kube.kubectl("apply", "-f", "-", stdin=manifest)

    def get(self, *args: str) -> str:
        return self.kube.kubectl("get", *args)

    async def until(self, what: str, check: Callable[[], bool], timeout_s: float = 60) -> None:
        """Wait until ``check()`` holds, failing loudly with ``what`` after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not (await self._refreshed(deadline) and check()):
            self.alive()
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s}s waiting until {what}")
            await asyncio.sleep(0.1)

    async def _refreshed(self, deadline: float) -> bool:
        """Refresh the snapshot; False when the API server did not answer in time. Three sessions on
        two cores can stall the test's own GET past its 30 s: that is a missed poll, not a failure,
        unless the deadline passes too."""
        try:
            await self.refresh()
        except KubeUnreachableError:
            if time.monotonic() > deadline:
                raise
            return False
        return True

    def alive(self) -> None:
        """Fail loudly if the backend or the scheduler loop died in the background."""
        if self.backend is not None and self.backend.failed() is not None:
            raise AssertionError(f"the backend died: {self.backend.failed()!r}")
        if self.driver is not None and self.driver.done() and not self.driver.cancelled():
            raise AssertionError(f"the scheduler loop died: {self.driver.exception()!r}")

    async def until_async(
        self, what: str, check: Callable[[], Awaitable[bool]], timeout_s: float = 60
    ) -> None:
        """Like :meth:`until`, for a check that reads the logs."""
        deadline = time.monotonic() + timeout_s
        while not await check():
            self.alive()
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s}s waiting until {what}")
            await asyncio.sleep(0.2)

    async def count(self, kind: type, log: str = INPUTS) -> int:
        return sum(isinstance(e, kind) for e in await self.events(log))

    async def events(self, log: str = INPUTS) -> list[Event]:
        return [event for _, event in await self.timed_events(log)]

    async def timed_events(self, log: str = INPUTS) -> list[tuple[int, Event]]:
        """Each event of ``log`` with its append time (``timestamp_ms``)."""
        end, out, at = await self.store.log(log).end_offset(), [], 0
        while at < end:
            records = await self.store.log(log).read(at, 10_000)
            if not records:
                break  # only Kafka transaction markers are left
            out.extend((r.timestamp_ms, decode(r.value).event) for r in records)
            at = records[-1].offset + 1
        return out

    async def decisions(self) -> list[Decision]:
        return [d for b in await self.events(DECISIONS) if isinstance(b, DecisionBatch) for d in b.decisions]


BOTH_LOGS = pytest.mark.parametrize(
    "store_maker", ["file", pytest.param("kafka", marks=pytest.mark.kafka)], indirect=True
)
"""Run a test over the file log and over a real Kafka broker (default: the file log only)."""


@pytest.fixture
def store_maker(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], LogStore]:
    if getattr(request, "param", "file") == "file":
        return lambda: FileLogStore(tmp_path / "log")
    bootstrap = request.getfixturevalue("kafka_bootstrap")
    prefix = f"kube-{uuid.uuid4().hex[:12]}"  # topics outlive the session: never reuse a prefix
    return lambda: KafkaLogStore(KafkaConfig(bootstrap_servers=bootstrap, topic_prefix=prefix))


@pytest.fixture
async def rig(kube: KubeControlPlane, store_maker: Callable[[], LogStore]) -> AsyncIterator[Rig]:
    wipe(kube)
    store = store_maker()
    await store.open()
    r = Rig(kube, store, KubeBackendConfig(heartbeat_ms=2_000))
    await r.start()
    try:
        yield r
    finally:
        await r.close()
        await store.close()
