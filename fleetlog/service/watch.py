"""``GET /v1/watch``: the decisions (or inputs) log as Server-Sent Events, from an offset, resumable.

Each record is one event: ``id`` is its offset, ``event`` its type (``DecisionBatch``,
``JobSubmitted``…) and ``data`` one JSON object ``{"offset", "timestamp_ms", "event"}``.  A client
that reconnects with ``Last-Event-ID`` (browsers' ``EventSource`` do) goes on after that offset, so
a stream read across reconnects has neither gaps nor repeats.  While nothing happens, a comment
line every ``keepalive_s`` keeps proxies from closing the stream.

What a watcher may cost is bounded (issue 46: eight watchers that never read took a service from
0.5 to 5.6 GB and blocked its loop for seconds), by :class:`WatchLimits`:

* **bytes** — each watcher reads the log itself (a long-poll read, woken by appends), at most
  :data:`BATCH` records and ``read_bytes`` bytes at a time (a larger record alone), turns them
  into frames and writes them out before it reads more.  Before a read it takes room for the
  records and their frames from one :class:`Budget` of ``total_bytes`` for all watchers (waiting
  while the others hold it), at most ``held_bytes`` for one (a record that needs more goes alone);
  it gives the room back as soon as the client has taken the frames, and all of it when it
  closes.  No frame is kept once written: nothing grows with the watchers there were.
* **the loop** — decoding a record and encoding its frame (a step of 10,000 placements is a
  0.6 MB record) happen in a worker thread, never on the event loop: health, ingest and the
  scheduler's steps go on while watchers read multi-megabyte records.
* **time** — a watcher whose client takes nothing for ``drain_timeout_s`` is dropped: a last
  ``dropped`` event says where to resume (``resume_from``: the offset after the last record
  sent, as ``from``; the last ``id`` it read works as ``Last-Event-ID`` too), and its connection
  is closed (:class:`fleetlog.service.http.Stream`), so what it held is given back.
* **count** — at most ``max_streams`` watchers at a time, ``max_streams_per_client`` of them one
  principal's (unauthenticated: one peer address's); past either, 429 ``too_many_watchers``.

A per-viewer ``view`` (what a principal may see of each event: fleetlog.api.visibility) is
applied to each decoded event before it is encoded; it runs in the worker thread too.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Final

import msgspec
import structlog
from prometheus_client import Counter

from fleetlog.api.resources import ApiError, check_params
from fleetlog.events import decode
from fleetlog.events.codec import BadEventError
from fleetlog.events.model import Event
from fleetlog.log.base import DECISIONS, INPUTS, Log, LogClosedError, Record, record_bytes
from fleetlog.numerals import whole
from fleetlog.service.http import Request, Response, Stream, refusal
from fleetlog.service.metrics import Metrics

if TYPE_CHECKING:
    from fleetlog.service.config import ServiceSettings

BATCH: Final = 256
KEEPALIVE_S: Final = 15.0
LOGS: Final = (DECISIONS, INPUTS)
PARAMS: Final = ("from", "log")
PROBE_BYTES: Final = 64 * 1024
"""Room a watcher takes for a read that waits at the end of the log (most of them): an idle
watcher holds little of the budget; one that finds more takes ``held_bytes`` for the next read."""
WORKERS: Final = 2
"""Threads that make the frames of all watchers (their own pool: a watch never waits behind, nor
holds up, the other work the service sends to threads; and at most this many records are being
decoded at a time, each a transient ten times its size in objects)."""
COST: Final = 3
"""Room a record needs per byte it weighs: itself, its frame (JSON: about 1.4 times the record)
and the worker's copies while it makes them."""

View = Callable[[Event], "Event | None"]
"""What one viewer may see of an event: it, a redacted copy, or ``None`` to leave it out."""

logger = structlog.get_logger("fleetlog.service.watch")


class WatchLimits(msgspec.Struct, frozen=True):
    """What all watchers, and each, may hold (the service's ``watch_*`` settings)."""

    read_bytes: int = 1 << 20
    held_bytes: int = 8 << 20
    total_bytes: int = 64 << 20
    drain_timeout_s: float = 10.0
    max_streams: int = 128
    max_streams_per_client: int = 64
    keepalive_s: float = KEEPALIVE_S


def watch_limits(settings: ServiceSettings) -> WatchLimits:
    s = settings
    return WatchLimits(s.watch_read_bytes, s.watch_held_bytes, s.watch_total_bytes, s.watch_drain_timeout_s,
                       s.watch_max_streams, s.watch_max_streams_per_client)


