"""The README's quick start is what CI runs, and the commands it names work."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_the_readme_openb_example_runs_as_written_from_a_clone_with_shared_beside_it(tmp_path: Path) -> None:
    """``./scripts/demo --cluster openb --workload openb:default --mode inflate`` exited 2: the
    traces were looked for one folder too high.  A checkout (the package, copied with its numba
    cache) with ``../shared/traces`` beside it (a link to the real traces, never a copy), no
    ``FLEETLOG_TRACES``: the command ``scripts/demo`` runs, from the checkout's root, as written."""
    import os
    import shutil

    readme = (ROOT / "README.md").read_text()
    example = "./scripts/demo --cluster openb --workload openb:default --mode inflate"
    assert example in readme
    traces = _real_traces()
    checkout = tmp_path / "work" / "fleetlog-clone"
    shutil.copytree(ROOT / "fleetlog", checkout / "fleetlog", symlinks=True)  # (copy2: mtimes kept)
    (tmp_path / "work" / "shared").mkdir()
    (tmp_path / "work" / "shared" / "traces").symlink_to(traces, target_is_directory=True)
    env = {k: v for k, v in os.environ.items() if k != "FLEETLOG_TRACES"} | {"PYTHONPATH": str(checkout)}
    args = example.removeprefix("./scripts/demo ").split()
    done = subprocess.run(
        [sys.executable, "-m", "fleetlog.cli", "simulate", *args, "--json"],
        cwd=checkout, env=env, capture_output=True, text=True, timeout=900, check=False,
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["jobs_submitted"] > 8000, summary
    assert summary["gpu_alloc_at_target_pct"] > 90, summary
    assert 'fleetlog" simulate "$@"' in (ROOT / "scripts" / "demo").read_text()  # what the script runs


def test_fleetlog_traces_takes_the_csv_folder_or_any_folder_above_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's hint: ``FLEETLOG_TRACES`` may name ``../shared/traces`` as a user writes it,
    the openb folder, or its ``csv`` folder; a folder without the trace says what it expects."""
    from fleetlog.simulation.spec import SpecError
    from fleetlog.simulation.traces import TRACES_ENV, openb_dir

    csv = _real_traces() / "alibaba-gpu-v2023-openb" / "csv"
    for given in (csv, csv.parent, csv.parent.parent, csv.parent.parent.parent):
        monkeypatch.setenv(TRACES_ENV, str(given))
        assert openb_dir() == csv, given
    monkeypatch.setenv(TRACES_ENV, str(tmp_path))
    with pytest.raises(SpecError, match=r"no openb traces there: .*openb_node_list_gpu_node\.csv"):
        openb_dir()


def _real_traces() -> Path:
    """The shared ``traces`` folder of this machine (``FLEETLOG_TRACES`` or beside the checkout)."""
    from benchmarks.simulate import find_traces

    return Path(find_traces()).resolve().parent.parent


def test_the_demo_takes_a_venv_the_test_command_made_as_it_is(tmp_path: Path) -> None:
    """Switching from ``./scripts/test`` to ``./scripts/demo`` reinstalled every Python package:
    a ``.venv`` stamped with the test tools (``dev``) serves the demo's plain install; the other
    way round still installs (the demo's ``.venv`` lacks pytest)."""
    import hashlib
    import shutil

    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "bootstrap.sh", tmp_path / "scripts" / "bootstrap.sh")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    fake = tmp_path / ".venv" / "bin" / "python"  # records what it was asked to install, installs nothing
    fake.write_text(f'#!/bin/sh\necho "$@" >> "{tmp_path}/pip-calls"\n')
    fake.chmod(0o755)
    digest = hashlib.sha256((tmp_path / "pyproject.toml").read_bytes()).hexdigest()[:16]

    def ensure(extras: str, stamped: str) -> subprocess.CompletedProcess[str]:
        (tmp_path / ".venv" / ".fleetlog-installed").write_text(f"{digest}-{stamped}\n")
        script = f'source "{tmp_path}/scripts/bootstrap.sh"; ensure_venv "{extras}"'
        return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120,
                              check=False)

    kept = ensure("", "dev")
    assert kept.returncode == 0, kept.stderr
    assert "installing" not in kept.stderr
    assert not (tmp_path / "pip-calls").exists()
    again = ensure("dev", "")
    assert again.returncode == 0, again.stderr
    assert "installing Python packages" in again.stderr
    assert f"-e {tmp_path}[dev]" in (tmp_path / "pip-calls").read_text()
