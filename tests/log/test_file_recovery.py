"""The file log says what opening it cut (torn write or bit rot, which offsets) and keeps its
files private whatever the umask."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetlog.log.base import DECISIONS, INPUTS, Message
from fleetlog.log.file import (
    HEADER_SIZE,
    INTENT_NAME,
    TRUNCATIONS_NAME,
    FileLogStore,
    HandOverError,
    RecoveryWarning,
    announce_intent,
    waiting_service,
    withdraw_intent,
)
from fleetlog.log.snapshots import DirectorySnapshots, Snapshot, SnapshotHeader, encode_snapshot
from tests.service.process import REPO


def msgs(n: int, start: int = 0) -> list[Message]:
    return [Message(value=b"m%d" % (start + i)) for i in range(n)]


async def three_frames(directory: Path) -> tuple[Path, list[int]]:
    """Frames of 3, 4 and 5 records in the inputs log: (segment, frame start positions + end)."""
    store = FileLogStore(directory, fsync="never")
    await store.open()
    segment = next((directory / INPUTS).glob("*.log"))
    positions = [0]
    start = 0
    for n in (3, 4, 5):
        await store.log(INPUTS).append(msgs(n, start))
        start += n
        positions.append(segment.stat().st_size)
    await store.close()
    return segment, positions


async def reopen(directory: Path) -> FileLogStore:
    store = FileLogStore(directory, fsync="never")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecoveryWarning)
        await store.open()
    return store


def report_lines(directory: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (directory / TRUNCATIONS_NAME).read_text().splitlines()]


async def test_a_torn_write_is_reported_as_torn_with_the_lost_offsets(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    segment, positions = await three_frames(directory)
    os.truncate(segment, positions[3] - 7)  # the last frame (offsets 7..11) cut short
    store = await reopen(directory)
    try:
        (cut,) = store.recovery.truncations
        assert (cut.kind, cut.first_lost_offset, cut.records_claimed) == ("torn", 7, 5)
        assert cut.reason.startswith("torn frame payload")
        assert "torn" in str(cut)
        assert "offsets 7..11" in str(cut)
        assert await store.log(INPUTS).end_offset() == 7
    finally:
        await store.close()
    (line,) = report_lines(directory)
    assert line["kind"] == "torn"
    assert line["log"] == INPUTS
    assert (line["first_lost_offset"], line["records_claimed"]) == (7, 5)
    assert line["position"] == positions[2]
    assert line["bytes"] == positions[3] - 7 - positions[2]


async def test_bit_rot_in_the_last_frame_is_reported_as_corrupt_not_torn(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    segment, positions = await three_frames(directory)
    data = bytearray(segment.read_bytes())
    data[positions[2] + HEADER_SIZE + 3] ^= 0x01  # one bit of the last frame's payload
    segment.write_bytes(bytes(data))
    store = await reopen(directory)
    try:
        (cut,) = store.recovery.truncations
        assert (cut.kind, cut.reason, cut.first_lost_offset) == ("corrupt", "crc mismatch", 7)
        assert "corrupt" in str(cut)
    finally:
        await store.close()
    assert [line["kind"] for line in report_lines(directory)] == ["corrupt"]


async def test_a_zero_filled_tail_is_torn_and_an_unreadable_header_claims_no_count(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    segment, _ = await three_frames(directory)
    with segment.open("ab") as f:
        f.write(bytes(4096))
    store = await reopen(directory)
    try:
        (cut,) = store.recovery.truncations
        assert (cut.kind, cut.first_lost_offset, cut.records_claimed) == ("torn", 12, None)
        assert "every record from offset 12 on" in str(cut)
    finally:
        await store.close()
    second = await reopen(directory)  # the report survives: the next process sees it too
    try:
        assert second.recovery.clean
        assert [e["first_lost_offset"] for e in second.truncation_history()] == [12]
    finally:
        await second.close()


async def test_a_read_only_store_reports_but_neither_cuts_nor_persists(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    segment, positions = await three_frames(directory)
    os.truncate(segment, positions[3] - 1)
    store = FileLogStore(directory, read_only=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecoveryWarning)
        await store.open()
    try:
        (cut,) = store.recovery.truncations
        assert not cut.applied
        assert segment.stat().st_size == positions[3] - 1
    finally:
        await store.close()
    assert not (directory / TRUNCATIONS_NAME).exists()


# -- the hand-over marker ----------------------------------------------------------------------


WAITER = (
    "import sys; from pathlib import Path; from fleetlog.log.file import announce_intent; "
    "announce_intent(Path(sys.argv[1])); print('waiting', flush=True); sys.stdin.read()"
)


async def test_a_producer_store_gives_the_log_up_to_a_waiting_service(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    producer = FileLogStore(directory, fsync="never", yields=True)
    await producer.open()
    waiter = subprocess.Popen([sys.executable, "-c", WAITER, str(directory)], cwd=REPO,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        await producer.log(INPUTS).append(msgs(2))
        assert waiter.stdout is not None
        assert waiter.stdout.readline() == b"waiting\n"
        assert waiting_service(directory) == waiter.pid
        with pytest.raises(HandOverError, match=f"pid {waiter.pid}"):
            await producer.log(INPUTS).append(msgs(1, 2))
        assert await producer.log(INPUTS).end_offset() == 2  # nothing was written
        await producer.close()
        with pytest.raises(HandOverError):
            await FileLogStore(directory, yields=True).open()
        service = FileLogStore(directory)  # the service itself does not yield
        await service.open()
        await service.close()
    finally:
        waiter.kill()
        waiter.wait(10)
        await producer.close()
    assert waiting_service(directory) is None  # a dead waiter's marker is ignored
    again = FileLogStore(directory, yields=True)
    await again.open()
    await again.close()


def test_only_the_waiting_process_withdraws_its_marker(tmp_path: Path) -> None:
    announce_intent(tmp_path)
    assert (tmp_path / INTENT_NAME).read_text().strip() == str(os.getpid())
    assert waiting_service(tmp_path) is None  # this process's own marker does not stop it
    (tmp_path / INTENT_NAME).write_text("1\n")
    withdraw_intent(tmp_path)
    assert (tmp_path / INTENT_NAME).exists()
    announce_intent(tmp_path)
    withdraw_intent(tmp_path)
    assert not (tmp_path / INTENT_NAME).exists()


# -- file modes under umask 000 ------------------------------------------------------------------


@pytest.fixture
def umask_000() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in [root, *root.rglob("*")]}


@pytest.mark.usefixtures("umask_000")
async def test_under_umask_000_every_log_file_is_0600_and_every_directory_0700(tmp_path: Path) -> None:
    directory = tmp_path / "deep" / "log"
    store = FileLogStore(directory, segment_bytes=256, fsync="batch")
    await store.open()
    for i in range(10):
        await store.log(INPUTS).append(msgs(5, 5 * i))  # rolls: sealed segments get .index files
    await store.append_transactional(DECISIONS, msgs(1), group="g", consumed=50)
    await store.close()
    segment = sorted((directory / INPUTS).glob("*.log"))[-1]
    with segment.open("ab") as f:
        f.write(b"FLOG torn")
    store = await reopen(directory)  # writes truncations.jsonl
    await store.close()
    await DirectorySnapshots(directory / "snapshots").save(
        encode_snapshot(Snapshot(SnapshotHeader(50, 1, "default", 0), b"state")))
    announce_intent(directory)
    found = modes(tmp_path / "deep")
    kinds = {name.rsplit(".", 1)[-1] for name in found if "." in name}
    assert {"log", "index", "jsonl", "bin"} <= kinds
    assert {"log/LOCK", f"log/{INTENT_NAME}", f"log/{TRUNCATIONS_NAME}"} <= set(found)
    for name, mode in found.items():
        is_dir = (tmp_path / "deep" / name).is_dir()
        assert mode == (0o700 if is_dir else 0o600), f"{name}: {mode:04o}"


@pytest.mark.usefixtures("umask_000")
async def test_an_existing_world_writable_lock_or_segment_file_is_made_private(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    store = FileLogStore(directory)
    await store.open()
    await store.close()
    (directory / "LOCK").chmod(0o666)
    store = FileLogStore(directory)
    await store.open()
    await store.close()
    assert stat.S_IMODE((directory / "LOCK").stat().st_mode) == 0o600


async def test_a_producer_waits_a_bounded_time_for_a_waiting_service_then_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fleetlog.client as client_module
    from fleetlog.client import Client, ClientError
    from fleetlog.service.config import load_config

    directory = tmp_path / "log"
    monkeypatch.setattr(client_module, "HANDOVER_WAIT_S", 1.0)
    waiter = subprocess.Popen([sys.executable, "-c", WAITER, str(directory)], cwd=REPO,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert waiter.stdout is not None
        assert waiter.stdout.readline() == b"waiting\n"
        started = time.monotonic()
        with pytest.raises(ClientError, match="did not announce itself in 1 s") as caught:
            await Client.connect(load_config(None, {}, log_dir=str(directory)))
        assert caught.value.reason == "unreachable"
        assert 1.0 <= time.monotonic() - started < 5
    finally:
        waiter.kill()
        waiter.wait(10)
    store = FileLogStore(directory)
    await store.open()
    try:
        assert await store.log(INPUTS).end_offset() == 0  # nothing was appended behind its back
    finally:
        await store.close()
