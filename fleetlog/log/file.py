"""The embedded default event log: segment files of CRC32C-checked batch frames.

Layout on disk::

    <directory>/LOCK                                   single-writer lock (holds the writer's PID)
    <directory>/<log>/00000000000000000000.log         segment, named by its base offset
    <directory>/<log>/00000000000000000000.index       sparse index of a *sealed* segment (a cache)

Each :meth:`FileLog.append` writes ONE frame holding the whole batch (like a Kafka
record batch).  A frame is a 40-byte little-endian header followed by the payload::

    byte  0  magic         4s   b"FLOG"
          4  version       u8   1
          5  flags         u8   0 (reserved)
          6  reserved      u16  0
          8  length        u32  payload length in bytes (records section + txn section)
         12  crc           u32  CRC32C of bytes 16 .. end of payload (header tail and payload)
         16  base_offset   u64  offset of the first record
         24  timestamp_ms  i64  append time of every record of the batch (injected clock)
         32  count         u32  number of records (0 for an empty transactional commit)
         36  txn_length    u32  length of the txn section at the end of the payload (0: none)
         40  payload:      records section = msgpack [values, keys | nil, headers | nil]
                           (columns: a list of value bytes, a list of keys or nil when no
                           record has a key, a list of header tuples or nil when none has
                           headers), then the txn section = msgpack [group, consumed, seq].

Columns decode in one msgspec call and become :class:`Record` values through ``map``
without a Python-level loop per record, which keeps sequential reads well above a
million records per second.

Transactions: :meth:`FileLogStore.append_transactional` writes one frame whose txn
section carries the consumer group, the consumed inputs offset and a store-wide
sequence number.  That frame *is* the commit record: it is valid (CRC) or it is
truncated away, and the commit with it.  Committed offsets are rebuilt on open from
the txn sections of every frame (the index of a sealed segment caches its commits).

Durability (``fsync``):

* ``"always"``: every append is fdatasync'ed before it returns.
* ``"batch"`` (default): :meth:`FileLogStore.append_transactional` is a durability
  barrier: every log with unsynced appends is synced first, then the transactional
  frame is written and synced; :meth:`FileLogStore.close` and segment rolls sync too.
  Plain appends in between may be lost on a power failure (never half-read: the
  torn tail is detected and truncated on open).
* ``"never"``: the operating system decides; fastest, for tests and simulation.

Recovery on open: sealed segments are trusted through their index file when it is
valid for the segment's size, otherwise scanned (and every frame CRC-checked); any
damage there raises :class:`LogError` naming file and byte position.  The last
segment is always scanned in full: the first invalid frame (torn header or payload,
bad magic, zero fill, CRC mismatch, offset discontinuity) starts a *torn tail* that
is truncated and reported in :attr:`FileLogStore.recovery` (and as a
:class:`RecoveryWarning`).  If a valid frame follows the damage it is not a torn
tail but corruption in the middle, and opening raises instead of dropping data.
Reads verify the CRC of every frame they decode.

Blocking: file I/O (and fsync) runs on the event loop thread; the log is local and
batched, so the calls are short.  A second process may open the directory with
``read_only=True`` (no lock, no truncation) and sees appends by polling.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import fcntl
import itertools
import json
import os
import struct
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal, NamedTuple, get_args

import msgspec
from crc32c import crc32c

from fleetlog.log import highwater
from fleetlog.log.base import (
    DECISIONS,
    INPUTS,
    LOG_NAMES,
    Clock,
    Headers,
    Log,
    LogClosedError,
    LogError,
    LogStore,
    Message,
    OffsetOutOfRangeError,
    Record,
    Shard,
    Target,
    pick_log,
    record_bytes,
    within_bytes,
)
from fleetlog.log.logdir import check_trusted
from fleetlog.log.memory import wall_clock_ms
from fleetlog.log.private import append_private, open_private, private_dir, write_private
from fleetlog.numerals import whole
from fleetlog.waiting import event_or_timeout

__all__ = [
    "CorruptLogError",
    "FileLog",
    "FileLogConfig",
    "FileLogStats",
    "FileLogStore",
    "FsyncPolicy",
    "HandOverError",
    "LockedError",
    "RecoveryReport",
    "RecoveryWarning",
    "Truncation",
]

FsyncPolicy = Literal["never", "batch", "always"]

MiB: Final = 1 << 20
MAX_FRAME_BYTES: Final = 1024 * MiB
"""The default frame limit.  One step's decisions are one transactional frame (all its parts, so a
crash never keeps half a step): 200,000 pending jobs whose reason changes make 34 MB, so the
limit is far above 64 MiB; readers must use the same limit (a longer frame reads as damage)."""
MAGIC: Final = b"FLOG"
VERSION: Final = 1
HEADER: Final = struct.Struct("<4sBBHIIQqII")
HEADER_SIZE: Final = HEADER.size  # 40
CRC_START: Final = 16
SEGMENT_SUFFIX: Final = ".log"
INDEX_SUFFIX: Final = ".index"
LOCK_NAME: Final = "LOCK"
INTENT_NAME: Final = "LOCK.intent"
"""Written by a service waiting for the lock: direct-appending producers hand the log over."""
OUTBOX_NAME: Final = "outbox"
"""A cross-shard append's intent: the batches for other shards' directories, redone after the
owner's commit frame until each target directory has recorded them (docs/logs.md, "Shards")."""
OUTBOX_GROUP: Final = "outbox:"
TRUNCATIONS_NAME: Final = "truncations.jsonl"
HIGH_WATER_EVERY_S: Final = 0.2
"""How often, at most, a durability barrier updates ``high-water.json`` (close always does)."""
"""One JSON line per torn or corrupt tail cut on open (what, where, which offsets were lost)."""
_OFFSET_DIGITS: Final = 20
_MAX_OPEN_SEGMENTS: Final = 16
_INDEX_CRC: Final = struct.Struct("<I")
_HEADER_HEAD: Final = struct.Struct("<4sBBHII")  # magic, version, flags, reserved, length, crc
_HEADER_TAIL: Final = struct.Struct("<QqII")  # the CRC-covered part of the header (bytes 16..40)

_Columns = tuple[list[bytes], list[bytes | None] | None, list[Headers] | None]
_Txn = tuple[str, int, int]  # group, consumed inputs offset, store-wide commit sequence
_Commits = dict[str, tuple[int, int]]  # group -> (consumed, sequence)

_ENCODER: Final = msgspec.msgpack.Encoder()
_COLUMNS: Final = msgspec.msgpack.Decoder(_Columns)
_TXN: Final = msgspec.msgpack.Decoder(_Txn)


