"""The one interface every event log implements.

A *log store* holds a few named logs (Kafka topics, one partition each per shard):
``inputs``, ``decisions`` and ``dead-letters``.  Each log is a totally ordered
sequence of :class:`Record` values addressed by a dense offset starting at 0.
Records carry opaque bytes: encoding and decoding events is the job of
:mod:`fleetlog.events.codec`, so the log layer never depends on the vocabulary.

Event time is the log's own append time (``timestamp_ms``): Kafka's
``LogAppendTime`` or, for the file and memory logs, an injected clock — never the
wall clock of the process that later reads the record.

Decisions are appended with :meth:`LogStore.append_transactional`: the batch and
the input offset it consumed become visible together or not at all.  After a
crash :meth:`LogStore.committed_offset` says where to resume.

A store belongs to one :class:`Shard`: today's single shard, the dispatcher's global partition
or one cell partition.  The dispatcher writes into other shards' logs with
:meth:`LogStore.append_transactional_many` (all or nothing across partitions).
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import ClassVar, Final, Literal, TypeVar

import msgspec

INPUTS: Final = "inputs"
DECISIONS: Final = "decisions"
DEAD_LETTERS: Final = "dead-letters"
LOG_NAMES: Final = (INPUTS, DECISIONS, DEAD_LETTERS)
UNREADABLE_HEADER: Final = "fleetlog-unreadable"
"""Marks a record a log made up for bytes it could not read (a Kafka batch that does not
decompress or parse): its value holds those raw bytes when small, the header says which offsets
it stands for and why.  Readers park it in the dead-letter log; nothing folds it."""
NULL_VALUE_HEADER: Final = "fleetlog-null-value"
"""Marks a Kafka record whose value is null (a tombstone, the delete marker of compacted
topics): :class:`Record` holds ``b""`` for it, and this header says it was null, not empty."""

PRINCIPAL_HEADER: Final = "fleetlog-principal"
"""Who appended a record through the authenticated API (fleetlog.service.auth): set by the
service, never taken from the producer; the audit trail (``fleetlog history --audit``)."""

Headers = tuple[tuple[str, bytes], ...]
L = TypeVar("L", bound="Log")
Clock = Callable[[], int]
"""A clock returns milliseconds since the epoch; injected so simulation can use virtual time."""


ShardKind = Literal["single", "global", "cell"]


class Shard(msgspec.Struct, frozen=True):
    """Which partition a store reads and writes: today's single shard, the dispatcher's global
    partition, or cell partition ``partition`` (docs/logs.md, "Shards")."""

    kind: ShardKind = "single"
    partition: int = 0

    SINGLE: ClassVar[Shard]
    GLOBAL: ClassVar[Shard]

    def __post_init__(self) -> None:
        if self.kind not in ("single", "global", "cell"):
            raise ValueError(f"shard kind {self.kind!r}: expected single, global or cell")
        if self.partition < 0 or (self.kind != "cell" and self.partition != 0):
            raise ValueError(f"shard {self.kind} partition {self.partition}: expected 0 (>= 0 for a cell)")

    @classmethod
    def cell(cls, partition: int) -> Shard:
        return cls("cell", partition)

    @property
    def dirname(self) -> str:
        """The file log's sub-directory of this shard (``""``: the log directory itself)."""
        return {"single": "", "global": "global"}.get(self.kind, f"cells-{self.partition}")

    def __str__(self) -> str:
        return self.dirname or "single"


Shard.SINGLE = Shard()
Shard.GLOBAL = Shard("global")

Target = tuple[Shard, str]
"""A log of some shard: the address of one batch of :meth:`LogStore.append_transactional_many`."""


class Message(msgspec.Struct, frozen=True, gc=False):
    """What a producer appends: the log assigns offset and timestamp."""

    value: bytes
    key: bytes | None = None
    headers: Headers = ()


class Record(msgspec.Struct, frozen=True, gc=False):
    """A message as stored: with its offset and the log's append time."""

    offset: int
    timestamp_ms: int
    value: bytes
    key: bytes | None = None
    headers: Headers = ()

    def header(self, name: str) -> bytes | None:
        """The last value of header ``name``, or ``None``."""
        found = None
        for key, value in self.headers:
            if key == name:
                found = value
        return found


class LogError(Exception):
    """Base class of every error raised by a log implementation."""


class LogClosedError(LogError):
    """The log store was used after :meth:`LogStore.close`."""


class OffsetOutOfRangeError(LogError):
    """A read asked for an offset before the start of the log."""


