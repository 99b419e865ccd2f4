"""``fleetlog run``: the scheduling loop as a long-running service.

One cycle: wait to lead the shard → open the logs → recover (newest valid snapshot + the
tail) → step until told to stop or leadership is lost.  Any error ends the cycle; the next
one starts from the logs again, so nothing the loop held only in memory matters.  One policy
for every error (:class:`fleetlog.log.errorpolicy.Retrier`, the backends' too): a fault that
may pass (a lost connection, an OS error) is retried with jittered exponential back-off
(``retrying``); one an operator must fix (corrupt or unreadable decisions, a log that lost
records, a damaged segment, an unexpected exception) makes the service stand by (``stalled``),
say what and where in ``/healthz``, the log and the metrics, and re-check every few seconds.
The HTTP server runs throughout; the process never exits for a data problem.  The step
itself is :class:`SchedulerLoop.step` — the same one ``fleetlog simulate`` drives.

The parts, each in its module: :mod:`.warmup` (numba compiled before leading),
:mod:`.leadership` (election, the file lock, ``service.json``), :mod:`.snapshots` (recover from
them, take them), :mod:`.ingest` (``POST /v1/events``).  None imports this one.

Batching is adaptive by construction: each step folds everything that arrived while the
previous one ran (up to ``max_batch``), so batches grow under load and a lone event waits
only for the poll that returns it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import time
from collections.abc import Callable
from typing import Any, Final

import msgspec
import structlog
from tenacity import RetryCallState

from fleetlog.api.detail import job_detail
from fleetlog.api.resources import ApiError, PolicyList
from fleetlog.api.routes import LISTS, answer_list, openapi, route_for
from fleetlog.api.visibility import Found, JobLookup, Viewer, on_owner, state_lookup, view_of, viewer_for
from fleetlog.core.authorize import Roles
from fleetlog.core.policy import service_policy
from fleetlog.core.views import pending_by_reason
from fleetlog.events import SCHEMA_VERSION
from fleetlog.log import errorpolicy
from fleetlog.log.base import INPUTS, LogStore
from fleetlog.log.file import TRUNCATIONS_NAME, FileLogStore
from fleetlog.log.kafka import FencedError
from fleetlog.service.auth import refused_files, security
from fleetlog.service.authz import (
    EVERY_ROLE,
    Authorizer,
    forbidden,
    may_send,
    policy_reader,
    refused_principal,
    warn_unpoliced,
)
from fleetlog.service.config import Config
from fleetlog.service.dryruns import DryRuns
from fleetlog.service.http import (
    BindError,
    HttpServer,
    PortInUseError,
    Request,
    Response,
    Stream,
    json_response,
    refusal,
    unrouted,
)
from fleetlog.service.ingest import IngestGate, http_limits
from fleetlog.service.leadership import Leadership
from fleetlog.service.loop import LogBehindError, LoopConfig, SchedulerLoop, StepResult, keep_recovered
from fleetlog.service.metrics import Metrics
from fleetlog.service.snapshots import Snapshotter, check_ends, recover, snapshot_store
from fleetlog.service.warmup import Warming, warm_off_loop
from fleetlog.service.watch import View, Watchers, resolve, watch_limits, where_from
from fleetlog.waiting import event_or_timeout

GAUGE_PERIOD_S: Final = 1.0
HTTP_BIND_WAIT_S: Final = 5.0
"""How long a process that takes the lead waits for its HTTP port to be free."""
COMMIT_EVERY: Final = 50_000
API_PRODUCER: Final = "fleetlog-api"
"""The producer id of what the API appends for its callers (a quota set by ``PUT /v1/quotas``)."""

log = structlog.get_logger("fleetlog.service")


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


class Service:
    """One ``fleetlog run`` process: it orchestrates the parts (leadership, snapshots, ingest, the
    loop's error policy) around :class:`SchedulerLoop` and serves HTTP throughout."""

    def __init__(self, config: Config, stopping: asyncio.Event | None = None) -> None:
        self.config, self.settings = config, config.service
        self.policy = service_policy(self.settings.policy)
        self.metrics = Metrics()
        guard = security(config.auth, self.settings.http_host)
        self.http = HttpServer(self._handle, self.settings.http_host, self.settings.http_port,
                               http_limits(self.settings), guard.auth, self.metrics.unauthenticated.inc,
                               guard.tls)
        self.ingest = IngestGate(self.settings)
        self.dry_runs = DryRuns(self.settings, self.policy)
        self.authz = Authorizer(config.auth.policy_file)
        self.http.before_body = self._before_body  # authorized before any body byte is read
        self.ingest.reserved_tenants = lambda state: (  # TENANT/NAME ids are TENANT's (issue 46)
            self.authz.tenants(state.policy) | frozenset(state.names["tenant"].names))
        self.snapshots = snapshot_store(config)
        self.snapshotter = Snapshotter(self.snapshots, self.settings, self.policy.name, self.metrics)
        self.stopping = stopping or asyncio.Event()
        self.leadership = Leadership(config, self.stopping, self._sleep)
        self.store: LogStore | None = None
        self.loop: SchedulerLoop | None = None
        self.problem: Problem | None = None
        self._stage = "starting"
        self.warming = Warming()
        self._recovering: SchedulerLoop | None = None
        self._failed_at: str | None = None
        self._truncations: list[dict[str, object]] = []
        self.watchers = Watchers(watch_limits(self.settings), self.metrics)
        self._backoff = errorpolicy.backoff()
        # Every exception of a cycle is retried (until stop), each after the wait its class calls
        # for; _report says why in health, metrics and the log first — but a leader that cannot
        # serve HTTP (BindError) ends the process.
        self._retrier = errorpolicy.Retrier(
            self._report, stopped=self.stopping.is_set, sleep=self._sleep, stalled=_ACTIONS,
            fatal=(BindError,), retry_wait=self._retry_wait)

    def make_loop(self, store: LogStore) -> SchedulerLoop:
        s = self.settings
        return SchedulerLoop(store, self.policy, LoopConfig(
            group=s.group, producer_id=s.producer_id, max_batch=s.max_batch, commit_every=COMMIT_EVERY,
            tick_every_ms=s.tick_every_ms), s.core())

    # -- lifecycle ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve until :meth:`stop`; leads the shard whenever it can."""
        # HTTP first: on a cold numba cache the kernels compile for minutes, while /healthz says
        # ``warming`` (with progress) and a signal stops the process at once (issue 47)
        await self._serve_http(leading=False)
        log.info("service_started", http=self._http_address(), pid=os.getpid(),
                 policy=self.policy.name, config=self.config.redacted())
        warn_unpoliced(self.config.auth, log)
        try:
            if not await warm_off_loop(self.policy, self.stopping, self.warming):
                return
            log.info("kernels_ready", seconds=round(self.warming.seconds or 0.0, 3),
                     compiled=self.warming.counter.compiles)
            while not self.stopping.is_set():
                await self._retrier.run(self._cycle)
        finally:
            self.leadership.want_log(False)
            await self.leadership.stop()
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

    def _retry_wait(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome is not None else None
        if isinstance(exc, FencedError):
            return self.leadership.fenced_wait_s
        return float(self._backoff(state))

    def _report(self, state: RetryCallState, status: str, action: str) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        assert exc is not None
        wait = state.upcoming_sleep
        if isinstance(exc, FencedError):
            log.warning("fenced", error=str(exc), retry_s=round(wait, 3))
            return
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
        await event_or_timeout(self.stopping, seconds)

    async def _cycle(self) -> None:
        self._stage = "waiting for leadership"
        if not await self.leadership.acquire():
            return
        self._stage = "opening the logs"
        store = await self.leadership.open_store()
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
            self.leadership.advertise(self.http.port)
            self.leadership.want_log(False)  # service.json tells producers where to send from now on
            started = time.monotonic()
            self._stage = "recovering"
            self.loop, used = await recover(store, self.snapshots, self._recovery_loop, candidates)
            self._recovered()
            self.snapshotter.restarted(used)
            self.metrics.recovery.set(time.monotonic() - started)
            seconds = round(time.monotonic() - started, 3)
            log.info("recovered", inputs_offset=self.loop.offset, seconds=seconds)
            keep_recovered()
            self._stage = "serving"
            await self._serve(self.loop)
        except Exception as exc:
            self._failed_at = self._where(exc)  # before the loop is dropped: it knows the offsets
            raise
        finally:
            self.metrics.stopped_leading()
            self.loop = self.store = self._recovering = None
            self.dry_runs.between_steps(None)  # (a dry run waiting for a copy gets 503)
            await self.snapshotter.finish()
            await store.close()
            self.leadership.unadvertise()
            self.leadership.want_log(not self.stopping.is_set())

    def _recovery_loop(self, store: LogStore) -> SchedulerLoop:
        self._recovering = self.make_loop(store)
        return self._recovering

    def _recovered(self) -> None:
        """Leading again: the problem is over, and the next failure backs off from the start."""
        if self.problem is not None:
            log.info("loop_resumed", after=self.problem.error, attempts=self.problem.attempts,
                     seconds=round(time.time() - self.problem.since, 3))
        self.problem = None
        self.metrics.stalled.set(0)
        self._retrier.recovered()

    def _note_truncations(self, store: LogStore) -> None:
        """Log what opening the file log cut (and keep the persisted report for health)."""
        if not isinstance(store, FileLogStore):
            return
        for cut in store.recovery.truncations:
            log.error("log_truncated", **cut.to_json(int(time.time() * 1000)))
        self._truncations = store.truncation_history(5)

    # -- the loop ----------------------------------------------------------------------------

    async def _serve(self, loop: SchedulerLoop) -> None:
        next_gauges = 0.0
        while not self.leadership.lost():
            result = await loop.step(timeout_ms=self.settings.idle_wait_ms)
            self._observe(result, result.work_s)  # the work, not the idle wait for input
            self.metrics.count_ignored("single", loop.state.observations.counts)
            loop.observed.flush()  # (one line per producer and reason of a task report not applied)
            now = time.monotonic()
            if now >= next_gauges:
                next_gauges = now + GAUGE_PERIOD_S
                await loop.commit()
                await self._gauges(loop)
            self.snapshotter.maybe(loop, now)
            self.dry_runs.between_steps(loop)  # (the one point a copy of the state is consistent)
        if not self.leadership.fenced_out():
            await loop.commit()
        self.snapshotter.maybe(loop, time.monotonic(), force=self.stopping.is_set())

    def _observe(self, result: StepResult, seconds: float) -> None:
        m = self.metrics
        m.step.observe(seconds)
        if result.inputs:  # (decide ran: a step without inputs only polled)
            m.decide_step.observe(seconds)
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
        m.snapshot_age.set(time.time() - self.snapshotter.taken_at)
        m.fleet.maybe_update(loop.state, time.monotonic())  # (at most 1% of the time: its cost sets when)

    # -- HTTP ----------------------------------------------------------------------------------

    async def _handle(self, request: Request) -> Response | Stream:
        path = request.path
        if path == "/healthz":
            return json_response(200, self.health())
        if path == "/readyz":
            return json_response(200 if self.loop is not None else 503, self.health())
        logged = self.loop.state.policy if self.loop is not None else None
        roles = None if request.principal is None else self.authz.roles(request.principal, logged)
        answer = (forbidden(refused_principal(request.principal))
                  if request.principal is not None and roles is None else await self._routed(request, roles))
        if isinstance(answer, Response) and answer.status == 403:
            self._refused(request, answer)
        elif isinstance(answer, Response) and answer.status == 429:
            self._limited(request, answer)
        return answer

    async def _before_body(self, request: Request) -> Response | Stream | None:
        """A request with a body, by its head (fleetlog.service.http.BeforeBody): a route that takes
        no body is answered as it is, a principal that may send the route nothing is refused 403,
        both before a byte of the body is read or a body slot is taken; ``None``: read the body."""
        route, _, _ = route_for(request.method, request.raw_path or request.path)
        if route is None or route.method not in ("POST", "PUT"):
            return await self._handle(request)
        if request.principal is None:
            return None
        logged = self.loop.state.policy if self.loop is not None else None
        refused = may_send(request.principal, self.authz.roles(request.principal, logged), route.path)
        if refused is None:
            return None
        answer = forbidden(refused)
        self._refused(request, answer)
        return answer

    def _limited(self, request: Request, answer: Response) -> None:
        """Count and log a tenant held back by ``max_submissions_per_s``."""
        body = msgspec.json.decode(answer.body)
        if body.get("code") == "too_many_submissions":
            self.metrics.rate_limited.inc()
            log.warning("rate_limited", principal=request.principal, tenant=body.get("tenant"),
                        message=body.get("message"))

    def _refused(self, request: Request, answer: Response) -> None:
        """Count and log a 403 (the audit of refusals: who, what, which rule)."""
        body = msgspec.json.decode(answer.body)
        self.metrics.forbidden.labels(body.get("action", "any")).inc()
        log.warning("forbidden", principal=request.principal, method=request.method, path=request.path,
                    message=body.get("message"), rule=body.get("rule"))

    async def _routed(self, request: Request, roles: Roles | None) -> Response | Stream:
        path = request.path
        if path == "/metrics" and request.method == "GET":
            return Response(200, self.metrics.exposition(), "text/plain; version=0.0.4")
        if path == "/v1/events":
            if request.method != "POST":
                return _not_allowed()
            return await self.ingest.serve(request, self._leading, roles)
        if request.method == "GET" and path == "/v1/openapi.json":
            return json_response(200, openapi())
        if request.method == "GET" and path == "/v1/policy" and roles is not None:
            refused = policy_reader(roles)
            if refused is not None:
                return forbidden(refused)
        if request.method == "GET" and path in LISTS:
            return self._list(path, request.query, _viewer(roles))
        if request.method == "GET" and path == "/v1/watch":
            return await self._watch(request, self._view(roles))
        route, found, elsewhere = route_for(request.method, request.raw_path or path)
        if route is not None and route.path == "/v1/jobs/{job_id}":
            return self._job(found["job_id"], _viewer(roles))
        if route is not None and route.path == "/v1/nodes/{node}":  # (answered as the lists are)
            return self._list(request.raw_path or path, request.query, _viewer(roles))
        if route is not None and route.path == "/v1/quotas/{tenant}":
            return await self._put_quota(found["tenant"], request, roles)
        if route is not None and route.path == "/v1/dry-run":  # (off the loop: fleetlog.service.dryruns)
            return await self.dry_runs.serve(request, self.loop is not None, _viewer(roles))
        if route is not None and route.path == "/v1/history":  # (it replays the whole log: not on this loop)
            return refusal(404, "not_served", "GET /v1/history folds the whole log, so it is served by "
                           "`fleetlog replay serve` and `fleetlog history`, not by the live service")
        return unrouted(request, elsewhere)

    def _view(self, roles: Roles | None) -> View | None:
        """What a watcher holding ``roles`` may see of each event (fleetlog.api.visibility), its
        jobs looked up in the live state on the event loop (the watch frames in a worker thread)."""
        def lookup() -> JobLookup:
            loop = self.loop
            return state_lookup(loop.state) if loop is not None else lambda ids: {}
        return view_of(_viewer(roles), on_owner(lookup, _on_loop(asyncio.get_running_loop())))

    async def _watch(self, request: Request, view: View | None = None) -> Response | Stream:
        """``GET /v1/watch`` (fleetlog.service.watch: its counts and byte bounds), each event as
        ``view`` shows it (``None``: whole)."""
        store = self.store
        if self.loop is None or store is None:
            return refusal(503, "standby", "this process is not leading")
        try:
            name, start = where_from(request.query, request.headers.get("last-event-id"))
            log_ = store.log(name)
            offset = await resolve(log_, start)
        except ApiError as exc:
            return refusal(exc.status, exc.code, exc.message, exc.field)
        refused = self.watchers.refused(request)  # (after the last wait: counted as it is checked)
        return refused or self.watchers.stream(request, log_, offset, view)

    async def _put_quota(self, tenant: str, request: Request, roles: Roles | None) -> Response:
        """``PUT /v1/quotas/TENANT``: the body as a ``QuotaSet`` for the tenant the path names,
        through ingest (the same checks, the same answer; its errors name the field)."""
        try:
            fields = msgspec.json.decode(request.body or b"{}")
        except msgspec.DecodeError as exc:
            return refusal(400, "undecodable", f"body is not JSON: {exc}")
        if not isinstance(fields, dict):
            return refusal(400, "undecodable", "the body must be a JSON object (a QuotaSet's fields)")
        for name in ("type", "tenant"):
            if name in fields:
                return refusal(400, "invalid_event", f"{name!r} comes from the path, not the body", name)
        event = {"type": "QuotaSet", "tenant": tenant, **fields}
        body = msgspec.json.encode({"schema_version": SCHEMA_VERSION, "producer_id": API_PRODUCER,
                                    "event": event})
        as_json = msgspec.structs.replace(request, body=body, headers={"content-type": "application/json"})
        answer = await self.ingest.serve(as_json, self._leading, roles)
        return _quota_fields(answer)

    def _list(self, path: str, query: dict[str, list[str]], viewer: Viewer) -> Response:
        """A read-only list (fleetlog.api) of the live state, as ``viewer`` may see it."""
        if self.loop is None:
            return refusal(503, "standby", "this process is not leading")
        try:
            answer = answer_list(self.loop.state, path, query, viewer)
        except ApiError as exc:
            return refusal(exc.status, exc.code, exc.message, exc.field)
        if isinstance(answer, PolicyList) and answer.source == "none":  # (no PolicySet folded yet)
            answer = self.authz.file_policy() or answer
        return json_response(200, answer)

    def health(self) -> dict[str, Any]:
        """``leading``, ``standby`` (another process leads), ``retrying`` or ``stalled`` (with the
        problem: what, where, what next), and the newest truncations the file log reported."""
        loop, problem = self.loop, self.problem
        status = "leading" if loop is not None else problem.status if problem is not None else "standby"
        if not self.warming.done:
            status = "warming"
        found: dict[str, Any] = {
            "status": status,
            "pid": os.getpid(),
            "inputs_offset": loop.offset if loop is not None else None,
            "policy": self.policy.name,
        }
        if problem is not None and loop is None:
            found["problem"] = msgspec.to_builtins(problem)
        if not self.warming.done:
            found["warming"] = self.warming.progress()
        if self._truncations:
            found["truncations"] = self._truncations
        auth = self.http.auth
        refused = refused_files(None if auth is None else auth.tokens, self.authz.file)
        if refused:  # (fail closed: nobody authenticates, or holds a role, until the file is good)
            found["auth_refused"] = refused
        return found

    def _job(self, job_id: str, viewer: Viewer) -> Response:
        """``GET /v1/jobs/JOB``: a job ``viewer`` may not see is 404 ``unknown_job``, as one that
        never was (and a retired one too, to a viewer who does not see all: the state no longer
        knows whose it was)."""
        if self.loop is None:
            return refusal(503, "standby", "this process is not leading")
        state = self.loop.state
        found = job_detail(state, job_id, viewer)
        if found is None and job_id in state.retired and viewer.sees_all:  # (docs/retention.md: in the logs)
            at = state.retired[job_id]
            return refusal(404, "retired", f"job {job_id!r} retired from the state at log time {at} ms "
                           "(`fleetlog status` reads it from the logs)")
        if found is None:
            return refusal(404, "unknown_job", f"unknown job {job_id!r}")
        return json_response(200, found)

    def _leading(self) -> tuple[LogStore | None, SchedulerLoop | None]:
        return self.store, self.loop


def _quota_fields(answer: Response) -> Response:
    """Ingest's answer to a ``PUT /v1/quotas``, its ``field`` relative to the body
    (``event.nominal.gpu_milli`` -> ``nominal.gpu_milli``)."""
    if answer.status < 400:
        return answer
    body = msgspec.json.decode(answer.body)
    field = body.get("field")
    if isinstance(field, str) and field.startswith("event."):
        body["field"] = field.removeprefix("event.")
        return json_response(answer.status, body, answer.headers)
    return answer


def _viewer(roles: Roles | None) -> Viewer:
    """What a request may read (fleetlog.api.visibility): everything when no policy restricts it
    (no ``[auth]``, or no policy file: every principal holds every role)."""
    return viewer_for(None if roles is None or roles is EVERY_ROLE else roles)


def _on_loop(aio: asyncio.AbstractEventLoop) -> Callable[[Callable[[], Found]], Found]:
    """Run a lookup on the service's event loop ``aio`` (where the state changes) and wait for it:
    a watch's worker thread never reads the state while the loop changes it.  On the loop itself it
    runs at once; a loop that does not answer within 10 s (stopping) finds no job (shows nothing)."""
    def call(fn: Callable[[], Found]) -> Found:
        if _running_loop() is aio:
            return fn()
        done: concurrent.futures.Future[Found] = concurrent.futures.Future()

        def run() -> None:
            try:
                done.set_result(fn())
            except Exception as exc:  # (handed to the caller)
                done.set_exception(exc)
        try:
            aio.call_soon_threadsafe(run)
            return done.result(timeout=10)
        except (RuntimeError, TimeoutError):
            return {}
    return call


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _not_allowed() -> Response:
    return refusal(405, "method_not_allowed", "use POST")