class RecoveryWarning(UserWarning):
    """Emitted when opening a file log found and cut a torn tail."""


class CorruptLogError(LogError):
    """Damage opening cannot repair (a sealed segment, the middle of a segment, a missing
    segment): an operator must restore or move files; retrying alone will not help."""


@dataclass(frozen=True, slots=True)
class FileLogConfig:
    """Tuning of a :class:`FileLogStore`; validated on construction."""

    fsync: FsyncPolicy = "batch"
    segment_bytes: int = 64 * MiB
    index_interval_bytes: int = 4096
    max_frame_bytes: int = MAX_FRAME_BYTES
    read_only: bool = False
    poll_interval_ms: int = 50

    def __post_init__(self) -> None:
        if self.fsync not in get_args(FsyncPolicy):
            raise LogError(f"invalid fsync policy {self.fsync!r}; expected one of never, batch, always")
        for name in ("segment_bytes", "index_interval_bytes", "max_frame_bytes", "poll_interval_ms"):
            if getattr(self, name) <= 0:
                raise LogError(f"{name} must be positive, got {getattr(self, name)}")
        if self.max_frame_bytes > 0xFFFFFFFF:
            raise LogError(f"max_frame_bytes must fit in 32 bits, got {self.max_frame_bytes}")


TruncationKind = Literal["torn", "corrupt"]


@dataclass(frozen=True, slots=True)
class Truncation:
    """One damaged tail found on open: ``bytes_truncated`` bytes from ``position`` of ``file``.

    ``kind`` tells a write cut short (``torn``: the frame runs past the end of the file, or the
    tail is zero fill) from bit rot (``corrupt``: a whole frame whose checksum, magic, version or
    offset is wrong).  Every record from ``first_lost_offset`` on is gone; ``records_claimed`` is
    how many the damaged frame's header says it held (unverified: the header may be the damage)."""

    log: str
    file: Path
    position: int
    bytes_truncated: int
    reason: str
    applied: bool = True  # False when the store is read-only: the bytes are only ignored
    kind: TruncationKind = "torn"
    first_lost_offset: int = 0
    records_claimed: int | None = None

    def lost(self) -> str:
        """Which acknowledged offsets are gone, in words."""
        if self.records_claimed:
            last = self.first_lost_offset + self.records_claimed - 1
            return f"offsets {self.first_lost_offset}..{last} (as the damaged frame claims) and any after"
        return f"every record from offset {self.first_lost_offset} on (the frame header is unreadable)"

    def __str__(self) -> str:
        verb = "truncated" if self.applied else "ignored (read-only)"
        where = f"{self.bytes_truncated} bytes of {self.file} at byte {self.position}"
        return f"{self.log}: {verb} {where}: {self.kind}: {self.reason}; lost {self.lost()}"

    def to_json(self, at_ms: int) -> dict[str, object]:
        """The persisted report line (``truncations.jsonl``)."""
        return {"at_ms": at_ms, "log": self.log, "file": str(self.file), "position": self.position,
                "bytes": self.bytes_truncated, "kind": self.kind, "reason": self.reason,
                "first_lost_offset": self.first_lost_offset, "records_claimed": self.records_claimed,
                "applied": self.applied, "message": str(self)}


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What opening the store repaired: torn tails cut, index files rebuilt."""

    truncations: tuple[Truncation, ...] = ()
    indexes_rebuilt: tuple[Path, ...] = ()

    @property
    def clean(self) -> bool:
        return not self.truncations

    def for_log(self, name: str) -> list[Truncation]:
        return [t for t in self.truncations if t.log == name]

    def __str__(self) -> str:
        if self.clean:
            return "clean: no torn tail"
        return "\n".join(str(t) for t in self.truncations)


@dataclass(slots=True)
class FileLogStats:
    """Counters of the read path (tests use them to check that the index is used)."""

    headers_read: int = 0
    frames_decoded: int = 0
    bytes_read: int = 0


class _Frame(NamedTuple):
    """A parsed frame header plus where it sits in its segment."""

    position: int
    base: int
    timestamp_ms: int
    record_count: int
    length: int
    txn_length: int
    crc: int

    @property
    def end(self) -> int:
        return self.position + HEADER_SIZE + self.length

    @property
    def next_offset(self) -> int:
        return self.base + self.record_count


class _Damage(NamedTuple):
    position: int
    reason: str


_TORN_REASONS: Final = ("torn frame", "bad magic (zero-filled tail)")


def _damage_kind(reason: str) -> TruncationKind:
    """A write cut short (the frame runs past the end of the file, or zero fill) or bit rot."""
    return "torn" if reason.startswith(_TORN_REASONS) else "corrupt"


def _claimed_records(buf: bytes, position: int) -> int | None:
    """The record count in the (possibly damaged) frame header at ``buf[position]``, if readable."""
    if len(buf) - position < HEADER_SIZE or buf[position : position + 4] != MAGIC:
        return None
    count: int = HEADER.unpack_from(buf, position)[8]
    return count


def _crc(data: bytes | memoryview, value: int = 0) -> int:
    return crc32c(data, value)


def _parse_header(raw: bytes | memoryview, at: int, position: int, max_frame: int) -> _Frame | str:
    """Parse the header at ``raw[at:]`` of a frame at file ``position``; a string says what is wrong."""
    if len(raw) - at < HEADER_SIZE:
        return "torn frame header"
    magic, version, _flags, _reserved, length, crc, base, ts, count, txn_length = HEADER.unpack_from(raw, at)
    if magic != MAGIC:
        return "bad magic (zero-filled tail)" if not any(raw[at : at + HEADER_SIZE]) else "bad magic"
    if version != VERSION:
        return f"unsupported frame version {version}"
    if length > max_frame or txn_length > length:
        return f"implausible payload length {length}"
    return _Frame(position, base, ts, count, length, txn_length, crc)


def _check_frame(buf: bytes, at: int, origin: int, expected: int, max_frame: int) -> _Frame | str:
    """Fully validate the frame at ``buf[at:]`` (file position ``origin + at``)."""
    frame = _parse_header(buf, at, origin + at, max_frame)
    if isinstance(frame, str):
        return frame
    end = at + HEADER_SIZE + frame.length
    if end > len(buf):
        return f"torn frame payload ({len(buf) - at - HEADER_SIZE} of {frame.length} bytes)"
    if _crc(memoryview(buf)[at + CRC_START : end]) != frame.crc:
        return "crc mismatch"
    if frame.base != expected:
        return f"offset discontinuity: frame base offset {frame.base}, expected {expected}"
    return frame


def _find_later_frame(buf: bytes, at: int, max_frame: int) -> int | None:
    """Where a CRC-valid frame starts after the damage at ``buf[at]``, if anywhere."""
    probe = buf.find(MAGIC, at + 1)
    while probe >= 0:
        frame = _parse_header(buf, probe, probe, max_frame)
        if not isinstance(frame, str) and probe + HEADER_SIZE + frame.length <= len(buf):
            payload_end = probe + HEADER_SIZE + frame.length
            if _crc(memoryview(buf)[probe + CRC_START : payload_end]) == frame.crc:
                return probe
        probe = buf.find(MAGIC, probe + 1)
    return None


def _decode_txn(section: bytes | memoryview, where: str) -> _Txn:
    try:
        return _TXN.decode(section)
    except msgspec.DecodeError as exc:
        raise CorruptLogError(f"{where}: undecodable transaction metadata: {exc}") from None


def _encode_columns(messages: Sequence[Message]) -> bytes:
    """The records section of a frame: one msgpack array of three columns."""
    values = [m.value for m in messages]
    keys = [m.key for m in messages]
    headers = [m.headers for m in messages]
    _check_types(values, keys, headers)
    has_keys = any(k is not None for k in keys)
    has_headers = any(headers)
    return _ENCODER.encode((values, keys if has_keys else None, headers if has_headers else None))


def _check_types(values: list[bytes], keys: list[bytes | None], headers: list[Headers]) -> None:
    """Refuse what would encode but not decode back as bytes (e.g. a ``str`` value)."""
    if not set(map(type, values)) <= {bytes}:
        raise LogError("message values must be bytes")
    if not set(map(type, keys)) <= {bytes, type(None)}:
        raise LogError("message keys must be bytes or None")
    for hs in headers:
        for pair in hs:
            if len(pair) != 2 or type(pair[0]) is not str or type(pair[1]) is not bytes:
                raise LogError(f"message headers must be (str, bytes) pairs, got {pair!r}")


def _build_records(frame: _Frame, columns: _Columns, start: int, limit: int) -> list[Record]:
    """Records ``start`` .. ``start + limit`` (clipped to the frame) without a per-record loop."""
    values, keys, headers = columns
    lo = start - frame.base
    hi = min(frame.record_count, lo + limit)
    n = hi - lo
    whole = lo == 0 and hi == len(values)
    return list(
        map(
            Record,
            range(start, start + n),
            itertools.repeat(frame.timestamp_ms, n),
            values if whole else values[lo:hi],
            itertools.repeat(None, n) if keys is None else keys[lo:hi],
            itertools.repeat((), n) if headers is None else headers[lo:hi],
        )
    )


def _segment_name(base: int) -> str:
    return f"{base:0{_OFFSET_DIGITS}d}{SEGMENT_SUFFIX}"


def _list_segments(directory: Path) -> list[int]:
    """Base offsets of the segment files in ``directory``, ascending."""
    bases = []
    for path in directory.glob(f"*{SEGMENT_SUFFIX}"):
        stem = path.name[: -len(SEGMENT_SUFFIX)]
        base = whole(stem, _OFFSET_DIGITS)  # (a file named with other digits is no segment)
        if len(stem) == _OFFSET_DIGITS and base is not None:
            bases.append(base)
    return sorted(bases)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_datasync = getattr(os, "fdatasync", os.fsync)


class _IndexFile(msgspec.Struct, array_like=True, frozen=True):
    """What a sealed segment's ``.index`` file holds (after a CRC32C of it)."""

    version: int
    segment_size: int
    next_offset: int
    last_ts: int | None
    offsets: list[int]
    positions: list[int]
    commits: dict[str, tuple[int, int]]


