"""``fleetlog history`` once older history was pruned (docs/retention.md): the replay starts from
the snapshot the retained logs continue; a job that ended before it is not listed; a job in
progress at it is listed with ``partial: true`` and what is known; the others exactly as the
whole log lists them."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from fleetlog.cli import main
from fleetlog.log.file import FileLogStore
from fleetlog.log.snapshots import DirectorySnapshots, decode_snapshot
from fleetlog.replay.prune import prune
from fleetlog.replay.source import open_file_source
from fleetlog.replay.state_at import Point, first_start
from tests.replay.scenario import ClockBox, record

SAME = ("tenant", "queue", "priority", "tasks", "submitted_at_ms", "state", "ended_at_ms", "exit_code", "end",
        "cell")
"""What a partial record knows as the whole log's does."""
COUNTS = ("preemptions", "requeues", "gpu_hours", "cpu_hours")
"""What a partial record counts only after the cut (never more than the whole log's)."""


async def _record(directory: Path) -> int:
    """The replay scenario on small segments with a snapshot after round 12; its inputs offset."""
    clock = ClockBox()
    store = FileLogStore(directory, clock=clock, fsync="never", segment_bytes=2048)
    snapshots: list[bytes] = []
    await store.open()
    try:
        await record(store, clock, rounds=24, snapshot_at=12, snapshots=snapshots)
    finally:
        await store.close()
    (data,) = snapshots
    await DirectorySnapshots(directory / "snapshots").save(data)
    return decode_snapshot(data).header.inputs_offset


async def _cut_ms(directory: Path) -> int:
    source = await open_file_source(directory)
    try:
        return (await first_start(source)).state.now_ms
    finally:
        await source.close()


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, int]:
    """(the whole log, a copy pruned below its snapshot, the snapshot's log time)."""
    where = tmp_path_factory.mktemp("history-pruned")
    whole, pruned = where / "whole", where / "pruned"
    inputs = asyncio.run(_record(whole))
    shutil.copytree(whole, pruned)
    report = asyncio.run(prune(pruned, Point(offset=inputs + 5)))
    assert report["inputs"]["segments_deleted"] > 0
    return whole, pruned, asyncio.run(_cut_ms(pruned))


def listed(capsys: pytest.CaptureFixture[str], log: Path) -> tuple[list[dict[str, Any]], str]:
    assert main(["history", "--log", str(log), "--json"]) == 0
    out, err = capsys.readouterr()
    items: list[dict[str, Any]] = json.loads(out)["items"]
    return items, err


def test_a_pruned_log_lists_what_ended_after_the_cut(
    capsys: pytest.CaptureFixture[str], logs: tuple[Path, Path, int]
) -> None:
    whole, pruned, cut_ms = logs
    everything, _ = listed(capsys, whole)
    found, err = listed(capsys, pruned)
    assert "older history was pruned" in err
    assert [r["job_id"] for r in found] == [r["job_id"] for r in everything if r["ended_at_ms"] > cut_ms]
    assert len(found) < len(everything)
    full = {r["job_id"]: r for r in everything}
    partial = [r for r in found if r["partial"]]
    assert partial, "some job was in progress at the cut"
    for r in found:
        was = full[r["job_id"]]
        if not r["partial"]:  # (submitted after the cut: all of it is in the retained logs)
            assert r == was
            assert r["submitted_at_ms"] >= cut_ms
            continue
        assert r["submitted_at_ms"] <= cut_ms
        assert {k: r[k] for k in SAME} == {k: was[k] for k in SAME}
        assert all(r[k] <= was[k] for k in COUNTS), (r, was)
        for key in ("placed_at_ms", "started_at_ms"):  # the earliest the retained history shows
            assert r[key] is None or r[key] >= was[key], (key, r, was)
        if r["placed_at_ms"] is not None:
            assert r["wait_ms"] + r["elapsed_ms"] == r["ended_at_ms"] - r["submitted_at_ms"]


def test_a_pruned_log_folds_in_step(logs: tuple[Path, Path, int]) -> None:
    """From the snapshot, the jobs held pending and running are the fold's at every step."""
    from fleetlog.replay.history import account

    async def run() -> int:
        source = await open_file_source(logs[1])
        try:
            out: list[Any] = []
            return (await account(source, out.append, check=True)).listed
        finally:
            await source.close()

    assert asyncio.run(run()) > 0
