"""The Kubernetes backend: observer + actuator over one API server, acting only through the logs.

Start-up order makes restarts safe: fold the inputs log into the ledger (what was already
said), list nodes and pods (reporting only differences), apply the decisions log as it stands
(binding only pods not yet bound), then follow the watches and the decisions log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from fleetlog.backends.kubernetes.actuator import Actuator
from fleetlog.backends.kubernetes.api import KubeApi
from fleetlog.backends.kubernetes.config import KubeBackendConfig
from fleetlog.backends.kubernetes.emitter import Emitter
from fleetlog.backends.kubernetes.ledger import read_ledger
from fleetlog.backends.kubernetes.observer import Observer
from fleetlog.log import errorpolicy
from fleetlog.log.base import LogStore
from fleetlog.retry import Backoff, always, retry

log = logging.getLogger("fleetlog.backends.kubernetes")


class KubernetesBackend:
    def __init__(self, store: LogStore, api: KubeApi, cfg: KubeBackendConfig | None = None) -> None:
        self.store, self.api = store, api
        self.cfg = cfg or KubeBackendConfig()
        self.tasks: list[asyncio.Task[None]] = []
        self.observer: Observer | None = None
        self.actuator: Actuator | None = None

    async def start(self) -> None:
        """Catch up with the logs and the API server, then follow both in background tasks."""
        ledger, _ = await read_ledger(self.store, self.cfg.cell)
        emitter = Emitter(self.store, ledger, self.cfg.producer_id)
        observer = self.observer = Observer(self.api, self.cfg, emitter)
        await self._first_lists(observer)
        await emitter.flush()
        actuator = self.actuator = Actuator(self.api, self.cfg, observer)
        try:
            await actuator.step(self.store)
        except Exception as exc:  # the actuator's loop re-checks with the policy's waits
            actuator.report(exc, *errorpolicy.classify(exc), 0.0)
        self.tasks = [
            asyncio.create_task(observer.node_watch.run(), name="fleetlog-kube-nodes"),
            asyncio.create_task(observer.pod_watch.run(), name="fleetlog-kube-pods"),
            asyncio.create_task(observer.foreign_watch.run(), name="fleetlog-kube-foreign-pods"),
            asyncio.create_task(self._rounds(observer), name="fleetlog-kube-heartbeats"),
            asyncio.create_task(emitter.run(self.cfg.flush_ms), name="fleetlog-kube-emitter"),
            asyncio.create_task(actuator.run(self.store), name="fleetlog-kube-actuator"),
        ]

    async def _first_lists(self, observer: Observer) -> None:
        """List the pods fleetlog does not own (so the first heartbeats carry them), nodes, then
        fleetlog's pods, retrying while the API server is not there yet."""
        for watcher in (observer.foreign_watch, observer.node_watch, observer.pod_watch):

            def failed(e: BaseException, _delay: float, path: str = watcher.kind.path) -> None:
                log.warning("first list of %s failed (%s); retrying", path, e)

            # any failure here is retried: the server may be starting
            await retry(
                watcher.relist, always, within_s=None, backoff=Backoff(0.1, max_s=5.0), on_retry=failed
            )

    async def _rounds(self, observer: Observer) -> None:
        """Each ``heartbeat_ms``: every node re-reported, in ``heartbeat_slices`` slices spread
        over the period; the gangs that are not whole yet retried once."""
        slices = self.cfg.heartbeat_slices
        while True:
            for part in range(slices):
                await asyncio.sleep(self.cfg.heartbeat_ms / slices / 1000)
                observer.heartbeat_round(part, slices)
            await observer.retry_incomplete_groups()

    async def stop(self) -> None:
        """Cancel the background tasks and append what is still queued."""
        if self.observer is not None:
            for watch in (self.observer.node_watch, self.observer.pod_watch, self.observer.foreign_watch):
                watch.running = False
        if self.actuator is not None:
            self.actuator.running = False
            self.tasks.extend(self.actuator.waiting | self.actuator.noting)
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.tasks = []
        if self.observer is not None:
            await self.observer.emitter.flush()

    def failed(self) -> BaseException | None:
        """The exception of a background task that died, if one did (tests check this)."""
        for task in self.tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                return task.exception()
        return None
