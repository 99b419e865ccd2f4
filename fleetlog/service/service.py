"""``fleetlog run``: the scheduling loop as a long-running service.

One cycle: wait to lead the shard → open the logs → recover (newest valid snapshot + the
tail) → step until told to stop or leadership is lost.  Any error ends the cycle; the next
one starts from the logs again, so nothing the loop held only in memory matters.  One policy
for every error (:func:`classify`): a fault that may pass (a lost connection, an OS error) is
retried with jittered exponential back-off (``retrying``); one an operator must fix (corrupt or
unreadable decisions, a log that lost records, a damaged segment, an unexpected exception) makes
the service stand by (``stalled``), say what and where in ``/healthz``, the log and the metrics,
and re-check every few seconds.  The HTTP server runs throughout; the process never exits for
a data problem.  The step itself is :class:`SchedulerLoop.step` — the same
one ``fleetlog simulate`` drives.

Batching is adaptive by construction: each step folds everything that arrived while the
previous one ran (up to ``max_batch``), so batches grow under load and a lone event waits
only for the poll that returns it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
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
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    RetryError,
    retry_if_exception_type,
    retry_if_not_exception_type,
)

from fleetlog.core.decide import decide
from fleetlog.core.digest import SnapshotError, digest, restore, snapshot
from fleetlog.core.fit import Fleet, never_fits_submitted
from fleetlog.core.fold import fold
from fleetlog.core.policy import Policy, policy_named
from fleetlog.core.state import CoreConfig, State
from fleetlog.core.views import (
    as_folded,
    folded_spec,
    job_ended,
    job_status,
    pending_by_reason,
    pending_tasks,
)
from fleetlog.events.codec import (
    CONTENT_TYPE_HEADER,
    CONTENT_TYPES,
    JSON,
    MSGPACK,
    BadEventError,
    decode,
    encode,
    format_of,
)
from fleetlog.events.model import (
    INPUT_TYPES,
    DecisionBatch,
    Event,
    InputEvent,
    JobCancelled,
    JobSubmitted,
    NodeHeartbeat,
    TaskGroup,
)
from fleetlog.events.spec import spec_differences, submission_spec
from fleetlog.log import errorpolicy
from fleetlog.log.base import DECISIONS, INPUTS, LogError, LogStore, Message, OffsetOutOfRangeError
from fleetlog.log.consumer import decision_batches
from fleetlog.log.discovery import announce, withdraw
from fleetlog.log.file import (
    TRUNCATIONS_NAME,
    FileLogStore,
    LockedError,
    announce_intent,
    withdraw_intent,
)
from fleetlog.log.kafka import FencedError
from fleetlog.log.location import make_store
from fleetlog.log.snapshots import (
    DirectorySnapshots,
    KafkaSnapshots,
    Snapshot,
    SnapshotHeader,
    SnapshotStore,
    decode_snapshot,
    encode_snapshot,
)
from fleetlog.service.config import Config, ServiceSettings
from fleetlog.service.http import (
    ACCEPT_NEVER_FITS,
    BindError,
    HttpLimits,
    HttpServer,
    PortInUseError,
    Request,
    Response,
    json_response,
    refusal,
)
from fleetlog.service.leader import KafkaElection
from fleetlog.service.loop import (
    LogBehindError,
    LoopConfig,
    SchedulerLoop,
    SnapshotMismatchError,
    StepResult,
    check_ahead,
)
from fleetlog.service.metrics import Metrics

LOCK_POLL_S: Final = 0.02
"""How often a service waiting for the file log's lock tries it (producers hand it over)."""
GAUGE_PERIOD_S: Final = 1.0
HTTP_BIND_WAIT_S: Final = 5.0
"""How long a process that takes the lead waits for its HTTP port to be free."""
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


Candidates = list[tuple[str, Callable[[], bytes]]]


