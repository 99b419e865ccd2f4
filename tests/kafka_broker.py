"""A real Kafka broker for tests and benchmarks, run with ``infra/kafka/kafka.sh``.

``KafkaBroker`` starts a single-node KRaft broker in its own data directory and port, stops it by
the PID in its pid file, and can restart it (keeping its data) or kill it hard.  If the
``FLEETLOG_KAFKA`` environment variable names a bootstrap address, that broker is used and nothing
is started or stopped.  A broker that cannot start raises :class:`KafkaBrokerError`: tests that need
Kafka fail loudly, they are never skipped.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Final

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "infra" / "kafka" / "kafka.sh"
ENV_BOOTSTRAP = "FLEETLOG_KAFKA"


class KafkaBrokerError(RuntimeError):
    """The broker could not be started or stopped."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


TEST_JVM_OPTS: Final = "-XX:TieredStopAtLevel=1"
"""A test broker's JIT: C1 alone.  Measured here: a fresh broker's start (format and launch) 6 s of
CPU instead of 11, idle 3.3% of a core instead of 5.5% — the test run starts dozens, beside
three other sessions on two cores.  The benchmarks start theirs with ``jvm_opts=""`` (both
compilers, as in production); ``FLEETLOG_KAFKA_JVM_OPTS`` set in the environment wins."""


