"""``fleetlog run``: the scheduling loop as a long-running service.

One cycle: wait to lead the shard → open the logs → recover (newest valid snapshot + the
tail) → step until told to stop or leadership is lost.  A lost connection or a fenced
producer ends the cycle; the next one starts from the logs again, so nothing the loop
held only in memory matters.  The step itself is :class:`SchedulerLoop.step` — the same
one ``fleetlog simulate`` drives.

Batching is adaptive by construction: each step folds everything that arrived while the
previous one ran (up to ``max_batch``), so batches grow under load and a lone event waits
only for the poll that returns it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import resource
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

import msgspec
import structlog

from fleetlog.core.decide import decide
from fleetlog.core.digest import SnapshotError, digest, restore, snapshot
from fleetlog.core.fold import fold
from fleetlog.core.policy import Policy, policy_named
from fleetlog.core.state import State
from fleetlog.core.views import job_status, pending_by_reason, pending_tasks
from fleetlog.events.codec import CONTENT_TYPE_HEADER, JSON, MSGPACK, BadEventError, decode, encode
from fleetlog.events.model import DecisionBatch, Event, JobSubmitted, NodeHeartbeat, TaskGroup
from fleetlog.log.base import INPUTS, LogError, LogStore, Message
from fleetlog.log.file import LockedError
from fleetlog.log.kafka import FencedError
from fleetlog.log.snapshots import (
    DirectorySnapshots,
    KafkaSnapshots,
    Snapshot,
    SnapshotHeader,
    SnapshotStore,
    decode_snapshot,
    encode_snapshot,
)
from fleetlog.service.config import Config, ServiceSettings, make_store
from fleetlog.service.http import HttpLimits, HttpServer, Request, Response, json_response, refusal
from fleetlog.service.leader import KafkaElection
from fleetlog.service.loop import LoopConfig, SchedulerLoop, SnapshotMismatchError, StepResult
from fleetlog.service.metrics import Metrics

SERVICE_FILE: Final = "service.json"
RETRY_MAX_S: Final = 5.0
GAUGE_PERIOD_S: Final = 1.0
COMMIT_EVERY: Final = 50_000
INLINE_DECODE_BYTES: Final = 64 * 1024
"""Ingest bodies up to this size are decoded on the loop (a few ms); larger ones in a thread."""

log = structlog.get_logger("fleetlog.service")


def snapshot_store(config: Config) -> SnapshotStore:
    if config.kafka is not None:
        return KafkaSnapshots(config.kafka)
    assert config.log.dir is not None
    return DirectorySnapshots(Path(config.log.dir) / "snapshots")


LoopFactory = Callable[[LogStore], SchedulerLoop]


class Restored(msgspec.Struct, frozen=True):
    header: SnapshotHeader
    state: State
    source: str


def restored(data: bytes, source: str) -> Restored:
    """Decode and restore one snapshot (restore re-checks the state digest)."""
    snap = decode_snapshot(data)
    return Restored(snap.header, restore(snap.state), source)


async def recover(
    store: LogStore, snapshots: SnapshotStore, make_loop: LoopFactory
) -> tuple[SchedulerLoop, SnapshotHeader | None]:
    """The newest snapshot that restores and lines up with the logs, then the tail; a bad one is
    reported and the previous one tried; with none left, the logs from the start.  Returns the
    loop and the header of the snapshot used."""
    for name, load in await snapshots.candidates():
        try:
            found = restored(load(), name)
            loop = make_loop(store)
            await loop.recover(found.state, found.header.inputs_offset, found.header.decisions_offset)
        except (SnapshotError, SnapshotMismatchError, LogError) as exc:
            log.warning("snapshot_skipped", snapshot=name, error=str(exc))
            continue
        log.info("snapshot_restored", snapshot=name, inputs_offset=found.header.inputs_offset)
        return loop, found.header
    loop = make_loop(store)
    await loop.recover()
    return loop, None


def warm_up(policy: Policy) -> None:
    """Run every hot path once on a toy fleet, so numba compiles (or loads from its cache) the
    kernels now — a compile takes seconds and must not stall a process that leads a shard."""
    state, now = State(), 1_000
    nodes = [NodeHeartbeat(cell="warm", node=f"n{i}", cpu_milli=64_000, mem_mib=262_144, gpu_count=8,
                           gpu_model="A100", topology=("b", f"r{i % 2}", f"n{i}")) for i in range(4)]
    jobs = [
        _warm_job("one", 1, 1, 1000), _warm_job("frac", 1, 1, 500), _warm_job("gang", 2, 8, 1000),
        _warm_job("cpu", 1, 0, 0), _warm_job("huge", 1, 64, 1000), _warm_job("wait", 4, 8, 1000),
        _warm_job("urgent", 2, 8, 1000, priority=100),
    ]
    events: list[Event] = [*nodes, *jobs]
    for event in events:
        now += 1
        fold(state, event, now)
        decisions = decide(state, policy)
        fold(state, DecisionBatch(as_of=now, digest=digest(state), decisions=tuple(decisions),
                                  policy=policy.name), now)
    snapshot(state)


def _warm_job(name: str, tasks: int, gpus: int, milli: int, priority: int = 0) -> JobSubmitted:
    group = TaskGroup(count=tasks, cpu_milli=1000, mem_mib=1024, gpu_count=gpus, gpu_milli=milli)
    return JobSubmitted(job_id=name, tenant="warm", task_groups=(group,), priority=priority,
                        required_topology="rack" if tasks > 1 else None)


class Service:
    """One ``fleetlog run`` process."""

    def __init__(self, config: Config, stopping: asyncio.Event | None = None) -> None:
        self.config, self.settings = config, config.service
        self.policy = policy_named(self.settings.policy)
        self.metrics = Metrics()
        self.http = HttpServer(self._handle, self.settings.http_host, self.settings.http_port,
                               http_limits(self.settings))
        self.ingest = IngestGate(self.settings)
        self.snapshots = snapshot_store(config)
        self.election = (
            KafkaElection(config.kafka, f"{self.settings.producer_id}-{os.getpid()}",
                          self.settings.leader_session_timeout_ms)
            if config.kafka is not None else None
        )
        self.stopping = stopping or asyncio.Event()
        self.store: LogStore | None = None
        self.loop: SchedulerLoop | None = None
        self._snapshot_task: asyncio.Task[None] | None = None
        self._last_snapshot = (0, time.monotonic(), time.time())  # (inputs offset, monotonic, wall)

    def make_loop(self, store: LogStore) -> SchedulerLoop:
        s = self.settings
        return SchedulerLoop(store, self.policy, LoopConfig(
            group=s.group, producer_id=s.producer_id, max_batch=s.max_batch, commit_every=COMMIT_EVERY))

    # -- lifecycle ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve until :meth:`stop`; leads the shard whenever it can."""
        started = time.monotonic()
        warm_up(self.policy)
        log.info("kernels_ready", seconds=round(time.monotonic() - started, 3))
        await self.http.start()
        log.info("service_started", http=f"{self.settings.http_host}:{self.http.port}", pid=os.getpid(),
                 policy=self.policy.name, config=self.config.redacted())
        delay = 0.1
        try:
            while not self.stopping.is_set():
                try:
                    await self._cycle()
                    delay = 0.1
                except FencedError as exc:
                    # Another process leads now: give the election a session to tell us so before
                    # opening a producer again (which would fence the new leader in turn).
                    log.warning("fenced", error=str(exc))
                    await self._sleep(self.settings.leader_session_timeout_ms / 1000)
                except (LogError, OSError) as exc:
                    log.warning("loop_interrupted", error=str(exc), retry_s=delay)
                    self.metrics.restarts.inc()
                    await self._sleep(delay)
                    delay = min(delay * 2, RETRY_MAX_S)
        finally:
            if self.election is not None:
                await self.election.stop()
            await self.snapshots.close()
            await self.http.stop()
            log.info("service_stopped")

    def stop(self) -> None:
        self.stopping.set()

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), seconds)

    async def _cycle(self) -> None:
        if self.election is not None and not await self._await_leadership():
            return
        store = await self._open_store()
        if store is None:
            return
        self.store = store
        try:
            self.metrics.leader.set(1)
            self._advertise()
            started = time.monotonic()
            self.loop, used = await recover(store, self.snapshots, self.make_loop)
            self._last_snapshot = (used.inputs_offset if used else 0, time.monotonic(),
                                   used.taken_ms / 1000 if used else time.time())
            self.metrics.recovery.set(time.monotonic() - started)
            seconds = round(time.monotonic() - started, 3)
            log.info("recovered", inputs_offset=self.loop.offset, seconds=seconds)
            # The recovered state is long-lived: keep the cyclic GC from re-scanning it in every
            # full collection (a pause of tens of ms with a large state, in the middle of a step).
            gc.collect()
            gc.freeze()
            await self._serve(self.loop)
        finally:
            self.metrics.leader.set(0)
            self.loop = self.store = None
            await self._finish_snapshot()
            await store.close()
            self._unadvertise()

    async def _await_leadership(self) -> bool:
        election = self.election
        assert election is not None
        await election.start()
        if not election.leader.is_set():
            log.info("standing_by", group=election.group)
        waiter = asyncio.create_task(election.leader.wait())
        stopper = asyncio.create_task(self.stopping.wait())
        await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
        for task in (waiter, stopper):
            task.cancel()
        return election.leader.is_set() and not self.stopping.is_set()

    async def _open_store(self) -> LogStore | None:
        """Open the logs; in embedded mode wait while another process holds the file log."""
        announced = False
        while not self.stopping.is_set():
            store = make_store(self.config)
            try:
                await store.open()
                return store
            except LockedError as exc:
                if not announced:
                    log.info("standing_by", reason=str(exc))
                    announced = True
                await self._sleep(0.2)
        return None

    def _lost(self) -> bool:
        return self.stopping.is_set() or (self.election is not None and self.election.lost.is_set())

    # -- the loop ----------------------------------------------------------------------------

    async def _serve(self, loop: SchedulerLoop) -> None:
        next_gauges = 0.0
        while not self._lost():
            started = time.perf_counter()
            result = await loop.step(timeout_ms=self.settings.idle_wait_ms)
            self._observe(result, time.perf_counter() - started)
            now = time.monotonic()
            if now >= next_gauges:
                next_gauges = now + GAUGE_PERIOD_S
                await loop.commit()
                await self._gauges(loop)
            self._maybe_snapshot(loop, now)
        if not self._fenced_out():
            await loop.commit()
        self._maybe_snapshot(loop, time.monotonic(), force=self.stopping.is_set())

    def _fenced_out(self) -> bool:
        return self.election is not None and self.election.lost.is_set()

    def _observe(self, result: StepResult, seconds: float) -> None:
        m = self.metrics
        m.step.observe(seconds)
        m.input_events.inc(result.inputs)
        m.dead_letters.inc(result.dead_lettered)
        if not result.published:
            return
        m.decisions.inc(result.decisions)
        m.batches.inc()
        latency = max(0.0, time.time() - result.oldest_ms / 1000)
        m.latency.observe(latency)
        log.info("decision_batch", as_of=result.as_of, inputs=result.inputs, decisions=result.decisions,
                 dead_lettered=result.dead_lettered, step_ms=round(seconds * 1000, 2),
                 latency_ms=round(latency * 1000, 2))

    async def _gauges(self, loop: SchedulerLoop) -> None:
        m = self.metrics
        end = await loop.store.log(INPUTS).end_offset()
        m.lag.set(max(0, end - loop.offset))
        m.offset.set(loop.offset)
        m.set_pending(pending_by_reason(loop.state))
        m.snapshot_age.set(time.time() - self._last_snapshot[2])

    # -- snapshots ---------------------------------------------------------------------------

    def _maybe_snapshot(self, loop: SchedulerLoop, now: float, force: bool = False) -> None:
        offset, at, _ = self._last_snapshot
        due = (loop.offset - offset >= self.settings.snapshot_every_events
               or (now - at >= self.settings.snapshot_every_s and loop.offset > offset))
        busy = self._snapshot_task is not None and not self._snapshot_task.done()
        if (not due and not (force and loop.offset > offset)) or busy:
            return
        header = SnapshotHeader(loop.offset, loop.decisions_next, self.policy.name, int(time.time() * 1000))
        data = encode_snapshot(Snapshot(header, snapshot(loop.state)))
        self._last_snapshot = (loop.offset, now, time.time())
        self._snapshot_task = asyncio.create_task(self._save(data, header))

    async def _save(self, data: bytes, header: SnapshotHeader) -> None:
        try:
            where = await self.snapshots.save(data)
        except (LogError, OSError) as exc:
            log.warning("snapshot_failed", error=str(exc), inputs_offset=header.inputs_offset)
            return
        self.metrics.snapshots.inc()
        log.info("snapshot_written", where=where, inputs_offset=header.inputs_offset, bytes=len(data))

    async def _finish_snapshot(self) -> None:
        task = self._snapshot_task
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- embedded mode: where producers find the service ---------------------------------------

    def _service_file(self) -> Path | None:
        return Path(self.config.log.dir) / SERVICE_FILE if self.config.log.dir else None

    def _advertise(self) -> None:
        path = self._service_file()
        if path is not None:
            tmp = path.with_suffix(".tmp")
            address = f"{self.settings.http_host}:{self.http.port}"
            tmp.write_text(json.dumps({"pid": os.getpid(), "http": address}))
            tmp.replace(path)

    def _unadvertise(self) -> None:
        path = self._service_file()
        if path is not None:
            path.unlink(missing_ok=True)

    # -- HTTP ----------------------------------------------------------------------------------

    async def _handle(self, request: Request) -> Response:
        path = request.path
        if path == "/metrics" and request.method == "GET":
            return Response(200, self.metrics.exposition(), "text/plain; version=0.0.4")
        if path == "/healthz":
            return json_response(200, self.health())
        if path == "/readyz":
            return json_response(200 if self.loop is not None else 503, self.health())
        if path == "/v1/events":
            return await self._ingest(request) if request.method == "POST" else _not_allowed()
        if path.startswith("/v1/jobs/") and request.method == "GET":
            return self._job(path.removeprefix("/v1/jobs/"))
        return json_response(404, {"error": f"no route {path}", "reason": "not_found"})

    def health(self) -> dict[str, Any]:
        loop = self.loop
        return {
            "status": "leading" if loop is not None else "standby",
            "pid": os.getpid(),
            "inputs_offset": loop.offset if loop is not None else None,
            "policy": self.policy.name,
        }

    def _job(self, job_id: str) -> Response:
        if self.loop is None:
            return json_response(503, {"error": "this process is not leading", "reason": "standby"})
        found = job_status(self.loop.state, job_id)
        if found is None:
            return json_response(404, {"error": f"unknown job {job_id!r}", "reason": "unknown_job"})
        return json_response(200, found)

    async def _ingest(self, request: Request) -> Response:
        """Decode and check the body in a worker thread (the loop keeps stepping and answering
        health meanwhile), then admit it against the pending work and append it."""
        if self.store is None:
            return refusal(503, "standby", "this process is not leading")
        content_type = request.headers.get("content-type")
        try:
            if len(request.body) <= INLINE_DECODE_BYTES:  # a few ms: cheaper than the thread hop
                batch = ingest_batch(request.body, content_type, self.settings)
            else:
                batch = await asyncio.get_running_loop().run_in_executor(
                    self.ingest.executor, ingest_batch, request.body, content_type, self.settings)
        except IngestError as exc:
            return refusal(exc.status, exc.reason, str(exc), **exc.extra)
        store, loop = self.store, self.loop
        if store is None or loop is None:
            return refusal(503, "standby", "this process is not leading")
        refused = self.ingest.admit(loop, batch.tasks)
        if refused is not None:
            return refused
        first = await store.log(INPUTS).append(batch.messages)
        self.ingest.appended(first + len(batch.messages), batch.tasks)
        return json_response(200, {"appended": len(batch.messages), "first_offset": first})