async def check_ends(store: LogStore, candidates: Candidates, group: str) -> None:
    """Refuse (:class:`LogBehindError`) logs that end before what a snapshot or the committed
    offset says they reached — before anyone may append to them: an event acknowledged at an
    offset the state already counts as folded would never be folded.  A snapshot that does not
    decode is left to :func:`recover` (which reports and skips it)."""
    ends = {name: await store.log(name).end_offset() for name in (INPUTS, DECISIONS)}
    committed = await store.committed_offset(group)
    check_ahead(f"group {group!r} committed inputs", committed or 0, INPUTS, ends[INPUTS])
    last = await _last_batch(store, ends[DECISIONS])
    if last is not None:
        check_ahead(f"decisions@{last[0]} was computed at inputs", last[1], INPUTS, ends[INPUTS])
    for name, load in candidates:
        try:
            header = decode_snapshot(load()).header
        except (LogError, OSError):
            continue
        check_ahead(f"snapshot {name} covers inputs", header.inputs_offset, INPUTS, ends[INPUTS])
        check_ahead(f"snapshot {name} covers decisions", header.decisions_offset, DECISIONS, ends[DECISIONS])


async def _last_batch(store: LogStore, end: int, window: int = 256) -> tuple[int, int] | None:
    """(offset, as_of) of the last decision batch (Kafka's transaction markers take offsets
    and are never returned: look further back until a record shows up)."""
    log_ = store.log(DECISIONS)
    while end > 0:
        start = max(0, end - window)
        try:
            records = [r for r in await log_.read(start, end - start) if r.offset < end]
        except OffsetOutOfRangeError:  # retention removed what lies before: nothing to compare
            return None
        if records:
            offset, batch = next(iter(decision_batches(records[-1:])))
            return offset, batch.as_of
        end = start
    return None


async def recover(
    store: LogStore, snapshots: SnapshotStore, make_loop: LoopFactory, candidates: Candidates | None = None
) -> tuple[SchedulerLoop, SnapshotHeader | None]:
    """The newest snapshot that restores and lines up with the logs, then the tail; a bad one is
    reported and the previous one tried; with none left, the logs from the start.  A log that
    ends before a snapshot is not the snapshot's fault: :class:`LogBehindError`, no fallback.
    Returns the loop and the header of the snapshot used."""
    for name, load in candidates if candidates is not None else await snapshots.candidates():
        try:
            found = restored(load(), name)
            loop = make_loop(store)
            await loop.recover(found.state, found.header.inputs_offset, found.header.decisions_offset)
        except LogBehindError as exc:  # not the snapshot's fault: the log lost records
            raise LogBehindError(f"snapshot {name}: {exc}") from exc
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
        # a second tenant: the general placement path (one job at a time), not only the fast one
        _warm_job("other", 1, 1, 1000, tenant="other"), _warm_job("other-frac", 1, 1, 250, tenant="other"),
        # whole hosts until one waits for room it could have (the "insufficient capacity" story:
        # "huge" never fits, so it is told apart before that path)
        *(_warm_job(f"host-{i}", 1, 8, 1000) for i in range(5)),
    ]
    events: list[Event] = [*nodes, *jobs]
    for event in events:
        now += 1
        fold(state, event, now)
        decisions = decide(state, policy)
        fold(state, DecisionBatch(as_of=now, digest=digest(state), decisions=tuple(decisions),
                                  policy=policy.name), now)
    snapshot(state)


def _warm_job(
    name: str, tasks: int, gpus: int, milli: int, priority: int = 0, tenant: str = "warm"
) -> JobSubmitted:
    group = TaskGroup(count=tasks, cpu_milli=1000, mem_mib=1024, gpu_count=gpus, gpu_milli=milli)
    return JobSubmitted(job_id=name, tenant=tenant, task_groups=(group,), priority=priority,
                        required_topology="rack" if tasks > 1 else None)


class Problem(msgspec.Struct, frozen=True):
    """Why the service does not lead, as ``/healthz`` shows it."""

    status: str
    """``retrying`` (a fault that may pass) or ``stalled`` (an operator must act)."""
    error: str
    """The exception type."""
    message: str
    where: str
    """What the loop was doing, and at which log offset."""
    action: str
    """What happens next, or what an operator should do."""
    since: float
    """Wall-clock time of the first failure of this run of failures."""
    attempts: int
    retry_in_s: float


