"""``fleetlog demo`` and ``fleetlog simulate`` delete nothing they did not write: a directory of
the user's (``--log .``) is refused even with ``--force``; an existing fleetlog log (one
``fleetlog submit`` made, one with snapshots) is refused without ``--force`` and replaced with
it; the default directories under ``.fleetlog/`` are replaced on a rerun (the quick start)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetlog.cli import EXIT_USAGE, main
from fleetlog.events import decode
from fleetlog.log.base import INPUTS
from fleetlog.log.file import FileLogStore
from tests.log.test_logdir import full_log, tree

ROOT = Path(__file__).resolve().parents[1]
TINY_SIM = ["--cluster", "synthetic?nodes=4", "--workload", "synthetic?jobs=5"]
TINY_DEMO = ["--nodes", "4", "--jobs", "100"]


def fleetlog(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path)
    return subprocess.run(
        [sys.executable, "-m", "fleetlog.cli", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False,
    )


def project(directory: Path) -> Path:
    """A directory of the user's, as ``.`` often is."""
    (directory / "src").mkdir(parents=True)
    (directory / "README.md").write_text("# my project\n")
    (directory / "src" / "main.py").write_text("print('hello')\n")
    return directory


def submitted(directory: Path) -> Path:
    """A log made the way a user makes one: ``fleetlog submit --log DIR``."""
    assert main(["submit", "j1", "--tenant", "t", "--gpus", "1", "--log", str(directory), "--create"]) == 0
    return directory


def first_input(directory: Path) -> object:
    async def read() -> object:
        async with FileLogStore(directory, read_only=True) as store:
            return decode((await store.log(INPUTS).read(0, max_records=1))[0].value).event

    return asyncio.run(read())


@pytest.mark.parametrize("command", [["demo", *TINY_DEMO], ["simulate", *TINY_SIM]], ids=["demo", "simulate"])
@pytest.mark.parametrize("force", [[], ["--force"]], ids=["plain", "force"])
def test_the_current_directory_of_a_project_is_never_touched(
    tmp_path: Path, command: list[str], force: list[str]
) -> None:
    here = project(tmp_path / "proj")
    before = tree(here)
    done = fleetlog(here, *command, "--log", ".", *force)
    assert done.returncode == EXIT_USAGE, done.stderr
    assert done.stderr.count("\n") == 1
    assert "holds 'README.md', which is not a fleetlog log" in done.stderr
    assert "Traceback" not in done.stderr
    assert tree(here) == before


@pytest.mark.parametrize("command", [["demo", *TINY_DEMO], ["simulate", *TINY_SIM]], ids=["demo", "simulate"])
def test_a_log_made_by_submit_is_refused_without_force_and_replaced_with_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    log = submitted(tmp_path / "log")
    before = tree(log)
    capsys.readouterr()
    report = ["--report", str(tmp_path / "report")] if command[0] == "simulate" else []
    assert main([*command, "--log", str(log), *report, "--json"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err == f"fleetlog {command[0]}: error: --log {log}: holds a fleetlog log already; pass --force " \
        "to replace it, or choose an empty or new directory\n"
    assert tree(log) == before
    assert main([*command, "--log", str(log), *report, "--json", "--force"]) == 0
    assert type(first_input(log)).__name__ != "JobSubmitted"  # the submission is gone: a new log


async def test_a_log_with_snapshots_is_called_a_fleetlog_log_not_foreign(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = await full_log(tmp_path / "log")
    before = tree(log)
    args = ["simulate", *TINY_SIM, "--log", str(log), "--report", str(tmp_path / "report")]
    assert await asyncio.to_thread(main, args) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "holds a fleetlog log already; pass --force" in err
    assert "not a fleetlog log" not in err  # (main called snapshots/ foreign)
    assert tree(log) == before


def test_new_and_empty_directories_need_no_force(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    for name in ("new/deeper", "empty"):
        args = ["--log", str(tmp_path / name), "--report", str(tmp_path / name / ".." / "r" / name), "--json"]
        assert main(["simulate", *TINY_SIM, *args]) == 0
        assert (tmp_path / name / INPUTS).is_dir()
    assert main(["demo", *TINY_DEMO, "--log", str(tmp_path / "d"), "--json"]) == 0


def test_an_earlier_report_is_replaced_with_force_and_another_file_never(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def run(log: str, *more: str) -> int:
        return main(["simulate", *TINY_SIM, "--log", str(tmp_path / log), "--report", str(tmp_path / "r"),
                     "--json", *more])

    assert run("a") == 0
    capsys.readouterr()
    assert run("b") == EXIT_USAGE
    assert "--report" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()  # refused before anything was written
    assert run("b", "--force") == 0
    (tmp_path / "r" / "summary.json").write_text('{"mine": true}')
    assert run("c", "--force") == EXIT_USAGE
    assert "'summary.json', which fleetlog did not write" in capsys.readouterr().err
    assert (tmp_path / "r" / "summary.json").read_text() == '{"mine": true}'


def test_rerunning_with_the_default_directories_replaces_the_earlier_run(tmp_path: Path) -> None:
    """The quick start (``./scripts/demo``) must keep working when rerun."""
    for _ in range(2):
        done = fleetlog(tmp_path, "simulate", *TINY_SIM, "--json")
        assert done.returncode == 0, done.stderr
        done = fleetlog(tmp_path, "demo", *TINY_DEMO, "--json")
        assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / ".fleetlog/simulate/report/summary.json").read_text())["runs"]
    (tmp_path / ".fleetlog/demo/notes.txt").write_text("mine")  # the user's file, even in the default
    done = fleetlog(tmp_path, "demo", *TINY_DEMO, "--force")
    assert done.returncode == EXIT_USAGE
    assert "holds 'notes.txt', which is not a fleetlog log" in done.stderr
    assert (tmp_path / ".fleetlog/demo/notes.txt").read_text() == "mine"
