"""``fleetlog replay verify`` on a decisions log that was cut (issue 46): what is left replays
bit-exactly, but the log is not whole, so it is not a pass — exit 1 and a line saying how it was
cut.  Two kinds of cut are seen: a torn or corrupt tail (a frame cut mid-way; a read-only open
ignores it and reports it) and, for a log cut at a frame boundary, its recorded high water
(``high-water.json``, written by the file log)."""

from __future__ import annotations

import asyncio
import json
import shutil
import struct
from pathlib import Path

import pytest

from fleetlog.cli import main
from fleetlog.log.file import FileLogStore

CLEAN = Path(__file__).parent / "data" / "clean"
HEADER = 40


def _copy(tmp_path: Path) -> Path:
    target = tmp_path / "log"
    shutil.copytree(CLEAN, target)
    return target


def _segment(log: Path) -> Path:
    return sorted((log / "decisions").glob("*.log"))[-1]


def _frame_ends(data: bytes) -> list[int]:
    """The byte position after each frame of a segment (each frame: a 40-byte header whose
    bytes 8..12 hold the payload length, then the payload)."""
    ends, at = [], 0
    while at + HEADER <= len(data):
        at += HEADER + struct.unpack_from("<I", data, at + 8)[0]
        ends.append(at)
    return ends


def _verify(capsys: pytest.CaptureFixture[str], log: Path) -> tuple[int, dict[str, object], str]:
    code = main(["replay", "verify", "--log", str(log), "--json"])
    found = json.loads(capsys.readouterr().out)
    text_code = main(["replay", "verify", "--log", str(log)])
    assert text_code == code
    return code, found, capsys.readouterr().out


def test_a_whole_log_verifies(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, found, text = _verify(capsys, _copy(tmp_path))
    assert (code, found["ok"], found["cut"]) == (0, True, [])
    assert text.startswith("OK: ")


def test_a_decisions_log_cut_mid_frame_fails_verify(
    capsys: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:
    log = _copy(tmp_path)
    segment = _segment(log)
    data = segment.read_bytes()
    ends = _frame_ends(data)
    half = len(data) // 2
    assert half not in ends  # (mid-frame)
    segment.write_bytes(data[:half])
    code, found, text = _verify(capsys, log)
    assert code == 1
    assert found["ok"] is False
    assert found["divergence"] is None  # what is left replays bit-exactly...
    assert 0 < int(found["batches"]) < 200  # type: ignore[call-overload]
    cut = found["cut"]
    assert isinstance(cut, list)
    assert len(cut) == 1
    assert "decisions: ignored (read-only)" in cut[0]
    assert text.startswith("CUT: ")  # ...but it is not the whole log
    assert "the log was cut" in text.splitlines()[0]


def test_a_decisions_log_cut_at_a_frame_boundary_fails_verify_by_its_high_water(
    capsys: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:
    log = _copy(tmp_path)

    async def record_high_water() -> int:  # the scheduler's next commit (no decision) records it
        async with FileLogStore(log) as store:
            group = "fleetlog-scheduler"
            consumed = await store.committed_offset(group)
            assert consumed is not None
            await store.append_transactional("decisions", [], group=group, consumed=consumed)
            return await store.log("decisions").end_offset()

    end = asyncio.run(record_high_water())
    segment = _segment(log)
    data = segment.read_bytes()
    ends = _frame_ends(data)
    boundary = ends[len(ends) // 2 - 1]
    segment.write_bytes(data[:boundary])
    code, found, text = _verify(capsys, log)
    assert code == 1
    assert found["ok"] is False
    assert found["divergence"] is None
    cut = found["cut"]
    assert isinstance(cut, list)
    assert len(cut) == 1
    assert f"the decisions log ends at {len(ends) // 2} but once held {end} records" in cut[0]
    assert "move high-water.json away" in cut[0]
    assert text.startswith("CUT: ")


def test_a_cell_partitions_decisions_cut_mid_frame_fails_the_sharded_verify(
    capsys: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:
    from tests.replay.test_fleet import Deployment, config_for

    log = tmp_path / "log"
    asyncio.run(Deployment(log).run())
    segment = _segment(log / "cells-1")
    data = segment.read_bytes()
    assert len(data) // 2 not in _frame_ends(data)
    segment.write_bytes(data[: len(data) // 2])
    config = config_for(log, tmp_path)
    assert main(["replay", "verify", "--config", config, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    by = {r["shard"]: r for r in report["shards"]}
    assert (report["ok"], report["diverged"]) == (False, "cells-1")
    assert by["cells-1"]["divergence"] is None
    assert "decisions: ignored (read-only)" in by["cells-1"]["cut"][0]
    assert by["cells-0"]["ok"]
    assert main(["replay", "verify", "--config", config]) == 1
    text = capsys.readouterr().out
    assert text.splitlines()[-1] == "CUT: cells-1"
    assert "cells-1    CUT" in text
