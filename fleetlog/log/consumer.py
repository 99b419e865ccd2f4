"""Read events from a log; park what cannot be decoded in the dead-letter log and go on.

A bad record is never dropped silently and never stops the reader: it is copied,
bytes, key and headers untouched, to the dead-letter log with headers naming the
reason code, the error message and where it came from — and a warning line on the
``fleetlog.dead_letters`` logger says so, one per record parked.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from itertools import compress, count, repeat
from operator import attrgetter, is_
from typing import Final

import msgspec

from fleetlog.events.codec import (
    CONTENT_TYPE_HEADER,
    BadEventError,
    InvalidEventError,
    UndecodableError,
    decode,
    decode_many,
)
from fleetlog.events.model import (
    INPUT_TYPES,
    DecisionBatch,
    Envelope,
    Event,
    InputEvent,
    NodeHeartbeat,
    PolicySet,
)
from fleetlog.log.base import (
    DEAD_LETTERS,
    INPUTS,
    NULL_VALUE_HEADER,
    PRINCIPAL_HEADER,
    UNREADABLE_HEADER,
    LogStore,
    Message,
    Record,
    chunks,
)

REASON_HEADER: Final = "fleetlog-dead-letter-reason"
ERROR_HEADER: Final = "fleetlog-dead-letter-error"
SOURCE_HEADER: Final = "fleetlog-dead-letter-source"
MEMO_LIMIT: Final = 1 << 16
"""The most distinct heartbeat values :class:`EventConsumer` keeps decoded (then it starts over)."""

LOG: Final = logging.getLogger("fleetlog.dead_letters")
_VALUE = attrgetter("value")
_TIMESTAMP = attrgetter("timestamp_ms")
_HEADERS = attrgetter("headers")


class Delivered(msgspec.Struct, frozen=True, gc=False):
    """A decoded event with the log position and the log's append time."""

    offset: int
    timestamp_ms: int
    envelope: Envelope


class Polled(msgspec.Struct, frozen=True):
    """One poll's result: good events, how many were parked, and where to read next."""

    events: list[Delivered]
    dead_lettered: int
    next_offset: int


class Inputs:
    """One poll's good input events and their log times as parallel lists (no object per event),
    how many records were parked, and where to read next: what the scheduling loop folds
    (``fold_lists``).  ``read_at`` is when the read returned (``time.perf_counter()``): the loop
    times its work from there, so waiting for input is not counted as work."""

    __slots__ = ("dead_lettered", "events", "next_offset", "policy_sets", "read_at", "records", "times")

    def __init__(
        self,
        events: list[Event],
        times: list[int],
        dead_lettered: int,
        next_offset: int,
        read_at: float = 0.0,
        records: Sequence[Record] = (),
        policy_sets: bool = True,
    ) -> None:
        self.events, self.times = events, times
        self.dead_lettered, self.next_offset = dead_lettered, next_offset
        self.read_at = read_at
        self.records = records
        """The record of each event (the same order): its principal, and its bytes to park."""
        self.policy_sets = policy_sets
        """Whether ``events`` may hold a ``PolicySet`` (``False``: the reader decoded none)."""

    def principals(self) -> list[str | None]:
        """Each event's principal: :func:`principals_of` its records."""
        return principals_of(self.records)


def principals_of(records: Sequence[Record]) -> list[str | None]:
    """Each record's principal (:data:`~fleetlog.log.base.PRINCIPAL_HEADER`), ``None`` where it
    names none: what ``fleetlog.core.authorize.fold_checked`` checks."""
    return [_principal(r) if r.headers else None for r in records]


def _principal(record: Record) -> str | None:
    raw = record.header(PRINCIPAL_HEADER)
    return None if raw is None else raw.decode("utf-8", "replace")


class UnauthorizedError(BadEventError):
    """A record whose principal the log's policy does not allow to make its event
    (``fleetlog.core.authorize``): parked, never folded."""

    reason = "unauthorized"