def _not_allowed() -> Response:
    return json_response(405, {"error": "use POST", "reason": "method_not_allowed"})


class IngestError(Exception):
    """An ingest body refused as a whole: ``status`` 400 (bad) or 413 (too much at once)."""

    def __init__(self, message: str, reason: str, status: int = 400, **extra: object) -> None:
        super().__init__(message)
        self.reason, self.status, self.extra = reason, status, extra


class IngestBatch(msgspec.Struct, frozen=True):
    messages: list[Message]
    tasks: int
    """Tasks of the jobs it submits: the pending work it can create."""


_RAW_LIST: Final = msgspec.json.Decoder(list[msgspec.Raw])


def ingest_messages(body: bytes, content_type: str | None,
                    settings: ServiceSettings | None = None) -> list[Message]:
    """The input records of an ingest body (see :func:`ingest_batch`)."""
    return ingest_batch(body, content_type, settings or ServiceSettings()).messages


def ingest_batch(body: bytes, content_type: str | None, settings: ServiceSettings) -> IngestBatch:
    """The input records of an ingest body: one envelope or a JSON array of them; every one is
    decoded first, so a bad one rejects the whole request and nothing is appended.  Past
    ``max_request_events`` events or ``max_request_tasks`` tasks: 413.  Runs in a worker thread:
    the array is split without building its items, and each event is decoded on its own, so no
    single call holds the GIL for long."""
    kind = (content_type or "application/json").split(";")[0].strip().encode()
    if kind == MSGPACK:
        parts: list[bytes] | list[msgspec.Raw] = [body]
    elif kind == JSON:
        parts = _json_parts(body)
    else:
        raise IngestError(f"content-type {kind.decode()!r} is neither application/json nor msgpack",
                          "unknown_content_type")
    if len(parts) > settings.max_request_events:
        raise IngestError(f"{len(parts)} events in one request; the limit is {settings.max_request_events}",
                          "too_many_events", 413, limit=settings.max_request_events)
    messages, tasks = [], 0
    for index, part in enumerate(parts):
        try:
            env = decode(bytes(part), kind)
        except BadEventError as exc:
            raise IngestError(f"event {index}: {exc}", exc.reason) from None
        if isinstance(env.event, JobSubmitted):
            tasks += sum(group.count for group in env.event.task_groups)
            if tasks > settings.max_request_tasks:
                raise IngestError(f"the jobs of this request have over {settings.max_request_tasks} tasks "
                                  f"(event {index} passes it); split it", "too_many_tasks", 413,
                                  limit=settings.max_request_tasks)
        messages.append(Message(encode(env), headers=((CONTENT_TYPE_HEADER, MSGPACK),)))
    return IngestBatch(messages, tasks)


