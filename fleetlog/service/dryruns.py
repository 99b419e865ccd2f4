"""``POST /v1/dry-run`` in the live service: off the event loop, bounded and rate-limited.

A dry run decides a whole step on a copy of the state (:mod:`fleetlog.api.dryrun`).  Run on the
event loop, one request of large jobs held it for most of a minute (issue 46), so here:

* **Off the loop.**  The loop mutates its state inside a step (fold, decide, append, fold the
  decisions), with awaits in between, so a copy is taken only *between* steps: a request asks
  for one and the service's step loop answers with :meth:`DryRuns.between_steps` after each step
  (within ``idle_wait_ms`` when idle).  The copy is the state's snapshot bytes — immutable, so
  the worker restores its own state from them and no one mutates anything under it — and is
  reused while the state has not moved (same inputs and decisions offsets): a client repeating a
  dry run on an unchanged state costs the loop nothing, and copies take at most
  :data:`COPY_SHARE` of the loop's time however many ask (a 100,000-pending state copies in
  about 0.15 s).  Decoding the body, restoring, deciding
  and encoding the answer all happen in one worker thread.
* **One at a time.**  One worker for the whole service (two dry runs never take both cores), at
  most :data:`MAX_WAITING` requests waiting for it (more: 429 ``busy``), and per principal at most
  ``max_dry_runs_in_flight`` at a time and ``max_dry_runs_per_s`` on average
  (``max_dry_run_burst`` at once), a token bucket as ingest's: 429 ``too_many_dry_runs`` with
  ``Retry-After``.  Without authentication every client is the one principal ``anonymous``.
* **Bounded** as ingest is: at most ``max_request_events`` (and 1,000) jobs, ``max_request_tasks``
  tasks in all, a job's own task limit, ``max_request_bytes`` of body (the HTTP server's bound);
  and the answer lists at most :data:`~fleetlog.api.dryrun.MAX_LISTED_TASKS` placements.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Final

import msgspec
import structlog

from fleetlog.api.dryrun import MAX_DRY_RUN_JOBS, dry_run, parse_jobs
from fleetlog.api.resources import ApiError
from fleetlog.api.visibility import EVERYTHING, Viewer, redact_dry_run, state_lookup
from fleetlog.core.digest import restore, snapshot
from fleetlog.core.policy import Policy
from fleetlog.events.model import JobSubmitted
from fleetlog.service.config import ServiceSettings
from fleetlog.service.http import Request, Response, refusal
from fleetlog.service.ingest import INLINE_DECODE_BYTES
from fleetlog.service.limits import SubmissionRates
from fleetlog.service.loop import SchedulerLoop

MAX_WAITING: Final = 8
"""Dry runs admitted and not answered yet, in all (one runs, the rest wait for the worker)."""
COPY_SHARE: Final = 0.2
"""The most of the loop's time copies for dry runs take: after a copy that took ``t`` seconds the
next is taken no sooner than ``t / COPY_SHARE`` seconds later (the dry runs wait meanwhile)."""
COPY_WAIT_S: Final = 30.0
"""How long a dry run waits for the loop to end its step and hand it a copy (else 503)."""
ANONYMOUS: Final = "anonymous"
"""The principal of a request without authentication (``[auth]`` off: loopback clients only)."""

log = structlog.get_logger("fleetlog.service.dryruns")

_Key = tuple[int, int, int]  # (the loop's id, its inputs offset, its decisions offset)


class DryRuns:
    """The live service's dry runs: admission (per principal, and in all), the copy taken
    between steps, and the one worker thread."""

    def __init__(self, settings: ServiceSettings, policy: Policy,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.settings, self.policy = settings, policy
        self.rates = SubmissionRates(settings.max_dry_runs_per_s, settings.max_dry_run_burst, monotonic)
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fleetlog-dry-run")
        self._worker = asyncio.Lock()
        self._in_flight: Counter[str] = Counter()
        self._admitted = 0
        self._wanted: list[asyncio.Future[bytes]] = []
        self._copy: tuple[_Key, bytes] | None = None
        self._monotonic, self._next_copy = monotonic, 0.0
        self.copies = 0
        """Copies of the state taken (for the tests: a dry run on a state that has not moved takes none)."""

    # -- the step loop's side ---------------------------------------------------------------

    def between_steps(self, loop: SchedulerLoop | None) -> None:
        """Hand the dry runs waiting for a copy the state as it is now, between two steps (``None``:
        the loop stopped; they get 503).  Called by the step loop, never inside a step."""
        if loop is None:
            self._copy = None
            self._fail_waiting()
            return
        key = (id(loop), loop.offset, loop.decisions_next)
        if self._copy is not None and self._copy[0] != key:
            self._copy = None  # (the state moved on: the old copy is not held in memory)
        if not self._wanted:
            return
        if self._copy is None:
            now = self._monotonic()
            if now < self._next_copy:  # (the waiting dry runs get one at a later step)
                return
            self._copy = key, snapshot(loop.state)
            took = self._monotonic() - now
            self._next_copy = now + took / COPY_SHARE
            self.copies += 1
        wanted, self._wanted = self._wanted, []
        for future in wanted:
            if not future.done():
                future.set_result(self._copy[1])

    def _fail_waiting(self) -> None:
        wanted, self._wanted = self._wanted, []
        for future in wanted:
            if not future.done():
                future.set_exception(ApiError(503, "standby", "this process stopped leading"))

    # -- the request's side -------------------------------------------------------------------

    async def serve(self, request: Request, leading: bool, viewer: Viewer = EVERYTHING) -> Response:
        """``POST /v1/dry-run``: admitted (or 429), then decided in the worker on a copy of the
        state taken between steps; answered as ``viewer`` may read it (fleetlog.api.visibility)."""
        if not leading:
            return refusal(503, "standby", "this process is not leading")
        who = request.principal or ANONYMOUS
        refused = self._admit(who)
        if refused is not None:
            log.warning("dry_run_limited", principal=who, code=refused[0], message=refused[1])
            return refusal(429, refused[0], refused[1], extra={"principal": who}, retry_after_s=refused[2])
        self._in_flight[who] += 1
        self._admitted += 1
        try:
            async with self._worker:  # (the copy is asked for once the worker is free: one held at a time)
                jobs = await self._parsed(request.body)
                data = await self._copy_between_steps()
                answer = await asyncio.get_running_loop().run_in_executor(
                    self.executor, self.answer, data, jobs, viewer)
                return Response(200, answer + b"\n")
        except ApiError as exc:
            return refusal(exc.status, exc.code, exc.message, exc.field)
        finally:
            self._admitted -= 1
            self._in_flight[who] -= 1
            if not self._in_flight[who]:
                del self._in_flight[who]

    def _admit(self, who: str) -> tuple[str, str, int] | None:
        """``None`` when ``who`` may start a dry run now (a token is taken), else (code, message,
        seconds to wait)."""
        most = self.settings.max_dry_runs_in_flight
        if self._in_flight[who] >= most:
            return ("too_many_dry_runs", f"principal {who!r} has {self._in_flight[who]} dry runs in flight; "
                    f"the limit is {most} (max_dry_runs_in_flight): wait for its answer", 1)
        if self._admitted >= MAX_WAITING:
            return ("busy", f"{self._admitted} dry runs are running or waiting; the limit is {MAX_WAITING}: "
                    "try again in a moment", 1)
        limited = self.rates.take({who: 1})
        if limited is None:
            return None
        return ("too_many_dry_runs", f"principal {who!r} asks for over {self.rates.rate:g} dry runs a second "
                f"(max_dry_runs_per_s, burst {self.rates.burst}): next in {limited.retry_after_s} s",
                limited.retry_after_s)

    async def _copy_between_steps(self) -> bytes:
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._wanted.append(future)
        try:
            return await asyncio.wait_for(future, COPY_WAIT_S)
        except TimeoutError:
            raise ApiError(503, "busy", f"the scheduler did not finish its step within {COPY_WAIT_S:.0f} s "
                           "to take a copy of its state: try again") from None

    async def _parsed(self, body: bytes) -> list[JobSubmitted]:
        """The body's jobs, bounded as ingest bounds a request (an :class:`ApiError` if not): a
        small body decoded here, a larger one in the worker."""
        s = self.settings
        limits = (min(MAX_DRY_RUN_JOBS, s.max_request_events), s.max_request_tasks)
        if len(body) <= INLINE_DECODE_BYTES:
            return parse_jobs(body, *limits)
        return await asyncio.get_running_loop().run_in_executor(self.executor, parse_jobs, body, *limits)

    def answer(self, data: bytes, jobs: list[JobSubmitted], viewer: Viewer = EVERYTHING) -> bytes:
        """The dry run itself, in the worker thread: the state restored from ``data`` (this dry run's
        own copy), the jobs decided on it, the answer redacted for ``viewer`` and encoded."""
        state = restore(data)
        found = dry_run(state, self.policy, jobs, owned=True)
        return msgspec.json.encode(redact_dry_run(found, viewer, state_lookup(state)))