_INDEX_DECODER: Final = msgspec.msgpack.Decoder(_IndexFile)


@dataclass(slots=True, eq=False)
class _Segment:
    """One segment file: its extent, sparse index and the commits its frames carry."""

    base: int
    path: Path
    size: int = 0
    next_offset: int = -1
    last_ts: int | None = None
    index_offsets: list[int] = field(default_factory=list)
    index_positions: list[int] = field(default_factory=list)
    commits: _Commits = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.next_offset < 0:
            self.next_offset = self.base

    def add_frame(self, frame: _Frame, interval: int) -> None:
        if not self.index_positions or frame.position - self.index_positions[-1] >= interval:
            self.index_offsets.append(frame.base)
            self.index_positions.append(frame.position)
        self.size = frame.end
        self.next_offset = frame.next_offset
        self.last_ts = frame.timestamp_ms

    def seek(self, offset: int) -> int:
        """Byte position of the last indexed frame starting at or before ``offset``."""
        i = bisect.bisect_right(self.index_offsets, offset) - 1
        return self.index_positions[i] if i >= 0 else 0

    def scan(self, buf: bytes, origin: int, config: FileLogConfig) -> _Damage | None:
        """Validate and add the frames in ``buf`` (file bytes from ``origin = self.size``)."""
        at = 0
        while at < len(buf):
            frame = _check_frame(buf, at, origin, self.next_offset, config.max_frame_bytes)
            if isinstance(frame, str):
                return _Damage(origin + at, frame)
            if frame.txn_length:
                end = frame.end - origin
                section = memoryview(buf)[end - frame.txn_length : end]
                group, consumed, seq = _decode_txn(section, f"{self.path} at byte {frame.position}")
                self.commits[group] = (consumed, seq)
            self.add_frame(frame, config.index_interval_bytes)
            at = frame.end - origin
        return None

    def write_index(self) -> None:
        """Persist the sparse index (atomically; it is a cache validated on load)."""
        offsets, positions = self.index_offsets, self.index_positions
        data = _ENCODER.encode(
            _IndexFile(1, self.size, self.next_offset, self.last_ts, offsets, positions, self.commits)
        )
        write_private(self.path.with_suffix(INDEX_SUFFIX), _INDEX_CRC.pack(_crc(data)) + data)

    @classmethod
    def from_index(cls, base: int, path: Path) -> _Segment | None:
        """The segment as its index file describes it, or ``None`` if that file is missing or stale."""
        try:
            raw = path.with_suffix(INDEX_SUFFIX).read_bytes()
            size = path.stat().st_size
        except OSError:
            return None
        if len(raw) < _INDEX_CRC.size or _INDEX_CRC.unpack_from(raw)[0] != _crc(raw[_INDEX_CRC.size :]):
            return None
        try:
            ix = _INDEX_DECODER.decode(raw[_INDEX_CRC.size :])
        except msgspec.DecodeError:
            return None
        if ix.version != 1 or ix.segment_size != size or len(ix.offsets) != len(ix.positions):
            return None
        return cls(base, path, size, ix.next_offset, ix.last_ts, ix.offsets, ix.positions, dict(ix.commits))


