"""``fleetlog run`` and its HTTP port, with real child processes on one file log.

Stand-by does not depend on the port: a second ``fleetlog run`` on the same host and port stands
by without HTTP and binds the port when it takes over.  A port another program holds is one line
and exit code 1 once the process leads, never a traceback.  (Before: ``OSError`` traceback, exit 1,
for the second process as for the first.)"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetlog.events import encode, envelope
from tests.core.builders import job, node
from tests.kafka_broker import free_port
from tests.service.process import REPO, ServiceProcess, health_at

ENV = {"FLEETLOG_SERVICE_IDLE_WAIT_MS": "20", "FLEETLOG_LOG_FSYNC": "never"}


@pytest.fixture
def processes() -> Iterator[list[ServiceProcess]]:
    started: list[ServiceProcess] = []
    yield started
    for proc in started:
        proc.kill_if_running()


def health(port: int) -> dict[str, Any] | None:
    return health_at(f"127.0.0.1:{port}")


def wait_for(what: str, proc: ServiceProcess, check: Any, timeout_s: float = 90) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        proc._check_alive()
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"{what}: not in {timeout_s}s\n{proc.tail()}")


def events(port: int) -> int:
    body = b"[" + b",".join(encode(envelope(e, "test"), "json") for e in (node("n1"), job("j1"))) + b"]"
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/events", data=body,
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as r:
        return int(json.loads(r.read())["appended"])


def test_a_second_run_on_the_same_port_stands_by_and_takes_over(
    tmp_path: Path, processes: list[ServiceProcess]
) -> None:
    directory, port = tmp_path / "log", free_port()
    args = ["--log", str(directory), "--http-port", str(port)]
    first = ServiceProcess(tmp_path / "first.log", args, ENV).start()
    processes.append(first)
    wait_for("first leads", first, lambda: (health(port) or {}).get("status") == "leading")
    second = ServiceProcess(tmp_path / "second.log", args, ENV).start()
    processes.append(second)
    events_of = lambda proc: {line.get("event") for line in proc.lines()}  # noqa: E731
    wait_for("second stands by", second, lambda: {"http_port_in_use", "standing_by"} <= events_of(second))
    time.sleep(1)  # standing by, not exiting
    second._check_alive()
    assert (health(port) or {}).get("pid") == first.pid  # the leader keeps the port
    first.kill9()
    def second_leads() -> bool:
        found = health(port) or {}
        return (found.get("pid"), found.get("status")) == (second.pid, "leading")

    wait_for("second leads on the port", second, second_leads)
    assert "http_serving" in events_of(second)
    assert events(port) == 2  # ingest through the port it took over
    assert second.stop() == 0
    assert "Traceback" not in (tmp_path / "second.log").read_text()


def test_a_port_held_by_another_program_is_one_line_and_exit_2(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "fleetlog.cli", "run", "--create", "--log", str(tmp_path / "log"),
             "--http-port", str(port)],
            check=False, cwd=REPO, capture_output=True, text=True, timeout=300,
            env={**os.environ, **ENV},
        )
    assert done.returncode == 2, done.stderr
    said = [line for line in done.stderr.splitlines() if not line.startswith("{")]  # the JSON log aside
    assert said == [f"fleetlog run: error: cannot serve HTTP on 127.0.0.1:{port}: the port is in use by "
                    "another process, still 5 s after this one took the lead: free it or give this process "
                    "another port (--http-port, service.http_port)"], done.stderr
    assert "Traceback" not in done.stderr
    assert time.monotonic() - started < 120
    assert not (tmp_path / "log" / "service.json").exists()  # never advertised an address it has not


def test_an_address_that_cannot_be_bound_is_one_line_and_exit_2_at_start(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.toml"  # (a host beyond this machine needs authentication first)
    tokens.write_text(f'[[token]]\nprincipal = "operator"\nsha256 = "{"0" * 64}"\n')
    tokens.chmod(0o600)
    done = subprocess.run(
        [sys.executable, "-m", "fleetlog.cli", "run", "--create", "--log", str(tmp_path / "log"),
         "--http-port", "9"],
        check=False, cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, **ENV, "FLEETLOG_SERVICE_HTTP_HOST": "no-such-host.invalid",
             "FLEETLOG_AUTH_TOKENS_FILE": str(tokens)},
    )
    assert done.returncode == 2, done.stderr
    said = [line for line in done.stderr.splitlines() if not line.startswith("{")]
    assert len(said) == 1, done.stderr
    assert said[0].startswith("fleetlog run: error: cannot serve HTTP on no-such-host.invalid:9: "), said
    assert "service_started" not in done.stderr  # at start, before it joins the election
    assert "Traceback" not in done.stderr


def test_stopped_while_waiting_for_the_port_it_exits_0(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        args = ["--log", str(tmp_path / "log"), "--http-port", str(port)]
        proc = ServiceProcess(tmp_path / "service.log", args, ENV).start()
        try:
            wait_for("waiting for the port", proc, lambda: any(
                line.get("event") == "http_port_in_use" and "leading" in line.get("action", "")
                for line in proc.lines()))
            assert proc.stop() == 0
        finally:
            proc.kill_if_running()
    text = (tmp_path / "service.log").read_text()
    assert "error:" not in text
    assert "Traceback" not in text


def test_replay_serve_on_a_busy_port_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """It printed a 39-line traceback (exit 1)."""
    clean = str(REPO / "tests" / "replay" / "data" / "clean")
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "fleetlog.cli", "replay", "serve", "--log", clean,
             "--http-port", str(port)],
            check=False, cwd=REPO, capture_output=True, text=True, timeout=300, env={**os.environ, **ENV},
        )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"fleetlog replay: error: cannot serve HTTP on 127.0.0.1:{port}: the port is in use (--http-port)"
    ], done.stderr
