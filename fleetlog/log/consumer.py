"""Read events from a log; park what cannot be decoded in the dead-letter log and go on.

A bad record is never dropped silently and never stops the reader: it is copied,
bytes, key and headers untouched, to the dead-letter log with headers naming the
reason code, the error message and where it came from.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Final

import msgspec

from fleetlog.events.codec import CONTENT_TYPE_HEADER, BadEventError, InvalidEventError, decode, decode_many
from fleetlog.events.model import INPUT_TYPES, DecisionBatch, Envelope
from fleetlog.log.base import DEAD_LETTERS, INPUTS, LogStore, Message, Record

REASON_HEADER: Final = "fleetlog-dead-letter-reason"
ERROR_HEADER: Final = "fleetlog-dead-letter-error"
SOURCE_HEADER: Final = "fleetlog-dead-letter-source"


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


def dead_letter(record: Record, source: str, error: BadEventError) -> Message:
    """The dead-letter copy of ``record``: original bytes, key and headers plus the reason."""
    extra = (
        (REASON_HEADER, error.reason.encode()),
        (ERROR_HEADER, error.message[:2000].encode("utf-8", "replace")),
        (SOURCE_HEADER, f"{source}@{record.offset}".encode()),
    )
    return Message(value=record.value, key=record.key, headers=record.headers + extra)


def _not_an_input(env: Envelope) -> InvalidEventError:
    name = type(env.event).__name__
    return InvalidEventError(f"{name} is a decision, not an input: only the scheduler writes decisions")


class EventConsumer:
    """Decodes the records of one log, parking bad ones in ``dead_letters``."""

    def __init__(self, store: LogStore, source: str = INPUTS, dead_letters: str = DEAD_LETTERS) -> None:
        self._store = store
        self._source = source
        self._dead_letters = dead_letters

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
            if isinstance(env, BadEventError):
                bad.append(dead_letter(record, self._source, env))
            else:
                events.append(Delivered(record.offset, record.timestamp_ms, env))
        return events, bad


class CorruptDecisionsError(RuntimeError):
    """The decisions log holds something this build cannot read: recovery stops and says where."""


def decision_batches(records: list[Record]) -> Iterator[tuple[int, DecisionBatch]]:
    """Decode the decision batches of ``records`` (the scheduler wrote them: bad bytes are fatal)."""
    for record in records:
        env = decode(record.value, record.header(CONTENT_TYPE_HEADER))
        if not isinstance(env.event, DecisionBatch):
            raise CorruptDecisionsError(f"decisions@{record.offset} holds {type(env.event).__name__}")
        yield record.offset, env.event
