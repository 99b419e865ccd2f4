"""``fleetlog run --role dispatch|cell|all`` with a ``[cells]`` map: the global dispatcher and the
cell shards as a service (issue 17, docs/scale-out.md "Roles").

* ``dispatch`` (Kafka): one leader for the global shard through the sticky election
  (:class:`fleetlog.service.leader.KafkaElection` over the global shard's configuration: group
  ``<prefix>.global.shard0.leader``), fenced by the transactional id ``<prefix>-dispatch``; it
  runs :class:`fleetlog.service.dispatcher.DispatcherLoop` with its snapshots.
* ``cell`` (Kafka): the cell partitions this process is assigned in the owners group
  (:mod:`fleetlog.service.owners`), each stepped by :mod:`fleetlog.service.cellrunner`.
* ``all`` with a ``[cells]`` map: both in one process.  On Kafka that is the two above side by
  side; on the file log (embedded mode) the process opens the global partition's store and every
  cell partition's (``for_shard``: one registry, so the dispatcher's outbox writes into them)
  before the dispatcher recovers, and steps them all.  ``all`` without a map is today's single
  shard (:class:`fleetlog.service.service.Service`), untouched.

A SIGTERM commits and snapshots every shard the process steps, then the process exits 0.  HTTP
serves ``/healthz``, ``/readyz`` and ``/metrics`` throughout; ingest is the single shard's
(producers write the roles' partitions themselves: the client routes by cell).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any, Final

import structlog

from fleetlog.core.policy import service_policy
from fleetlog.log.base import LogStore, Shard
from fleetlog.log.file import LockedError
from fleetlog.log.kafka import FencedError, KafkaLogStore, shard_config
from fleetlog.log.location import make_store
from fleetlog.service.auth import refused_files, security
from fleetlog.service.authz import warn_unpoliced
from fleetlog.service.cellrunner import RETRY_S, CellShards
from fleetlog.service.cellshard import shard_snapshots
from fleetlog.service.config import Config
from fleetlog.service.dispatcher import DispatcherConfig, DispatcherLoop
from fleetlog.service.http import HttpServer, PortInUseError, Request, Response, json_response, refusal
from fleetlog.service.ingest import http_limits
from fleetlog.service.leader import KafkaElection
from fleetlog.service.loop import keep_recovered
from fleetlog.service.metrics import Metrics
from fleetlog.service.owners import Ownership
from fleetlog.service.warmup import Warming, warm_off_loop
from fleetlog.waiting import event_or_timeout

LOCK_POLL_S: Final = 0.1

log = structlog.get_logger("fleetlog.service")


class Dispatching:
    """The global shard as this process holds it: elected (Kafka) or embedded (file log)."""

    def __init__(self, config: Config, stopping: asyncio.Event, metrics: Metrics) -> None:
        self.config, self.stopping, self.metrics = config, stopping, metrics
        self.settings = config.service
        self.snapshots = shard_snapshots(config, Shard.GLOBAL)
        self.election = (
            KafkaElection(shard_config(config.kafka, Shard.GLOBAL), f"{self.settings.producer_id}-dispatch-"
                          f"{os.getpid()}", self.settings.leader_session_timeout_ms)
            if config.kafka is not None else None
        )
        self.loop: DispatcherLoop | None = None

    def make_loop(self, store: LogStore) -> DispatcherLoop:
        return DispatcherLoop(store, self.config.cell_map,
                              DispatcherConfig(max_batch=self.settings.max_batch, commit_every=1_000_000),
                              self.snapshots)

    def lost(self) -> bool:
        return self.stopping.is_set() or (self.election is not None and self.election.lost.is_set())

    async def run_elected(self) -> None:
        """Kafka: lead the global shard whenever elected, until the process stops."""
        failures = 0
        try:
            while not self.stopping.is_set():
                try:
                    await self._elected_cycle()
                    failures = 0
                except FencedError as exc:
                    log.warning("dispatcher_fenced", error=str(exc), action="standing by")
                    await self._sleep(self.settings.leader_session_timeout_ms / 1000)
                except Exception as exc:
                    wait = RETRY_S[min(failures, len(RETRY_S) - 1)]
                    failures += 1
                    log.warning("dispatcher_interrupted", error=str(exc)[:2000],
                                error_type=type(exc).__name__, retry_s=wait)
                    await self._sleep(wait)
        finally:
            if self.election is not None:
                await self.election.stop()
            await self.snapshots.close()

    async def _elected_cycle(self) -> None:
        election = self.election
        assert election is not None
        if not await election.elected(self.stopping):
            return
        store = await open_fenced(self.config, Shard.GLOBAL)
        try:
            loop = self.make_loop(store)
            await self.serve(loop)
        finally:
            await store.close()

    async def serve(self, loop: DispatcherLoop, recovered: bool = False) -> None:
        """Recover (unless the caller just did: ``recovered``), then step until the process
        stops or another process leads; a stopping process commits and snapshots."""
        started = time.monotonic()
        if not recovered:
            await loop.recover()
        keep_recovered()
        self.loop = loop
        self.metrics.leader.set(1)
        log.info("dispatcher_leading", inputs_offset=loop.offset, snapshot=loop.restored_from,
                 seconds=round(time.monotonic() - started, 3))
        try:
            await self._steps(loop)
        finally:
            self.loop = None
            self.metrics.leader.set(0)

    async def _steps(self, loop: DispatcherLoop) -> None:
        committed_at = snapshot_at = time.monotonic()
        snapshot_of, commit_every_s = loop.offset, self.settings.role_commit_every_ms / 1000
        while not self.lost():
            result = await loop.step(timeout_ms=self.settings.idle_wait_ms)
            self.metrics.input_events.inc(result.inputs)
            self.metrics.dead_letters.inc(result.dead_lettered)
            if result.published:
                self.metrics.decisions.inc(result.dispatched)
                self.metrics.batches.inc()
            now = time.monotonic()
            if result.published:
                committed_at = now  # (the step's transaction committed the offset)
            elif now - committed_at >= commit_every_s:
                committed_at = now
                await loop.commit()
            due = loop.offset - snapshot_of >= self.settings.snapshot_every_events or (
                now - snapshot_at >= self.settings.snapshot_every_s and loop.offset > snapshot_of)
            if due:
                snapshot_at, snapshot_of = now, loop.offset
                await loop.snapshot()
        if self.stopping.is_set() and not loop.fenced:
            await loop.commit()
            await loop.snapshot()

    async def _sleep(self, seconds: float) -> None:
        await event_or_timeout(self.stopping, seconds)

    def health(self) -> dict[str, Any]:
        loop = self.loop
        return {"leading": loop is not None, "inputs_offset": loop.offset if loop is not None else None,
                "committed": loop.committed if loop is not None else None,
                "decisions_offset": loop.decisions_next if loop is not None else None}


class RoleService:
    """One ``fleetlog run`` process of the scaled-out roles (module docstring)."""

    def __init__(self, config: Config, stopping: asyncio.Event | None = None) -> None:
        self.config, self.settings = config, config.service
        self.role = config.service.role
        self.policy = service_policy(self.settings.policy)
        self.metrics = Metrics()
        self.stopping = stopping or asyncio.Event()
        guard = security(config.auth, self.settings.http_host)
        self.http = HttpServer(self._handle, self.settings.http_host, self.settings.http_port,
                               http_limits(self.settings), guard.auth, self.metrics.unauthenticated.inc,
                               guard.tls)
        self.dispatching = Dispatching(config, self.stopping, self.metrics) if self.role != "cell" else None
        self.cells: CellShards | None = None
        self.ownership: Ownership | None = None
        self.warming = Warming()

    async def run(self) -> None:
        """Serve until stopped (SIGTERM): every shard commits and snapshots, then it returns."""
        try:  # HTTP first: health says ``warming`` while the kernels compile off the loop (issue 47)
            await self.http.start()
        except PortInUseError as exc:  # every process of these roles steps: none waits for the port
            log.warning("http_port_in_use", error=str(exc), action="running without HTTP: give each "
                        "process its own port (--http-port, service.http_port)")
        address = f"{self.settings.http_host}:{self.http.port}" if self.http.serving else None
        log.info("service_started", http=address, pid=os.getpid(),
                 role=self.role, cells=len(self.config.cells), policy=self.policy.name,
                 config=self.config.redacted())
        warn_unpoliced(self.config.auth, log)
        try:
            if self.role != "dispatch":  # (the dispatcher runs no placement kernel)
                if not await warm_off_loop(self.policy, self.stopping, self.warming):
                    return
                log.info("kernels_ready", seconds=round(self.warming.seconds or 0.0, 3),
                         compiled=self.warming.counter.compiles)
            if self.config.kafka is None:
                await self._embedded()
            else:
                await self._on_kafka()
        finally:
            await self.http.stop()
            log.info("service_stopped")

    async def _on_kafka(self) -> None:
        tasks = []
        if self.dispatching is not None:
            tasks.append(asyncio.create_task(self.dispatching.run_elected(), name="fleetlog-dispatch"))
        if self.role != "dispatch":
            tasks.append(asyncio.create_task(self._own_cells(), name="fleetlog-cells"))
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _own_cells(self) -> None:
        """``--role cell`` on Kafka: step the partitions the owners group assigns this process."""
        assert self.config.kafka is not None

        async def opener(shard: Shard) -> LogStore:
            return await open_fenced(self.config, shard)

        cells = self.cells = CellShards(self.config, self.policy, self.metrics, opener, _close)
        ownership = self.ownership = Ownership(
            self.config.kafka, f"{self.settings.producer_id}-cells-{os.getpid()}", cells.pause, cells.assign,
            self.settings.leader_session_timeout_ms)
        limit_s = 2 * self.settings.leader_session_timeout_ms / 1000 + 20
        try:
            while not self.stopping.is_set():
                if ownership.stuck(limit_s):
                    log.warning("owners_group_no_assignment", seconds=round(limit_s), action="joining again")
                    await cells.pause()
                    await ownership.stop()
                if not await self._join(ownership):
                    await self._sleep(1.0)
                    continue
                await self._sleep(1.0)
        finally:
            await cells.pause()  # no step after this; then commit and snapshot each shard, then leave
            await cells.stop()
            await ownership.stop()

    async def _join(self, ownership: Ownership) -> bool:
        """Join the owners group unless a member; ``False`` when the broker cannot be reached."""
        try:
            await ownership.start()
            return True
        except Exception as exc:
            log.warning("owners_group_unreachable", error=str(exc)[:2000], retry_s=1.0)
            return False

    async def _embedded(self) -> None:
        """``--role all`` with a map on the file log: the dispatcher and every cell partition in
        this process, the cells' stores opened before the dispatcher recovers (its outbox).  A
        failure closes every store and starts again from the logs after a back-off."""
        assert self.dispatching is not None
        failures, announced = 0, False
        try:
            while not self.stopping.is_set():
                try:
                    await self._embedded_open()
                    return
                except LockedError as exc:
                    if not announced:
                        announced = True
                        log.info("standing_by", reason=str(exc))
                    await self._sleep(LOCK_POLL_S)
                except Exception as exc:
                    wait = RETRY_S[min(failures, len(RETRY_S) - 1)]
                    failures += 1
                    log.warning("loop_interrupted", error=str(exc)[:2000], error_type=type(exc).__name__,
                                retry_s=wait)
                    await self._sleep(wait)
        finally:
            await self.dispatching.snapshots.close()

    async def _embedded_open(self) -> None:
        named = sorted({p for _, p in self.config.cells})
        root = make_store(self.config, Shard.GLOBAL)
        opened: list[LogStore] = []
        try:
            for store in [root, *(root.for_shard(Shard.cell(p)) for p in named)]:  # type: ignore[attr-defined]
                await store.open()
                opened.append(store)
            await self._embedded_cycle(root, named)
        finally:
            for store in reversed(opened):
                await store.close()

    async def _embedded_cycle(self, root: LogStore, named: list[int]) -> None:
        assert self.dispatching is not None

        async def opener(shard: Shard) -> LogStore:
            return root.for_shard(shard)  # type: ignore[attr-defined,no-any-return]

        cells = self.cells = CellShards(self.config, self.policy, self.metrics, opener, _no_close)
        loop = self.dispatching.make_loop(root)
        try:
            await loop.recover()  # before the cells: it finishes a crashed dispatch into them
            await cells.assign(frozenset(named))
            await self.dispatching.serve(loop, recovered=True)  # (not a second replay of the log)
        finally:
            await cells.pause()
            await cells.stop()

    async def _sleep(self, seconds: float) -> None:
        await event_or_timeout(self.stopping, seconds)

    # -- HTTP ----------------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """``leading`` while this process steps a shard (the dispatcher, or a cell partition),
        else ``standby``; the dispatcher's offsets and each owned cell partition's."""
        dispatch = self.dispatching.health() if self.dispatching is not None else None
        partitions = self.cells.health() if self.cells is not None else {}
        leading = bool(dispatch and dispatch["leading"]) or any(p["stepping"] for p in partitions.values())
        status = "leading" if leading else "standby"
        warming = self.role != "dispatch" and not self.warming.done
        found: dict[str, Any] = {"status": "warming" if warming else status, "pid": os.getpid(),
                                 "role": self.role, "policy": self.policy.name,
                                 "inputs_offset": dispatch["inputs_offset"] if dispatch else None}
        if warming:
            found["warming"] = self.warming.progress()
        if dispatch is not None:
            found["dispatcher"] = dispatch
        if self.role != "dispatch":
            found["partitions"] = partitions
            found["rebalances"] = self.ownership.rebalances if self.ownership is not None else 0
        refused = refused_files(None if self.http.auth is None else self.http.auth.tokens)
        if refused:  # (fail closed: nobody authenticates until the tokens file is good again)
            found["auth_refused"] = refused
        return found

    async def _handle(self, request: Request) -> Response:
        path = request.path
        if path == "/metrics" and request.method == "GET":
            return Response(200, self.metrics.exposition(), "text/plain; version=0.0.4")
        health = self.health()
        if path == "/healthz":
            return json_response(200, health)
        if path == "/readyz":
            return json_response(200 if health["status"] == "leading" else 503, health)
        if path.startswith("/v1/") and request.method == "POST":
            return refusal(404, "not_served_by_role", f"--role {self.role} with a [cells] map takes no "
                           "ingest: producers write the global and cell partitions (docs/scale-out.md)")
        if path.startswith("/v1/"):
            return refusal(404, "not_served_by_role", f"--role {self.role} with a [cells] map serves no read "
                           "API yet: the state is split across the shards; `fleetlog replay serve` answers "
                           "for one shard's logs (docs/api.md, \"Not yet\")")
        return refusal(404, "no_route", f"no route {path}")


async def open_fenced(config: Config, shard: Shard) -> LogStore:
    """``shard``'s Kafka store, opened and its transactional id taken before anything is read:
    a former owner still stepping (its session expired while it ran on) can commit nothing the
    recovery that follows would miss; its next step fails with ``FencedError``."""
    store = make_store(config, shard)
    await store.open()
    try:
        if isinstance(store, KafkaLogStore):
            await store.fence()
    except BaseException:
        await store.close()
        raise
    return store


async def _close(store: LogStore) -> None:
    await store.close()


async def _no_close(store: LogStore) -> None:
    """Embedded mode: the process's one registry closes every shard's store at the end."""
