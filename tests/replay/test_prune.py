"""Retention of the file log: ``fleetlog log prune`` deletes whole segments before the newest
valid snapshot at or before a point, never past it; every replay command then starts from the
oldest snapshot the retained logs continue, says so, and refuses a point before it by naming
the first point available (docs/retention.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fleetlog.core.digest import digest, snapshot
from fleetlog.log.base import INPUTS
from fleetlog.log.file import FileLogStore
from fleetlog.log.snapshots import (
    DirectorySnapshots,
    Snapshot,
    SnapshotHeader,
    decode_snapshot,
    encode_snapshot,
)
from fleetlog.replay.prune import prune
from fleetlog.replay.source import ReplayError, open_file_source
from fleetlog.replay.state_at import Point, first_start, state_at
from fleetlog.replay.verify import verify
from tests.replay.scenario import ClockBox, record

REPO = Path(__file__).resolve().parents[2]


def in_process(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``fleetlog ARGV`` in this process: (exit code, stdout, stderr)."""
    from fleetlog.cli import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


async def _recorded(directory: Path, snapshot_round: int = 12) -> tuple[int, int]:
    """The scenario on a file log of small segments, with a snapshot after ``snapshot_round``;
    its (inputs, decisions) offsets."""
    clock = ClockBox()
    store = FileLogStore(directory, clock=clock, fsync="never", segment_bytes=2048)
    snapshots: list[bytes] = []
    await store.open()
    try:
        await record(store, clock, rounds=24, snapshot_at=snapshot_round, snapshots=snapshots)
    finally:
        await store.close()
    (data,) = snapshots
    await DirectorySnapshots(directory / "snapshots").save(data)
    header = decode_snapshot(data).header
    return header.inputs_offset, header.decisions_offset


async def _end_digest(directory: Path) -> str:
    source = await open_file_source(directory)
    try:
        end = await source.store.log(INPUTS).end_offset()
        return digest((await state_at(source, Point(offset=end))).state)
    finally:
        await source.close()


async def test_a_pruned_log_verifies_from_its_snapshot_and_refuses_points_before_it(tmp_path: Path) -> None:
    log = tmp_path / "log"
    inputs, decisions = await _recorded(log)
    before = await _end_digest(log)
    segments = len(list((log / INPUTS).glob("*.log")))
    assert segments > 3
    report = await prune(log, Point(offset=inputs + 5))
    assert report["inputs"]["segments_deleted"] > 0
    assert report["decisions"]["segments_deleted"] > 0
    assert 0 < report["inputs"]["start"] <= inputs
    assert 0 < report["decisions"]["start"] <= decisions
    assert report["inputs"]["records_deleted"] == report["inputs"]["start"]
    source = await open_file_source(log)
    try:
        assert await source.store.log(INPUTS).start_offset() == report["inputs"]["start"]
        notes: list[str] = []
        start = await first_start(source, notes)
        assert (start.inputs, start.decisions) == (inputs, decisions)
        assert "older history was pruned" in notes[0]
        assert "replay starts from the oldest snapshot" in notes[0]
        result = await verify(source)
        assert result.divergence is None
        assert result.batches > 0
        parallel = await verify(source, jobs=2)
        assert parallel.divergence is None  # type: ignore[attr-defined]
        with pytest.raises(ReplayError, match=f"before the retained history.*first point available is "
                                              f"inputs offset {inputs}"):
            await state_at(source, Point(offset=inputs - 1))
        assert digest((await state_at(source, Point(offset=inputs))).state) == digest(start.state)
    finally:
        await source.close()
    assert await _end_digest(log) == before  # the state at the end is the same as before the prune


async def test_prune_never_deletes_past_the_newest_valid_snapshot_before_the_point(tmp_path: Path) -> None:
    log = tmp_path / "log"
    inputs, _ = await _recorded(log)
    with pytest.raises(ReplayError, match=f"no valid snapshot at or before inputs offset {inputs - 1}"):
        await prune(log, Point(offset=inputs - 1))
    files = sorted(p.name for p in (log / INPUTS).glob("*.log"))
    dry = await prune(log, Point(offset=inputs), dry_run=True)
    assert dry["inputs"]["segments_deleted"] > 0
    assert sorted(p.name for p in (log / INPUTS).glob("*.log")) == files  # a dry run deletes nothing
    # a damaged snapshot is not one to keep history from
    (path,) = (log / "snapshots").glob("*.bin")
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(ReplayError, match="nothing was pruned"):
        await prune(log, Point(offset=inputs + 50))
    assert sorted(p.name for p in (log / INPUTS).glob("*.log")) == files


async def test_prune_refuses_a_log_a_service_holds(tmp_path: Path) -> None:
    log = tmp_path / "log"
    inputs, _ = await _recorded(log)
    held = FileLogStore(log)
    await held.open()
    try:
        with pytest.raises(ReplayError, match=r"in use .*prune runs with the service stopped"):
            await prune(log, Point(offset=inputs))
    finally:
        await held.close()