def dead_letter(record: Record, source: str, error: BadEventError) -> Message:
    """The dead-letter copy of ``record``: original bytes, key and headers plus the reason."""
    extra = (
        (REASON_HEADER, error.reason.encode()),
        (ERROR_HEADER, error.message[:2000].encode("utf-8", "replace")),
        (SOURCE_HEADER, f"{source}@{record.offset}".encode()),
    )
    return Message(value=record.value, key=record.key, headers=record.headers + extra)


def _warn_parked(bad: Sequence[Message], dead_letters: str) -> None:
    """One warning line per record parked: where it came from, why, and where it went."""
    for message in bad:
        found = dict(message.headers)  # (the dead-letter headers come last: they win)
        source, reason, error = (found.get(h, b"") for h in (SOURCE_HEADER, REASON_HEADER, ERROR_HEADER))
        key = f" key {message.key.decode('utf-8', 'replace')!r}" if message.key else ""
        LOG.warning("dead-lettered %s%s to the %s log (%s): %s", source.decode(), key, dead_letters,
                    reason.decode(), error[:300].decode("utf-8", "replace"))


class UnreadableRecordsError(BadEventError):
    """Bytes the log itself could not read (a Kafka batch that does not decompress or parse):
    the log hands back one record standing for them, which names the offsets it covers."""

    reason = "unreadable"


def _unreadable(note: bytes) -> UnreadableRecordsError:
    return UnreadableRecordsError(note.decode("utf-8", "replace"))


def _null_value() -> UndecodableError:
    return UndecodableError("a null value (a Kafka tombstone, the delete marker of compacted topics), "
                            "not an event: inputs are never deleted by key")


def _not_an_input(env: Envelope, accepts: tuple[type, ...]) -> InvalidEventError:
    name = type(env.event).__name__
    if accepts is not INPUT_TYPES and not isinstance(env.event, DecisionBatch):
        return InvalidEventError(f"{name} is not an input of this shard's log (it holds "
                                 f"{', '.join(t.__name__ for t in accepts)})")
    return InvalidEventError(f"{name} is a decision, not an input: only the scheduler writes decisions")


