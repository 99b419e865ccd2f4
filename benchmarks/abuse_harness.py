"""The plumbing of ``benchmarks.abuse`` (issue 46's bar): the ``fleetlog run`` child processes it
attacks, the clients of its principals, and the victim (bob's submissions, the health probes, the
reader's watch) whose measures each attack is judged by.  The attacks are in ``benchmarks.abuse``."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import re
import resource
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Iterable
from pathlib import Path
from typing import Any, Final

import aiohttp

from fleetlog.events import JobSubmitted, TaskGroup, encode, envelope
from fleetlog.events.model import JobCancelled
from fleetlog.service.auth import entry_toml, new_token

TIMEOUT_S: Final = 60.0
"""The longest any one request of the harness waits for its answer."""
HEALTH_EVERY_S: Final = 0.1
SERVICE_FDS: Final = 1024
RATE_PER_S: Final = 5
BURST: Final = 50
PRINCIPALS: Final = {"alice": "tenant:alice", "bob": "tenant:bob", "rdr": "reader", "ops": "operator",
                     "be": "backend:cell-1", "ghost": "backend:nope", "quota": "quota-admin"}
"""Each principal's one role; ``nope`` has a token and no grant."""
VICTIM: Final = "127.0.0.2"
ATTACKER: Final = "127.0.0.3"
"""The client addresses (the service listens on 127.0.0.1): a service that shares its slots by
peer tells the victim from the attackers, as it would tell two hosts apart."""


@dataclasses.dataclass(frozen=True)
class Size:
    name: str
    phase_s: float
    watchers: int
    dry_jobs: int
    max_pending_tasks: int
    metadata_jobs: int
    tls_connections: int
    priority_jobs: int


SIZES: Final = {
    "full": Size("full", 30.0, 16, 1000, 1_000_000, 10_000, 1200, 4),
    "quick": Size("quick", 8.0, 16, 100, 400_000, 2000, 1200, 4),
    "smoke": Size("smoke", 2.0, 2, 11, 400_000, 20, 60, 2),
}
STARTED: list[subprocess.Popen[bytes]] = []
"""Every service this process started: stopped by PID on the way out, whatever happened."""


def progress(text: str) -> None:
    print(f"benchmarks.abuse: {text}", file=sys.stderr, flush=True)


def _private(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o600)
    return path


# -- the service ------------------------------------------------------------------------------


def secrets(root: Path) -> dict[str, str]:
    """Each principal's token; beside them in ``root`` the tokens file, the policy file and a
    self-signed certificate for ``127.0.0.1`` with its key (for the TLS service)."""
    tokens = {who: new_token() for who in [*PRINCIPALS, "nope"]}
    _private(root / "tokens.toml", "".join(entry_toml(who, t, None) for who, t in tokens.items()))
    _private(root / "policy.toml", "".join(f'[[grant]]\nprincipal = "{who}"\nroles = ["{role}"]\n\n'
                                           for who, role in PRINCIPALS.items()))
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "2", "-subj", "/CN=fleetlog-abuse",
                    "-keyout", str(root / "server.key"),
                    "-out", str(root / "server.pem"), "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    (root / "server.key").chmod(0o600)
    return tokens


def _run_takes_create() -> bool:
    """Whether ``fleetlog run`` needs ``--create`` to start a new file log (it does since issue 46;
    the harness also measures the revision before, which does not know the flag)."""
    done = subprocess.run([sys.executable, "-m", "fleetlog.cli", "run", "--help"], capture_output=True,
                          text=True, timeout=120, check=False)
    return "--create" in done.stdout


