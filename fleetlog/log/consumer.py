"""Read events from a log; park what cannot be decoded in the dead-letter log and go on.

A bad record is never dropped silently and never stops the reader: it is copied,
bytes, key and headers untouched, to the dead-letter log with headers naming the
reason code, the error message and where it came from.
"""

from __future__ import annotations

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
from fleetlog.events.model import INPUT_TYPES, DecisionBatch, Envelope, Event, InputEvent, NodeHeartbeat
from fleetlog.log.base import (
    DEAD_LETTERS,
    INPUTS,
    NULL_VALUE_HEADER,
    UNREADABLE_HEADER,
    LogStore,
    Message,
    Record,
)

REASON_HEADER: Final = "fleetlog-dead-letter-reason"
ERROR_HEADER: Final = "fleetlog-dead-letter-error"
SOURCE_HEADER: Final = "fleetlog-dead-letter-source"
MEMO_LIMIT: Final = 1 << 16
"""The most distinct heartbeat values :class:`EventConsumer` keeps decoded (then it starts over)."""

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
    (``fold_lists``)."""

    __slots__ = ("dead_lettered", "events", "next_offset", "times")

    def __init__(self, events: list[Event], times: list[int], dead_lettered: int, next_offset: int) -> None:
        self.events, self.times = events, times
        self.dead_lettered, self.next_offset = dead_lettered, next_offset


def dead_letter(record: Record, source: str, error: BadEventError) -> Message:
    """The dead-letter copy of ``record``: original bytes, key and headers plus the reason."""
    extra = (
        (REASON_HEADER, error.reason.encode()),
        (ERROR_HEADER, error.message[:2000].encode("utf-8", "replace")),
        (SOURCE_HEADER, f"{source}@{record.offset}".encode()),
    )
    return Message(value=record.value, key=record.key, headers=record.headers + extra)


class UnreadableRecordsError(BadEventError):
    """Bytes the log itself could not read (a Kafka batch that does not decompress or parse):
    the log hands back one record standing for them, which names the offsets it covers."""

    reason = "unreadable"


def _unreadable(note: bytes) -> UnreadableRecordsError:
    return UnreadableRecordsError(note.decode("utf-8", "replace"))


def _null_value() -> UndecodableError:
    return UndecodableError("a null value (a Kafka tombstone, the delete marker of compacted topics), "
                            "not an event: inputs are never deleted by key")


def _not_an_input(env: Envelope) -> InvalidEventError:
    name = type(env.event).__name__
    return InvalidEventError(f"{name} is a decision, not an input: only the scheduler writes decisions")


class EventConsumer:
    """Decodes the records of one log, parking bad ones in ``dead_letters``."""

    def __init__(self, store: LogStore, source: str = INPUTS, dead_letters: str = DEAD_LETTERS) -> None:
        self._store = store
        self._source = source
        self._dead_letters = dead_letters
        self._memo: dict[object, InputEvent] = {}

    async def poll(
        self, offset: int, max_records: int = 10_000, timeout_ms: int = 0, park: bool = True
    ) -> Polled:
        """Read from ``offset``; return the good events and the offset to read next.

        ``park=False`` (recovery, replay) skips bad records without parking them again."""
        records = await self._store.log(self._source).read(offset, max_records, timeout_ms)
        events, bad = self.split(records)
        if bad and park:
            await self._store.log(self._dead_letters).append(bad)
        next_offset = records[-1].offset + 1 if records else offset
        return Polled(events, len(bad), next_offset)

    async def poll_inputs(
        self, offset: int, max_records: int = 10_000, timeout_ms: int = 0, park: bool = True
    ) -> Inputs:
        """:meth:`poll` for the scheduling loop: the same events, as parallel lists.

        A fleet's steady heartbeats repeat byte for byte: a heartbeat's bytes are decoded once
        and a repeat is a dictionary lookup (handing the fold the very object it saw last time,
        which its steady-heartbeat path recognises by identity)."""
        records = await self._store.log(self._source).read(offset, max_records, timeout_ms)
        next_offset = records[-1].offset + 1 if records else offset
        events = self.decode_memoised(records)
        if events is not None:
            return Inputs(events, list(map(_TIMESTAMP, records)), 0, next_offset)
        good, bad = self.split(records)
        if bad and park:
            await self._store.log(self._dead_letters).append(bad)
        return Inputs([d.envelope.event for d in good], [d.timestamp_ms for d in good], len(bad), next_offset)

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
        found = list(map(self._memo.get, keys))  # repeats: no Python per record
        misses = list(compress(count(), map(is_, found, repeat(None)))) if None in found else []
        if not misses:
            return found  # type: ignore[return-value]  # no None left
        wanted = [(records[i].value, records[i].header(CONTENT_TYPE_HEADER)) for i in misses]
        for i, result in zip(misses, decode_many(wanted), strict=True):
            if not isinstance(result, Envelope) or not isinstance(result.event, INPUT_TYPES):
                return None
            found[i] = event = result.event
            if type(event) is NodeHeartbeat:
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
                _not_an_input(result)
                if isinstance(result, Envelope) and not isinstance(result.event, INPUT_TYPES)
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
        return events, bad


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