_ACTIONS: Final = (
    (LogBehindError, "restore the log from a backup; or, to accept the loss, move away what lies past "
                     "its end (the snapshots named; a decisions log past it); re-checked every few seconds"),
)


def classify(exc: BaseException) -> tuple[str, str]:
    """``(status, action)`` for an error that ended a cycle: the policy every loop that reads
    the logs shares (:func:`fleetlog.log.errorpolicy.classify`), plus the service's own
    ``LogBehindError``."""
    return errorpolicy.classify(exc, _ACTIONS)


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
        self.problem: Problem | None = None
        self._stage = "starting"
        self._recovering: SchedulerLoop | None = None
        self._failed_at: str | None = None
        self._truncations: list[dict[str, object]] = []
        self._backoff, self._recheck = errorpolicy.backoff(), errorpolicy.recheck()

    def make_loop(self, store: LogStore) -> SchedulerLoop:
        s = self.settings
        return SchedulerLoop(store, self.policy, LoopConfig(
            group=s.group, producer_id=s.producer_id, max_batch=s.max_batch, commit_every=COMMIT_EVERY),
            CoreConfig(node_timeout_ms=s.node_timeout_ms))

    # -- lifecycle ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve until :meth:`stop`; leads the shard whenever it can."""
        started = time.monotonic()
        warm_up(self.policy)
        log.info("kernels_ready", seconds=round(time.monotonic() - started, 3))
        await self._serve_http(leading=False)
        log.info("service_started", http=self._http_address(), pid=os.getpid(),
                 policy=self.policy.name, config=self.config.redacted())
        try:
            while not self.stopping.is_set():
                with contextlib.suppress(RetryError):  # RetryError: stopped while failing
                    async for attempt in self._retrying():
                        with attempt:
                            await self._cycle(attempt.retry_state)
        finally:
            self._want_log(False)
            if self.election is not None:
                await self.election.stop()
            await self.snapshots.close()
            await self.http.stop()
            log.info("service_stopped")

    def stop(self) -> None:
        self.stopping.set()

    def _http_address(self) -> str | None:
        return f"{self.settings.http_host}:{self.http.port}" if self.http.serving else None

    async def _serve_http(self, leading: bool) -> None:
        """Bind the HTTP port unless bound.  Stand-by does not depend on the port: a process that
        does not lead and finds it taken (most often by the ``fleetlog run`` that leads, on the
        same host) stands by without HTTP.  Leading, it must serve: it waits up to
        ``HTTP_BIND_WAIT_S`` for the port (the old leader's socket closes a moment after its lock
        or session), then gives up with :class:`BindError`, which ends the process (exit 1)."""
        if self.http.serving:
            return
        deadline, waiting = time.monotonic() + HTTP_BIND_WAIT_S, False
        while True:
            try:
                await self.http.start()
                break
            except PortInUseError as exc:
                if not leading:
                    log.warning("http_port_in_use", error=str(exc), action="standing by without HTTP; "
                                "the port is bound when this process leads")
                    return
                if not waiting:
                    waiting = True
                    log.warning("http_port_in_use", error=str(exc), action=f"leading: waiting up to "
                                f"{HTTP_BIND_WAIT_S:.0f} s for the port, then exiting")
                if self.stopping.is_set():
                    return
                if time.monotonic() >= deadline:
                    raise PortInUseError(
                        f"{exc} by another process, still {HTTP_BIND_WAIT_S:.0f} s after this one took the "
                        "lead: free it or give this process another port (--http-port, service.http_port)"
                    ) from None
                await self._sleep(0.1)
        if leading:
            log.info("http_serving", http=self._http_address())

    def _retrying(self) -> AsyncRetrying:
        """Every exception of a cycle is retried (until :meth:`stop`), each after the wait its
        class calls for; :meth:`_report` says why in health, metrics and the log first — but
        a leader that cannot serve HTTP (:class:`BindError`) ends the process."""
        return AsyncRetrying(
            retry=retry_if_exception_type(Exception) & retry_if_not_exception_type(BindError),
            wait=self._wait, sleep=self._sleep,
            stop=lambda _: self.stopping.is_set(), before_sleep=self._report,
        )

    def _wait(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome is not None else None
        if isinstance(exc, FencedError):
            # Another process leads now: give the election a session to tell us so before
            # opening a producer again (which would fence the new leader in turn).
            return self.settings.leader_session_timeout_ms / 1000
        if exc is not None and classify(exc)[0] == "stalled":
            return float(self._recheck(state))
        return float(self._backoff(state))

    def _report(self, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        assert exc is not None
        wait = state.upcoming_sleep
        if isinstance(exc, FencedError):
            log.warning("fenced", error=str(exc), retry_s=round(wait, 3))
            return
        status, action = classify(exc)
        where, self._failed_at = self._failed_at or self._where(exc), None
        since = self.problem.since if self.problem is not None else time.time()
        self.problem = Problem(status, type(exc).__name__, str(exc)[:2000], where, action, since,
                               state.attempt_number, round(wait, 3))
        self.metrics.restarts.inc()
        self.metrics.loop_errors.labels(status=status, error=type(exc).__name__).inc()
        self.metrics.stalled.set(1 if status == "stalled" else 0)
        event = "loop_interrupted" if status == "retrying" else "loop_stalled"
        emit = log.warning if status == "retrying" else log.error
        emit(event, error=str(exc)[:2000], error_type=type(exc).__name__, where=where, action=action,
             attempt=state.attempt_number, retry_s=round(wait, 3))

    def _where(self, exc: BaseException) -> str:
        """What the loop was doing when ``exc`` ended it, with the log position."""
        loop = self.loop or self._recovering
        if self._stage == "serving" and loop is not None:
            return f"stepping: inputs log, the step reading from offset {loop.offset}"
        where = self._stage
        if self._stage == "recovering" and loop is not None:
            where = (f"recovering: inputs folded up to offset {loop.offset}, decisions up to "
                     f"offset {loop.decisions_next}")
        if isinstance(exc, LogBehindError) and self._truncations:
            where += f"; {TRUNCATIONS_NAME} says: {self._truncations[-1].get('message')}"
        return where

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), seconds)

    async def _cycle(self, attempt: RetryCallState) -> None:
        self._stage = "waiting for leadership"
        if self.election is not None and not await self._await_leadership():
            return
        self._stage = "opening the logs"
        store = await self._open_store()
        if store is None:
            return
        try:
            await self._serve_http(leading=True)
            if not self.http.serving:  # stopped while waiting for the port
                return
            self._note_truncations(store)
            self._stage = "checking the logs against the snapshots"
            candidates = await self.snapshots.candidates()
            await check_ends(store, candidates, self.settings.group)
            self.store = store  # ingest may append from now on
            self.metrics.leader.set(1)
            self._advertise()
            self._want_log(False)  # service.json tells producers where to send from now on
            started = time.monotonic()
            self._stage = "recovering"
            self.loop, used = await recover(store, self.snapshots, self._recovery_loop, candidates)
            self._recovered(attempt)
            self._last_snapshot = (used.inputs_offset if used else 0, time.monotonic(),
                                   used.taken_ms / 1000 if used else time.time())
            self.metrics.recovery.set(time.monotonic() - started)
            seconds = round(time.monotonic() - started, 3)
            log.info("recovered", inputs_offset=self.loop.offset, seconds=seconds)
            # The recovered state is long-lived: keep the cyclic GC from re-scanning it in every
            # full collection (a pause of tens of ms with a large state, in the middle of a step).
            gc.collect()
            gc.freeze()
            self._stage = "serving"
            await self._serve(self.loop)
        except Exception as exc:
            self._failed_at = self._where(exc)  # before the loop is dropped: it knows the offsets
            raise
        finally:
            self.metrics.leader.set(0)
            self.loop = self.store = self._recovering = None
            await self._finish_snapshot()
            await store.close()
            self._unadvertise()
            self._want_log(not self.stopping.is_set())

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

    def _recovery_loop(self, store: LogStore) -> SchedulerLoop:
        self._recovering = self.make_loop(store)
        return self._recovering

    def _recovered(self, attempt: RetryCallState) -> None:
        """Leading again: the problem is over, and the next failure backs off from the start."""
        if self.problem is not None:
            log.info("loop_resumed", after=self.problem.error, attempts=self.problem.attempts,
                     seconds=round(time.time() - self.problem.since, 3))
        self.problem = None
        self.metrics.stalled.set(0)
        attempt.attempt_number = 1

    def _note_truncations(self, store: LogStore) -> None:
        """Log what opening the file log cut (and keep the persisted report for health)."""
        if not isinstance(store, FileLogStore):
            return
        for cut in store.recovery.truncations:
            log.error("log_truncated", **cut.to_json(int(time.time() * 1000)))
        self._truncations = store.truncation_history(5)

    def _log_dir(self) -> Path | None:
        return Path(self.config.log.dir) if self.config.kafka is None and self.config.log.dir else None

    def _want_log(self, wanted: bool) -> None:
        """Embedded mode: ``LOCK.intent`` names this process whenever it runs but does not lead
        (waiting for the lock, recovering, retrying or stalled).  Producers that append directly
        give the log up at their next append, and new ones wait for ``service.json`` instead of
        taking it: nothing is appended behind the back of a service that stands by (a log that
        went backwards must not grow at offsets the snapshots already count)."""
        directory = self._log_dir()
        if directory is not None:
            (announce_intent if wanted else withdraw_intent)(directory)

    async def _open_store(self) -> LogStore | None:
        """Open the logs; in embedded mode wait while another process holds the file log.

        The wait is bounded by one append of the producers that hold it (``LOCK.intent``, see
        :meth:`_want_log` and docs/logs.md), not by how busy they are."""
        announced = False
        self._want_log(True)
        while not self.stopping.is_set():
            store = make_store(self.config)
            try:
                await store.open()
                return store
            except LockedError as exc:
                if not announced:
                    log.info("standing_by", reason=str(exc))
                    announced = True
                await self._sleep(LOCK_POLL_S)
        return None

    def _lost(self) -> bool:
        return self.stopping.is_set() or (self.election is not None and self.election.lost.is_set())

    # -- the loop ----------------------------------------------------------------------------

    async def _serve(self, loop: SchedulerLoop) -> None:
        next_gauges = 0.0
        while not self._lost():
            result = await loop.step(timeout_ms=self.settings.idle_wait_ms)
            self._observe(result, result.work_s)  # the work, not the idle wait for input
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

    def _advertise(self) -> None:
        if self.config.log.dir:  # 0600: a service.json others could rewrite would redirect producers
            announce(Path(self.config.log.dir), os.getpid(), f"{self.settings.http_host}:{self.http.port}")

    def _unadvertise(self) -> None:
        if self.config.log.dir:
            withdraw(Path(self.config.log.dir))

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
        """``leading``, ``standby`` (another process leads), ``retrying`` or ``stalled`` (with the
        problem: what, where, what next), and the newest truncations the file log reported."""
        loop, problem = self.loop, self.problem
        status = "leading" if loop is not None else problem.status if problem is not None else "standby"
        found: dict[str, Any] = {
            "status": status,
            "pid": os.getpid(),
            "inputs_offset": loop.offset if loop is not None else None,
            "policy": self.policy.name,
        }
        if problem is not None and loop is None:
            found["problem"] = msgspec.to_builtins(problem)
        if self._truncations:
            found["truncations"] = self._truncations
        return found

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
        try:
            batch, duplicates = screened(loop.state, self.ingest.unfolded_jobs(loop), batch)
        except IngestError as exc:
            return refusal(exc.status, exc.reason, str(exc), **exc.extra)
        refused = self.ingest.admit(loop, batch.tasks)
        if refused is not None:
            return refused
        refused = None if _accepts_never_fits(request) else never_fitting(loop.state, batch.events)
        if refused is not None:
            return refused
        log_ = store.log(INPUTS)
        self.ingest.reserve(batch)  # before the await: a concurrent request sees these jobs
        try:
            first = await log_.append(batch.messages) if batch.messages else await log_.end_offset()
        except BaseException:
            self.ingest.release(batch)
            raise
        self.ingest.appended(first, batch)
        answer: dict[str, object] = {"appended": len(batch.messages), "first_offset": first}
        if duplicates:  # (only then: the answer stays what it always was for new events)
            answer["duplicates"] = duplicates
        return json_response(200, answer)


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
    events: list[InputEvent] = []
    """The events of ``messages``, in order."""


