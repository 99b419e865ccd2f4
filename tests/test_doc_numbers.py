"""Numbers the README and docs/service.md quote from a command are what the command does: the
quick start's fleet, jobs and tenants come from a real ``fleetlog simulate`` with its defaults,
the demo's from its defaults and a small real run, and the ``fleetlog submit`` examples run as
written against a file log and print the output shown."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from fleetlog.cli import build_parser
from fleetlog.client import envelope_from_json
from fleetlog.events.model import JobSubmitted
from fleetlog.log.file import FileLogStore

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
WORDS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "eight": 8, "ten": 10, "fifty": 50}


def number(text: str) -> int:
    return WORDS[text] if text in WORDS else int(text.replace(",", ""))


def fleetlog(*args: str, cwd: Path = ROOT, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleetlog.cli", *args], cwd=cwd, input=stdin,
                          capture_output=True, text=True, timeout=600, check=False,
                          env=os.environ | {"PYTHONPATH": str(ROOT)})


def test_the_quick_starts_fleet_jobs_and_tenants_are_simulates_defaults(tmp_path: Path) -> None:
    m = re.search(r"\((\d+) GPU nodes in racks.*?— (\d[\d,]*) jobs from (\w+) tenants arrive", README, re.S)
    assert m is not None, "the quick start no longer says how many nodes, jobs and tenants"
    nodes, jobs, tenants = number(m.group(1)), number(m.group(2)), number(m.group(3))
    log = tmp_path / "log"
    done = fleetlog("simulate", "--log", str(log), "--report", str(tmp_path / "report"), "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert (summary["nodes"], summary["jobs"]) == (nodes, jobs)
    assert summary["gpus"] > 0
    state = fleetlog("replay", "state-at", str(summary["inputs"]), "--log", str(log), "--show", "tenants",
                     "--json")
    assert state.returncode == 0, state.stderr
    assert len(json.loads(state.stdout)["tenants"]) == tenants


def test_the_demo_row_states_the_demos_defaults_and_its_malformed_share(tmp_path: Path) -> None:
    m = re.search(r"a seeded round trip through the file log: ([\d,]+) nodes, ([\d,]+) jobs and one "
                  r"malformed record in (\w+)", README)
    assert m is not None
    defaults = build_parser().parse_args(["demo"])
    assert (defaults.nodes, defaults.jobs) == (number(m.group(1)), number(m.group(2)))
    jobs = 500
    done = fleetlog("demo", "--log", str(tmp_path / "log"), "--nodes", "16", "--jobs", str(jobs), "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert sum(result["dead_letters"].values()) == jobs // number(m.group(3))


# -- docs/service.md: the fleetlog submit / cancel block ----------------------------------------


def cli_block() -> list[str]:
    """The command-line block's lines, continuation lines joined."""
    section = (ROOT / "docs" / "service.md").read_text().split("### Command line: `fleetlog submit`", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    return block.replace("\\\n", " ").splitlines()


def _new_log(directory: Path) -> None:
    """An empty file log, as ``fleetlog run --log`` leaves one before any producer appends."""

    async def make() -> None:
        store = FileLogStore(directory, fsync="never")
        await store.open()
        await store.close()

    asyncio.run(make())


def test_the_submit_examples_run_as_written_and_print_what_is_shown(tmp_path: Path) -> None:
    lines = cli_block()
    _new_log(tmp_path / "var" / "fleetlog")
    first = next(i for i, line in enumerate(lines) if line.startswith("fleetlog submit train-42 "))
    shown = lines[first + 1].removeprefix("# ")
    args = [a for a in shlex.split(lines[first])[1:] if a != "--create"]  # a fresh log either way
    done = fleetlog(*args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == shown
    cancel = next(line for line in lines if line.startswith("fleetlog cancel "))
    done = fleetlog(*shlex.split(cancel)[1:], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "JobCancelled train-42 (key cancel/train-42) appended at inputs offset" in done.stdout


def test_the_piped_example_generates_jobs_with_the_shell_alone(tmp_path: Path) -> None:
    """Every command of the pipe exists (no placeholder such as ``generate-jobs``), the generator
    writes one valid JobSubmitted per line, and each is one ``fleetlog submit --file -`` takes
    (many lines at once: ``submit``'s own tests)."""
    lines = cli_block()
    start = next(i for i, line in enumerate(lines) if line.startswith("for "))
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("done |"))
    generator = "\n".join([*lines[start:end], "done"])
    consumer = lines[end].removeprefix("done |").partition("#")[0].strip()
    assert shlex.split(consumer)[:4] == ["fleetlog", "submit", "--file", "-"]
    made = subprocess.run(["bash", "-euo", "pipefail", "-c", generator], capture_output=True, text=True,
                          timeout=60, check=True)
    jobs = made.stdout.splitlines()
    assert len(jobs) == 3
    envelopes = [envelope_from_json(line.encode(), "docs", default_type="JobSubmitted") for line in jobs]
    assert all(isinstance(e.event, JobSubmitted) for e in envelopes)
    _new_log(tmp_path / "var" / "fleetlog")
    for offset, line in enumerate(jobs):
        done = fleetlog(*shlex.split(consumer)[1:], cwd=tmp_path, stdin=line + "\n")
        assert done.returncode == 0, done.stderr
        assert f"appended at inputs offset {offset} (the file log at var/fleetlog)" in done.stdout
    used = {shlex.split(line)[0] for line in lines if line.strip() and not line.startswith(("#", " "))}
    assert used <= {"fleetlog", "for", "done"}, used