def record_bytes(record: Record) -> int:
    """What a record weighs in a byte-bounded read: its value, key and headers (what a reader
    holds of it, whatever the log's framing or compression)."""
    size = len(record.value) + (len(record.key) if record.key is not None else 0)
    return size + sum(len(name) + len(value) for name, value in record.headers)


def within_bytes(records: list[Record], max_bytes: int | None, used: int = 0) -> list[Record]:
    """The longest prefix of ``records`` that keeps ``used`` plus their bytes within
    ``max_bytes`` (``None``: all of them); when ``used`` is 0 the first record is kept however
    large, so a record larger than any bound is read alone rather than never."""
    if max_bytes is None:
        return records
    for i, record in enumerate(records):
        used += record_bytes(record)
        if used > max_bytes and (i > 0 or used > record_bytes(record)):
            return records[:i]
    return records


def pick_log(logs: Mapping[str, L], name: str) -> L:
    """``logs[name]``, or a :class:`LogError` naming the logs there are."""
    try:
        return logs[name]
    except KeyError:
        raise LogError(f"unknown log {name!r}; expected one of {', '.join(LOG_NAMES)}") from None


class Log(abc.ABC):
    """One totally ordered stream of records (a Kafka topic-partition)."""

    name: str

    @abc.abstractmethod
    async def append(self, messages: Sequence[Message]) -> int:
        """Append ``messages`` in order; return the offset given to the first one.

        An empty batch appends nothing and returns the current end offset.
        """

    @abc.abstractmethod
    async def read(self, offset: int, max_records: int = 10_000, timeout_ms: int = 0,
                   max_bytes: int | None = None) -> list[Record]:
        """Read up to ``max_records`` committed records starting at ``offset``, and, given
        ``max_bytes``, no more than that many bytes of them (:func:`record_bytes`; the first record
        comes alone however large, so a reader always moves on).

        Returns an empty list when ``offset`` is the end of the log and nothing
        arrives within ``timeout_ms``.  Records of aborted or unfinished
        transactions are never returned.
        """

    @abc.abstractmethod
    async def end_offset(self) -> int:
        """The offset the next appended record will get (committed records only)."""

    async def start_offset(self) -> int:
        """The first offset the log still holds: 0 unless older records were deleted (Kafka
        retention, ``fleetlog log prune``); reading before it raises :class:`OffsetOutOfRangeError`."""
        return 0


class LogStore(abc.ABC):
    """A set of named logs plus transactional decision commits."""

    @abc.abstractmethod
    async def open(self) -> None:
        """Connect / recover; must be called before any other method."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Flush and release every resource. Idempotent."""

    @abc.abstractmethod
    def log(self, name: str) -> Log:
        """The log called ``name`` (one of :data:`LOG_NAMES`)."""

    @abc.abstractmethod
    async def append_transactional(
        self, name: str, messages: Sequence[Message], *, group: str, consumed: int
    ) -> int:
        """Atomically append ``messages`` to log ``name`` and record that consumer
        ``group`` has consumed the inputs log up to (excluding) offset ``consumed``.

        Either both become visible or neither does.  Returns the first offset.
        """

    @abc.abstractmethod
    async def committed_offset(self, group: str) -> int | None:
        """The inputs offset last committed by ``group`` with
        :meth:`append_transactional`, or ``None`` if it never committed."""

    shard: Shard = Shard.SINGLE

    async def append_transactional_many(
        self, appends: Mapping[Target, Sequence[Message]], *, group: str, consumed: int
    ) -> dict[Target, int]:
        """Atomically append each batch to its ``(shard, log)`` — this store's shard or another's
        — and record that ``group`` consumed this shard's inputs up to ``consumed``: everything
        becomes visible or nothing does (a crash in between is finished by :meth:`recover`).

        Returns the first offset per target (``-1`` where a store cannot know it at return)."""
        raise LogError(f"{type(self).__name__} cannot append across shards")

    async def recover(self) -> None:
        """Finish a cross-shard append a crash interrupted (the file log's outbox); a no-op
        where a transaction is atomic by itself."""
        return None

    async def __aenter__(self) -> LogStore:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def chunks(log: Log, start: int = 0, max_records: int = 10_000) -> AsyncIterator[list[Record]]:
    """The records of ``log`` from ``start`` to its end as it is when the scan starts, a read at a
    time (for a scan of a whole log: the direct submit's duplicate check, a job's dead letters)."""
    end = await log.end_offset()
    while start < end:
        records = await log.read(start, max_records)
        if not records:
            return
        yield records
        start = records[-1].offset + 1
