"""One logging setup (:mod:`fleetlog.logsetup`) for every command and backend: ``--log-format
json`` is one JSON object per line with ``event``, ``level`` and ``timestamp``; ``console`` is
human lines; each command keeps the default it had (JSON lines for ``fleetlog run``, human lines
for the backends and the client commands).  No other module configures logging."""

from __future__ import annotations

import ast
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fleetlog import cli
from fleetlog.logsetup import configure_logging
from fleetlog.usage import walk
from tests.service.process import ServiceProcess

REPO = Path(__file__).resolve().parents[1]
SETUP_MODULE = REPO / "fleetlog" / "logsetup.py"
CONFIGURING = {"basicConfig", "addHandler", "setFormatter", "dictConfig", "fileConfig",
               "StreamHandler", "FileHandler", "NullHandler", "Formatter", "ProcessorFormatter"}


def json_lines(text: str) -> list[dict[str, Any]]:
    """Every line of ``text`` as a JSON object with the three keys the docs promise."""
    lines = [json.loads(line) for line in text.splitlines()]
    for line in lines:
        assert {"event", "level", "timestamp"} <= line.keys(), line
        assert line["timestamp"].endswith("Z"), line
    return lines


def assert_console(text: str, level: str, event: str) -> None:
    """Human lines: none of them JSON, one with ``[level`` and ``event`` on it."""
    for line in text.splitlines():
        assert not line.startswith("{"), line
    assert any(f"[{level}" in line and event in line for line in text.splitlines()), text


def run_until(out: Path, args: list[str], ready: Path) -> str:
    """``fleetlog run ARGS`` until it writes ``ready`` (its ``service.json``), stopped; its output."""
    service = ServiceProcess(out, args, {}).start()
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert time.monotonic() < deadline, out.read_text(errors="replace")
            service._check_alive()
            time.sleep(0.1)
    finally:
        assert service.stop() == 0, out.read_text(errors="replace")
    return out.read_text(errors="replace")


def test_the_service_logs_json_lines_by_default_and_human_lines_on_request(tmp_path: Path) -> None:
    def run(name: str, *flags: str) -> str:
        log = tmp_path / name
        return run_until(tmp_path / f"{name}.out", ["--log", str(log), *flags], log / "service.json")

    events = [line["event"] for line in json_lines(run("json"))]
    assert "service_started" in events
    assert events[-1] == "service_stopped"
    console = run("console", "--log-format", "console")
    assert_console(console, "info", "service_started")
    assert_console(console, "info", "service_stopped")
    assert run("quiet", "--log-level", "warning") == ""


def backend(*argv: str) -> subprocess.CompletedProcess[str]:
    """The Kubernetes backend with a kubeconfig that does not exist: it logs where the logs are,
    then stops with one line of its own."""
    return subprocess.run(
        [sys.executable, "-m", "fleetlog.backends.kubernetes", "--kubeconfig", "/nonexistent/kube", *argv],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False, env=dict(os.environ))


@pytest.mark.parametrize("module", ["fleetlog.backends.kubernetes", "fleetlog.backends.slurm"])
def test_each_backend_takes_the_logging_flags(module: str) -> None:
    done = subprocess.run([sys.executable, "-m", module, "--help"], cwd=REPO, capture_output=True, text=True,
                          timeout=120, check=True)
    assert "--log-format {json,console}" in done.stdout
    assert "(default: console)" in done.stdout
    assert "--log-level {debug,info,warning,error}" in done.stdout
    assert "(default: info)" in done.stdout


def test_a_backend_logs_human_lines_by_default_and_json_lines_on_request(tmp_path: Path) -> None:
    where = f"logs: file log at {tmp_path} (fsync=batch)"
    error = "python -m fleetlog.backends.kubernetes: error: KubeConfigError: kubeconfig /nonexistent/kube"
    console = backend("--log", str(tmp_path))
    assert console.returncode == 1
    logged, last = console.stderr.splitlines()[:-1], console.stderr.splitlines()[-1]
    assert_console("\n".join(logged), "info", where)
    assert last.startswith(error)
    done = backend("--log", str(tmp_path), "--log-format", "json")
    *logged, last = done.stderr.splitlines()
    assert [(line["level"], line["logger"], line["event"]) for line in json_lines("\n".join(logged))] == [
        ("info", "fleetlog.backends", where)]
    assert last.startswith(error)
    quiet = backend("--log", str(tmp_path), "--log-level", "warning")
    assert quiet.stderr.splitlines() == [last]


def test_every_command_takes_the_logging_flags() -> None:
    commands = [p for p in walk(cli.build_parser()) if p.get_default("func") is not None]
    assert len(commands) > 10
    for parser in commands:
        defaults = (parser.get_default("log_format"), parser.get_default("log_level"))
        assert defaults == (("json", "info") if parser.prog == "fleetlog run" else ("console", "warning")), (
            parser.prog)


def test_a_client_command_logs_through_the_setup(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = logging.getLogger("fleetlog.tests.client")
    assert cli.main(["status", "ghost", "--log", str(tmp_path / "none"), "--log-format", "json"]) == 2
    capsys.readouterr()
    log.warning("dead-lettered %s", "inputs@3")
    log.info("not shown below warnings")
    [line] = json_lines(capsys.readouterr().err)
    assert (line["level"], line["logger"], line["event"]) == ("warning", "fleetlog.tests.client",
                                                              "dead-lettered inputs@3")
    assert cli.main(["schema", "--compact"]) == 0  # the default: human lines
    capsys.readouterr()
    log.warning("dead-lettered %s", "inputs@4")
    assert_console(capsys.readouterr().err, "warning", "dead-lettered inputs@4")


def test_the_level_is_fleetlogs_other_libraries_log_warnings_and_up_or_everything_at_debug(
    capsys: pytest.CaptureFixture[str],
) -> None:
    ours, theirs = logging.getLogger("fleetlog.tests.level"), logging.getLogger("a_library.tests")
    configure_logging("json", "info")
    ours.info("ours at info")
    theirs.info("theirs at info")
    theirs.warning("theirs at warning")
    shown = [line["event"] for line in json_lines(capsys.readouterr().err)]
    assert shown == ["ours at info", "theirs at warning"]
    configure_logging("json", "debug")
    theirs.debug("theirs at debug")
    assert [line["event"] for line in json_lines(capsys.readouterr().err)] == ["theirs at debug"]
    configure_logging("console", "error")
    ours.warning("ours at warning")
    theirs.warning("theirs at warning")
    assert capsys.readouterr().err == ""


def _configuring_calls(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            name = ast.unparse(node.func).split(".")[-1]
            if ast.unparse(node.func).startswith("structlog."):
                name = f"structlog.{name}"  # structlog.configure, .configure_once, ...
            if name in CONFIGURING or name.startswith("structlog.configure"):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: {name}")
    return found


def test_no_module_but_the_setup_configures_logging() -> None:
    found = [hit for path in sorted((REPO / "fleetlog").rglob("*.py")) if path != SETUP_MODULE
             for hit in _configuring_calls(path)]
    assert found == []
    assert _configuring_calls(SETUP_MODULE)  # the test sees what it looks for
