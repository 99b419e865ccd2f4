"""Fault and format tests of the file log (the shared contract runs in ``test_contract.py``)."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import fleetlog.log.file as file_log
from fleetlog.log.base import DEAD_LETTERS, DECISIONS, INPUTS, LogClosedError, LogError, Message, Record
from fleetlog.log.file import HEADER_SIZE, FileLogStore, RecoveryWarning
from tests.log.conftest import ManualClock


def msgs(n: int, start: int = 0, size: int = 0) -> list[Message]:
    return [Message(value=b"m%d" % (start + i) + b"." * size) for i in range(n)]


def segments(directory: Path, name: str = INPUTS) -> list[Path]:
    return sorted((directory / name).glob("*.log"))


def values(records: list[Record]) -> list[bytes]:
    return [r.value.rstrip(b".") for r in records]


@pytest.fixture
def directory(tmp_path: Path) -> Path:
    return tmp_path / "log"


async def opened(directory: Path, **kwargs: object) -> FileLogStore:
    store = FileLogStore(directory, **kwargs)  # type: ignore[arg-type]
    await store.open()
    return store


async def reopen_quietly(directory: Path, **kwargs: object) -> FileLogStore:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecoveryWarning)
        return await opened(directory, **kwargs)


async def write_batches(directory: Path, sizes: list[int], name: str = INPUTS) -> list[int]:
    """Append one batch per size; return the byte position each frame starts at, then the end."""
    store = await opened(directory)
    path = segments(directory, name)[0]
    positions = [0]
    start = 0
    for n in sizes:
        await store.log(name).append(msgs(n, start))
        start += n
        positions.append(path.stat().st_size)
    await store.close()
    return positions


async def read_values(store: FileLogStore, name: str = INPUTS, offset: int = 0) -> list[bytes]:
    return values(await store.log(name).read(offset, max_records=1_000_000))


# -- (1) torn or corrupt tails are reported, truncated, and lose no complete frame -----------


def _cut_mid_payload(path: Path, last: int, end: int) -> None:
    os.truncate(path, end - 7)


def _cut_mid_header(path: Path, last: int, end: int) -> None:
    os.truncate(path, last + 10)


def _flip_payload_byte(path: Path, last: int, end: int) -> None:
    data = bytearray(path.read_bytes())
    data[last + HEADER_SIZE + 3] ^= 0x40
    path.write_bytes(bytes(data))


def _append_zeros(path: Path, last: int, end: int) -> None:
    with open(path, "ab") as f:
        f.write(bytes(100))


def _append_garbage(path: Path, last: int, end: int) -> None:
    with open(path, "ab") as f:
        f.write(b"this is not a frame header, it is garbage" * 3)


Damage = Callable[[Path, int, int], None]

# (damage, does the last complete frame survive, expected reason)
TAIL_CASES: list[tuple[Damage, bool, str]] = [
    (_cut_mid_payload, False, "torn frame payload"),
    (_cut_mid_header, False, "torn frame header"),
    (_flip_payload_byte, False, "crc mismatch"),
    (_append_zeros, True, "zero-filled tail"),
    (_append_garbage, True, "bad magic"),
]


@pytest.mark.parametrize(("damage", "last_survives", "reason"), TAIL_CASES)
async def test_torn_tail_is_reported_truncated_and_appends_continue(
    directory: Path, damage: Damage, last_survives: bool, reason: str
) -> None:
    positions = await write_batches(directory, [2, 3, 4])
    path = segments(directory)[0]
    damage(path, positions[2], positions[3])
    damaged_size = path.stat().st_size
    cut_at = positions[3] if last_survives else positions[2]
    kept = 9 if last_survives else 5

    with pytest.warns(RecoveryWarning, match=reason):
        store = await opened(directory)
    (cut,) = store.recovery.truncations
    expected_cut = (INPUTS, path, cut_at, damaged_size - cut_at)
    assert (cut.log, cut.file, cut.position, cut.bytes_truncated) == expected_cut
    assert reason in cut.reason
    assert cut.applied
    assert store.recovery.for_log(DECISIONS) == []
    assert path.stat().st_size == cut_at
    assert await read_values(store) == [b"m%d" % i for i in range(kept)]
    assert await store.log(INPUTS).append(msgs(2, 100)) == kept
    await store.close()

    store = await opened(directory)
    assert store.recovery.clean
    assert await read_values(store) == [b"m%d" % i for i in range(kept)] + [b"m100", b"m101"]
    await store.close()


async def test_corruption_followed_by_a_valid_frame_is_not_a_tail(directory: Path) -> None:
    positions = await write_batches(directory, [2, 3, 4])
    path = segments(directory)[0]
    data = bytearray(path.read_bytes())
    data[positions[1] + HEADER_SIZE + 2] ^= 0x01  # the middle frame
    path.write_bytes(bytes(data))
    with pytest.raises(LogError, match=rf"{path.name} at byte {positions[1]} \(crc mismatch\).*valid frame"):
        await opened(directory)
    assert path.stat().st_size == positions[3]  # nothing was truncated


async def test_torn_whole_segment_tail_after_a_roll(directory: Path) -> None:
    store = await opened(directory, segment_bytes=300)
    for i in range(6):
        await store.log(INPUTS).append(msgs(3, 3 * i, size=20))
    await store.close()
    *_, last = segments(directory)
    with open(last, "ab") as f:
        f.write(b"\x00" * 10)
    store = await reopen_quietly(directory, segment_bytes=300)
    assert [c.file for c in store.recovery.truncations] == [last]
    assert await read_values(store) == [b"m%d" % i for i in range(18)]
    await store.close()


async def test_empty_segment_left_by_a_crash_mid_roll_is_dropped(directory: Path) -> None:
    store = await opened(directory, segment_bytes=300)
    for i in range(4):
        await store.log(INPUTS).append(msgs(3, 3 * i, size=20))
    await store.close()
    *_, last = segments(directory)
    os.truncate(last, last.stat().st_size - 5)  # unsynced tail lost ...
    empty = last.with_name(f"{int(last.stem) + 6:020d}.log")
    empty.touch()  # ... though the next segment's creation reached the disk
    store = await reopen_quietly(directory, segment_bytes=300)
    assert not empty.exists()
    assert [c.file for c in store.recovery.truncations] == [last]
    assert await read_values(store) == [b"m%d" % i for i in range(9)]
    await store.close()


# -- (2) corruption in a sealed (non-last) segment is an error, never silently dropped ------


async def _two_segments(directory: Path) -> Path:
    store = await opened(directory, segment_bytes=400)
    for i in range(8):
        await store.log(INPUTS).append(msgs(4, 4 * i, size=10))
    await store.close()
    assert len(segments(directory)) >= 2
    return segments(directory)[0]


def _flip(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0x10
    path.write_bytes(bytes(data))


async def test_corrupt_sealed_segment_without_index_fails_to_open(directory: Path) -> None:
    first = await _two_segments(directory)
    _flip(first, first.stat().st_size - 5)
    first.with_suffix(".index").unlink()
    with pytest.raises(LogError, match=rf"sealed segment .*{first.name} at byte \d+: crc mismatch"):
        await opened(directory)
    # the lock was released: a clean open works once the damage is repaired
    _flip(first, first.stat().st_size - 5)
    store = await opened(directory)
    assert await read_values(store) == [b"m%d" % i for i in range(32)]
    await store.close()


async def test_corrupt_sealed_segment_with_index_fails_on_read(directory: Path) -> None:
    first = await _two_segments(directory)
    _flip(first, HEADER_SIZE + 3)  # payload of the first frame; the index is still valid
    store = await opened(directory)
    assert store.recovery.clean
    with pytest.raises(LogError, match=rf"{first.name} at byte 0: crc mismatch"):
        await store.log(INPUTS).read(1)
    await store.close()


async def test_truncated_sealed_segment_fails_to_open(directory: Path) -> None:
    first = await _two_segments(directory)
    os.truncate(first, first.stat().st_size - 3)  # the index no longer matches: rescanned
    with pytest.raises(LogError, match=rf"{first.name} at byte \d+: torn frame payload"):
        await opened(directory)


async def test_missing_segment_is_a_gap_error(directory: Path) -> None:
    store = await opened(directory, segment_bytes=200)
    for i in range(10):
        await store.log(INPUTS).append(msgs(3, 3 * i, size=10))
    await store.close()
    files = segments(directory)
    assert len(files) >= 3
    files[1].unlink()
    with pytest.raises(LogError, match="missing or damaged segment"):
        await opened(directory)


# -- (3) segment rolling: reads across segments from every offset ---------------------------


async def test_segments_roll_and_reads_cross_them_from_every_offset(directory: Path) -> None:
    store = await opened(directory, segment_bytes=500, index_interval_bytes=64)
    total = 0
    for i in range(40):
        n = 1 + i % 7
        await store.log(INPUTS).append(msgs(n, total, size=15))
        total += n
    expected = [b"m%d" % i for i in range(total)]
    files = segments(directory)
    assert len(files) > 5
    assert all(f.stat().st_size <= 500 for f in files)
    assert [int(f.stem) for f in files] == sorted(int(f.stem) for f in files)
    await _check_every_offset(store, expected)
    await store.close()

    store = await opened(directory, segment_bytes=500, index_interval_bytes=64)
    assert store.recovery.indexes_rebuilt == ()  # sealed segments loaded from their .index files
    await _check_every_offset(store, expected)
    assert await store.log(INPUTS).append(msgs(1, total)) == total
    await store.close()


async def _check_every_offset(store: FileLogStore, expected: list[bytes]) -> None:
    log = store.log(INPUTS)
    assert await log.end_offset() == len(expected)
    for offset in range(len(expected)):
        for limit in (1, 5, 1000):
            got = await log.read(offset, max_records=limit)
            assert [r.offset for r in got] == list(range(offset, min(offset + limit, len(expected))))
            assert values(got) == expected[offset : offset + limit]


async def test_segment_base_offsets_name_the_files(directory: Path) -> None:
    store = await opened(directory, segment_bytes=100)
    for i in range(3):
        await store.log(INPUTS).append(msgs(2, 2 * i, size=40))
    await store.close()
    assert [f.name for f in segments(directory)] == [f"{b:020d}.log" for b in (0, 2, 4)]


# -- (4) reading from inside a batch frame --------------------------------------------------


async def test_read_from_the_middle_of_a_batch_frame(directory: Path) -> None:
    store = await opened(directory)
    log = store.log(INPUTS)
    await log.append(msgs(100))
    await log.append(msgs(50, 100))
    assert values(await log.read(37, max_records=5)) == [b"m%d" % i for i in range(37, 42)]
    decoded = log.stats.frames_decoded
    assert values(await log.read(42, max_records=3)) == [b"m42", b"m43", b"m44"]
    assert log.stats.frames_decoded == decoded  # the last decoded frame is cached
    spanning = await log.read(95, max_records=10)
    assert [r.offset for r in spanning] == list(range(95, 105))
    assert values(spanning) == [b"m%d" % i for i in range(95, 105)]
    assert values(await log.read(149)) == [b"m149"]
    assert await log.read(150) == []
    await store.close()


# -- (5) the sparse index: a late offset is found without scanning from the start ------------


async def test_sparse_index_seeks_near_the_frame(directory: Path) -> None:
    store = await opened(directory, index_interval_bytes=4096)
    log = store.log(INPUTS)
    for i in range(3000):
        await log.append(msgs(1, i, size=100))
    await _check_seek(store)
    await store.close()
    store = await opened(directory, index_interval_bytes=4096)  # the index is rebuilt by the scan
    await _check_seek(store)
    await store.close()


async def _check_seek(store: FileLogStore) -> None:
    log = store.log(INPUTS)
    size = segments(store.directory)[0].stat().st_size
    frame_bytes = size // 3000
    index = log.index_entries()
    assert size // (4096 + frame_bytes) <= len(index) <= size // 4096 + 1
    assert all(b[2] - a[2] >= 4096 for a, b in itertools.pairwise(index))
    before = log.stats.headers_read
    assert values(await log.read(2990, max_records=3)) == [b"m2990", b"m2991", b"m2992"]
    assert log.stats.headers_read - before <= 4096 // frame_bytes + 2  # not ~2990


async def test_lost_index_file_is_rebuilt(directory: Path) -> None:
    first = await _two_segments(directory)
    index = first.with_suffix(".index")
    index.write_bytes(b"\x00" * 12)  # invalid: rebuilt by a scan
    store = await opened(directory)
    assert store.recovery.indexes_rebuilt == (index,)
    assert await read_values(store) == [b"m%d" % i for i in range(32)]
    await store.close()
    store = await opened(directory)
    assert store.recovery.indexes_rebuilt == ()
    await store.close()


# -- (6) one writer per directory -----------------------------------------------------------


async def test_second_store_on_the_same_directory_is_refused(directory: Path) -> None:
    store = await opened(directory)
    with pytest.raises(LogError, match=rf"{directory} is already open .*pid {os.getpid()}, this process"):
        await opened(directory)
    await store.log(INPUTS).append(msgs(1))  # the first store is unaffected
    await store.close()
    second = await opened(directory)
    assert await read_values(second) == [b"m0"]
    await second.close()


_CHILD_WRITER = """
import asyncio, sys
from fleetlog.log.base import Message
from fleetlog.log.file import FileLogStore

