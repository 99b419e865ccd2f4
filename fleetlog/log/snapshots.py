"""Snapshots: the state plus the log positions it covers, so a restart folds only the tail.

This module stores and frames the bytes; the state inside is :func:`fleetlog.core.digest.snapshot`
output, which the service (and replay) restore with :func:`fleetlog.core.digest.restore`.

A snapshot is taken right after a step: the state has folded every input before
``inputs_offset`` and every decision batch before ``decisions_offset``.  Restart =
the newest snapshot that decodes, restores (its digest checks its contents) and lines up
with the decisions log, then the fold of the tail; a corrupt snapshot is reported and the
previous one is tried; with none, recovery folds the logs from the start.

Bytes on disk or in Kafka::

    b"FLSNAP1\\n" | u32 header length | msgpack header | state bytes | u32 CRC32C of all before

Two stores: a directory (embedded mode; written to a temporary file, fsynced and renamed,
the newest :data:`KEEP` kept) and a compacted Kafka topic ``<prefix>.snapshots`` (one
partition per shard, records keyed ``slot0``/``slot1`` in turn, so compaction always keeps
the two newest).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Final

import crc32c
import msgspec
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from fleetlog.log.base import LogError
from fleetlog.log.kafka import KafkaConfig, ensure_topic
from fleetlog.log.private import private_dir, write_private

MAGIC: Final = b"FLSNAP1\n"
KEEP: Final = 3
MAX_SNAPSHOT_BYTES: Final = 96 * 1024 * 1024
"""Under the broker's default socket.request.max.bytes (100 MB)."""
_U32: Final = struct.Struct(">I")


class SnapshotHeader(msgspec.Struct, frozen=True):
    inputs_offset: int
    """Every input before this offset is folded."""
    decisions_offset: int
    """Every decision batch before this offset is folded."""
    policy: str
    taken_ms: int
    """Wall-clock time it was taken (for the snapshot-age metric only; never folded)."""


class Snapshot(msgspec.Struct, frozen=True):
    header: SnapshotHeader
    state: bytes


class CorruptSnapshotError(LogError):
    """A snapshot's bytes are damaged or not a snapshot at all."""


def encode_snapshot(snap: Snapshot) -> bytes:
    """The file's bytes: magic, header, state, CRC32C (the state copied once: it can be
    hundreds of MB, and each copy holds the interpreter while it runs)."""
    header = msgspec.msgpack.encode(snap.header)
    head = MAGIC + _U32.pack(len(header)) + header
    crc = crc32c.crc32c(snap.state, crc32c.crc32c(head))
    return b"".join((head, snap.state, _U32.pack(crc)))


def decode_snapshot(data: bytes) -> Snapshot:
    """The snapshot in ``data``; :class:`CorruptSnapshotError` says what is wrong."""
    header, start = _checked(data)
    return Snapshot(header, data[start:-4])


def snapshot_header(data: bytes) -> SnapshotHeader:
    """:func:`decode_snapshot`'s header, its checks made, without copying the state out."""
    return _checked(data)[0]


def _checked(data: bytes) -> tuple[SnapshotHeader, int]:
    """The header of the snapshot in ``data`` and where its state starts, once its magic, length
    and checksum are checked."""
    if not data.startswith(MAGIC):
        raise CorruptSnapshotError("does not start with the snapshot magic")
    if len(data) < len(MAGIC) + 8:
        raise CorruptSnapshotError(f"truncated ({len(data)} bytes)")
    (crc,) = _U32.unpack_from(data, len(data) - 4)
    if crc32c.crc32c(memoryview(data)[:-4]) != crc:  # (a view: no copy of the whole)
        raise CorruptSnapshotError("checksum mismatch (torn or damaged)")
    (size,) = _U32.unpack_from(data, len(MAGIC))
    start = len(MAGIC) + 4
    try:
        header = msgspec.msgpack.decode(data[start : start + size], type=SnapshotHeader)
    except (msgspec.DecodeError, RecursionError) as exc:  # a forged header may nest deeply
        raise CorruptSnapshotError(f"bad header: {exc!r}") from None
    return header, start + size


class SnapshotStore(abc.ABC):
    """Where snapshots are kept; :meth:`candidates` lists them newest first."""

    @abc.abstractmethod
    async def save(self, data: bytes) -> str:
        """Store one encoded snapshot durably; return where it went."""

    @abc.abstractmethod
    async def candidates(self) -> list[tuple[str, Callable[[], bytes]]]:
        """(name, loader) pairs, newest first; a loader may raise :class:`LogError`."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources."""


