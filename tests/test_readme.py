"""The README's quick start is what CI runs, and the commands it names work."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def fleetlog(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleetlog.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_readme_quick_start_has_exactly_the_two_commands_and_ci_runs_the_second() -> None:
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Quick start", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in block.strip().splitlines()]
    assert commands == ["./scripts/demo", "./scripts/test"]
    assert "exec ./scripts/test" in (ROOT / ".ci" / "run").read_text()
    assert 'fleetlog" simulate "$@"' in (ROOT / "scripts" / "demo").read_text()


def test_schema_command_prints_the_json_schema() -> None:
    out = fleetlog("schema", "--compact")
    assert out.returncode == 0, out.stderr
    schema = json.loads(out.stdout)
    assert "JobSubmitted" in schema["$defs"]
    assert schema["x-fleetlog-event-types"][0] == "JobSubmitted"


def test_demo_round_trips_through_the_file_log(tmp_path: Path) -> None:
    out = fleetlog("demo", "--log", str(tmp_path / "log"), "--nodes", "16", "--jobs", "500", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["events_read"]["JobSubmitted"] == 500
    assert result["events_read"]["NodeHeartbeat"] == 16
    assert sum(result["dead_letters"].values()) == 10
    assert set(result["dead_letters"]) <= {
        "undecodable",
        "unknown_event_type",
        "invalid_event",
        "unsupported_schema_version",
    }


def test_usage_errors_exit_2_with_a_message() -> None:
    out = fleetlog("demo", "--nodes", "-3")
    assert out.returncode == 2
    assert "must be a positive integer" in out.stderr
    assert "Traceback" not in out.stderr
    out = fleetlog("no-such-command")
    assert out.returncode == 2
