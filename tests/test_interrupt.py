"""Ctrl-C, as a shell sends it: a real child process gets SIGINT.  Every command prints one line
and exits 130, never a traceback; ``simulate`` first writes what it has (a log that replays
bit-exactly, a report marked interrupted); ``fleetlog run`` stops cleanly (exit 0)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from fleetlog.cli import EXIT_INTERRUPTED, main

ROOT = Path(__file__).resolve().parents[1]
BIG_WORKLOAD = "synthetic?jobs=20000"


def start(cwd: Path, *args: str) -> subprocess.Popen[str]:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path)
    return subprocess.Popen(
        [sys.executable, "-m", "fleetlog.cli", *args],
        cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def interrupt_when(
    child: subprocess.Popen[str], ready: Callable[[], bool], timeout_s: float = 300, signals: int = 1
) -> tuple[str, str]:
    """Send SIGINT (``signals`` times) once ``ready()`` (polled), then collect the child's output;
    a child still running 120 s later fails the test (and is killed)."""
    try:
        deadline = time.monotonic() + timeout_s
        while not ready():
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline, "the child never got ready"
            time.sleep(0.05)
        for _ in range(signals):
            child.send_signal(signal.SIGINT)
            time.sleep(0.1)  # two signals, not one coalesced
        try:
            return child.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            raise AssertionError("still running 120 s after Ctrl-C") from None
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()


def grown(path: Path, size: int = 1) -> Callable[[], bool]:
    return lambda: path.is_file() and path.stat().st_size >= size


def test_simulate_writes_what_it_has_and_the_log_replays(tmp_path: Path) -> None:
    log, report = tmp_path / "log", tmp_path / "report"
    child = start(
        tmp_path, "simulate", "--workload", BIG_WORKLOAD, "--log", str(log), "--report", str(report), "--json"
    )
    segment = log / "inputs" / "00000000000000000000.log"
    out, err = interrupt_when(child, grown(segment, 200_000))  # well into the run
    assert child.returncode == EXIT_INTERRUPTED, err
    assert err == (
        "fleetlog simulate: interrupted; the log and the report hold what was simulated until then\n"
    )
    result = json.loads(out)
    assert result["interrupted"] is True
    assert 0 < result["jobs"] < 20_000  # what had arrived when Ctrl-C came
    assert result["jobs_placed"] > 0
    summary = json.loads((report / "summary.json").read_text())
    assert summary["summary"]["interrupted"] is True
    assert summary["runs"][0]["jobs"] == result["jobs"]
    assert (report / "plot.png").stat().st_size > 0
    assert main(["replay", "verify", "--log", str(log)]) == 0  # whole, and every batch re-decided


def test_a_second_ctrl_c_stops_simulate_at_once(tmp_path: Path) -> None:
    log = tmp_path / "log"
    child = start(tmp_path, "simulate", "--workload", BIG_WORKLOAD, "--log", str(log), "--report",
                  str(tmp_path / "report"), "--json")
    segment = log / "inputs" / "00000000000000000000.log"
    _, err = interrupt_when(child, grown(segment, 200_000), signals=2)
    assert child.returncode == EXIT_INTERRUPTED
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("fleetlog simulate: interrupted")


def test_demo_stops_at_once_with_one_line(tmp_path: Path) -> None:
    log = tmp_path / "log"
    child = start(tmp_path, "demo", "--log", str(log), "--jobs", "400000", "--json")
    started = time.monotonic()
    out, err = interrupt_when(child, grown(log / "inputs" / "00000000000000000000.log", 100_000))
    assert child.returncode == EXIT_INTERRUPTED
    assert (out, err) == ("", "fleetlog demo: interrupted\n")
    assert time.monotonic() - started < 300


def test_ctrl_c_while_simulate_loads_its_inputs_is_one_line(tmp_path: Path) -> None:
    """Before the run starts (no log yet): nothing to write, still one line and 130."""
    child = start(tmp_path, "simulate", "--workload", "synthetic?jobs=3000000", "--mode", "inflate",
                  "--log", str(tmp_path / "log"), "--report", str(tmp_path / "report"))
    time.sleep(2)  # importing, then generating three million jobs: long before the first append
    _, err = interrupt_when(child, lambda: True)
    assert child.returncode == EXIT_INTERRUPTED, err
    assert err == "fleetlog simulate: interrupted\n"
    assert not (tmp_path / "log").exists()


def test_replay_stops_at_once_with_one_line(tmp_path: Path) -> None:
    """A command busy folding (no ``await`` that suspends) still stops on the first Ctrl-C."""
    log = tmp_path / "log"
    assert main(["demo", "--log", str(log), "--nodes", "64", "--jobs", "300000", "--json"]) == 0
    child = start(tmp_path, "replay", "state-at", "--log", str(log), "300000")
    time.sleep(2.5)  # imported, and folding 300,000 jobs: the whole command takes several times longer
    out, err = interrupt_when(child, lambda: True)
    assert child.returncode == EXIT_INTERRUPTED, (out, err)
    assert err == "fleetlog replay state-at: interrupted\n"


def test_run_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    log = tmp_path / "log"
    child = start(tmp_path, "run", "--log", str(log), "--create", "--http-port", "0")
    _, err = interrupt_when(child, (log / "service.json").is_file)
    assert child.returncode == 0, err
    assert "Traceback" not in err
    assert '"service_stopped"' in err


def test_ctrl_c_before_the_arguments_are_parsed_names_the_command_typed(tmp_path: Path) -> None:
    """Imports on a busy machine take seconds: Ctrl-C then still names the command, through the
    program's own entry point (``run``, the console script), and the exit status is 130 — not a
    death by SIGINT while the interpreter shuts down after an interrupted import."""
    code = (
        "import sys\n"
        "from fleetlog import cli\n"
        "def parser():\n"
        "    exec('raise KeyboardInterrupt')  # as when Ctrl-C lands in an import's exec\n"
        "cli.build_parser = parser\n"
        "sys.argv = ['fleetlog', 'replay', 'state-at', '--log', 'x', '3']\n"
        "cli.run()\n"
    )
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=path), timeout=120, check=False)
    assert (done.returncode, done.stdout, done.stderr) == (130, "", "fleetlog replay state-at: interrupted\n")


def test_the_console_script_is_the_entry_that_exits_130() -> None:
    from importlib.metadata import entry_points

    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "fleetlog"]
    assert script.value == "fleetlog.cli:run"