class Budget:
    """Bytes every watcher together may hold: :meth:`take` waits until the others leave room
    (room larger than the whole budget is taken once the others hold at most a quarter of it:
    that record goes nearly alone, and idle watchers' small rooms do not hold it back for ever),
    :meth:`give` hands it back."""

    def __init__(self, total: int) -> None:
        self.total, self.held = total, 0
        self._freed = asyncio.Event()

    async def take(self, size: int) -> int:
        while self.held + size > self.total and self.held > (self.total // 4 if size > self.total else 0):
            freed = self._freed
            await freed.wait()
        self.held += size
        return size

    def give(self, size: int) -> None:
        if size:
            self.held -= size
            self._freed.set()
            self._freed = asyncio.Event()


def frame(record: Record, view: View | None = None) -> bytes:
    """One record as an SSE event (``b""``: ``view`` leaves it out); a record that does not
    decode (a hostile producer's, parked by the consumer) is an ``undecodable`` event naming the
    problem, so the offsets stay whole."""
    try:
        decoded = decode(record.value).event
    except BadEventError as exc:
        data = msgspec.json.encode({"offset": record.offset, "timestamp_ms": record.timestamp_ms,
                                    "error": str(exc)[:500]})
        return b"id: %d\nevent: undecodable\ndata: %s\n\n" % (record.offset, data)
    event = decoded if view is None else view(decoded)
    if event is None:
        return b""
    data = msgspec.json.encode({"offset": record.offset, "timestamp_ms": record.timestamp_ms, "event": event})
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (record.offset, type(event).__name__.encode(), data)


def frames(records: list[Record], room: int, view: View | None) -> tuple[bytes, int]:
    """The frames of the first records whose frames fit in ``room`` (the first however large),
    and the offset after the last one framed (run in a worker thread)."""
    parts: list[bytes] = []
    size, after = 0, records[0].offset
    for record in records:
        made = frame(record, view)
        if parts and size + len(made) > room:
            break
        parts.append(made)
        size += len(made)
        after = record.offset + 1
    return b"".join(parts), after


def farewell(resume_from: int, seconds: float) -> bytes:
    """The ``dropped`` event: why, and where to resume (no ``id``: the last record's stays)."""
    data = msgspec.json.encode({
        "code": "too_slow", "resume_from": resume_from,
        "message": f"the client took nothing for {seconds:g} s: reconnect with from={resume_from} "
                   "(or Last-Event-ID: the last id read)"})
    return b"event: dropped\ndata: %s\n\n" % data


def where_from(query: Mapping[str, list[str]], last_event_id: str | None) -> tuple[str, str]:
    """(log name, start: an offset, ``start`` or ``end``) of a watch request; ``Last-Event-ID``
    (the offset of the last event the client has) wins over ``from``."""
    check_params(query, PARAMS)
    logs = query.get("log", [DECISIONS])
    if len(logs) != 1 or logs[0] not in LOGS:
        raise ApiError(400, "invalid_value", f"log={logs!r}: one of {', '.join(LOGS)}", "log")
    if last_event_id is not None:
        last = whole(last_event_id.strip(), 18)  # (ASCII digits: "²" passes str.isdigit, not int)
        if last is None:
            raise ApiError(400, "invalid_value", f"Last-Event-ID {last_event_id!r} is not an offset",
                           "Last-Event-ID")
        return logs[0], str(last + 1)
    start = query.get("from", ["end"])
    if len(start) != 1 or not (start[0] in ("start", "end") or whole(start[0], 18) is not None):
        raise ApiError(400, "invalid_value", f"from={start!r}: an offset, start or end", "from")
    return logs[0], start[0]


async def resolve(log: Log, start: str) -> int:
    """The offset ``start`` names; before the first the log holds (pruned) is 410 ``gone``."""
    first, end = await log.start_offset(), await log.end_offset()
    if start == "start":
        return first
    if start == "end":
        return end
    offset = int(start)
    if offset < first:
        raise ApiError(410, "gone", f"offset {offset} was pruned: the log starts at {first}", "from")
    return offset


class Watch:
    """One watcher's stream of ``log`` from ``offset``: its chunks (SSE frames), the room it
    holds of the budget, and where it would resume."""

    def __init__(self, log: Log, offset: int, limits: WatchLimits | None = None, budget: Budget | None = None,
                 view: View | None = None, workers: ThreadPoolExecutor | None = None) -> None:
        self.log, self.next_offset, self.view, self.workers = log, offset, view, workers
        self.limits = limits or WatchLimits()
        self.budget = budget or Budget(self.limits.total_bytes)
        self.held = 0

    def farewell(self) -> bytes:
        return farewell(self.next_offset, self.limits.drain_timeout_s)

    async def events(self) -> AsyncIterator[bytes]:
        """The stream, until the client or the server ends it (or the log is closed: the process
        stops leading).  The room taken for a chunk is held until the client has taken it."""
        yield b"retry: 1000\n\n"
        want = PROBE_BYTES
        try:
            while True:
                chunk, want = await self._next(want)
                if chunk is None:
                    return
                yield chunk
                self._hold(0)
        finally:
            self._hold(0)

    async def _next(self, want: int) -> tuple[bytes | None, int]:
        """The next chunk (a keepalive when nothing came; ``None``: the log was closed) and the
        room to take for the read after it."""
        lim = self.limits
        self._hold(0)
        self.held = await self.budget.take(want)
        bound = max(1, min(lim.read_bytes, self.held // COST))
        try:
            records = await self.log.read(self.next_offset, BATCH, timeout_ms=int(lim.keepalive_s * 1000),
                                          max_bytes=bound)
        except LogClosedError:
            return None, want
        if not records:
            self._hold(0)
            return b": keepalive\n\n", PROBE_BYTES
        weight = sum(map(record_bytes, records))
        if len(records) == 1 and weight * COST > self.held:  # a record larger than the room: alone
            self._hold(0)
            return await self._next(weight * COST)
        made = functools.partial(frames, records, self.held - weight, self.view)
        chunk, after = await asyncio.get_running_loop().run_in_executor(self.workers, made)
        full = len(records) == BATCH or weight * 2 >= bound  # (the bound cut it: more is likely there)
        del records
        self._hold(len(chunk))
        self.next_offset = after
        return chunk or b": keepalive\n\n", max(lim.held_bytes, PROBE_BYTES) if full else PROBE_BYTES

    def _hold(self, size: int) -> None:
        """Hold ``size`` bytes of the budget from now (more than taken: the frames came out
        larger than their room, and are counted as they are)."""
        if size > self.held:
            self.budget.held += size - self.held
        else:
            self.budget.give(self.held - size)
        self.held = size


async def events(log: Log, offset: int, keepalive_s: float = KEEPALIVE_S) -> AsyncIterator[bytes]:
    """The SSE stream of ``log`` from ``offset`` under the default limits (a watch of its own)."""
    async for chunk in Watch(log, offset, WatchLimits(keepalive_s=keepalive_s)).events():
        yield chunk


class _Slot:
    """A watcher's place in the counts, given back once (at the stream's close, or when the
    stream is dropped without ever being run)."""

    def __init__(self, watchers: Watchers, client: str) -> None:
        self.watchers, self.client, self.open = watchers, client, True
        watchers.count += 1
        watchers.by_client[client] = watchers.by_client.get(client, 0) + 1

    def release(self) -> None:
        if not self.open:
            return
        self.open = False
        w = self.watchers
        w.count -= 1
        w.by_client[self.client] -= 1
        if not w.by_client[self.client]:
            del w.by_client[self.client]


class _Chunks:
    """A watch's chunks as :class:`fleetlog.service.http.Stream` reads them; closing them (or
    losing them unrun) frees the slot at once."""

    def __init__(self, chunks: AsyncIterator[bytes], slot: _Slot) -> None:
        self.chunks, self.slot = chunks, slot

    def __aiter__(self) -> _Chunks:
        return self

    async def __anext__(self) -> bytes:
        return await anext(self.chunks)

    async def aclose(self) -> None:
        self.slot.release()
        aclose = getattr(self.chunks, "aclose", None)
        if aclose is not None:
            await aclose()

    def __del__(self) -> None:
        self.slot.release()


class Watchers:
    """The service's watchers: their counts (all, and per client), the one byte budget they
    share, and their gauges (``fleetlog_watchers``, ``fleetlog_watch_bytes_held``,
    ``fleetlog_watch_dropped``)."""

    def __init__(self, limits: WatchLimits | None = None, metrics: Metrics | None = None) -> None:
        self.limits = limits or WatchLimits()
        self.count = 0
        self.by_client: dict[str, int] = {}
        self.budget = Budget(self.limits.total_bytes)
        self.workers = ThreadPoolExecutor(WORKERS, thread_name_prefix="fleetlog-watch")
        self.dropped: Counter | None = None
        if metrics is not None:
            metrics.watchers.set_function(lambda: self.count)
            metrics.watch_bytes.set_function(lambda: self.budget.held)
            self.dropped = metrics.watch_dropped

    def refused(self, request: Request) -> Response | None:
        """429 ``too_many_watchers`` past the cap of all, or of this client."""
        lim, client = self.limits, client_of(request)
        if self.count >= lim.max_streams:
            return refusal(429, "too_many_watchers", f"{self.count} watchers already; the limit is "
                           f"{lim.max_streams}", extra={"limit": lim.max_streams})
        mine = self.by_client.get(client, 0)
        if mine >= lim.max_streams_per_client:
            who = client.replace(":", " ", 1)
            return refusal(429, "too_many_watchers", f"{who} has {mine} watchers already; the limit of "
                           f"one client is {mine}", extra={"limit": lim.max_streams_per_client})
        return None

    def stream(self, request: Request, source: Log, offset: int,
               view: View | None = None) -> Stream:
        """A watch of ``source`` from ``offset`` for ``request``'s client (check :meth:`refused`
        first); ``view``: what the client may see of each event (fleetlog.api.visibility), called
        in a worker thread, so it must not read what the loop changes meanwhile."""
        watch = Watch(source, offset, self.limits, self.budget, view, self.workers)
        slot = _Slot(self, client_of(request))

        def last_words() -> bytes:
            if self.dropped is not None:
                self.dropped.inc()
            logger.warning("watcher_dropped", client=slot.client, resume_from=watch.next_offset,
                        seconds=self.limits.drain_timeout_s)
            return watch.farewell()

        return Stream(_Chunks(watch.events(), slot), write_timeout_s=self.limits.drain_timeout_s,
                      farewell=last_words)


def client_of(request: Request) -> str:
    """Whose share a request counts in: its principal's, else its peer address's."""
    if request.principal is not None:
        return f"principal:{request.principal}"
    return f"peer:{request.peer}"