class DirectorySnapshots(SnapshotStore):
    """Snapshots as files in a directory, written atomically."""

    def __init__(self, directory: Path, keep: int = KEEP) -> None:
        self.directory, self.keep = directory, keep

    def _path(self, inputs_offset: int) -> Path:
        return self.directory / f"snapshot-{inputs_offset:020d}.bin"

    async def save(self, data: bytes) -> str:
        """Check, write and sync in a thread: a snapshot can be hundreds of MB, and the loop
        that saves it answers health and folds meanwhile."""
        return await asyncio.to_thread(self._save, data)

    def _save(self, data: bytes) -> str:
        header = snapshot_header(data)
        private_dir(self.directory)
        path = self._path(header.inputs_offset)
        write_private(path, data, sync=True)  # 0600: a snapshot others could write could be forged
        _fsync_dir(self.directory)
        for old in self._files()[self.keep :]:
            old.unlink(missing_ok=True)
        return str(path)

    def _files(self) -> list[Path]:
        if not self.directory.is_dir():
            return []
        return sorted(self.directory.glob("snapshot-*.bin"), reverse=True)

    async def candidates(self) -> list[tuple[str, Callable[[], bytes]]]:
        return [(str(p), p.read_bytes) for p in self._files()]


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class KafkaSnapshots(SnapshotStore):
    """Snapshots in the compacted topic ``<prefix>.snapshots``, partition = shard."""

    TOPIC_CONFIG: Final = {
        "cleanup.policy": "compact",
        "max.message.bytes": str(MAX_SNAPSHOT_BYTES),
        "segment.bytes": str(MAX_SNAPSHOT_BYTES),
        "min.cleanable.dirty.ratio": "0.1",
    }

    def __init__(self, config: KafkaConfig) -> None:
        self.config = config
        self.tp = TopicPartition(config.topic("snapshots"), config.shard)
        self._producer: AIOKafkaProducer | None = None
        self._slot = 0
        self._ready = False

    async def _ensure_topic(self) -> None:
        if not self._ready:
            await ensure_topic(self.config, self.tp.topic, self.config.shards, dict(self.TOPIC_CONFIG))
            self._ready = True

    async def save(self, data: bytes) -> str:
        await self._ensure_topic()
        if self._producer is None:
            producer = AIOKafkaProducer(
                **self.config.client_options(), acks="all", enable_idempotence=True,
                max_request_size=MAX_SNAPSHOT_BYTES, max_batch_size=1 << 20,
            )
            try:
                await producer.start()
            except KafkaError as exc:
                raise LogError(f"start the snapshot producer: {exc!r}") from exc
            self._producer = producer
        key = f"slot{self._slot}".encode()
        self._slot ^= 1
        try:
            meta = await self._producer.send_and_wait(
                self.tp.topic, data, key=key, partition=self.tp.partition
            )
        except KafkaError as exc:
            raise LogError(f"write a snapshot to {self.tp.topic}: {exc!r}") from exc
        return f"{self.tp.topic}[{self.tp.partition}]@{meta.offset}"

    async def candidates(self) -> list[tuple[str, Callable[[], bytes]]]:
        await self._ensure_topic()
        consumer = AIOKafkaConsumer(
            **self.config.client_options(), group_id=None, enable_auto_commit=False,
            auto_offset_reset="earliest", fetch_max_bytes=MAX_SNAPSHOT_BYTES,
            max_partition_fetch_bytes=MAX_SNAPSHOT_BYTES,
        )
        try:
            await consumer.start()
            consumer.assign([self.tp])
            end = int((await consumer.end_offsets([self.tp]))[self.tp])
            start = int((await consumer.beginning_offsets([self.tp]))[self.tp])
            found = await self._read_tail(consumer, max(start, end - 2 * KEEP), end)
        except KafkaError as exc:
            raise LogError(f"read snapshots from {self.tp.topic}: {exc!r}") from exc
        finally:
            with contextlib.suppress(KafkaError):
                await consumer.stop()
        return [(f"{self.tp.topic}[{self.tp.partition}]@{o}", _const(v)) for o, v in reversed(found)]

    async def _read_tail(self, consumer: AIOKafkaConsumer, start: int, end: int) -> list[tuple[int, bytes]]:
        consumer.seek(self.tp, start)
        found: list[tuple[int, bytes]] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.request_timeout_ms / 1000
        while (not found or found[-1][0] < end - 1) and loop.time() < deadline:
            batch = await consumer.getmany(self.tp, timeout_ms=500)
            found.extend((r.offset, r.value) for r in batch.get(self.tp, []) if r.value is not None)
            if not batch and int(await consumer.position(self.tp)) >= end:
                break
        return found

    async def close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            with contextlib.suppress(KafkaError):
                await producer.stop()


def _const(value: bytes) -> Callable[[], bytes]:
    return lambda: value
