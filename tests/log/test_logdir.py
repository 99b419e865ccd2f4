"""The one check behind every deletion: a directory holding a real file log (every kind of file
fleetlog writes in one) is recognised whole and removed only when asked; anything else in it —
at the top, inside a log's subdirectory, a symlink — makes it untouchable; a log held open by
another writer is never removed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fleetlog.log.base import DECISIONS, INPUTS, Message
from fleetlog.log.file import FileLogStore, RecoveryWarning, announce_intent
from fleetlog.log.logdir import LogDirError, UntrustedError, check_overwrite, prepare_log_dir, survey
from fleetlog.log.private import write_private
from fleetlog.log.snapshots import DirectorySnapshots, Snapshot, SnapshotHeader, encode_snapshot


async def full_log(directory: Path) -> Path:
    """A file log holding every kind of file fleetlog writes there: rolled segments and their
    indexes, a transactional commit, a torn tail recovered (``truncations.jsonl``), a snapshot,
    ``LOCK``, ``LOCK.intent`` and ``service.json``."""
    store = FileLogStore(directory, segment_bytes=256, fsync="batch")
    await store.open()
    for i in range(10):
        await store.log(INPUTS).append([Message(f"m{5 * i + k}".encode()) for k in range(5)])
    await store.append_transactional(DECISIONS, [Message(b"d")], group="g", consumed=50)
    await store.close()
    with sorted((directory / INPUTS).glob("*.log"))[-1].open("ab") as f:
        f.write(b"FLOG torn")
    store = FileLogStore(directory)
    with pytest.warns(RecoveryWarning, match="torn"):
        await store.open()  # recovers the torn tail: writes truncations.jsonl
    await store.close()
    await DirectorySnapshots(directory / "snapshots").save(
        encode_snapshot(Snapshot(SnapshotHeader(50, 1, "default", 0), b"state"))
    )
    announce_intent(directory)
    write_private(directory / "service.json", b'{"pid": 1, "http": "127.0.0.1:1"}')
    return directory


def tree(directory: Path) -> dict[str, bytes]:
    files = sorted(p for p in directory.rglob("*") if p.is_file())
    return {str(p.relative_to(directory)): p.read_bytes() for p in files}


async def test_every_file_of_a_real_log_is_fleetlogs_and_is_removed_only_when_asked(tmp_path: Path) -> None:
    directory = await full_log(tmp_path / "log")
    names = set(tree(directory))
    assert {"LOCK", "LOCK.intent", "truncations.jsonl", "service.json"} <= names
    assert any(n.startswith("snapshots/snapshot-") for n in names)
    assert any(n.endswith(".index") for n in names)
    found = survey(directory)
    assert found.foreign is None
    assert {str(p.relative_to(directory)) for p in found.owned if p.is_file()} == names
    before = tree(directory)
    with pytest.raises(LogDirError, match="holds a fleetlog log already; pass --force"):
        prepare_log_dir(directory, replace=False)
    assert tree(directory) == before
    prepare_log_dir(directory, replace=True)
    assert directory.is_dir()
    assert list(directory.iterdir()) == []


@pytest.mark.parametrize(
    ("intruder", "named"),
    [
        ("README.md", "'README.md'"),
        ("inputs/notes.txt", "'inputs/notes.txt'"),
        ("snapshots/snapshot-1.bin", "'snapshots/snapshot-1.bin'"),
        ("inputs/sub/00000000000000000000.log", "'inputs/sub'"),
        ("src/main.py", "'src'"),
        (".git/HEAD", "'.git'"),
    ],
)
async def test_a_log_with_anything_else_in_it_is_never_touched_even_with_force(
    tmp_path: Path, intruder: str, named: str
) -> None:
    directory = await full_log(tmp_path / "log")
    (directory / intruder).parent.mkdir(parents=True, exist_ok=True)
    (directory / intruder).write_text("the user's")
    before = tree(directory)
    refusal = rf"holds {named}, which is not a fleetlog log.*not even with --force"
    for replace in (False, True):
        with pytest.raises(LogDirError, match=refusal):
            prepare_log_dir(directory, replace=replace)
    assert tree(directory) == before


def test_a_symlink_is_foreign_wherever_it_is(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep")
    directory = tmp_path / "log"
    directory.mkdir()
    (directory / "LOCK").write_text("")
    (directory / "inputs").symlink_to(outside)
    with pytest.raises(LogDirError, match="'inputs'"):
        prepare_log_dir(directory, replace=True)
    (directory / "inputs").unlink()
    (directory / "inputs").mkdir()
    (directory / "inputs" / "00000000000000000000.log").symlink_to(outside / "precious")
    with pytest.raises(LogDirError, match=r"'inputs/00000000000000000000\.log'"):
        prepare_log_dir(directory, replace=True)
    assert (outside / "precious").read_text() == "keep"


def test_missing_and_empty_directories_are_fine_and_a_file_is_refused(tmp_path: Path) -> None:
    prepare_log_dir(tmp_path / "new", replace=False)
    assert not (tmp_path / "new").exists()  # nothing created, nothing removed
    (tmp_path / "empty").mkdir()
    prepare_log_dir(tmp_path / "empty", replace=False)
    (tmp_path / "file").write_text("x")
    with pytest.raises(LogDirError, match=r"--log .*file: not a directory"):
        prepare_log_dir(tmp_path / "file", replace=True)
    assert (tmp_path / "file").read_text() == "x"


async def test_a_log_another_writer_holds_open_is_never_removed(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    async with FileLogStore(directory) as store:
        await store.log(INPUTS).append([Message(b"x")])
        with pytest.raises(LogDirError, match=f"open in another process \\(pid {os.getpid()}\\)"):
            prepare_log_dir(directory, replace=True)
        assert (directory / INPUTS / "00000000000000000000.log").stat().st_size > 0
    prepare_log_dir(directory, replace=True)
    assert list(directory.iterdir()) == []


async def test_nested_logs_count_only_where_the_caller_says(tmp_path: Path) -> None:
    for name in ("seed-1", "seed-2"):
        await full_log(tmp_path / "runs" / name)
    with pytest.raises(LogDirError, match="'seed-1'"):
        prepare_log_dir(tmp_path / "runs", replace=True)
    (tmp_path / "runs" / "seed-2" / "mine.txt").write_text("x")
    with pytest.raises(LogDirError, match=r"'seed-2/mine\.txt'"):
        prepare_log_dir(tmp_path / "runs", replace=True, nested=lambda n: n.startswith("seed-"))
    (tmp_path / "runs" / "seed-2" / "mine.txt").unlink()
    prepare_log_dir(tmp_path / "runs", replace=True, nested=lambda n: n.startswith("seed-"))
    assert list((tmp_path / "runs").iterdir()) == []


def test_overwrite_only_our_own_files_and_only_when_asked(tmp_path: Path) -> None:
    ours, theirs = tmp_path / "summary.json", tmp_path / "plot.png"
    check_overwrite({ours: lambda _: True}, replace=False, flag="--report")  # missing: fine
    ours.write_text("{}")
    with pytest.raises(LogDirError, match="report of an earlier run; pass --force"):
        check_overwrite({ours: lambda _: True}, replace=False, flag="--report")
    check_overwrite({ours: lambda _: True}, replace=True, flag="--report")
    theirs.write_text("holiday")
    with pytest.raises(LogDirError, match=r"'plot\.png', which fleetlog did not write"):
        check_overwrite({theirs: lambda _: False}, replace=True, flag="--report")


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o770, 0o720])
async def test_a_writer_refuses_a_log_directory_others_may_write_and_a_reader_still_reads_it(
    tmp_path: Path, mode: int,
) -> None:
    directory = tmp_path / "log"
    async with FileLogStore(directory, fsync="never") as store:
        await store.log(INPUTS).append([Message(b"x")])
    directory.chmod(mode)
    with pytest.raises(UntrustedError, match=f"{directory}: mode d.* lets other users write it.*chmod 700"):
        await FileLogStore(directory, fsync="never").open()
    async with FileLogStore(directory, read_only=True) as store:  # replay appends nothing
        assert await store.log(INPUTS).end_offset() == 1
    directory.chmod(0o700)
    async with FileLogStore(directory, fsync="never") as store:
        assert await store.log(INPUTS).end_offset() == 1