def screened(state: State, unfolded: dict[str, JobSubmitted], batch: IngestBatch
             ) -> tuple[IngestBatch, list[dict[str, object]]]:
    """``batch`` without the identical resubmissions of jobs the service already has (folded,
    appended but not folded yet, or earlier in the batch), and those as ``{"index", "job_id"}``.
    A job id submitted again with another spec (409 ``already_exists``), a cancel of a job never
    submitted (404 ``unknown_job``) or of one that already ended otherwise than cancelled (409
    ``already_ended``) refuses the whole batch.  A cancel of a cancelled job is an identical resend.
    A new job costs dictionary lookups only: specs are compared when an id is seen again."""
    seen: dict[str, JobSubmitted] = {}
    skip: list[int] = []
    for index, event in enumerate(batch.events):
        if isinstance(event, JobSubmitted):
            if _resubmitted(state, seen.get(event.job_id) or unfolded.get(event.job_id), event, index):
                skip.append(index)
            else:
                seen[event.job_id] = event
        elif (isinstance(event, JobCancelled) and event.job_id not in seen and event.job_id not in unfolded
              and _cancelled_already(state, event.job_id, index)):
            skip.append(index)
    dropped: list[dict[str, object]] = [{"index": i, "job_id": getattr(batch.events[i], "job_id", "")}
                                        for i in skip]
    if not skip:
        return batch, dropped
    keep = sorted(set(range(len(batch.events))) - set(skip))
    events = [batch.events[i] for i in keep]
    tasks = sum(g.count for e in events if isinstance(e, JobSubmitted) for g in e.task_groups)
    return IngestBatch([batch.messages[i] for i in keep], tasks, events), dropped