class KafkaBroker:
    """One broker process.  ``port=None`` picks a free port; ``data_dir`` (default
    ``var/kafka-test-PORT``) holds its data, config, log and pid file, so several test sessions in
    one checkout never share a broker.  ``fresh`` wipes the directory before the first start;
    ``ephemeral`` removes it on :meth:`close`.  ``use_env=False`` ignores ``FLEETLOG_KAFKA``
    (a test that needs a broker of its own, to restart or kill)."""

    def __init__(
        self,
        port: int | None = None,
        data_dir: Path | None = None,
        *,
        fresh: bool = True,
        ephemeral: bool = False,
        use_env: bool = True,
        heap: str = "512m",
        start_timeout_s: int = 90,
        sasl: bool = False,
        users: tuple[str, ...] = (),
        jvm_opts: str = TEST_JVM_OPTS,
    ) -> None:
        self.jvm_opts = os.environ.get("FLEETLOG_KAFKA_JVM_OPTS", jvm_opts)
        self.external = (os.environ.get(ENV_BOOTSTRAP) or None) if use_env else None
        self.port = port or free_port()
        self.controller_port = free_port()
        self.data_dir = data_dir or REPO / "var" / f"kafka-test-{self.port}"
        self.fresh = fresh
        self.ephemeral = ephemeral
        self.heap = heap
        self.start_timeout_s = start_timeout_s
        self.sasl_port = free_port() if sasl or users else None
        self.users = users
        """SCRAM users made at the start besides ``fleetlog`` (:meth:`password`): with a SASL
        port the broker authorizes, so each may do only what :meth:`acl` allows it."""

    @property
    def bootstrap(self) -> str:
        return self.external or f"127.0.0.1:{self.port}"

    @property
    def pid_file(self) -> Path:
        return self.data_dir / "kafka.pid"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "kafka.log"

    def _env(self) -> dict[str, str]:
        return {
            **os.environ,
            "FLEETLOG_KAFKA_PORT": str(self.port),
            "FLEETLOG_KAFKA_CONTROLLER_PORT": str(self.controller_port),
            "FLEETLOG_KAFKA_DIR": str(self.data_dir),
            "FLEETLOG_KAFKA_HEAP": self.heap,
            "FLEETLOG_KAFKA_JVM_OPTS": self.jvm_opts,
            "FLEETLOG_KAFKA_START_TIMEOUT": str(self.start_timeout_s),
            **({"FLEETLOG_KAFKA_SASL_PORT": str(self.sasl_port)} if self.sasl_port else {}),
            **({"FLEETLOG_KAFKA_SASL_USERS": " ".join(self.users)} if self.users else {}),
        }

    def password(self, user: str) -> str:
        """The SCRAM password of ``user`` (one of :attr:`users`, or ``fleetlog``)."""
        path = self.tls_dir / "password" if user == "fleetlog" else self.tls_dir / "users" / user
        return path.read_text().strip()

    def acl(self, *args: str) -> str:
        """``kafka-acls`` against this broker (``kafka.sh acl``): ``acl("--add", "--allow-principal",
        "User:a", "--operation", "Write", "--topic", "t")``; its output."""
        return self._script("acl", *args)

    def add_user(self, name: str) -> str:
        """A new SCRAM user on the running broker (``kafka.sh user``); its password."""
        self._script("user", name)
        return self.password(name)

    def _script(self, *args: str) -> str:
        done = subprocess.run(["bash", str(SCRIPT), *args], env=self._env(), capture_output=True,
                              text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise KafkaBrokerError(f"kafka.sh {' '.join(args)} failed (exit {done.returncode}):\n"
                                   f"{done.stdout}{done.stderr}")
        return done.stdout

    @property
    def sasl_bootstrap(self) -> str:
        """The SASL_SSL (SCRAM-SHA-512) listener; user ``fleetlog``, see :attr:`tls_dir`."""
        assert self.sasl_port is not None, "start the broker with sasl=True"
        return f"127.0.0.1:{self.sasl_port}"

    @property
    def tls_dir(self) -> Path:
        """``ca.pem`` (the CA to trust) and ``password`` (user ``fleetlog``'s SCRAM password)."""
        return self.data_dir / "tls"

    def start(self) -> str:
        """Start the broker (wiping its directory if ``fresh``) and return the bootstrap address."""
        if self.external:
            return self.external
        args = ["bash", str(SCRIPT), "start", *(["--fresh"] if self.fresh else [])]
        done = subprocess.run(
            args,
            env=self._env(),
            capture_output=True,
            text=True,
            timeout=self.start_timeout_s + 600,
            check=False,
        )
        if done.returncode != 0:
            raise KafkaBrokerError(
                f"Kafka broker did not start on 127.0.0.1:{self.port} (exit {done.returncode}).\n"
                f"--- kafka.sh output ---\n{done.stdout}{done.stderr}"
            )
        self.fresh = False  # a restart keeps the data
        return self.bootstrap

    def pid(self) -> int | None:
        try:
            return int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM the broker by its PID, wait, SIGKILL if it lingers."""
        if self.external:
            return
        pid = self.pid()
        if pid is None or not self._ours(pid):
            self.pid_file.unlink(missing_ok=True)
            return
        self._signal(pid, signal.SIGTERM)
        if not self._wait_exit(pid, timeout_s):
            self._signal(pid, signal.SIGKILL)
            self._wait_exit(pid, 10.0)
        self.pid_file.unlink(missing_ok=True)

    def close(self) -> None:
        """Stop; an ``ephemeral`` broker's data directory is removed as well, and such a broker
        is SIGKILLed, not shut down cleanly: a clean shutdown flushes and checkpoints every
        partition (2 s empty, 5 s with 300 topics) for data about to be deleted."""
        if self.ephemeral and not self.external:
            self.kill()
            shutil.rmtree(self.data_dir, ignore_errors=True)
        else:
            self.stop()

    def kill(self) -> None:
        """SIGKILL the broker: a crash, no clean shutdown."""
        if self.external:
            raise KafkaBrokerError("cannot kill an external broker (FLEETLOG_KAFKA is set)")
        pid = self.pid()
        if pid is not None and self._ours(pid):
            self._signal(pid, signal.SIGKILL)
            self._wait_exit(pid, 10.0)
            self.pid_file.unlink(missing_ok=True)

    def restart(self) -> str:
        """Stop and start again on the same port and data."""
        if self.external:
            raise KafkaBrokerError("cannot restart an external broker (FLEETLOG_KAFKA is set)")
        self.stop()
        deadline = time.monotonic() + 30
        while _listening(self.port) and time.monotonic() < deadline:
            time.sleep(0.1)
        return self.start()

    def __enter__(self) -> KafkaBroker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    def _ours(self, pid: int) -> bool:
        """Whether ``pid`` is this broker's JVM (and not a process that reused a stale PID)."""
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return False
        return str(self.data_dir / "server.properties").encode() in cmdline

    @staticmethod
    def _signal(pid: int, sig: signal.Signals) -> None:
        with suppress(ProcessLookupError):
            os.kill(pid, sig)

    @staticmethod
    def _wait_exit(pid: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            _reap(pid)
            if _exited(pid):
                return True
            time.sleep(0.1)
        return False


def _exited(pid: int) -> bool:
    """Gone, or a zombie: exited but not reaped yet (init reaps the detached broker up to 2 s
    late here), which holds no port or file any more."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"


def _reap(pid: int) -> None:
    """Collect the exit status if the broker happens to be our child (it normally is not)."""
    with suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


@contextmanager
def running_broker(
    port: int | None = None, data_dir: Path | None = None, *, use_env: bool = True
) -> Iterator[KafkaBroker]:
    """A started broker for the duration of the ``with`` block; a default data directory is
    removed afterwards."""
    broker = KafkaBroker(port, data_dir, ephemeral=data_dir is None, use_env=use_env)
    broker.start()
    try:
        yield broker
    finally:
        broker.close()
