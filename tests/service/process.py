"""``fleetlog run`` as a real child process: started, probed over HTTP, SIGKILLed, stopped by PID."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


class ServiceProcess:
    """One ``python -m fleetlog.cli run`` child; its JSON log lines go to ``log_path``."""

    def __init__(self, log_path: Path, args: list[str], env: dict[str, str]) -> None:
        self.log_path, self.args, self.env = log_path, args, env
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ServiceProcess:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "fleetlog.cli", "run", "--http-port", "0", "--create", *self.args],
                cwd=REPO, env={**os.environ, **self.env}, stdout=log, stderr=log,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def lines(self) -> list[dict[str, Any]]:
        """This process's structured log lines (other lines, e.g. aiokafka's, skipped)."""
        out = []
        for raw in self.log_path.read_text(errors="replace").splitlines():
            if raw.startswith("{"):
                try:
                    line = json.loads(raw)
                except ValueError:
                    continue
                out.append(line)
        return out

    def address(self, timeout_s: float = 60) -> str:
        """host:port of this process's HTTP server (from its ``service_started`` line)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._check_alive()
            for line in self.lines():
                if line.get("event") == "service_started" and line.get("pid", self.pid) == self.pid:
                    return str(line["http"])
            time.sleep(0.1)
        raise AssertionError(f"service did not start in {timeout_s}s:\n{self.tail()}")

    def health(self) -> dict[str, Any] | None:
        return health_at(self.address())

    def wait_leading(self, timeout_s: float = 60, past: int = -1) -> dict[str, Any]:
        """Wait until this process leads (and has folded past input offset ``past``)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._check_alive()
            found = self.health()
            if found and found["status"] == "leading" and (found["inputs_offset"] or 0) > past:
                return found
            time.sleep(0.1)
        raise AssertionError(f"service did not lead in {timeout_s}s:\n{self.tail()}")

    def wait_status(self, status: str, timeout_s: float = 60) -> dict[str, Any]:
        """Wait until this process's health says ``status`` (``standby``, ``leading``…)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._check_alive()
            found = self.health()
            if found and found["status"] == status:
                return found
            time.sleep(0.1)
        raise AssertionError(f"service was not {status} in {timeout_s}s:\n{self.tail()}")

    def _check_alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"service exited with {self.proc.returncode}:\n{self.tail()}")

    def kill9(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def kill_if_running(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill9()

    def stop(self, timeout_s: float = 30) -> int:
        """SIGTERM, then SIGKILL if it does not exit in time; the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def health_at(address: str) -> dict[str, Any] | None:
    """The ``/healthz`` answer of the service at ``host:port``; ``None`` if nothing answers."""
    try:
        with urllib.request.urlopen(f"http://{address}/healthz", timeout=5) as r:
            result: dict[str, Any] = json.loads(r.read())
            return result
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None