def _resubmitted(state: State, earlier: JobSubmitted | None, event: JobSubmitted, index: int) -> bool:
    """Whether ``event`` resubmits a job the service has (``earlier``, not folded yet, or else in
    the state), with the same spec; an :class:`IngestError` if with another spec; ``False`` for
    a new job."""
    if earlier is not None:
        before, after = submission_spec(earlier), submission_spec(event)
    elif state.job_row(event.job_id) < 0:
        return False
    else:
        folded = folded_spec(state, event.job_id)
        assert folded is not None
        before, after = folded, as_folded(state, submission_spec(event))
    if before == after:
        return True
    changed = "; ".join(spec_differences(before, after))
    raise IngestError(f"event {index}: job {event.job_id!r} already exists with another spec ({changed}); "
                      "a job id is submitted once: cancel it and submit under a new id", "already_exists",
                      409, job_id=event.job_id, index=index)


def _cancelled_already(state: State, job_id: str, index: int) -> bool:
    """Whether a cancel of ``job_id`` repeats one the state holds; an :class:`IngestError` if the
    job is unknown or ended otherwise."""
    if state.job_row(job_id) < 0:
        raise IngestError(f"event {index}: cannot cancel job {job_id!r}: no such job", "unknown_job", 404,
                          job_id=job_id, index=index)
    ended = job_ended(state, job_id)
    if ended is None:
        return False
    if ended == "cancelled":
        return True
    raise IngestError(f"event {index}: cannot cancel job {job_id!r}: it already ended ({ended})",
                      "already_ended", 409, job_id=job_id, index=index, state=ended)


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
    try:  # case-insensitive, with parameters (RFC 9110); none at all: JSON
        fmt = format_of(content_type.encode("utf-8", "replace") if content_type is not None else JSON)
    except BadEventError as exc:
        raise IngestError(str(exc), exc.reason) from None
    kind = CONTENT_TYPES[fmt]
    parts: list[bytes] | list[msgspec.Raw] = [body] if fmt == "msgpack" else _json_parts(body)
    if len(parts) > settings.max_request_events:
        raise IngestError(f"{len(parts)} events in one request; the limit is {settings.max_request_events}",
                          "too_many_events", 413, limit=settings.max_request_events)
    messages, tasks, events = [], 0, []
    for index, part in enumerate(parts):
        try:
            env = decode(bytes(part), kind)
        except BadEventError as exc:
            raise IngestError(f"event {index}: {exc}", exc.reason) from None
        if not isinstance(env.event, INPUT_TYPES):
            raise IngestError(f"event {index}: {type(env.event).__name__} is a decision, not an input: only "
                              "the scheduler writes decisions", "not_an_input", index=index)
        events.append(env.event)
        if isinstance(env.event, JobSubmitted):
            tasks += sum(group.count for group in env.event.task_groups)
            if tasks > settings.max_request_tasks:
                raise IngestError(f"the jobs of this request have over {settings.max_request_tasks} tasks "
                                  f"(event {index} passes it); split it", "too_many_tasks", 413,
                                  limit=settings.max_request_tasks)
        messages.append(Message(encode(env), headers=((CONTENT_TYPE_HEADER, MSGPACK),)))
    return IngestBatch(messages, tasks, events)