class ServiceProcess:
    """``fleetlog run`` in a child process, on a file log in ``root / name``; over TLS if ``tls``."""

    def __init__(self, root: Path, name: str, size: Size, tokens: dict[str, str], tls: bool = False) -> None:
        self.dir = root / name
        self.dir.mkdir(mode=0o700)
        self.tokens = tokens
        served = (f'tls_cert_file = "{root / "server.pem"}"\ntls_key_file = "{root / "server.key"}"\n'
                  if tls else "")
        _private(self.dir / "fleetlog.toml", f"""
[log]
dir = "{self.dir / 'log'}"
[service]
http_port = 0
node_timeout_ms = 86400000
snapshot_every_s = 15.0
max_pending_tasks = {size.max_pending_tasks}
max_submissions_per_s = {RATE_PER_S}
max_submission_burst = {BURST}
[auth]
tokens_file = "{root / 'tokens.toml'}"
policy_file = "{root / 'policy.toml'}"
{served}""")
        self.tls = ssl.create_default_context(cafile=str(root / "server.pem")) if tls else None
        self.child: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.starts = 0

    def start(self) -> None:
        """Start it, with at most :data:`SERVICE_FDS` descriptors (``prlimit``, before it serves)."""
        argv = [sys.executable, "-m", "fleetlog.cli", "run", "--config", str(self.dir / "fleetlog.toml")]
        if not (self.dir / "log").exists() and _run_takes_create():
            argv.append("--create")
        with (self.dir / "service.err").open("ab") as err:
            self.child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=err, stderr=err)
        STARTED.append(self.child)
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.prlimit(self.child.pid, resource.RLIMIT_NOFILE, (SERVICE_FDS, hard))
        self.starts += 1

    async def ready(self, timeout_s: float = 1200.0) -> None:
        """Until ``/healthz`` says ``leading`` (a cold numba cache takes minutes: progress meanwhile)."""
        started = time.monotonic()
        said = started
        while True:
            if self.exited() is not None:
                raise SystemExit(f"benchmarks.abuse: fleetlog run exited {self.exited()}:\n{self.tail()}")
            if time.monotonic() - started > timeout_s:
                raise SystemExit(f"benchmarks.abuse: the service did not lead in {timeout_s:.0f} s:\n"
                                 f"{self.tail()}")
            if await self._leading():
                return
            if time.monotonic() - said > 10:
                said = time.monotonic()
                progress(f"waiting for the service to lead ({said - started:.0f} s; compiling kernels?)")
            await asyncio.sleep(0.25)

    async def _leading(self) -> bool:
        announced = self.dir / "log" / "service.json"
        if not announced.is_file():
            return False
        with contextlib.suppress(ValueError, OSError):
            self.port = int(announced.read_text().split('"http"')[1].split('"')[1].rpartition(":")[2])
        if not self.port:
            return False
        try:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.tls or True)) as http, \
                    http.get(self.url + "/healthz", timeout=aiohttp.ClientTimeout(total=10)) as answer:
                return answer.status == 200 and (await answer.json()).get("status") == "leading"
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError):
            return False

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def exited(self) -> int | None:
        return None if self.child is None else self.child.poll()

    def rss_mib(self) -> float:
        """The service's resident memory (``VmRSS``), MiB; 0 when it is gone."""
        if self.child is None:
            return 0.0
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{self.child.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return 0.0

    def tracebacks(self) -> int:
        with contextlib.suppress(OSError):
            return (self.dir / "service.err").read_bytes().count(b"Traceback")
        return 0

    def tail(self) -> str:
        with contextlib.suppress(OSError):
            return (self.dir / "service.err").read_bytes()[-3000:].decode(errors="replace")
        return ""


def stop(child: subprocess.Popen[bytes]) -> None:
    """SIGTERM by PID, then SIGKILL after 30 s."""
    if child.poll() is not None:
        return
    child.send_signal(signal.SIGTERM)
    try:
        child.wait(30)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait(30)


# -- clients ----------------------------------------------------------------------------------


class Run:
    """One benchmark run: the service, its principals, and the 500s counted in the current phase."""

    def __init__(self, service: ServiceProcess, size: Size) -> None:
        self.service = service
        self.size = size
        self.errors_500 = 0
        self.cleanup: list[str] = []
        self._session: aiohttp.ClientSession | None = None

    def session(self, fresh: bool = False, source: str = ATTACKER) -> aiohttp.ClientSession:
        """A client session from address ``source``; ``fresh``: a new connection per request."""
        connector = aiohttp.TCPConnector(ssl=self.service.tls or True, force_close=fresh, limit=0,
                                         local_addr=(source, 0))
        return aiohttp.ClientSession(connector=connector, read_bufsize=1 << 20)

    @property
    def shared(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = self.session()
        return self._session

    async def call(self, method: str, path: str, who: str, body: bytes | None = None,
                   session: aiohttp.ClientSession | None = None, timeout_s: float = TIMEOUT_S,
                   headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        """Status and body of one request as ``who``; a 500 is counted in the phase."""
        sent = {"Authorization": f"Bearer {self.service.tokens[who]}", "Content-Type": "application/json",
                **(headers or {})}
        async with (session or self.shared).request(method, self.service.url + path, data=body, headers=sent,
                                                    timeout=aiohttp.ClientTimeout(total=timeout_s)) as answer:
            raw = await answer.read()
        self.errors_500 += answer.status == 500
        return answer.status, raw

    async def submit(self, who: str, events: list[Any], **kwargs: Any) -> tuple[int, bytes]:
        """POST ``events`` as ``who``; the jobs of an accepted request are cancelled after the phase."""
        status, raw = await self.call("POST", "/v1/events", who, body(events), **kwargs)
        if status == 200:
            self.cleanup += [e.job_id for e in events if isinstance(e, JobSubmitted)]
        return status, raw

    async def raw(self, *, small_buffer: bool = False, tls: bool = True
                  ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection of the attacker's own (TLS if the service serves it and ``tls``), for
        requests aiohttp will not send or reads it will not stop."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.bind((ATTACKER, 0))
        tls = tls and self.service.tls is not None
        if small_buffer:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        try:
            loop = asyncio.get_running_loop()
            await asyncio.wait_for(loop.sock_connect(sock, ("127.0.0.1", self.service.port)), 10)
            return await asyncio.wait_for(asyncio.open_connection(
                sock=sock, ssl=self.service.tls if tls else None,
                server_hostname="127.0.0.1" if tls else None,
                limit=4096), 10)
        except BaseException:
            sock.close()
            raise

    def head(self, method: str, path: str, who: str | None, *extra: bytes) -> bytes:
        lines = [f"{method} {path} HTTP/1.1".encode(), b"Host: 127.0.0.1"]
        if who is not None:
            lines.append(f"Authorization: Bearer {self.service.tokens[who]}".encode())
        return b"\r\n".join([*lines, *extra, b"", b""])

    async def status_of(self, request: bytes) -> int | None:
        """The status of one raw request (only its status line is read); ``None``: no answer."""
        try:
            reader, writer = await self.raw()
        except (TimeoutError, OSError, ssl.SSLError):
            return None
        try:
            writer.write(request)
            line = await asyncio.wait_for(reader.readline(), 10)
            return int(line.split()[1]) if line.startswith(b"HTTP/") else None
        except (TimeoutError, OSError, ValueError, IndexError, ssl.SSLError):
            return None
        finally:
            await close(writer)

    async def cancel_all(self) -> None:
        """``ops`` cancels every job the attacks submitted (so that no phase inherits them)."""
        ids, self.cleanup = self.cleanup, []
        for first in range(0, len(ids), 5000):
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, OSError):
                await self.submit("ops", [JobCancelled(job_id=i, reason="abuse cleanup")
                                          for i in ids[first:first + 5000]])


async def close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(writer.wait_closed(), 2)


def body(events: Iterable[Any]) -> bytes:
    return b"[" + b",".join(encode(envelope(e, "abuse"), "json") for e in events) + b"]"


def job(job_id: str, tenant: str, *, tasks: int = 1, cpu: int = 100, mem: int = 256, gpus: int = 0,
        cells: tuple[str, ...] = (), **more: Any) -> JobSubmitted:
    group = TaskGroup(count=tasks, cpu_milli=cpu, mem_mib=mem, gpu_count=gpus, gpu_milli=1000 if gpus else 0)
    return JobSubmitted(job_id=job_id, tenant=tenant, task_groups=(group,), allowed_cells=cells, **more)


def code_of(raw: bytes) -> str:
    found = re.search(rb'"code"\s*:\s*"([^"]*)"', raw[:2000])
    return found.group(1).decode() if found else "?"


def p99(values: list[float]) -> float:
    if len(values) < 2:
        return values[0] if values else 0.0
    return statistics.quantiles(values, n=100, method="inclusive")[98]


# -- the victim -------------------------------------------------------------------------------


@dataclasses.dataclass
class Victim:
    """Bob's submissions, the health probes and the reader's watch during one phase."""

    run: Run
    prefix: str
    submit_s: list[float] = dataclasses.field(default_factory=list)
    refused: Counter[str] = dataclasses.field(default_factory=Counter)
    failed: int = 0
    health_s: list[float] = dataclasses.field(default_factory=list)
    health_failures: int = 0
    watch_bytes: int = 0
    watch_errors: int = 0
    held: list[str] = dataclasses.field(default_factory=list)
    """Bob's GPU jobs placed before the phase (``priority``)."""
    stopped: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

    def ids(self, n: int) -> list[str]:
        return [f"{self.prefix}-{i:05d}" for i in range(n)]

    async def submitter(self) -> None:
        """One job a second, each on its own connection, whether or not the last was answered."""
        async with self.run.session(fresh=True, source=VICTIM) as http:
            sent: set[asyncio.Task[None]] = set()
            started = time.monotonic()
            for i, job_id in enumerate(self.ids(1_000_000)):
                if self.stopped.is_set():
                    break
                sent.add(asyncio.create_task(self._submit(http, job_id)))
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.stopped.wait(), max(0.0, started + i + 1 - time.monotonic()))
            if sent:
                _, late = await asyncio.wait(sent, timeout=5)
                for task in late:
                    task.cancel()
                await asyncio.gather(*late, return_exceptions=True)

    async def _submit(self, http: aiohttp.ClientSession, job_id: str) -> None:
        started = time.monotonic()
        try:
            status, raw = await self.run.submit("bob", [job(job_id, "bob")], session=http)
            if status != 200:
                self.refused[f"{status} {code_of(raw)}"] += 1
        except (TimeoutError, aiohttp.ClientError, OSError):
            self.failed += 1
        except asyncio.CancelledError:
            self.failed += 1  # (not answered before the phase ended)
            raise
        finally:
            self.submit_s.append(time.monotonic() - started)

    async def prober(self) -> None:
        """``/healthz`` one probe after another, each on a new connection.  ``health_s`` gets, per
        probe, how long health had been unanswered when it ended: its own latency, or, while
        probes fail, the time since the first failing probe of the streak began (a refused
        connection fails fast, and must count as the outage it is); a probe still waiting when
        the phase ends counts the time it waited."""
        failing_since: float | None = None
        async with self.run.session(fresh=True, source=VICTIM) as http:
            while not self.stopped.is_set():
                started, ok = time.monotonic(), False
                try:
                    async with http.get(self.run.service.url + "/healthz",
                                        timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as answer:
                        await answer.read()
                        ok = answer.status == 200
                except (TimeoutError, aiohttp.ClientError, OSError):
                    pass
                finally:
                    since = started if failing_since is None else failing_since
                    self.health_s.append(time.monotonic() - since)
                    self.health_failures += not ok
                    failing_since = None if ok else since
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.stopped.wait(), HEALTH_EVERY_S)

    async def watcher(self) -> None:
        """The reader's watch of the decisions, read as it comes; reconnected after an error."""
        while not self.stopped.is_set():
            try:
                async with self.run.session(source=VICTIM) as http, http.get(
                        self.run.service.url + "/v1/watch",
                        headers={"Authorization": f"Bearer {self.run.service.tokens['rdr']}"},
                        timeout=aiohttp.ClientTimeout(total=None, sock_connect=10)) as answer:
                    self.run.errors_500 += answer.status == 500
                    async for chunk in answer.content.iter_any():
                        self.watch_bytes += len(chunk)
            except (TimeoutError, aiohttp.ClientError, OSError):
                self.watch_errors += 1
            await asyncio.sleep(0.5)

    async def during(self, attack: Awaitable[dict[str, Any]], limit_s: float) -> dict[str, Any]:
        """``attack``'s details, the victim running meanwhile (probes cut at the end count as waited)."""
        tasks = [asyncio.create_task(work()) for work in (self.submitter, self.prober)]
        reader = asyncio.create_task(self.watcher())
        try:
            return await asyncio.wait_for(attack, limit_s)
        except TimeoutError:
            return {"error": f"the attack did not end in {limit_s:.0f} s"}
        except (aiohttp.ClientError, OSError, ValueError) as e:  # (the harness goes on: said in the JSON)
            return {"error": f"{type(e).__name__}: {e}"}
        finally:
            self.stopped.set()
            reader.cancel()  # (it reads: nothing to wait for)
            _done, late = await asyncio.wait(tasks, timeout=8)
            for task in late:
                task.cancel()
            await asyncio.gather(*tasks, reader, return_exceptions=True)

    def measures(self) -> dict[str, Any]:
        return {
            "victim_submit_p99_ms": round(p99(self.submit_s) * 1000, 1),
            "victim_submit_max_ms": round(max(self.submit_s, default=0.0) * 1000, 1),
            "victim_submits": len(self.submit_s),
            "victim_refused": sum(self.refused.values()),
            "victim_refused_by": dict(self.refused),
            "victim_failed": self.failed,
            "victim_health_max_s": round(max(self.health_s, default=0.0), 3),
            "victim_health_probes": len(self.health_s),
            "victim_health_failures": self.health_failures,
            "victim_watch_bytes": self.watch_bytes,
            "victim_watch_errors": self.watch_errors,
        }
