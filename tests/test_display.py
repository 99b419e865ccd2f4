"""What people read: tables piped to a file keep every column whole (a terminal keeps its width),
log times are ISO 8601 UTC and durations read like kubectl's ages (``fleetlog.display``)."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from fleetlog.display import cell, describe, duration, human_row, log_time

ROOT = Path(__file__).resolve().parents[1]
CLEAN = str(ROOT / "tests" / "replay" / "data" / "clean")
STATE_AT = ["replay", "state-at", "290", "--log", CLEAN, "--show", "nodes,jobs,tenants", "--all-jobs",
            "--limit", "1000"]


def env(**extra: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    return out | {"PYTHONPATH": str(ROOT)} | extra


def piped(args: list[str], tmp_path: Path, **extra: str) -> str:
    """stdout to a file, no terminal on any stream (rich would take the width of one)."""
    out = tmp_path / "out.txt"
    with out.open("wb") as sink:
        done = subprocess.run([sys.executable, "-m", "fleetlog.cli", *args], stdin=subprocess.DEVNULL,
                              stdout=sink, stderr=subprocess.PIPE, env=env(**extra), timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    return out.read_text()


def test_a_table_piped_to_a_file_keeps_every_column_and_line_whole(tmp_path: Path) -> None:
    out = piped(STATE_AT, tmp_path)
    assert "…" not in re.sub(r"digest [0-9a-f]{16}…", "", out)  # the digest is shortened on purpose
    lines = out.splitlines()
    assert lines[0].startswith("state at inputs offset 290 (log time 2026-01-01T00:01:55Z)")
    assert lines[0].endswith(" s")  # the whole sentence on one line
    header = next(line for line in lines if "last_heartbeat" in line)
    for column in ("cell", "gpus_free", "cores_free", "mem_free_gib", "last_heartbeat"):  # people's units
        assert f" {column} " in header
    assert "│ c1   │ n0   │ up     │ A100      │ 8    │" in out
    assert "│ 768     │" in out  # 786,432 MiB of memory: 768 GiB
    assert "2026-01-01T00:01:45Z" in out  # a heartbeat time, whole
    assert max(len(line) for line in lines) > 100


def test_columns_in_the_environment_still_sets_the_width(tmp_path: Path) -> None:
    out = piped(STATE_AT, tmp_path, COLUMNS="70")
    assert max(len(line) for line in out.splitlines()) <= 70


def test_the_demo_table_piped_keeps_its_long_title(tmp_path: Path) -> None:
    log = tmp_path / ("a-directory-with-a-name-long-enough-to-pass-eighty-columns-" * 2) / "log"
    out = piped(["demo", "--log", str(log), "--nodes", "16", "--jobs", "200"], tmp_path)
    assert f"fleetlog demo — file log at {log} (seed 1)" in out


def test_on_a_terminal_a_table_fits_the_terminal() -> None:
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 90, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "fleetlog.cli", *STATE_AT], stdin=subprocess.DEVNULL,
                            stdout=follower, stderr=subprocess.DEVNULL, env=env(TERM="xterm"))
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait(timeout=300) == 0
    os.close(leader)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode())  # colours
    lines = [line for line in text.replace("\r", "").splitlines() if line.strip()]
    assert lines
    assert max(len(line) for line in lines) <= 90
    assert "…" in text.replace("…; from", "")  # the nodes table had to be cut to fit


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "1970-01-01T00:00:00Z"),
        (1_767_225_640_000, "2026-01-01T00:00:40Z"),
        (1_767_225_640_250, "2026-01-01T00:00:40.250Z"),
        (1_767_225_640_001, "2026-01-01T00:00:40.001Z"),
        (-1, "1969-12-31T23:59:59.999Z"),
    ],
)
def test_log_times_are_iso_8601_utc(ms: int, text: str) -> None:
    assert log_time(ms) == text


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "0s"),
        (250, "0.25s"),
        (15_000, "15s"),
        (59_999, "59.999s"),
        (60_000, "1m00s"),
        (245_900, "4m05s"),
        (3_723_000, "1h02m03s"),
        (183_845_000, "2d03h04m05s"),
        (-15_000, "-15s"),
    ],
)
def test_durations_read_like_kubectl_ages(ms: int, text: str) -> None:
    assert duration(ms) == text


def test_rows_and_facts_for_people() -> None:
    row = {"job_id": "j1", "submitted_at_ms": 1_767_225_640_000, "elapsed_ms": 61_000, "cell": None}
    assert human_row(row) == {"job_id": "j1", "submitted_at": "2026-01-01T00:00:40Z", "elapsed": "1m01s",
                              "cell": "-"}
    assert cell("done_ms", True) == "True"  # a bool is no duration, whatever its key
    lines = describe({"job_id": "j1", "task_nodes": [{"task": 0, "state": "placed", "node": "n1"}],
                      "counts": {"a_b": 1, "when_at_ms": 0}, "empty": [], "steps": ["lost", "placed"],
                      "nested": [{"step": "x", "why": {"gone_ms": 1000}, "nodes": ["n1", "n2"]}]})
    assert lines == [
        "job id  j1",
        "task 0  state placed, node n1",
        "counts  a b 1, when at 1970-01-01T00:00:00Z",
        "empty   -",
        "steps   lost; placed",
        "step x  why gone 1s, nodes n1; n2",
    ]
    assert not any("[" in line or "{" in line or "'" in line for line in lines)


TIMES = frozenset({"at_ms", "ended_at_ms", "last_heartbeat_ms", "oldest_ms", "placed_at_ms", "requeued_at_ms",
                   "started_at_ms", "submitted_at_ms", "taken_ms", "time_ms", "timestamp_ms"})
"""Every ``*_ms`` struct field of the package that holds an epoch time, classified by hand."""


def _ms_fields() -> set[str]:
    """The ``*_ms`` fields of every msgspec struct defined in the package (not the kernels)."""
    import importlib
    import inspect
    import pkgutil

    import msgspec

    import fleetlog

    found: set[str] = set()
    for info in pkgutil.walk_packages(fleetlog.__path__, "fleetlog."):
        if ".kernels" in info.name or info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if (inspect.isclass(value) and issubclass(value, msgspec.Struct)
                    and value.__module__ == module.__name__):
                found.update(f for f in value.__struct_fields__ if f.endswith("_ms"))
    return found


def test_one_rule_says_which_keys_are_times_for_every_struct_field() -> None:
    """``history --audit`` showed its ``at_ms`` (an epoch time) as ``20794d15h26m48s``: every
    ``*_ms`` field any table or ``describe`` may show is a time exactly when it is classified so."""
    from fleetlog.display import is_time

    fields = _ms_fields()
    assert not TIMES - fields, TIMES - fields
    wrong = sorted(f for f in fields if is_time(f) != (f in TIMES))
    assert not wrong, f"classify these in TIMES (a time) or fix is_time: {wrong}"
    assert human_row({"at_ms": 1_767_225_640_000})["at"] == "2026-01-01T00:00:40Z"


def test_the_audit_table_shows_log_times(tmp_path: Path) -> None:
    """A table as a user reads it: the recorded log's audit trail shows ISO times, never days."""
    text = piped(["history", "--audit", "--all", "--log", CLEAN], tmp_path)
    assert re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", text), text
    assert not re.search(r"\d+d\d\dh\d\dm", text), text