def _accepts_never_fits(request: Request) -> bool:
    name, value = ACCEPT_NEVER_FITS
    return request.headers.get(name, "").strip().lower() == value


def never_fitting(state: State, events: list[InputEvent]) -> Response | None:
    """422 ``never_fits`` when a submitted job can never fit on the fleet the service knows (node
    shapes, not usage: :mod:`fleetlog.core.fit`), as ``sbatch`` refuses a job no node can run;
    nothing of the request is appended.  Jobs of one shape are judged once."""
    if state.nodes.size == 0:
        return None
    fleet: Fleet | None = None
    judged: dict[tuple[object, ...], str | None] = {}
    for job in events:
        if not isinstance(job, JobSubmitted):
            continue
        fleet = fleet or Fleet(state)
        key = (job.task_groups, job.required_topology, job.allowed_cells)
        if key not in judged:
            judged[key] = never_fits_submitted(state, job, fleet)
        why = judged[key]
        if why is not None:
            return refusal(422, "never_fits", f"job {job.job_id!r} can never fit on the current fleet: {why}",
                           job_id=job.job_id)
    return None


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
        self._jobs: dict[str, JobSubmitted] = {}  # appended, not folded yet: job id -> submission
        self._job_ends: deque[tuple[int, str]] = deque()  # (end offset, job id) of those, in order
        self._appending: set[str] = set()  # ids in ``_jobs`` whose append has not returned yet

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

    def unfolded_jobs(self, loop: SchedulerLoop) -> dict[str, JobSubmitted]:
        """The jobs appended through ingest that the loop has not folded yet, with their submission
        (the folded ones are in its state).  Read it, do not keep it."""
        ends = self._job_ends
        while ends and ends[0][0] <= loop.offset:
            del self._jobs[ends.popleft()[1]]
        return self._jobs

    def reserve(self, batch: IngestBatch) -> None:
        """Count the jobs of ``batch`` as the service's while it is being appended."""
        for event in batch.events:
            if isinstance(event, JobSubmitted) and event.job_id not in self._jobs:
                self._jobs[event.job_id] = event
                self._appending.add(event.job_id)

    def release(self, batch: IngestBatch) -> None:
        """``batch`` was not appended after all: forget what :meth:`reserve` counted."""
        for event in batch.events:
            if isinstance(event, JobSubmitted) and event.job_id in self._appending:
                self._appending.discard(event.job_id)
                del self._jobs[event.job_id]

    def appended(self, first: int, batch: IngestBatch) -> None:
        end = first + len(batch.messages)
        if batch.tasks:
            self._unfolded.append((end, batch.tasks))
        for event in batch.events:
            if isinstance(event, JobSubmitted) and event.job_id in self._appending:
                self._appending.discard(event.job_id)
                self._job_ends.append((end, event.job_id))
