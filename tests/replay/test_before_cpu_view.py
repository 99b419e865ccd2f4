"""Logs recorded before a change of ``default``'s rule still verify, given the settings that
turn the change off; without them they diverge at their first batch, with a hint that names
them. Each ``old-logs/`` directory is the clean fixture as the fleetlog of that day wrote it
(its decision batches' digests, its format-5 snapshot), kept unchanged (outside ``data/``:
``make_fixtures`` re-records those, and ``benchmarks.shape`` verifies them with the default
settings):

- ``before-cpu-view``: before the shape mix's view by CPU (2026-12-06, issue 23), verified
  with ``service.shape_cpu_rows = 0``, ``service.cpu_bound_rule = false`` and
  ``service.cpu_bound_weights = false``;
- ``before-cpu-bound``: before the CPU-bound rule (2026-12-07, issue 23), verified with
  ``service.cpu_bound_rule = false`` and ``service.cpu_bound_weights = false``;
- ``before-cpu-weights``: with the first CPU-bound rule (d932362, 2026-12-07), before CPU-bound
  windows were scored against the view by CPU alone by GPU per CPU, verified with
  ``service.cpu_bound_weights = false``;
- ``before-most-free-usable``: before capacity reasons counted only the nodes a job may use
  (2026-12-07, issue 47), verified with ``service.most_free_usable = false``.

Every log recorded before a setting needs the later settings off too: on, they enter the digest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetlog.cli import main

OLD = Path(__file__).parent / "old-logs"
USABLE = {"FLEETLOG_SERVICE_MOST_FREE_USABLE": "0"}
BEFORE = {  # old log -> the settings it verifies with
    "before-cpu-view": {"FLEETLOG_SERVICE_SHAPE_CPU_ROWS": "0", "FLEETLOG_SERVICE_CPU_BOUND_RULE": "0",
                        "FLEETLOG_SERVICE_CPU_BOUND_WEIGHTS": "0"} | USABLE,
    "before-cpu-bound": {"FLEETLOG_SERVICE_CPU_BOUND_RULE": "0",
                         "FLEETLOG_SERVICE_CPU_BOUND_WEIGHTS": "0"} | USABLE,
    "before-cpu-weights": {"FLEETLOG_SERVICE_CPU_BOUND_WEIGHTS": "0"} | USABLE,
    "before-most-free-usable": USABLE,
}
HINTS = (
    "service.cpu_bound_weights = false (FLEETLOG_SERVICE_CPU_BOUND_WEIGHTS=0)",
    "service.cpu_bound_rule = false (FLEETLOG_SERVICE_CPU_BOUND_RULE=0)",
    "service.shape_cpu_rows = 0 as well (FLEETLOG_SERVICE_SHAPE_CPU_ROWS=0)",
    "service.most_free_usable = false (FLEETLOG_SERVICE_MOST_FREE_USABLE=0)",
)


def verify(capsys: pytest.CaptureFixture[str], log: str, code: int) -> dict[str, object]:
    assert main(["replay", "verify", "--log", log, "--json"]) == code
    report: dict[str, object] = json.loads(capsys.readouterr().out)
    return report


@pytest.mark.parametrize("name", sorted(BEFORE))
def test_it_verifies_with_the_change_turned_off(
    name: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    log = str(OLD / name)
    for key, value in BEFORE[name].items():
        monkeypatch.setenv(key, value)
    report = verify(capsys, log, 0)
    assert report["ok"]
    assert isinstance(report["batches"], int)
    assert report["batches"] > 10
    assert main(["replay", "state-at", "290", "--log", log, "--json"]) == 0  # (from its snapshot)
    fast = json.loads(capsys.readouterr().out)
    assert main(["replay", "state-at", "290", "--log", log, "--json", "--no-snapshots"]) == 0
    slow = json.loads(capsys.readouterr().out)
    assert fast["snapshot"]
    assert fast["digest"] == slow["digest"] == report["final_digest"]


def short_of(name: str) -> list[dict[str, str]]:
    """Every proper subset of an old log's settings (none of them, or all but some)."""
    keys = sorted(BEFORE[name])
    subsets = [[k for i, k in enumerate(keys) if bits >> i & 1] for bits in range((1 << len(keys)) - 1)]
    return [{k: BEFORE[name][k] for k in subset} for subset in subsets]


@pytest.mark.parametrize(("name", "settings"), [(name, s) for name in sorted(BEFORE) for s in short_of(name)])
def test_short_of_them_it_diverges_at_the_first_batch_and_says_why(
    name: str, settings: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in settings.items():
        monkeypatch.setenv(key, value)
    log = str(OLD / name)
    report = verify(capsys, log, 1)
    divergence = report["divergence"]
    assert isinstance(divergence, dict)
    assert divergence["what"] == "state digest"
    assert report["batches"] == 0
    assert main(["replay", "verify", "--log", log]) == 1
    out = capsys.readouterr().out
    assert all(hint in out for hint in HINTS)