def test_a_plain_table_is_as_wide_as_its_content_or_cut_to_the_terminal() -> None:
    from fleetlog.display import plain_table

    rows = [["j1", "pending", "no node has 8 free GPUs of model A100 in one rack"],
            ["job-two", "running", "-"]]
    whole = plain_table(["JOB", "STATE", "REASON"], rows, None)
    assert whole[0].split() == ["JOB", "STATE", "REASON"]
    assert whole[1] == "j1       pending  no node has 8 free GPUs of model A100 in one rack"
    cut = plain_table(["JOB", "STATE", "REASON"], rows, 40)
    assert max(map(len, cut)) <= 40
    assert cut[1].endswith("…")
    assert cut[2].split() == ["job-two", "running", "-"]


def test_a_jobs_table_shows_the_first_rows_and_says_how_many_more(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``fleetlog jobs`` on 10,000 jobs took 27–34 s laying out a rich table: a table shows
    ``TABLE_ROWS`` unless ``--limit`` says otherwise, and says how many it left out."""
    import argparse

    from fleetlog import reads_cli

    asked: list[int | None] = []

    def read(args: argparse.Namespace, *_: object) -> dict[str, object]:
        asked.append(args.limit)
        items = [{"job_id": f"j{i}", "state": "pending"} for i in range(args.limit or 10_000)]
        return {"items": items, "total": 10_000, "next_page_token": "t" if args.limit else None}

    monkeypatch.setattr(reads_cli, "_read", read)
    run = reads_cli._command("jobs", reads_cli.LISTINGS["jobs"], SystemExit, lambda _: None)
    for output, limit in (("table", None), ("json", None), ("table", 10_000)):
        args = argparse.Namespace(output=output, limit=limit, watch=False, tenant=[], queue=[], state=[],
                                  reason=[], cell=[], label=[])
        assert run(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert asked == [reads_cli.TABLE_ROWS, None, 10_000]
    assert lines[reads_cli.TABLE_ROWS + 1] == (
        "(1,000 of 10,000 jobs shown, 9,000 more: --limit N shows more, -o json all)")
    assert len(lines) == reads_cli.TABLE_ROWS + 2 + 1 + 10_001  # the table, the json line, 10,000 rows


def test_resources_read_in_gpus_cores_and_gib() -> None:
    """Tables showed milli-units (``gpu_free_milli 2750``); ``-o json`` keeps them (exact integers)."""
    row = human_row({"gpu_free_milli": 2750, "used_gpu_milli": 8000, "cpu_free_milli": 91_500,
                     "mem_free_mib": 786_432, "pending_gpu_milli": None, "gpus": 8})
    assert row == {"gpus_free": "2.75", "used_gpus": "8", "cores_free": "91.5", "mem_free_gib": "768",
                   "pending_gpus": "-", "gpus": "8"}