async def main() -> None:
    store = FileLogStore(sys.argv[1], fsync="never")
    await store.open()
    print("ready", flush=True)
    sys.stdin.readline()
    await store.log("inputs").append([Message(value=b"from-child")])
    print("appended", flush=True)
    sys.stdin.readline()
    await store.close()

asyncio.run(main())
"""


@pytest.fixture
def child_writer(directory: Path) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD_WRITER, str(directory)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    yield proc
    proc.kill()
    proc.wait()


async def test_lock_names_another_process_and_read_only_follows_it(
    directory: Path, child_writer: subprocess.Popen[str]
) -> None:
    with pytest.raises(LogError, match=rf"already open .*pid {child_writer.pid}\)"):
        await opened(directory)
    reader = await opened(directory, read_only=True)
    with pytest.raises(LogError, match="read-only"):
        await reader.log(INPUTS).append(msgs(1))
    assert await reader.log(INPUTS).read(0, timeout_ms=60) == []
    assert child_writer.stdin is not None
    child_writer.stdin.write("\n")
    child_writer.stdin.flush()
    got = await reader.log(INPUTS).read(0, timeout_ms=10_000)  # seen by polling the file
    assert [r.value for r in got] == [b"from-child"]
    await reader.close()


# -- (7) timestamps come from the injected clock and never go backwards ---------------------


async def test_timestamps_from_the_clock_once_per_append_and_monotonic(directory: Path) -> None:
    clock = ManualClock(1_000)
    calls = 0

    def counting() -> int:
        nonlocal calls
        calls += 1
        return clock()

    store = await opened(directory, clock=counting)
    log = store.log(INPUTS)
    for now in (1_000, 2_000, 1_500, 2_500):
        clock.now_ms = now
        await log.append(msgs(3))
    assert calls == 4
    await log.append([])
    assert calls == 4  # an empty append writes no frame and reads no clock
    stamps = [r.timestamp_ms for r in await log.read(0)]
    assert stamps == [1_000] * 3 + [2_000] * 3 + [2_000] * 3 + [2_500] * 3
    await store.close()

    clock.now_ms = 10  # the clock went back across a restart
    store = await opened(directory, clock=counting)
    await store.log(INPUTS).append(msgs(1))
    assert (await store.log(INPUTS).read(12))[0].timestamp_ms == 2_500
    await store.close()


# -- (8) fsync policies -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "plain_syncs", "txn_syncs"),
    [("never", 0, 0), ("batch", 0, 2), ("always", 3, 1)],
)
async def test_fsync_policies(
    directory: Path, monkeypatch: pytest.MonkeyPatch, policy: str, plain_syncs: int, txn_syncs: int
) -> None:
    synced: list[int] = []
    monkeypatch.setattr(file_log, "_datasync", synced.append)
    store = await opened(directory, fsync=policy)
    for i in range(3):
        await store.log(INPUTS).append(msgs(2, 2 * i))
    assert len(synced) == plain_syncs
    # batch: the inputs the commit depends on are synced, then the commit itself
    await store.append_transactional(DECISIONS, msgs(1), group="g", consumed=6)
    assert len(synced) == plain_syncs + txn_syncs
    await store.close()
    store = await opened(directory, fsync=policy)
    assert await store.committed_offset("g") == 6
    assert len(await read_values(store)) == 6
    await store.close()


def test_invalid_fsync_policy_and_sizes_are_rejected(directory: Path) -> None:
    with pytest.raises(LogError, match="invalid fsync policy 'sometimes'"):
        FileLogStore(directory, fsync="sometimes")  # type: ignore[arg-type]
    with pytest.raises(LogError, match="segment_bytes must be positive"):
        FileLogStore(directory, segment_bytes=0)


# -- (9) transactions: the frame is the commit ---------------------------------------------


async def test_torn_transactional_frame_loses_its_commit(directory: Path) -> None:
    store = await opened(directory)
    await store.log(INPUTS).append(msgs(10))
    await store.append_transactional(DECISIONS, msgs(2, size=5), group="g", consumed=4)
    await store.append_transactional(DECISIONS, [], group="h", consumed=5)
    path = segments(directory, DECISIONS)[0]
    kept = path.stat().st_size
    await store.append_transactional(DECISIONS, msgs(3, 2), group="g", consumed=8)
    await store.close()
    os.truncate(path, path.stat().st_size - 2)

    with pytest.warns(RecoveryWarning, match="decisions"):
        store = await opened(directory)
    (cut,) = store.recovery.truncations
    assert (cut.log, cut.position) == (DECISIONS, kept)
    assert await store.committed_offset("g") == 4
    assert await store.committed_offset("h") == 5
    assert await store.log(DECISIONS).end_offset() == 2
    assert await store.append_transactional(DECISIONS, msgs(1, 9), group="g", consumed=9) == 2
    await store.close()
    store = await opened(directory)
    assert await store.committed_offset("g") == 9
    await store.close()


async def test_torn_empty_commit_falls_back_too(directory: Path) -> None:
    store = await opened(directory)
    await store.append_transactional(DECISIONS, [], group="g", consumed=1)
    await store.append_transactional(DECISIONS, [], group="g", consumed=2)
    await store.close()
    path = segments(directory, DECISIONS)[0]
    os.truncate(path, path.stat().st_size - 1)
    store = await reopen_quietly(directory)
    assert await store.committed_offset("g") == 1
    assert await store.log(DECISIONS).end_offset() == 0
    await store.close()


async def test_commits_survive_rolls_index_loss_and_span_logs(directory: Path) -> None:
    store = await opened(directory, segment_bytes=300)
    for i in range(20):
        await store.append_transactional(DECISIONS, msgs(2, 2 * i, size=20), group="g", consumed=i)
    await store.append_transactional(DEAD_LETTERS, msgs(1), group="g", consumed=50)  # the latest wins
    await store.append_transactional(DECISIONS, msgs(1), group="other", consumed=3)
    await store.close()
    assert len(segments(directory, DECISIONS)) > 3
    for index in (directory / DECISIONS).glob("*.index"):
        index.unlink()
    store = await opened(directory, segment_bytes=300)
    assert await store.committed_offset("g") == 50
    assert await store.committed_offset("other") == 3
    await store.close()


# -- limits, types and lifecycle ------------------------------------------------------------


async def test_oversized_batch_is_refused(directory: Path) -> None:
    store = await opened(directory, max_frame_bytes=1024)
    log = store.log(INPUTS)
    with pytest.raises(LogError, match=r"over the 1024-byte frame limit"):
        await log.append([Message(value=b"x" * 2000)])
    assert await log.append(msgs(1)) == 0
    await store.close()


async def test_values_that_would_not_round_trip_are_refused(directory: Path) -> None:
    store = await opened(directory)
    with pytest.raises(LogError, match="values must be bytes"):
        await store.log(INPUTS).append([Message(value="text")])  # type: ignore[arg-type]
    with pytest.raises(LogError, match="headers must be"):
        await store.log(INPUTS).append([Message(value=b"", headers=(("h", "text"),))])  # type: ignore[arg-type]
    assert await store.log(INPUTS).end_offset() == 0
    await store.close()


async def test_closed_log_refuses_reads_and_appends(directory: Path) -> None:
    store = await opened(directory)
    log = store.log(INPUTS)
    await store.close()
    await store.close()  # idempotent
    with pytest.raises(LogClosedError):
        await log.read(0)
    with pytest.raises(LogClosedError):
        await log.append(msgs(1))
    with pytest.raises(LogClosedError):
        store.log(INPUTS)


async def test_read_only_store_does_not_truncate(directory: Path) -> None:
    positions = await write_batches(directory, [2, 3])
    path = segments(directory)[0]
    os.truncate(path, positions[2] - 4)
    with pytest.warns(RecoveryWarning, match="ignored"):
        reader = await opened(directory, read_only=True)
    (cut,) = reader.recovery.truncations
    assert not cut.applied
    assert path.stat().st_size == positions[2] - 4
    assert await read_values(reader) == [b"m0", b"m1"]
    await reader.close()
    with pytest.raises(LogError, match="no file log"):
        await opened(directory.parent / "missing", read_only=True)


async def test_prune_deletes_whole_sealed_segments_and_keeps_a_groups_last_commit(directory: Path) -> None:
    """``prune`` deletes sealed segments ending at or before the bound (never the active one),
    the log then starts at the first kept offset (a read before it is refused); a segment that
    holds a consumer group's last commit is kept, and everything after it (the commit survives
    a reopen)."""
    from fleetlog.log.base import OffsetOutOfRangeError

    store = FileLogStore(directory, segment_bytes=256, fsync="never")
    await store.open()
    for i in range(40):
        await store.log(INPUTS).append([Message(b"input-%03d" % i)])
    await store.append_transactional(DECISIONS, [Message(b"d-0")], group="old", consumed=5)
    for i in range(40):
        await store.append_transactional(DECISIONS, [Message(b"d-%03d" % (i + 1))], group="new", consumed=i)
    inputs_segments = sorted(p.name for p in (directory / INPUTS).glob("*.log"))
    gone = store.prune(INPUTS, 20, dry_run=True)
    assert gone
    assert sorted(p.name for p in (directory / INPUTS).glob("*.log")) == inputs_segments  # dry run
    assert store.prune(INPUTS, 20) == gone
    start = gone[-1][1]
    assert 0 < start <= 20
    assert await store.log(INPUTS).start_offset() == start
    assert (await store.log(INPUTS).read(start, 1))[0].value == b"input-%03d" % start
    with pytest.raises(OffsetOutOfRangeError, match="before the start of the log"):
        await store.log(INPUTS).read(start - 1, 1)
    assert store.prune(INPUTS, 10**6)[-1][1] < 40  # the active segment stays
    assert store.prune(DECISIONS, 41) == []  # "old"'s last commit is in the first segment
    await store.close()
    again = FileLogStore(directory, segment_bytes=256, fsync="never")
    await again.open()
    assert await again.committed_offset("old") == 5
    assert await again.log(INPUTS).start_offset() > 0
    await again.close()