class EventConsumer:
    """Decodes the records of one log, parking bad ones in ``dead_letters``."""

    def __init__(self, store: LogStore, source: str = INPUTS, dead_letters: str = DEAD_LETTERS,
                 warn: bool = True, accepts: tuple[type, ...] = INPUT_TYPES) -> None:
        """``warn=False``: no warning line per parked record (``fleetlog demo``, which parks
        malformed records on purpose and counts them in its summary).  ``accepts``: the event
        types this log holds (a cell shard's inputs add ``JobDispatched``, the dispatcher's
        global partition ``JobReturned`` and ``CellSummary``); any other is dead-lettered."""
        self._store = store
        self._accepts = accepts
        self._warn = warn
        self._source = source
        self._dead_letters = dead_letters
        self._memo: dict[object, InputEvent] = {}
        self.saw_policy_set = True
        """Whether the last :meth:`decode_memoised` or :meth:`split` decoded a ``PolicySet``
        (what the fold's gate scans for otherwise; repeats from the memo are heartbeats)."""

    async def poll(
        self, offset: int, max_records: int = 10_000, timeout_ms: int = 0, park: bool = True
    ) -> Polled:
        """Read from ``offset``; return the good events and the offset to read next.

        ``park=False`` (recovery, replay) skips bad records without parking them again."""
        records = await self._store.log(self._source).read(offset, max_records, timeout_ms)
        events, bad = self.split(records)
        if bad and park:
            await self.park(bad)
        next_offset = records[-1].offset + 1 if records else offset
        return Polled(events, len(bad), next_offset)

    async def poll_inputs(
        self, offset: int, max_records: int = 10_000, timeout_ms: int = 0, park: bool = True,
        before: int | None = None,
    ) -> Inputs:
        """:meth:`poll` for the scheduling loop: the same events, as parallel lists.

        A fleet's steady heartbeats repeat byte for byte: a heartbeat's bytes are decoded once
        and a repeat is a dictionary lookup (handing the fold the very object it saw last time,
        which its steady-heartbeat path recognises by identity).

        ``before``: read nothing at or past this offset (recovery folding up to a batch's
        ``as_of``).  A count of records is not a span of offsets: on Kafka transaction markers
        take offsets too (a cell partition's inputs hold the dispatcher's transactions)."""
        records = await self._store.log(self._source).read(offset, max_records, timeout_ms)
        read_at = time.perf_counter()
        next_offset = records[-1].offset + 1 if records else offset
        if before is not None and records and next_offset > before:
            records, next_offset = [r for r in records if r.offset < before], before
        events = self.decode_memoised(records)
        if events is not None:
            return Inputs(events, list(map(_TIMESTAMP, records)), 0, next_offset, read_at, records,
                          self.saw_policy_set)
        good, bad = self.split(records)
        if bad and park:
            await self.park(bad)
        good_events, times = [d.envelope.event for d in good], [d.timestamp_ms for d in good]
        by_offset = {r.offset: r for r in records}
        kept = [by_offset[d.offset] for d in good]
        return Inputs(good_events, times, len(bad), next_offset, read_at, kept, self.saw_policy_set)

    async def park(self, bad: Sequence[Message]) -> None:
        """Append ``bad`` to the dead-letter log (and say so, one warning line each)."""
        await self._store.log(self._dead_letters).append(bad)
        if self._warn:
            _warn_parked(bad, self._dead_letters)

    def refused(self, records: Sequence[Record], refusals: Sequence[tuple[int, str, str]]) -> list[Message]:
        """The dead-letter copies of the records the fold's gate refused (``(index, message,
        rule)`` each, ``fleetlog.core.authorize.Refused``), with reason ``unauthorized``."""
        return [dead_letter(records[at], self._source, UnauthorizedError(f"{message}: {rule}"))
                for at, message, rule in refusals]

    def decode_memoised(self, records: Sequence[Record]) -> list[Event] | None:
        """The events of ``records``, a heartbeat's bytes (with its content type) decoded once
        and repeats looked up at C speed; ``None`` when some record needs :meth:`split` (bytes
        that do not decode to an input).  A log's stand-in for bytes it could not read never
        decodes (its value is a raw Kafka batch, which starts with an 8-byte offset, or empty)."""
        if any(map(_HEADERS, records)):
            keys: list[object] = [
                (r.header(CONTENT_TYPE_HEADER), r.value) if r.headers else r.value for r in records
            ]
        else:
            keys = list(map(_VALUE, records))
        found: list[Event | None] = list(map(self._memo.get, keys))  # repeats: no Python per record
        misses = list(compress(count(), map(is_, found, repeat(None)))) if None in found else []
        self.saw_policy_set = False
        if not misses:
            return found  # type: ignore[return-value]  # no None left
        wanted = [(records[i].value, records[i].header(CONTENT_TYPE_HEADER)) for i in misses]
        for i, result in zip(misses, decode_many(wanted), strict=True):
            if not isinstance(result, Envelope) or not isinstance(result.event, self._accepts):
                return None
            found[i] = event = result.event
            if type(event) is PolicySet:
                self.saw_policy_set = True
            elif isinstance(event, NodeHeartbeat):
                if len(self._memo) >= MEMO_LIMIT:
                    self._memo.clear()
                self._memo[keys[i]] = event
        return found  # type: ignore[return-value]

    def split(self, records: Sequence[Record]) -> tuple[list[Delivered], list[Message]]:
        """Decode ``records``: (good events, dead-letter messages for the bad ones)."""
        events: list[Delivered] = []
        bad: list[Message] = []
        decoded = decode_many(
            [(r.value, r.header(CONTENT_TYPE_HEADER) if r.headers else None) for r in records]
        )
        for record, result in zip(records, decoded, strict=True):
            env = (
                _not_an_input(result, self._accepts)
                if isinstance(result, Envelope) and not isinstance(result.event, self._accepts)
                else result
            )
            note = record.header(UNREADABLE_HEADER) if record.headers else None
            if note is not None:  # its value (a raw batch, or nothing) never decodes: say why
                env = _unreadable(note)
            elif record.headers and record.header(NULL_VALUE_HEADER) is not None:
                env = _null_value()
            if isinstance(env, BadEventError):
                bad.append(dead_letter(record, self._source, env))
            else:
                events.append(Delivered(record.offset, record.timestamp_ms, env))
        self.saw_policy_set = any(type(d.envelope.event) is PolicySet for d in events)
        return events, bad