class FileLog(Log):
    """One log: a directory of segments, the last one (the active one) open for appends."""

    def __init__(self, name: str, directory: Path, clock: Clock, config: FileLogConfig) -> None:
        self.name = name
        self.directory = directory
        self.stats = FileLogStats()
        self._clock = clock
        self._config = config
        self._segments: list[_Segment] = []
        self._bases: list[int] = []
        self._active_fd: int | None = None
        self._read_fds: OrderedDict[int, int] = OrderedDict()
        self._last_ts: int | None = None
        self._dirty = False
        self._closed = True
        self._grew = asyncio.Event()
        self._cached: tuple[int, int, _Columns] | None = None
        self.indexes_rebuilt: list[Path] = []
        self.before_append: Callable[[], None] | None = None
        """Called before every plain append (a producer's store: hand the log to a waiting service)."""

    # -- opening and recovery -------------------------------------------------------------------

    def open(self) -> list[Truncation]:
        """Load sealed segments, recover the active one; return the torn tails found."""
        if not self._config.read_only:
            private_dir(self.directory)
        bases = self._existing_bases()
        if not bases and not self._config.read_only:
            self._create_segment_file(0)
            bases = [0]
        for base in bases[:-1]:
            self._add_segment(self._load_sealed(base))
        truncations = []
        if bases:
            last, truncation = self._recover_last(bases[-1])
            self._add_segment(last)
            truncations = [truncation] if truncation else []
        self._last_ts = next((s.last_ts for s in reversed(self._segments) if s.last_ts is not None), None)
        if not self._config.read_only:
            self._active_fd = os.open(self._segments[-1].path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
        self._closed = False
        return truncations

    def _existing_bases(self) -> list[int]:
        """Segments on disk, less empty trailing ones (a crash between a roll and its first frame)."""
        bases = _list_segments(self.directory) if self.directory.is_dir() else []
        while len(bases) > 1 and self._segment_path(bases[-1]).stat().st_size == 0:
            if not self._config.read_only:
                self._segment_path(bases[-1]).unlink()
            bases.pop()
        return bases

    def _add_segment(self, seg: _Segment) -> None:
        if self._segments and seg.base != self._segments[-1].next_offset:
            prev = self._segments[-1]
            raise CorruptLogError(
                f"{seg.path}: segment starts at offset {seg.base} but {prev.path.name} ends at offset "
                f"{prev.next_offset} (missing or damaged segment)"
            )
        self._segments.append(seg)
        self._bases.append(seg.base)

    def _segment_path(self, base: int) -> Path:
        return self.directory / _segment_name(base)

    def _load_sealed(self, base: int) -> _Segment:
        path = self._segment_path(base)
        seg = _Segment.from_index(base, path)
        if seg is not None:
            return seg
        seg = _Segment(base, path)
        damage = seg.scan(path.read_bytes(), 0, self._config)
        if damage is not None:
            raise CorruptLogError(
                f"{self.name}: corrupt frame in sealed segment {path} at byte {damage.position}: "
                f"{damage.reason}; refusing to drop data (restore the segment or move it away)"
            )
        if not self._config.read_only:
            seg.write_index()
            self.indexes_rebuilt.append(path.with_suffix(INDEX_SUFFIX))
        return seg

    def _recover_last(self, base: int) -> tuple[_Segment, Truncation | None]:
        path = self._segment_path(base)
        buf = path.read_bytes()
        seg = _Segment(base, path)
        damage = seg.scan(buf, 0, self._config)
        if damage is None:
            return seg, None
        later = _find_later_frame(buf, damage.position, self._config.max_frame_bytes)
        if later is not None:
            raise CorruptLogError(
                f"{self.name}: corrupt frame in {path} at byte {damage.position} ({damage.reason}) "
                f"followed by a valid frame at byte {later}: corruption in the middle, not a torn tail; "
                "refusing to truncate"
            )
        if not self._config.read_only:
            with open(path, "r+b") as f:
                f.truncate(damage.position)
                os.fsync(f.fileno())
        cut = Truncation(
            self.name, path, damage.position, len(buf) - damage.position, damage.reason,
            not self._config.read_only, _damage_kind(damage.reason), seg.next_offset,
            _claimed_records(buf, damage.position),
        )
        return seg, cut

    def index_entries(self) -> list[tuple[int, int, int]]:
        """The sparse index: (segment base offset, frame base offset, byte position) entries."""
        return [
            (seg.base, offset, position)
            for seg in self._segments
            for offset, position in zip(seg.index_offsets, seg.index_positions, strict=True)
        ]

    def commits(self) -> _Commits:
        """Every group's last commit found in this log's frames: group -> (consumed, sequence)."""
        merged: _Commits = {}
        for seg in self._segments:
            merged.update(seg.commits)
        return merged

    def prune(
        self, before: int, keep: Callable[[_Segment], bool], dry_run: bool = False
    ) -> list[tuple[int, int, int]]:
        """Delete the sealed segments (never the active one) that end at or before offset
        ``before``, oldest first, stopping at the first one ``keep`` holds on to; (base, next
        offset, bytes) of each deleted (``dry_run``: of each that would be). The files go first,
        then the directory is synced."""
        self._check_writable()
        count = 0
        for seg in self._segments[:-1]:
            if seg.next_offset > before or keep(seg):
                break
            count += 1
        doomed = self._segments[:count]
        gone = [(seg.base, seg.next_offset, seg.size) for seg in doomed]
        if dry_run or not doomed:
            return gone
        del self._segments[:count], self._bases[:count]
        self._cached = None
        for seg in doomed:
            fd = self._read_fds.pop(seg.base, None)
            if fd is not None:
                os.close(fd)
            seg.path.with_suffix(INDEX_SUFFIX).unlink(missing_ok=True)
            seg.path.unlink()
        _fsync_dir(self.directory)
        return gone

    def close(self) -> None:
        if self._closed:
            return
        self.sync()
        for fd in self._read_fds.values():
            os.close(fd)
        self._read_fds.clear()
        if self._active_fd is not None:
            os.close(self._active_fd)
            self._active_fd = None
        self._closed = True
        self._cached = None
        self._grew.set()  # wake waiting readers: they find the log closed

    # -- appending ------------------------------------------------------------------------------

    async def append(self, messages: Sequence[Message]) -> int:
        if self.before_append is not None:
            self.before_append()
        return self.append_now(messages)

    def append_now(self, messages: Sequence[Message], txn: _Txn | None = None) -> int:
        """Write one frame holding ``messages`` (and the commit ``txn``); return the first offset."""
        self._check_writable()
        first = self._segments[-1].next_offset
        if not messages and txn is None:
            return first
        records = _encode_columns(messages)
        txn_section = _ENCODER.encode(txn) if txn is not None else b""
        length = len(records) + len(txn_section)
        if length > self._config.max_frame_bytes:
            raise LogError(
                f"{self.name}: batch of {len(messages)} records is {length} bytes, over the "
                f"{self._config.max_frame_bytes}-byte frame limit; split it"
            )
        self._roll_if_needed(HEADER_SIZE + length)
        position = self._segments[-1].size
        frame = _Frame(position, first, self._tick(), len(messages), length, len(txn_section), 0)
        self._write_frame(frame, records, txn_section)
        if txn is not None:
            self._segments[-1].commits[txn[0]] = (txn[1], txn[2])
        if messages:
            self._grew.set()
            self._grew = asyncio.Event()
        return first

    def _check_writable(self) -> None:
        if self._closed:
            raise LogClosedError(f"file log {self.name} is closed")
        if self._config.read_only:
            raise LogError(f"file log {self.directory} is open read-only")

    def _tick(self) -> int:
        """The batch timestamp: the clock, but never before the previous batch's."""
        now = self._clock()
        if self._last_ts is not None and now < self._last_ts:
            now = self._last_ts
        self._last_ts = now
        return now

    def _write_frame(self, frame: _Frame, records: bytes, txn_section: bytes) -> None:
        tail = _HEADER_TAIL.pack(frame.base, frame.timestamp_ms, frame.record_count, frame.txn_length)
        crc = _crc(txn_section, _crc(records, _crc(tail)))
        header = _HEADER_HEAD.pack(MAGIC, VERSION, 0, 0, frame.length, crc) + tail
        assert self._active_fd is not None
        seg = self._segments[-1]
        try:
            _write_all(self._active_fd, [header, records, txn_section])
            if self._config.fsync == "always":
                _datasync(self._active_fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(self._active_fd, seg.size)
            raise LogError(f"{self.name}: writing {seg.path} at byte {seg.size} failed: {exc}") from exc
        self._dirty = self._config.fsync == "batch"
        seg.add_frame(frame, self._config.index_interval_bytes)

    def sync(self) -> None:
        """fdatasync the active segment if it has unsynced appends (policy permitting)."""
        if self._dirty and self._active_fd is not None and self._config.fsync != "never":
            _datasync(self._active_fd)
        self._dirty = False

    def _roll_if_needed(self, frame_bytes: int) -> None:
        active = self._segments[-1]
        has_records = active.next_offset > active.base  # two segments must never share a base
        if not (active.size and has_records and active.size + frame_bytes > self._config.segment_bytes):
            return
        self.sync()
        active.write_index()
        self._create_segment_file(active.next_offset)
        fd = os.open(self._segment_path(active.next_offset), os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
        assert self._active_fd is not None
        os.close(self._active_fd)
        self._active_fd = fd
        self._add_segment(_Segment(active.next_offset, self._segment_path(active.next_offset)))

    def _create_segment_file(self, base: int) -> None:
        fd = open_private(self._segment_path(base), os.O_WRONLY | os.O_EXCL)
        os.close(fd)
        if self._config.fsync != "never":
            _fsync_dir(self.directory)

    # -- reading --------------------------------------------------------------------------------

    async def end_offset(self) -> int:
        self._check_open()
        self.refresh()
        return self._end()

    def _end(self) -> int:
        return self._segments[-1].next_offset if self._segments else 0

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosedError(f"file log {self.name} is closed")

    async def start_offset(self) -> int:
        self._check_open()
        self.refresh()
        return self._start()

    def _start(self) -> int:
        return self._segments[0].base if self._segments else 0

    async def read(self, offset: int, max_records: int = 10_000, timeout_ms: int = 0,
                   max_bytes: int | None = None) -> list[Record]:
        self._check_open()
        if offset < 0 or offset < self._start():
            raise OffsetOutOfRangeError(
                f"{self.name}: offset {offset} is before the start of the log ({self._start()})")
        if offset >= self._end():
            self.refresh()
        if offset >= self._end() and timeout_ms > 0:
            await self._wait_past(offset, timeout_ms)
            self._check_open()
        return self.read_now(offset, max_records, max_bytes)

    async def _wait_past(self, offset: int, timeout_ms: int) -> None:
        """Wait until the log holds ``offset`` (woken by appends; polling the files if read-only)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        while offset >= self._end() and not self._closed:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            if self._config.read_only:
                remaining = min(remaining, self._config.poll_interval_ms / 1000)
            await event_or_timeout(self._grew, remaining)
            self.refresh()

    def read_now(self, offset: int, max_records: int, max_bytes: int | None = None) -> list[Record]:
        """Up to ``max_records`` records (and ``max_bytes``: :meth:`Log.read`) from ``offset``
        among those already appended; no frame is decoded past the byte bound."""
        out: list[Record] = []
        used = [0, 0]  # (bytes taken so far, 1 once the byte bound is reached: _read_segment's)
        while len(out) < max_records and offset < self._end() and not used[1]:
            seg = self._segments[bisect.bisect_right(self._bases, offset) - 1]
            got = self._read_segment(seg, offset, max_records - len(out), max_bytes, used)
            if not got:
                break
            out.extend(got)
            offset = got[-1].offset + 1
        return out

    def _read_segment(self, seg: _Segment, offset: int, limit: int, max_bytes: int | None = None,
                      used: list[int] | None = None) -> list[Record]:
        out: list[Record] = []
        used = [0, 0] if used is None else used
        fd = self._fd(seg)
        position = seg.seek(offset)
        while position < seg.size and len(out) < limit:
            frame = self._read_header(seg, fd, position)
            if frame.next_offset > offset:
                columns = self._decode(seg, fd, frame)
                got = _build_records(frame, columns, max(offset, frame.base), limit - len(out))
                kept = within_bytes(got, max_bytes, used[0])
                if kept:
                    out.extend(kept)
                    offset = kept[-1].offset + 1
                    used[0] += sum(map(record_bytes, kept)) if max_bytes is not None else 0
                if len(kept) < len(got):  # the byte bound is reached
                    used[1] = 1
                    break
            position = frame.end
        return out

    def _read_header(self, seg: _Segment, fd: int, position: int) -> _Frame:
        raw = os.pread(fd, HEADER_SIZE, position)
        self.stats.headers_read += 1
        frame = _parse_header(raw, 0, position, self._config.max_frame_bytes)
        if isinstance(frame, str):
            raise CorruptLogError(f"{self.name}: corrupt frame in {seg.path} at byte {position}: {frame}")
        return frame

    def _decode(self, seg: _Segment, fd: int, frame: _Frame) -> _Columns:
        """The columns of ``frame``, CRC-checked (the last decoded frame is cached)."""
        if self._cached is not None and self._cached[:2] == (seg.base, frame.position):
            return self._cached[2]
        payload = os.pread(fd, frame.length, frame.position + HEADER_SIZE)
        self.stats.frames_decoded += 1
        self.stats.bytes_read += len(payload)
        where = f"{self.name}: corrupt frame in {seg.path} at byte {frame.position}"
        tail = _HEADER_TAIL.pack(frame.base, frame.timestamp_ms, frame.record_count, frame.txn_length)
        if len(payload) != frame.length or _crc(payload, _crc(tail)) != frame.crc:
            raise CorruptLogError(f"{where}: crc mismatch or short payload")
        try:
            columns = _COLUMNS.decode(memoryview(payload)[: frame.length - frame.txn_length])
        except msgspec.DecodeError as exc:
            raise CorruptLogError(f"{where}: undecodable records: {exc}") from None
        if not _columns_match(columns, frame.record_count):
            raise CorruptLogError(f"{where}: record columns do not match the count {frame.record_count}")
        self._cached = (seg.base, frame.position, columns)
        return columns

    def _fd(self, seg: _Segment) -> int:
        """A descriptor to pread ``seg``: the active one's, or one of a few cached read-only ones."""
        if self._active_fd is not None and seg is self._segments[-1]:
            return self._active_fd
        fd = self._read_fds.pop(seg.base, None)
        if fd is None:
            fd = os.open(seg.path, os.O_RDONLY | os.O_CLOEXEC)
            if len(self._read_fds) >= _MAX_OPEN_SEGMENTS:
                os.close(self._read_fds.popitem(last=False)[1])
        self._read_fds[seg.base] = fd
        return fd

    # -- following another process's appends (read-only) ----------------------------------------

    def refresh(self) -> None:
        """Read-only mode: pick up frames and segments the writing process added since."""
        if not self._config.read_only or self._closed:
            return
        before = self._end()
        if self._segments:
            self._scan_tail(self._segments[-1])
        newer = [b for b in _list_segments(self.directory) if not self._bases or b > self._bases[-1]]
        for base in newer:
            if self._segments and base != self._segments[-1].next_offset:
                break  # the writer is mid-roll or we lag; retry on the next poll
            seg = _Segment(base, self._segment_path(base))
            self._add_segment(seg)
            self._scan_tail(seg)
        if self._end() > before:
            self._grew.set()  # wake other readers of this log waiting in this process
            self._grew = asyncio.Event()

    def _scan_tail(self, seg: _Segment) -> None:
        fd = self._fd(seg)
        size = os.fstat(fd).st_size
        if size > seg.size:
            seg.scan(os.pread(fd, size - seg.size, seg.size), seg.size, self._config)
            if seg.last_ts is not None:
                self._last_ts = seg.last_ts


def _columns_match(columns: _Columns, count: int) -> bool:
    values, keys, headers = columns
    return all(len(column) == count for column in (values, keys or values, headers or values))


def _write_all(fd: int, parts: list[bytes]) -> None:
    """Write ``parts`` at the end of ``fd`` (O_APPEND), finishing any short write."""
    total = sum(map(len, parts))
    written = os.writev(fd, parts)
    if written == total:
        return
    rest = memoryview(b"".join(parts))[written:]
    while rest:
        rest = rest[os.write(fd, rest) :]


class LockedError(LogError):
    """Another process holds the directory's writer lock."""


class HandOverError(LockedError):
    """A service is waiting for the writer lock (``LOCK.intent``): a producer that appends
    directly gives the log up to it (and sends to the service once it announces itself)."""


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (another user's counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: alive
    return True


def waiting_service(directory: Path) -> int | None:
    """The PID of a live service (not this process) waiting for the lock, per ``LOCK.intent``."""
    try:
        pid = int((directory / INTENT_NAME).read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if pid != os.getpid() and pid > 0 and process_alive(pid) else None


def announce_intent(directory: Path) -> None:
    """Say that this process waits for the writer lock: producers that append directly hand
    the log over at their next append, and new ones do not take the lock."""
    private_dir(directory)
    write_private(directory / INTENT_NAME, f"{os.getpid()}\n".encode())


def withdraw_intent(directory: Path) -> None:
    """Remove this process's ``LOCK.intent`` (another waiting process's is left alone)."""
    path = directory / INTENT_NAME
    with contextlib.suppress(OSError, ValueError):
        if int(path.read_text().strip()) == os.getpid():
            path.unlink()


def _check_no_waiter(directory: Path) -> None:
    pid = waiting_service(directory)
    if pid is not None:
        raise HandOverError(
            f"file log directory {directory}: the service (pid {pid}) is taking the log over; "
            "send to it once it announces itself in service.json"
        )


def _acquire_lock(directory: Path, yields: bool = False) -> int:
    """Take the directory's exclusive writer lock; a clear error names the holder.  A yielding
    opener (a producer) does not take it while a service waits for it."""
    private_dir(directory)
    if yields:
        _check_no_waiter(directory)
    fd = open_private(directory / LOCK_NAME, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        if holder == str(os.getpid()):
            holder += ", this process"
        raise LockedError(
            f"file log directory {directory} is already open for writing by another FileLogStore "
            f"(pid {holder}); only one writer may open it"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


class _Remote(msgspec.Struct, array_like=True, frozen=True):
    kind: str
    partition: int
    name: str
    messages: list[Message]


class _Outbox(msgspec.Struct, array_like=True, frozen=True):
    """The remote batches of the owner's commit ``seq`` of ``group``."""

    seq: int
    group: str
    remotes: list[_Remote]


_OUTBOX: Final = msgspec.msgpack.Decoder(_Outbox)


def _read_outbox(path: Path) -> _Outbox | None:
    """The outbox at ``path`` (written whole by rename: damage is corruption, not a torn write)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    crc, body = raw[:4], raw[4:]
    if len(raw) < 4 or _INDEX_CRC.unpack(crc)[0] != _crc(body):
        raise CorruptLogError(f"{path}: the outbox's CRC does not match; its cross-shard batches are lost")
    try:
        return _OUTBOX.decode(body)
    except (msgspec.DecodeError, ValueError) as exc:
        raise CorruptLogError(f"{path}: undecodable outbox: {exc}") from None


def _write_outbox(path: Path, outbox: _Outbox) -> None:
    body = _ENCODER.encode(outbox)
    write_private(path, _INDEX_CRC.pack(_crc(body)) + body, sync=True)
    _fsync_dir(path.parent)


class FileLogStore(LogStore):
    """The inputs, decisions and dead-letters logs in one directory, for one writing process.

    ``directory`` is the log directory; a store of another :class:`Shard` than today's single
    one lives in its sub-directory (``global/``, ``cells-<p>/``)."""

    def __init__(
        self,
        directory: Path | str,
        *,
        shard: Shard = Shard.SINGLE,
        peers: dict[Shard, FileLogStore] | None = None,
        clock: Clock = wall_clock_ms,
        fsync: FsyncPolicy = "batch",
        segment_bytes: int = 64 * MiB,
        index_interval_bytes: int = 4096,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        read_only: bool = False,
        yields: bool = False,
    ) -> None:
        """``yields=True`` (producers appending directly): give the log up to a service that
        waits for it — refuse to open, and raise :class:`HandOverError` on the next append.
        ``peers``: the stores of the other shards in this process (:meth:`for_shard`)."""
        self.base = Path(directory)
        self.shard = shard
        self.directory = self.base / shard.dirname
        self.yields = yields
        self._options = (clock, fsync, segment_bytes, index_interval_bytes, max_frame_bytes)
        self.config = FileLogConfig(fsync, segment_bytes, index_interval_bytes, max_frame_bytes, read_only)
        self.recovery = RecoveryReport()
        self._clock = clock
        self._logs: dict[str, FileLog] = {}
        self._lock_fd: int | None = None
        self._commits: _Commits = {}
        self._txn_seq = 0
        self._peers = {} if peers is None else peers
        self._peers.setdefault(shard, self)
        self._borrowed: list[FileLogStore] = []
        """Target stores this one opened for a cross-shard append (closed with it)."""
        self._outbox: _Outbox | None = None
        self._high: dict[str, int] = {}
        """What ``high-water.json`` records (a writer's: :meth:`_mark_high_water`)."""
        self._marked_at = -HIGH_WATER_EVERY_S
        self._barrier: dict[str, int] = {}
        """Each log's end at the last durability barrier (a transactional append)."""
        self.shorter: highwater.LogShorterError | None = None
        """A read-only store's finding that a log is shorter than it once was (a writer refuses)."""

    async def open(self) -> None:
        if self._logs:
            return
        if self.config.read_only and not self.directory.is_dir():
            raise LogError(f"no file log at {self.directory}")
        for directory in dict.fromkeys((self.base, self.directory)) if not self.config.read_only else ():
            check_trusted(directory)  # (issue 46: a writer's log that others may write could be forged)
        if not self.config.read_only:
            self._lock_fd = _acquire_lock(self.directory, self.yields)
        logs = {name: FileLog(name, self.directory / name, self._clock, self.config) for name in LOG_NAMES}
        if self.yields:
            for log in logs.values():
                log.before_append = self._yield_if_wanted
        try:
            truncations = [t for log in logs.values() for t in log.open()]
        except BaseException:
            self._close_all(logs.values())
            raise
        self._logs = logs
        self._rebuild_commits()
        if not self.config.read_only:
            try:
                self._load_outbox()
            except BaseException:
                await self.close()
                raise
        rebuilt = tuple(p for log in logs.values() for p in log.indexes_rebuilt)
        self.recovery = RecoveryReport(tuple(truncations), rebuilt)
        self._check_high_water(truncations)
        if truncations and not self.config.read_only:
            self._persist_truncations(truncations)
        for cut in truncations:
            warnings.warn(str(cut), RecoveryWarning, stacklevel=2)

    def _check_high_water(self, truncations: list[Truncation]) -> None:
        """Refuse to write a log shorter than it once was durably, unless a truncation just said
        why (:mod:`fleetlog.log.highwater`); a read-only store keeps the finding in
        :attr:`shorter`.  The record is then brought up to date (a reported cut lowers it)."""
        ends = {name: log._end() for name, log in self._logs.items()}
        recorded = highwater.read(self.directory)
        found = highwater.shorter(self.directory, recorded, ends, {t.log for t in truncations})
        if self.config.read_only:
            self.shorter = found
            return
        if found is not None:
            self._close_all(self._logs.values())
            self._logs = {}
            raise found
        cut = {t.log: ends[t.log] for t in truncations}
        ends.pop(DECISIONS)  # (only its transactions count: _mark_high_water)
        self._high = highwater.grown({**recorded, **cut}, ends)
        if self._high != recorded:
            highwater.write(self.directory, self._high)

    def _mark_high_water(self, now: float | None = None) -> None:
        """After a durability barrier (``now``: written at most every :data:`HIGH_WATER_EVERY_S`)
        or on close: record how far every log is durable.  The decisions log counts only what its
        transactions (the scheduler's steps) made durable: a plain append to it is no decision, and
        an operator who cuts one off again has lost nothing."""
        if self.config.read_only or not self._logs:
            return
        ends = {name: log._end() for name, log in self._logs.items()}
        if now is not None:
            self._barrier = ends
            if now - self._marked_at < HIGH_WATER_EVERY_S:
                return
            self._marked_at = now
        else:
            ends[DECISIONS] = self._barrier.get(DECISIONS, 0)
        high = highwater.grown(self._high, ends)
        if high != self._high:
            highwater.write(self.directory, high)
            self._high = high

    def _persist_truncations(self, truncations: list[Truncation]) -> None:
        """Append what was cut to ``truncations.jsonl``: the next process (and an operator) can
        tell lost acknowledged records from a log that never held them."""
        at_ms = int(time.time() * 1000)
        lines = "".join(json.dumps(t.to_json(at_ms)) + "\n" for t in truncations)
        append_private(self.directory / TRUNCATIONS_NAME, lines.encode())

    def truncation_history(self, limit: int = 20) -> list[dict[str, object]]:
        """The newest ``limit`` entries of the persisted truncation report (oldest first)."""
        try:
            lines = (self.directory / TRUNCATIONS_NAME).read_text().splitlines()
        except OSError:
            return []
        found = []
        for line in lines[-limit:]:
            with contextlib.suppress(ValueError):
                found.append(json.loads(line))
        return found

    def _yield_if_wanted(self) -> None:
        _check_no_waiter(self.directory)

    def prune(self, name: str, before: int, dry_run: bool = False) -> list[tuple[int, int, int]]:
        """:meth:`FileLog.prune` of log ``name`` before offset ``before``, keeping every segment
        that holds a consumer group's last commit (and all after it): a group's committed
        offset is never lost to a prune."""
        log = self.log(name)
        best = {(group, seq) for group, (_, seq) in self._commits.items()}

        def holds_a_last_commit(seg: _Segment) -> bool:
            return any((group, seq) in best for group, (_, seq) in seg.commits.items())

        return log.prune(before, holds_a_last_commit, dry_run)

    def _rebuild_commits(self) -> None:
        """Each group's commit with the highest sequence, over every log's frames."""
        self._commits = {}
        for log in self._logs.values():
            for group, (consumed, seq) in log.commits().items():
                if group not in self._commits or seq > self._commits[group][1]:
                    self._commits[group] = (consumed, seq)
        self._txn_seq = max((seq for _, seq in self._commits.values()), default=0)

    async def close(self) -> None:
        borrowed, self._borrowed = self._borrowed, []
        for peer in borrowed:
            await peer.close()
        logs = self._logs
        try:
            self._close_all(logs.values(), mark=True)
        finally:
            self._logs = {}

    def _close_all(self, logs: Iterable[FileLog], mark: bool = False) -> None:
        """Close (and sync) every log, then (``mark``) record the high water, then release the
        lock, even if a close fails."""
        try:
            for log in logs:
                log.close()
            if mark:
                self._mark_high_water()
        finally:
            if self._lock_fd is not None:
                os.close(self._lock_fd)  # releases the flock
                self._lock_fd = None

    def log(self, name: str) -> FileLog:
        if not self._logs:
            raise LogClosedError(f"file log store {self.directory} is not open")
        return pick_log(self._logs, name)

    async def append_transactional(
        self, name: str, messages: Sequence[Message], *, group: str, consumed: int
    ) -> int:
        target = self.log(name)
        for log in self._logs.values():
            if log is not target:
                log.sync()  # what the commit depends on is durable before the commit is
        first = self._commit_frame(target, messages, group, consumed)
        self._mark_high_water(time.monotonic())
        return first

    def _commit_frame(self, target: FileLog, messages: Sequence[Message], group: str, consumed: int) -> int:
        """One frame of ``messages`` with the commit record of ``group``, synced."""
        seq = self._txn_seq + 1
        first = target.append_now(messages, (group, consumed, seq))
        target.sync()
        self._txn_seq = seq
        self._commits[group] = (consumed, seq)
        return first

    # -- across shards: the outbox ----------------------------------------------------------------

    def for_shard(self, shard: Shard) -> FileLogStore:
        """The store of ``shard`` over the same log directory and options, shared by the stores of
        this process (the same object each time; open it before use)."""
        found = self._peers.get(shard)
        if found is not None:
            return found
        clock, fsync, segment_bytes, interval, max_frame = self._options
        return FileLogStore(self.base, shard=shard, peers=self._peers, clock=clock, fsync=fsync,
                            segment_bytes=segment_bytes, index_interval_bytes=interval,
                            max_frame_bytes=max_frame, read_only=self.config.read_only)

    async def _open_peer(self, shard: Shard) -> FileLogStore:
        """``shard``'s store, opened (its lock taken) here if no store of this process has it."""
        peer = self.for_shard(shard)
        if not peer._logs:
            await peer.open()
            self._borrowed.append(peer)
        return peer

    def _load_outbox(self) -> None:
        """On open: keep the outbox of a committed cross-shard append (to redo), drop the intent
        of one whose commit frame never made it (nothing was written anywhere else)."""
        outbox = _read_outbox(self.directory / OUTBOX_NAME)
        if outbox is None:
            return
        committed = self._commits.get(outbox.group)
        if committed is not None and committed[1] >= outbox.seq:
            self._outbox = outbox
        else:
            (self.directory / OUTBOX_NAME).unlink()

    async def recover(self) -> None:
        """Write the batches of a committed outbox its targets have not recorded yet."""
        outbox = self._outbox
        if outbox is None:
            return
        for remote in outbox.remotes:
            peer = await self._open_peer(Shard(remote.kind, remote.partition))  # type: ignore[arg-type]
            self._redo(peer, remote, outbox.seq)
        (self.directory / OUTBOX_NAME).unlink(missing_ok=True)
        self._outbox = None

    def _redo(self, peer: FileLogStore, remote: _Remote, seq: int) -> int:
        """Append ``remote`` to ``peer`` as one frame recording ``seq``, unless it already has."""
        group = f"{OUTBOX_GROUP}{self.shard}:{remote.name}"
        done = peer._commits.get(group)
        if done is not None and done[0] >= seq:
            return -1
        return peer._commit_frame(peer.log(remote.name), remote.messages, group, seq)

    async def append_transactional_many(
        self, appends: Mapping[Target, Sequence[Message]], *, group: str, consumed: int
    ) -> dict[Target, int]:
        await self.recover()
        own = {name: list(m) for (shard, name), m in appends.items() if shard == self.shard}
        remotes = [_Remote(shard.kind, shard.partition, name, list(m))
                   for (shard, name), m in appends.items() if shard != self.shard and m]
        if len(own) > 1:  # one frame is the commit point: it holds all of this shard's records
            raise LogError(f"a cross-shard append writes at most one log of its own shard, not {sorted(own)}")
        for name in own:
            self.log(name)  # an unknown log is refused before anything is written
        peers = [await self._open_peer(Shard(r.kind, r.partition)) for r in remotes]  # type: ignore[arg-type]
        for peer, remote in zip(peers, remotes, strict=True):
            peer.log(remote.name)
        firsts: dict[Target, int] = {}
        if remotes:
            self._outbox = _Outbox(self._txn_seq + 1, group, remotes)
            _write_outbox(self.directory / OUTBOX_NAME, self._outbox)
        for log in self._logs.values():
            log.sync()
        name = next(iter(own), INPUTS)
        first = self._commit_frame(self.log(name), own.get(name, []), group, consumed)  # the commit point
        if name in own:
            firsts[(self.shard, name)] = first
        for peer, remote in zip(peers, remotes, strict=True):
            firsts[(peer.shard, remote.name)] = self._redo(peer, remote, self._txn_seq)
        if remotes:
            (self.directory / OUTBOX_NAME).unlink()
            self._outbox = None
        self._mark_high_water(time.monotonic())
        return firsts

    async def committed_offset(self, group: str) -> int | None:
        if not self._logs:
            raise LogClosedError(f"file log store {self.directory} is not open")
        if self.config.read_only:
            for log in self._logs.values():
                log.refresh()
            self._rebuild_commits()
        found = self._commits.get(group)
        return None if found is None else found[0]
