"""An in-memory log store, for tests and for the simulator's fastest mode."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence

from fleetlog.log.base import (
    LOG_NAMES,
    Clock,
    Log,
    LogClosedError,
    LogStore,
    Message,
    OffsetOutOfRangeError,
    Record,
    Shard,
    Target,
    pick_log,
    within_bytes,
)
from fleetlog.waiting import event_or_timeout


def wall_clock_ms() -> int:
    """Milliseconds since the epoch from the host clock (the default append clock)."""
    return time.time_ns() // 1_000_000


class MemoryLog(Log):
    """A list of records guarded by a condition so readers can wait for appends."""

    def __init__(self, name: str, clock: Clock) -> None:
        self.name = name
        self._clock = clock
        self._records: list[Record] = []
        self._grew = asyncio.Event()

    def append_now(self, messages: Sequence[Message]) -> int:
        first = len(self._records)
        now = self._clock()
        for i, m in enumerate(messages):
            self._records.append(Record(first + i, now, m.value, m.key, m.headers))
        if messages:
            self._grew.set()
            self._grew = asyncio.Event()
        return first

    async def append(self, messages: Sequence[Message]) -> int:
        return self.append_now(messages)

    async def read(self, offset: int, max_records: int = 10_000, timeout_ms: int = 0,
                   max_bytes: int | None = None) -> list[Record]:
        if offset < 0:
            raise OffsetOutOfRangeError(f"{self.name}: offset {offset} is before the start of the log")
        waits = offset >= len(self._records) and timeout_ms > 0
        if waits and not await event_or_timeout(self._grew, timeout_ms / 1000):
            return []
        return within_bytes(self._records[offset : offset + max_records], max_bytes)

    async def end_offset(self) -> int:
        return len(self._records)


class MemoryLogStore(LogStore):
    """Logs kept in lists; committed offsets kept in a dict.  The stores of the shards of one
    fleet share a registry (:meth:`for_shard`), so a cross-shard append finds its targets."""

    def __init__(
        self, clock: Clock = wall_clock_ms, shard: Shard = Shard.SINGLE,
        peers: dict[Shard, MemoryLogStore] | None = None,
    ) -> None:
        self.shard = shard
        self._clock = clock
        self._logs = {name: MemoryLog(name, clock) for name in LOG_NAMES}
        self._committed: dict[str, int] = {}
        self._open = False
        self._peers = {} if peers is None else peers
        self._peers.setdefault(shard, self)

    def for_shard(self, shard: Shard) -> MemoryLogStore:
        """The store of ``shard`` in this fleet (the same one each time; open it before use)."""
        found = self._peers.get(shard)
        return found if found is not None else MemoryLogStore(self._clock, shard, self._peers)

    async def open(self) -> None:
        self._open = True

    async def close(self) -> None:
        self._open = False

    def log(self, name: str) -> MemoryLog:
        if not self._open:
            raise LogClosedError("memory log store is not open")
        return pick_log(self._logs, name)

    async def append_transactional(
        self, name: str, messages: Sequence[Message], *, group: str, consumed: int
    ) -> int:
        first = self.log(name).append_now(messages)
        self._committed[group] = consumed
        return first

    async def committed_offset(self, group: str) -> int | None:
        return self._committed.get(group)

    async def append_transactional_many(
        self, appends: Mapping[Target, Sequence[Message]], *, group: str, consumed: int
    ) -> dict[Target, int]:
        logs = {target: self.for_shard(target[0]).log(target[1]) for target in appends}  # all or none
        firsts = {target: logs[target].append_now(messages) for target, messages in appends.items()}
        self._committed[group] = consumed
        return firsts