class Parked(msgspec.Struct, frozen=True):
    """A dead-lettered record that names a job: why it was refused and where it is."""

    offset: int
    """Its offset in the dead-letter log."""
    source: str
    """Where it was read: ``inputs@OFFSET``."""
    reason: str
    error: str


async def parked_for_job(store: LogStore, job_id: str, dead_letters: str = DEAD_LETTERS) -> Parked | None:
    """The newest dead-lettered record about ``job_id`` (its key ``submit/JOB``/``cancel/JOB``, or
    an ``event.job_id`` in bytes that still parse as JSON or msgpack), ``None`` if there is none."""
    found, needle = None, job_id.encode()
    async for records in chunks(store.log(dead_letters)):
        for record in records:
            mentioned = needle in record.value or needle in (record.key or b"")
            if mentioned and (record.key in (b"submit/" + needle, b"cancel/" + needle)
                              or _names_job(record, job_id)):
                found = record
    if found is None:
        return None
    return Parked(found.offset, *why_parked(found))


def why_parked(record: Record) -> tuple[str, str, str]:
    """A dead letter's source (``inputs@OFFSET``), reason code and error, as text."""
    source, reason, error = ((record.header(h) or b"").decode("utf-8", "replace")
                             for h in (SOURCE_HEADER, REASON_HEADER, ERROR_HEADER))
    return source, reason, error


def _names_job(record: Record, job_id: str) -> bool:
    """Whether the bytes, parsed without a schema, are an envelope whose event (or whose key)
    names ``job_id``."""
    doc: object = None
    for parse in (msgspec.json.decode, msgspec.msgpack.decode):
        try:
            doc = parse(record.value)
            break
        except (msgspec.DecodeError, RecursionError, ValueError):
            continue
    if not isinstance(doc, dict):
        return False
    event = doc.get("event")
    return doc.get("key") in (f"submit/{job_id}", f"cancel/{job_id}") or (
        isinstance(event, dict) and event.get("job_id") == job_id)


class CorruptDecisionsError(RuntimeError):
    """The decisions log holds something this build cannot read: recovery stops and says where."""

    def __init__(self, message: str, offset: int | None = None) -> None:
        super().__init__(message)
        self.offset = offset
        """The decisions record that cannot be read, when one is to blame."""


def decision_batches(records: list[Record]) -> Iterator[tuple[int, DecisionBatch]]:
    """Decode the decision batches of ``records`` (the scheduler wrote them: bad bytes are fatal)."""
    for record in records:
        try:
            if record.headers and record.header(NULL_VALUE_HEADER) is not None:
                raise _null_value()
            env = decode(record.value, record.header(CONTENT_TYPE_HEADER))
        except (BadEventError, RecursionError) as exc:  # any decode failure names the record
            raise CorruptDecisionsError(
                f"decisions@{record.offset} ({len(record.value)} bytes) cannot be read: "
                f"{type(exc).__name__}: {str(exc)[:500]}", record.offset
            ) from exc
        if not isinstance(env.event, DecisionBatch):
            raise CorruptDecisionsError(
                f"decisions@{record.offset} holds {type(env.event).__name__}", record.offset
            )
        yield record.offset, env.event