def _json_parts(body: bytes) -> list[bytes] | list[msgspec.Raw]:
    stripped = body.lstrip()
    if not stripped.startswith(b"["):
        return [body]
    try:  # each element's own bytes (not re-encoded: the codec sees repeated keys)
        return _RAW_LIST.decode(stripped)
    except msgspec.DecodeError as exc:
        raise IngestError(f"body is not a JSON array of events: {exc}", "undecodable") from None
    except RecursionError:
        raise IngestError("body nests arrays or maps too deeply", "too_deep") from None


def http_limits(settings: ServiceSettings) -> HttpLimits:
    """The HTTP server's limits: connections held under half the file-descriptor limit, so the
    logs and snapshots always find a descriptor, and requests with a body to at most half the
    connections, so health and status always find one."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    cap = settings.http_max_connections if soft == resource.RLIM_INFINITY else max(
        4, min(settings.http_max_connections, soft // 2))
    return HttpLimits(
        header_timeout_s=settings.http_header_timeout_s, body_timeout_s=settings.http_body_timeout_s,
        max_connections=cap, max_body_requests=max(1, min(settings.max_concurrent_requests, cap // 2)),
        max_headers=settings.http_max_headers, max_line_bytes=settings.http_max_header_bytes,
        max_field_bytes=settings.http_max_header_bytes, max_body_bytes=settings.max_request_bytes)


class IngestGate:
    """Bounds the pending work ingest can create: tasks of pending jobs plus tasks appended but
    not folded yet."""

    def __init__(self, settings: ServiceSettings) -> None:
        self.settings = settings
        self.executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="fleetlog-ingest")
        self._unfolded: deque[tuple[int, int]] = deque()  # (end offset, tasks) of appended requests

    def pending(self, loop: SchedulerLoop) -> int:
        while self._unfolded and self._unfolded[0][0] <= loop.offset:
            self._unfolded.popleft()
        return pending_tasks(loop.state) + sum(tasks for _, tasks in self._unfolded)

    def admit(self, loop: SchedulerLoop, tasks: int) -> Response | None:
        """``None`` when a request creating ``tasks`` pending tasks fits, else the 429."""
        if tasks == 0:
            return None
        limit = self.settings.max_pending_tasks
        pending = self.pending(loop)
        if pending + tasks <= limit:
            return None
        return refusal(429, "too_much_pending", f"{pending} tasks pending; {tasks} more would pass "
                       f"the limit of {limit}", pending=pending, limit=limit)

    def appended(self, end: int, tasks: int) -> None:
        if tasks:
            self._unfolded.append((end, tasks))