async def test_a_pruned_log_without_its_snapshot_says_there_is_nothing_to_replay_from(tmp_path: Path) -> None:
    log = tmp_path / "log"
    await _recorded(log)
    report = await prune(log, Point(offset=10**6))
    assert report["inputs"]["start"] > 0
    for path in (log / "snapshots").glob("*.bin"):
        path.unlink()
    source = await open_file_source(log)
    try:
        with pytest.raises(ReplayError, match=r"older history was pruned.*nothing to replay from"):
            await verify(source)
    finally:
        await source.close()


def test_the_command_prunes_prints_json_and_gives_usage_errors_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import asyncio

    log = tmp_path / "log"
    inputs, _ = asyncio.run(_recorded(log))

    def fleetlog(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "fleetlog.cli", *args], cwd=REPO, capture_output=True,
                              text=True, timeout=120, check=False)

    bad = fleetlog("log", "prune", "--before", "yesterday", "--log", str(log))
    assert bad.returncode == 2
    assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    assert "neither an offset" in bad.stderr
    early = fleetlog("log", "prune", "--before", "3", "--log", str(log))
    assert early.returncode == 2
    assert "no valid snapshot at or before inputs offset 3" in early.stderr
    done = fleetlog("log", "prune", "--before", str(inputs), "--log", str(log), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["inputs"]["start"] > 0
    assert report["snapshot"].endswith(".bin")
    verified = fleetlog("replay", "verify", "--log", str(log))
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "older history was pruned" in verified.stderr
    # every replay command starts from the snapshot and says so
    late = "j230"  # (submitted after the snapshot: its story is in the retained logs)
    for args in (("explain", late), ("what-if", "--policy", "fgd"),
                 ("timeline", "--out", str(tmp_path / "t.json")),
                 ("report", "--out", str(tmp_path / "report")), ("state-at", str(inputs + 1))):
        code, out, err = in_process(capsys, "replay", *args, "--log", str(log))  # (in this process: faster)
        assert code == 0, (args, out, err)
        assert "older history was pruned" in err, args
    before = fleetlog("replay", "state-at", str(inputs - 1), "--log", str(log))
    assert before.returncode == 2
    assert f"the first point available is inputs offset {inputs}" in before.stderr
    status = fleetlog("status", "j000", "--log", str(log), "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["state"] == "succeeded"  # (j000 ended before its cancel came)


async def test_the_status_of_a_retired_job_is_read_from_the_logs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A job that retired from the state still has a status (from its events), and one whose
    submission was pruned away says so rather than "unknown job"."""
    import argparse

    from fleetlog.core.policy import Policy
    from fleetlog.core.state import CoreConfig
    from fleetlog.events import TaskFinished, encode, envelope
    from fleetlog.log.base import Message
    from fleetlog.replay import handlers
    from fleetlog.service.loop import LoopConfig, SchedulerLoop
    from tests.core.builders import job, node

    core = CoreConfig(node_timeout_ms=4_000, retain_finished_ms=1_000)
    clock = ClockBox()
    log = tmp_path / "log"
    store = FileLogStore(log, clock=clock, fsync="never", segment_bytes=512)
    await store.open()
    loop = SchedulerLoop(store, Policy(), LoopConfig(), core)

    async def send(*events: object, after_ms: int = 100) -> None:
        clock.now_ms += after_ms
        await store.log(INPUTS).append([Message(encode(envelope(e, "test"))) for e in events])  # type: ignore[arg-type]
        await loop.step()

    await send(node("n0"), job("done", tenant="a", tasks=2))
    await send(TaskFinished(job_id="done", task_index=0), TaskFinished(job_id="done", task_index=1))
    await send(node("n0"), after_ms=5_000)
    assert loop.state.job_row("done") < 0
    assert loop.state.known_job("done")
    header = SnapshotHeader(loop.offset, loop.decisions_next, "default", 0)
    await DirectorySnapshots(log / "snapshots").save(encode_snapshot(Snapshot(header, snapshot(loop.state))))
    for _ in range(6):  # (more segments: the one the snapshot is in is sealed, prunable)
        await send(node("n0"), job(f"more-{clock.now_ms}"))
    await store.close()
    args = argparse.Namespace(job="done", json=True, core=core, topology=None)
    assert await handlers.run("status", log, args) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["state"] == "succeeded"
    assert found["retired"] is True
    assert found["tenant"] == "a"
    assert found["tasks"] == 2
    assert found["exit_code"] == 0
    assert found["ended_at_ms"] > found["placed_at_ms"] >= found["submitted_at_ms"]
    # its submission pruned away (but still in the dedup window): said so, not "unknown job"
    report = await prune(log, Point(offset=header.inputs_offset))
    assert report["inputs"]["start"] > 0
    with pytest.raises(ReplayError, match=r"'done' retired .* its history was pruned"):
        await handlers.run("status", log, args)
