"""``GET /v1/watch``: the decisions (or inputs) log as Server-Sent Events, from an offset, resumable.

Each record is one event: ``id`` is its offset, ``event`` its type (``DecisionBatch``,
``JobSubmitted``…) and ``data`` one JSON object ``{"offset", "timestamp_ms", "event"}``.  A client
that reconnects with ``Last-Event-ID`` (browsers' ``EventSource`` do) goes on after that offset, so
a stream read across reconnects has neither gaps nor repeats.  Each watcher reads the log itself
(a long-poll read, woken by appends), at most :data:`BATCH` records at a time, and writes them
out before reading more: a slow watcher holds at most one batch in memory and never slows
another watcher.  Each record is turned into its frame once for all watchers (:class:`Frames`).
While nothing happens, a comment line every ``keepalive_s`` keeps
proxies from closing the stream.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from typing import Final

import msgspec

from fleetlog.api.resources import ApiError, check_params
from fleetlog.events import decode
from fleetlog.events.codec import BadEventError
from fleetlog.log.base import DECISIONS, INPUTS, Log, LogClosedError, Record

BATCH: Final = 256
KEEPALIVE_S: Final = 15.0
LOGS: Final = (DECISIONS, INPUTS)
PARAMS: Final = ("from", "log")


def frame(record: Record) -> bytes:
    """One record as an SSE event; a record that does not decode (a hostile producer's, parked by
    the consumer) is an ``undecodable`` event naming the problem, so the offsets stay whole."""
    try:
        event = decode(record.value).event
    except BadEventError as exc:
        data = msgspec.json.encode({"offset": record.offset, "timestamp_ms": record.timestamp_ms,
                                    "error": str(exc)[:500]})
        return b"id: %d\nevent: undecodable\ndata: %s\n\n" % (record.offset, data)
    data = msgspec.json.encode({"offset": record.offset, "timestamp_ms": record.timestamp_ms, "event": event})
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (record.offset, type(event).__name__.encode(), data)


def where_from(query: Mapping[str, list[str]], last_event_id: str | None) -> tuple[str, str]:
    """(log name, start: an offset, ``start`` or ``end``) of a watch request; ``Last-Event-ID``
    (the offset of the last event the client has) wins over ``from``."""
    check_params(query, PARAMS)
    logs = query.get("log", [DECISIONS])
    if len(logs) != 1 or logs[0] not in LOGS:
        raise ApiError(400, "invalid_value", f"log={logs!r}: one of {', '.join(LOGS)}", "log")
    if last_event_id is not None:
        if not last_event_id.strip().isdigit():
            raise ApiError(400, "invalid_value", f"Last-Event-ID {last_event_id!r} is not an offset",
                           "Last-Event-ID")
        return logs[0], str(int(last_event_id) + 1)
    start = query.get("from", ["end"])
    if len(start) != 1 or not (start[0] in ("start", "end") or (start[0].isdigit() and len(start[0]) < 19)):
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


class Frames:
    """The SSE frames of one log's recent records, made once for every watcher: watchers read the
    same records at about the same time, and turning a record into JSON is the watch's main cost
    (a step of 10,000 placements is a 0.6 MB record).  Holds at most ``max_bytes`` of frames,
    the oldest dropped first."""

    def __init__(self, max_bytes: int = 64 << 20) -> None:
        self.max_bytes, self.size = max_bytes, 0
        self.made: OrderedDict[int, bytes] = OrderedDict()

    def of(self, record: Record) -> bytes:
        found = self.made.get(record.offset)
        if found is None:
            found = self.made[record.offset] = frame(record)
            self.size += len(found)
            while self.size > self.max_bytes and len(self.made) > 1:
                self.size -= len(self.made.popitem(last=False)[1])
        return found


async def events(log: Log, offset: int, keepalive_s: float = KEEPALIVE_S,
                 frames: Frames | None = None) -> AsyncIterator[bytes]:
    """The SSE stream of ``log`` from ``offset``, until the client or the server ends it (or the
    log is closed: the process stops leading)."""
    made = frames.of if frames is not None else frame
    yield b"retry: 1000\n\n"
    while True:
        try:
            records = await log.read(offset, BATCH, timeout_ms=int(keepalive_s * 1000))
        except LogClosedError:
            return
        if not records:
            yield b": keepalive\n\n"
            continue
        yield b"".join(made(r) for r in records)
        offset = records[-1].offset + 1
