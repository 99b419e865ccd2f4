"""A log recorded before the shape mix's view by CPU (2026-12-06, issue 23) still verifies, with
``service.shape_cpu_rows = 0``: ``old-logs/before-cpu-view`` is the clean fixture as the fleetlog
of that day wrote it (its decision batches' digests, its format-5 snapshot), kept unchanged
(outside ``data/``: ``make_fixtures`` re-records those, and ``benchmarks.shape`` verifies them
with the default settings)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetlog.cli import main

BEFORE = str(Path(__file__).parent / "old-logs" / "before-cpu-view")


def verify(capsys: pytest.CaptureFixture[str], code: int, *more: str) -> dict[str, object]:
    assert main(["replay", "verify", "--log", BEFORE, "--json", *more]) == code
    report: dict[str, object] = json.loads(capsys.readouterr().out)
    return report


def test_it_verifies_without_the_view(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEETLOG_SERVICE_SHAPE_CPU_ROWS", "0")
    report = verify(capsys, 0)
    assert report["ok"]
    assert isinstance(report["batches"], int)
    assert report["batches"] > 10
    assert main(["replay", "state-at", "290", "--log", BEFORE, "--json"]) == 0  # (from its snapshot)
    fast = json.loads(capsys.readouterr().out)
    assert main(["replay", "state-at", "290", "--log", BEFORE, "--json", "--no-snapshots"]) == 0
    slow = json.loads(capsys.readouterr().out)
    assert fast["snapshot"]
    assert fast["digest"] == slow["digest"] == report["final_digest"]


def test_with_the_view_it_diverges_at_the_first_batch_and_says_why(
    capsys: pytest.CaptureFixture[str],
) -> None:
    report = verify(capsys, 1)
    divergence = report["divergence"]
    assert isinstance(divergence, dict)
    assert divergence["what"] == "state digest"
    assert report["batches"] == 0
    assert main(["replay", "verify", "--log", BEFORE]) == 1
    out = capsys.readouterr().out
    assert "service.shape_cpu_rows = 0 (FLEETLOG_SERVICE_SHAPE_CPU_ROWS=0)" in out
