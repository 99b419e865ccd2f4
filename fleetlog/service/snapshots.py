"""Snapshots: where they are kept, how the service recovers from them (the newest that restores
and lines up with the logs, then the tail), the check that the logs reach what they cover,
and taking them while it leads (in the background: a step never waits for a save, and the loop
only for the state's copy, not for its encoding or its write)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import structlog

from fleetlog.core.digest import SnapshotError, encode_parts, restore, snapshot_parts
from fleetlog.core.state import State
from fleetlog.log.base import DECISIONS, INPUTS, LogError, LogStore, OffsetOutOfRangeError
from fleetlog.log.consumer import decision_batches
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
from fleetlog.service.loop import LogBehindError, SchedulerLoop, SnapshotMismatchError, check_ahead
from fleetlog.service.metrics import Metrics

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


def encoded(parts: dict[str, Any], header: SnapshotHeader) -> bytes:
    """The snapshot file's bytes of :func:`~fleetlog.core.digest.snapshot_parts` (for a thread)."""
    return encode_snapshot(Snapshot(header, encode_parts(parts)))


class Snapshotter:
    """Takes the leader's snapshots: every ``snapshot_every_events`` inputs or, with something new,
    every ``snapshot_every_s`` seconds; one save at a time, in a task of its own."""

    def __init__(self, store: SnapshotStore, settings: ServiceSettings, policy: str,
                 metrics: Metrics) -> None:
        self.store, self.settings, self.policy, self.metrics = store, settings, policy, metrics
        self._task: asyncio.Task[None] | None = None
        self._last = (0, time.monotonic(), time.time())  # (inputs offset, monotonic, wall)

    def restarted(self, used: SnapshotHeader | None) -> None:
        """Count from the snapshot recovery used (or from nothing, now)."""
        self._last = (used.inputs_offset if used else 0, time.monotonic(),
                      used.taken_ms / 1000 if used else time.time())

    @property
    def taken_at(self) -> float:
        """Wall-clock time of the newest snapshot (the one recovered from, or taken)."""
        return self._last[2]

    def maybe(self, loop: SchedulerLoop, now: float, force: bool = False) -> None:
        offset, at, _ = self._last
        due = (loop.offset - offset >= self.settings.snapshot_every_events
               or (now - at >= self.settings.snapshot_every_s and loop.offset > offset))
        busy = self._task is not None and not self._task.done()
        if (not due and not (force and loop.offset > offset)) or busy:
            return
        header = SnapshotHeader(loop.offset, loop.decisions_next, self.policy, int(time.time() * 1000))
        parts = snapshot_parts(loop.state)  # (between steps: what the state is now, copied)
        self._last = (loop.offset, now, time.time())
        self._task = asyncio.create_task(self._save(parts, header))

    async def _save(self, parts: dict[str, Any], header: SnapshotHeader) -> None:
        """Encode the snapshot in a thread (its costly part, the jobs' labels and annotations,
        in short calls: the loop steps and answers meanwhile), then store it."""
        data = await asyncio.to_thread(encoded, parts, header)
        try:
            where = await self.store.save(data)
        except (LogError, OSError) as exc:
            log.warning("snapshot_failed", error=str(exc), inputs_offset=header.inputs_offset)
            return
        self.metrics.snapshots.inc()
        log.info("snapshot_written", where=where, inputs_offset=header.inputs_offset, bytes=len(data))

    async def finish(self) -> None:
        """Wait for the save in flight, if any."""
        task = self._task
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await task
