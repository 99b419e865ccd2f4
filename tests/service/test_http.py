"""The service's HTTP server under hostile and unusual clients, on real sockets: idle and slow
connections past the cap, oversized heads and bodies, malformed framing, chunked uploads (Python,
Java, curl), request limits (413/429) and health answered while a large body decodes."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import ssl
import subprocess
import sys
import threading
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from fleetlog.client import HttpTransport, keyed
from fleetlog.events import encode, envelope
from fleetlog.events.model import MAX_TASKS_PER_JOB
from fleetlog.log.base import INPUTS
from fleetlog.service.auth import entry_toml, new_token
from fleetlog.service.config import AuthSettings, Config, LogConfig, ServiceSettings
from fleetlog.service.http import HttpLimits, HttpServer, Request, Response, json_response
from tests.core.builders import job, node
from tests.fuzzing import ServerErrors
from tests.service.process import REPO, ServiceProcess
from tests.service.test_mtls import Pki
from tests.service.test_mtls import call as tls_call
from tests.service.test_mtls import client as tls_client
from tests.service.test_service import Running, embedded, events_body, start

LIMITS: dict[str, Any] = {
    "http_header_timeout_s": 1.0,
    "http_body_timeout_s": 1.0,
    "http_max_connections": 8,
    "max_concurrent_requests": 4,
    "max_request_bytes": 1 << 20,
    "max_request_tasks": 1_000,
    "max_pending_tasks": 1_500,
    "max_pending_tasks_per_tenant": 1_500,  # (one tenant: the bound in all is tested here)
}


@pytest.fixture
async def guarded(tmp_path: Path) -> AsyncIterator[Running]:
    running = await start(embedded(tmp_path / "log", **LIMITS))
    try:
        yield running
    finally:
        if not running.task.done():
            await running.stop()


def connect(running: Running) -> socket.socket:
    return socket.create_connection(("127.0.0.1", running.service.http.port), timeout=10)


def answer(sock: socket.socket, timeout_s: float = 10) -> bytes:
    """Everything the server sends until it closes the connection (or ``timeout_s`` passes)."""
    sock.settimeout(timeout_s)
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return out


def status_of(raw: bytes) -> int:
    """The status code of a raw HTTP response (0 for none)."""
    parts = raw.split(b"\r\n", 1)[0].split()
    return int(parts[1]) if len(parts) > 1 and parts[0].startswith(b"HTTP/1.") else 0


def exchange(running: Running, raw: bytes) -> bytes:
    with connect(running) as sock:
        sock.sendall(raw)  # no half-close: asyncio closes a connection at its EOF
        return answer(sock)


def healthz(running: Running) -> tuple[int, float]:
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", running.service.http.port, timeout=10)
    try:
        conn.request("GET", "/healthz")
        status = conn.getresponse().status
    finally:
        conn.close()
    return status, time.perf_counter() - started


def post(running: Running, body: Any, headers: dict[str, str] | None = None,
         path: str = "/v1/events") -> tuple[int, dict[str, Any], dict[str, str]]:
    conn = http.client.HTTPConnection("127.0.0.1", running.service.http.port, timeout=30)
    try:
        conn.request("POST", path, body, {"Content-Type": "application/json", **(headers or {})},
                     encode_chunked=not isinstance(body, bytes))
        response = conn.getresponse()
        return response.status, json.loads(response.read()), dict(response.getheaders())
    finally:
        conn.close()


async def appended(running: Running) -> int:
    store = running.service.store
    assert store is not None
    return await store.log(INPUTS).end_offset()


# -- connections and time ------------------------------------------------------------------------


async def test_idle_connections_past_the_cap_neither_block_health_nor_ingest(guarded: Running) -> None:
    idle = [await asyncio.to_thread(connect, guarded) for _ in range(40)]  # 5x the cap of 8
    try:
        await asyncio.sleep(0.2)
        for _ in range(5):
            status, seconds = await asyncio.to_thread(healthz, guarded)
            assert status == 200
            assert seconds < 2
        status, body, _ = await asyncio.to_thread(post, guarded, events_body(node("n1")))
        assert (status, body["appended"]) == (200, 1)
        assert guarded.service.http.connections <= 8
        closed = sum(answer(sock, 0.05) == b"" for sock in idle)  # evicted, or timed out
        assert closed >= 32
    finally:
        for sock in idle:
            sock.close()


class LimitedService(ServiceProcess):
    """``fleetlog run`` with only ``descriptors`` file descriptors (``ulimit -n``)."""

    def __init__(self, log_path: Path, args: list[str], descriptors: int) -> None:
        super().__init__(log_path, args, {})
        self.descriptors = descriptors

    def start(self) -> LimitedService:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(  # prlimit execs the service: its pid is the service's
                ["prlimit", f"--nofile={self.descriptors}", sys.executable, "-m", "fleetlog.cli", "run",
                 "--http-port", "0", "--create", *self.args], cwd=REPO, stdout=log, stderr=log,
            )
        return self


def test_with_128_descriptors_200_idle_connections_stop_neither_health_nor_ingest(tmp_path: Path) -> None:
    service = LimitedService(tmp_path / "service.log", ["--log", str(tmp_path / "log")], 128).start()
    idle: list[socket.socket] = []
    try:
        service.wait_leading(300)
        host, _, port = service.address().rpartition(":")
        for _ in range(200):
            idle.append(socket.create_connection((host, int(port)), timeout=5))
        time.sleep(0.5)
        with urllib.request.urlopen(f"http://{host}:{port}/healthz", timeout=5) as r:
            assert json.loads(r.read())["status"] == "leading"
        request = urllib.request.Request(f"http://{host}:{port}/v1/events", events_body(node("n1")),
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=5) as r:
            assert json.loads(r.read()) == {"appended": 1, "first_offset": 0}
    finally:
        for sock in idle:
            sock.close()
        assert service.stop() == 0, service.tail()


async def test_an_idle_or_slowloris_connection_is_closed_after_the_header_timeout(guarded: Running) -> None:
    def slowloris() -> tuple[float, bool]:
        with connect(guarded) as sock:
            started = time.monotonic()
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            try:
                for i in range(40):  # a header byte every 0.1 s: 4 s if the server never gives up
                    sock.sendall(b"X-%d: y\r\n" % i)
                    time.sleep(0.1)
            except (BrokenPipeError, ConnectionResetError):
                return time.monotonic() - started, True
            return time.monotonic() - started, answer(sock, 0.1) == b""

    def idle() -> float:
        with connect(guarded) as sock:
            started = time.monotonic()
            assert answer(sock, 5) == b""  # closed by the server, nothing sent
            return time.monotonic() - started

    seconds, closed = await asyncio.to_thread(slowloris)
    assert closed
    assert seconds < 2.5
    assert 0.8 < await asyncio.to_thread(idle) < 2.5


async def test_a_slow_body_is_answered_408(guarded: Running) -> None:
    def slow() -> bytes:
        with connect(guarded) as sock:
            sock.sendall(b"POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 1000\r\n\r\n[")
            return answer(sock, 5)

    raw = await asyncio.to_thread(slow)
    assert status_of(raw) == 408
    assert b'"reason":"timeout"' in raw


async def test_health_answers_while_ingest_is_saturated(guarded: Running) -> None:
    """Slow uploads fill the ingest slots; more uploads get 429, health still answers at once."""
    head = (b"POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n[")
    slow = [await asyncio.to_thread(connect, guarded) for _ in range(4)]
    try:
        for sock in slow:
            sock.sendall(head)
        await asyncio.sleep(0.2)
        status, body, headers = await asyncio.to_thread(post, guarded, events_body(node("n1")))
        assert (status, body["reason"], headers["Retry-After"]) == (429, "busy", "1")
        status, seconds = await asyncio.to_thread(healthz, guarded)
        assert status == 200
        assert seconds < 0.5
    finally:
        for sock in slow:
            sock.close()


# -- malformed and oversized heads -----------------------------------------------------------------


def flood_headers(running: Running, total: int, chunk: bytes) -> tuple[int, bytes]:
    """Send header lines until the server answers (or ``total`` bytes); bytes sent, its answer."""
    with connect(running) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        sent = 0
        try:
            while sent < total:
                sock.sendall(chunk)
                sent += len(chunk)
                sock.settimeout(0.05)
                try:
                    first = sock.recv(65536)
                except TimeoutError:
                    continue
                return sent, first + answer(sock, 2)
        except (BrokenPipeError, ConnectionResetError):
            return sent, b""
        return sent, b""


async def test_100_mb_of_headers_is_refused_early_with_400(guarded: Running) -> None:
    lines = b"".join(b"X-Flood-%d: %s\r\n" % (i, b"v" * 40) for i in range(1000))
    sent, raw = await asyncio.to_thread(flood_headers, guarded, 100 << 20, lines)
    assert status_of(raw) == 400, raw[:200]
    assert sent < 4 << 20, "refused within the first few MB"
    assert (await asyncio.to_thread(healthz, guarded))[0] == 200


@pytest.mark.parametrize(
    "raw",
    [
        b"POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
        b"GET /" + b"a" * (70 << 10) + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * (70 << 10) + b"\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X: y\r\n" * 65 + b"\r\n",
        b"NOT HTTP AT ALL\r\n\r\n",
        b"POST /v1/events HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    ],
    ids=["negative-content-length", "64k-request-line", "64k-header", "65-headers", "garbage", "bad-chunk"],
)
async def test_a_malformed_request_is_answered_400(guarded: Running, raw: bytes) -> None:
    got = await asyncio.to_thread(exchange, guarded, raw)
    assert status_of(got) == 400, got[:200]


# -- bodies ----------------------------------------------------------------------------------------


def chunks(body: bytes, size: int = 100) -> Iterator[bytes]:
    for i in range(0, len(body), size):
        yield body[i:i + size]


async def test_a_chunked_upload_from_python_is_ingested(guarded: Running) -> None:
    body = events_body(node("n1"), node("n2"), job("chunked-1", gpus=2))
    status, answer_, _ = await asyncio.to_thread(post, guarded, chunks(body))
    assert (status, answer_) == (200, {"appended": 3, "first_offset": 0})


async def test_a_chunked_upload_from_java_and_curl_is_ingested(guarded: Running) -> None:
    url = f"http://127.0.0.1:{guarded.service.http.port}/v1/events"
    body = events_body(node("j1"), job("from-java", gpus=1))
    java = await asyncio.to_thread(
        subprocess.run, ["java", str(Path(__file__).parent / "java" / "ChunkedPost.java"), url,
                         "application/json"], input=body, capture_output=True, timeout=120, check=False)
    status, _, text = java.stdout.decode().partition("\n")
    assert (status, json.loads(text)) == ("200", {"appended": 2, "first_offset": 0}), java.stderr
    curl = await asyncio.to_thread(
        subprocess.run, ["curl", "-sS", "-H", "Transfer-Encoding: chunked", "-H",
                         "Content-Type: application/json", "--data-binary", "@-", url],
        input=events_body(job("from-curl")), capture_output=True, timeout=60, check=False)
    assert json.loads(curl.stdout) == {"appended": 1, "first_offset": 2}, curl.stderr


async def test_a_body_over_the_limit_is_refused_413_however_framed(guarded: Running) -> None:
    big = events_body(*[node(f"n{i}") for i in range(8000)])  # about 1.6 MB; the limit is 1 MiB
    assert len(big) > 1 << 20

    def declared() -> bytes:  # refused on its Content-Length, before a byte of the body is sent
        with connect(guarded) as sock:
            sock.sendall(b"POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % (60 << 20))
            return answer(sock, 5)

    raw = await asyncio.to_thread(declared)
    assert status_of(raw) == 413
    assert b'"reason":"too_large"' in raw
    status, body, _ = await asyncio.to_thread(post, guarded, chunks(big, 64 << 10))
    assert (status, body["reason"], body["limit"]) == (413, "too_large", 1 << 20)
    assert await appended(guarded) == 0


# -- request limits ----------------------------------------------------------------------------


async def test_too_many_tasks_in_one_request_is_413_and_too_much_pending_work_429(guarded: Running) -> None:
    huge = events_body(*[job(f"big-{i}", tasks=MAX_TASKS_PER_JOB if i == 0 else 1) for i in range(20)])
    status, body, _ = await asyncio.to_thread(post, guarded, huge)
    assert (status, body["reason"], body["limit"]) == (413, "too_many_tasks", 1_000)
    # one job past the per-job bound is a bad event, whatever the request limits
    vast = events_body(job("vast", tasks=1)).replace(b'"count":1', b'"count":100000')
    status, body, _ = await asyncio.to_thread(post, guarded, vast)
    assert (status, body["reason"]) == (400, "invalid_event"), body
    assert f"at most {MAX_TASKS_PER_JOB} tasks" in body["error"]
    # no node: every job stays pending; 1,000 tasks fit, the next 600 pass the 1,500 limit
    for i in range(2):
        batch = events_body(*[job(f"p{i}-{k}", tasks=500) for k in range(2 if i == 0 else 1)])
        status, body, _ = await asyncio.to_thread(post, guarded, batch)
        assert status == 200, body
    status, body, headers = await asyncio.to_thread(post, guarded, events_body(job("over", tasks=600)))
    assert (status, body["reason"], headers["Retry-After"]) == (429, "too_much_pending", "1")
    assert body["pending"] == 1_500
    status, body, _ = await asyncio.to_thread(post, guarded, events_body(node("n9")))
    assert status == 200, "events that create no pending work are still taken"
    assert await appended(guarded) == 4


async def test_health_answers_within_a_bound_while_a_large_body_decodes(tmp_path: Path) -> None:
    """12 MB of events, the last one invalid: the whole body is decoded (about a second of CPU)
    and refused, nothing is appended, so what is timed is the decoding alone."""
    running = await start(embedded(tmp_path / "log", max_request_bytes=32 << 20, max_request_events=100_000))
    try:
        body = events_body(*[node(f"n{i % 100}", cell=f"c{i % 5}") for i in range(60_000)])
        body = body[:-1] + b', {"schema_version": 1, "producer_id": "x"}]'
        probes: list[tuple[float, float]] = []  # (sent, answered); answered inf: no answer
        done = threading.Event()

        def probe() -> None:
            while not done.is_set():
                sent = time.perf_counter()
                try:
                    healthz(running)
                    probes.append((sent, time.perf_counter()))
                except OSError:
                    probes.append((sent, float("inf")))
                time.sleep(0.01)

        prober = threading.Thread(target=probe)
        prober.start()
        try:
            started = time.perf_counter()
            status, answer_, _ = await asyncio.to_thread(post, running, body)
            ended = time.perf_counter()
            seconds = ended - started
        finally:
            done.set()
            await asyncio.to_thread(prober.join)  # not on the loop: the service answers the last probe
        assert (status, answer_["reason"]) == (400, "invalid_event")
        assert "event 60000" in answer_["error"]
        assert await appended(running) == 0
        latencies = [answered - sent for sent, answered in probes]
        during = [p for p in probes if started <= p[0] and p[1] <= ended]
        assert len(during) >= 3, f"probes answered while the body decoded: {len(during)} in {seconds:.2f}s"
        assert max(latencies) < min(0.3, seconds / 2), (seconds, sorted(latencies)[-5:])
    finally:
        await running.stop()


async def test_a_60_mb_array_is_refused_413_with_a_reason(tmp_path: Path) -> None:
    running = await start(embedded(tmp_path / "log"))  # the default limits
    try:
        element = encode(envelope(node("n1"), "t"), "json")
        body = b"[" + b",".join([element] * (60_000_000 // len(element))) + b"]"
        status, answer_, _ = await asyncio.to_thread(post, running, body)
        assert (status, answer_["reason"]) == (413, "too_large")
        assert (await asyncio.to_thread(healthz, running))[0] == 200
    finally:
        await running.stop()


# -- ids in paths ----------------------------------------------------------------------------------


async def test_a_non_ascii_job_id_is_found_through_its_percent_encoded_path(guarded: Running) -> None:
    job_id = "trainér/ü+42?#%"  # ids hold no spaces (docs/events.md)
    status, _, _ = await asyncio.to_thread(post, guarded, events_body(job(job_id)))
    assert status == 200
    loop = guarded.service.loop
    assert loop is not None
    await guarded.until(lambda: loop.offset == 1)
    transport = HttpTransport("127.0.0.1", guarded.service.http.port)
    try:
        found = await transport.job(job_id)
        assert found is not None
        assert found["job_id"] == job_id
        assert await transport.job("nobody") is None
    finally:
        await transport.close()


def test_the_documented_service_settings_are_the_defaults() -> None:
    """docs/service.md shows every ``[service]`` key with its default (the limits included)."""
    text = (Path(REPO) / "docs" / "service.md").read_text()
    block = text.split("```toml", 1)[1].split("```", 1)[0]
    documented = tomllib.loads(block)["service"]
    defaults = msgspec.to_builtins(ServiceSettings())
    unset = sorted(key for key, value in defaults.items() if value is None)  # (TOML has no null)
    assert documented == {key: value for key, value in defaults.items() if value is not None}
    assert unset == ["max_pending_tasks_per_tenant", "max_submission_burst", "max_submissions_per_s",
                     "max_submitted_task_burst", "max_submitted_tasks_per_s"]
    for key in unset:  # shown commented out, with an example value
        assert f"\n# {key} = " in block, key


async def test_past_the_cap_with_every_connection_inside_a_request_the_next_gets_503() -> None:
    release = asyncio.Event()

    async def slow(request: Request) -> Response:
        await release.wait()
        return json_response(200, {"path": request.path})

    server = HttpServer(slow, limits=HttpLimits(max_connections=2))
    await server.start()
    address = ("127.0.0.1", server.port)
    held = [await asyncio.to_thread(socket.create_connection, address, 10) for _ in range(2)]
    try:
        for sock in held:
            sock.sendall(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.sleep(0.2)

        def third() -> bytes:
            with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
                return answer(sock, 5)

        raw = await asyncio.to_thread(third)
        assert status_of(raw) == 503
        assert b'"reason": "overloaded"' in raw
        release.set()
        for sock in held:
            assert status_of(await asyncio.to_thread(answer, sock, 1)) == 200
    finally:
        release.set()
        for sock in held:
            sock.close()
        await server.stop()


async def test_the_client_resends_after_retry_after(guarded: Running) -> None:
    """Slow uploads hold every ingest slot for a second (then get 408): the client's first POST
    gets 429 ``busy``, and its resend after ``Retry-After`` is taken."""
    slow = [await asyncio.to_thread(connect, guarded) for _ in range(4)]
    transport = HttpTransport("127.0.0.1", guarded.service.http.port, timeout_s=10)
    try:
        for sock in slow:
            sock.sendall(b"POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100\r\n\r\n[")
        await asyncio.sleep(0.1)
        started = time.monotonic()
        assert await transport.append([keyed(node("n1"), "test")]) == 0
        assert time.monotonic() - started >= 0.9
    finally:
        await transport.close()
        for sock in slow:
            sock.close()


# -- issue 46: body slots, the order of checks, TLS handshakes, hostile numbers ------------------

PEOPLE = ("alice", "bob", "reader", "nobody")
TOKENS = {who: new_token() for who in PEOPLE}
POLICY = ('[[grant]]\nprincipal = "alice"\nroles = ["tenant:a"]\n[[grant]]\nprincipal = "bob"\n'
          'roles = ["tenant:b"]\n[[grant]]\nprincipal = "reader"\nroles = ["reader"]\n')  # (nobody: none)


def policed_config(tmp_path: Path, **settings: Any) -> Config:
    """A service with tokens for :data:`PEOPLE` and :data:`POLICY` (``nobody`` has a valid token
    the policy names nowhere)."""
    tokens = tmp_path / "tokens.toml"
    tokens.write_text("".join(entry_toml(who, TOKENS[who], None) for who in PEOPLE))
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    for path in (tokens, policy):
        path.chmod(0o600)
    return Config(log=LogConfig(dir=str(tmp_path / "log"), fsync="never"),
                  service=ServiceSettings(http_port=0, idle_wait_ms=20, **settings),
                  auth=AuthSettings(tokens_file=str(tokens), policy_file=str(policy)))


@pytest.fixture
async def policed(tmp_path: Path) -> AsyncIterator[Running]:
    """With the default limits: 16 body slots, 4 per principal, a body's first byte in 5 s."""
    running = await start(policed_config(tmp_path))
    try:
        yield running
    finally:
        if not running.task.done():
            await running.stop()


def head(who: str, path: str = "/v1/events", method: str = "POST", length: int = 1000) -> bytes:
    """A request head announcing a body of ``length`` bytes, none of which is ever sent."""
    return (f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {TOKENS[who]}\r\nContent-Length: {length}\r\n\r\n").encode()


def reply(sock: socket.socket, timeout_s: float = 10) -> bytes:
    """The server's answer, read up to its end (``Content-Length``), not to the close: a refused
    request's connection stays open while the server drains the body it announced."""
    sock.settimeout(timeout_s)
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
            top, sep, body = out.partition(b"\r\n\r\n")
            sizes = [line.split(b":", 1)[1] for line in top.lower().split(b"\r\n")
                     if line.startswith(b"content-length:")]
            if sep and sizes and len(body) >= int(sizes[0]):
                break
    except (TimeoutError, ConnectionResetError):
        pass
    return out


def refused_head(running: Running, raw: bytes) -> bytes:
    with connect(running) as sock:
        sock.sendall(raw)
        return reply(sock)


def post_as(running: Running, who: str, body: bytes, path: str = "/v1/events") -> tuple[int, dict[str, Any]]:
    status, answer_, _ = post(running, body, {"Authorization": f"Bearer {TOKENS[who]}"}, path)
    return status, answer_


async def test_sixteen_bodiless_heads_of_one_principal_leave_ingest_to_another(policed: Running) -> None:
    """The issue's probe: 16 heads with a Content-Length and no body from alice hold at most her
    share (4) of the 16 body slots; the rest get 429 ``busy`` at once, and bob ingests at once."""
    heads = [await asyncio.to_thread(connect, policed) for _ in range(16)]
    try:
        for sock in heads:
            sock.sendall(head("alice"))
        await asyncio.sleep(0.3)
        started = time.monotonic()
        status, body = await asyncio.to_thread(post_as, policed, "bob", events_body(job("b-1", tenant="b")))
        assert (status, body.get("appended")) == (200, 1), body
        assert time.monotonic() - started < 2  # at once (the heads' 408 comes only after 5 s)
        refused = [status_of(await asyncio.to_thread(reply, sock, 0.2)) for sock in heads]
        assert refused.count(429) == 12, refused  # (the 4 others still wait for their body)
        assert policed.service.http.body_requests == 4
    finally:
        for sock in heads:
            sock.close()


async def test_a_head_whose_body_never_starts_is_answered_408_in_seconds_and_frees_the_slot(
        policed: Running) -> None:
    """``http_body_first_byte_timeout_s`` (5 s), not ``http_body_timeout_s`` (30 s): alice's 4
    slots are hers again within seconds."""
    heads = [await asyncio.to_thread(connect, policed) for _ in range(4)]
    try:
        for sock in heads:
            sock.sendall(head("alice"))
        started = time.monotonic()
        answers = [await asyncio.to_thread(reply, sock, 20) for sock in heads]
        took = time.monotonic() - started
        assert [status_of(raw) for raw in answers] == [408] * 4
        assert b"no byte of the request body in 5.0s" in answers[0]
        assert took < 15, took  # 5 s and a margin; far below the 30 s body timeout
        status, body = await asyncio.to_thread(post_as, policed, "alice", events_body(job("a-1", tenant="a")))
        assert (status, body.get("appended")) == (200, 1), body
    finally:
        for sock in heads:
            sock.close()


async def test_a_principal_the_policy_names_nowhere_is_refused_before_its_body(policed: Running) -> None:
    """``nobody``'s token is valid but the policy names it nowhere: 403 to its head alone (the body
    never needs to arrive), and its heads hold no body slot; a tenant setting a quota is refused by
    its head too."""
    heads = [await asyncio.to_thread(connect, policed) for _ in range(20)]
    try:
        for sock in heads:
            sock.sendall(head("nobody"))
        answers = [await asyncio.to_thread(reply, sock, 3) for sock in heads]
        assert {status_of(raw) for raw in answers} == {403}
        assert b"has no roles in the policy" in answers[0]
        assert policed.service.http.body_requests == 0
        raw = await asyncio.to_thread(refused_head, policed, head("alice", "/v1/quotas/a", "PUT"))
        assert status_of(raw) == 403, raw[:300]
        assert b'"rule":"quota-admin sets quotas"' in raw
        status, body = await asyncio.to_thread(post_as, policed, "alice", events_body(job("a-1", tenant="a")))
        assert status == 200, body
    finally:
        for sock in heads:
            sock.close()


async def test_a_route_that_takes_no_body_is_answered_without_reading_one(policed: Running) -> None:
    """A GET with a Content-Length is answered at once (its body is not waited for) and holds no
    body slot."""
    raw = await asyncio.to_thread(refused_head, policed, head("alice", "/v1/tenants", "GET"))
    assert status_of(raw) == 200, raw[:300]
    assert policed.service.http.body_requests == 0


async def test_the_share_of_an_unauthenticated_client_is_per_peer_address() -> None:
    """Without authentication a client is its peer address: 127.0.0.1 holds its share (2 of 8),
    127.0.0.2 still gets a slot."""
    async def echo(request: Request) -> Response:
        return json_response(200, {"bytes": len(request.body)})

    server = HttpServer(echo, limits=HttpLimits(max_body_requests=8, max_body_requests_per_client=2))
    await server.start()
    held = [await asyncio.to_thread(socket.create_connection, ("127.0.0.1", server.port), 10)
            for _ in range(3)]
    try:
        for sock in held:
            sock.sendall(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n")
        assert status_of(await asyncio.to_thread(reply, held[2], 5)) == 429

        def other() -> bytes:
            with socket.create_connection(("127.0.0.1", server.port), 10, ("127.0.0.2", 0)) as sock:
                sock.sendall(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n[]")
                return reply(sock, 5)

        assert status_of(await asyncio.to_thread(other)) == 200
    finally:
        for sock in held:
            sock.close()
        await server.stop()


@pytest.mark.parametrize(("target", "header", "field"), [
    ("/v1/jobs?page_token=%C2%B2", None, "page_token"),  # ² (str.isdigit() says yes, int() raises)
    ("/v1/nodes?page_token=%C2%B2", None, "page_token"),
    ("/v1/jobs?limit=%C2%B2", None, "limit"),
    ("/v1/jobs?limit=%D9%A3", None, "limit"),  # Arabic-Indic 3 (int() takes it: a limit nobody wrote)
    ("/v1/jobs?page_token=%D9%A3", None, "page_token"),
    ("/v1/watch?from=%C2%B2", None, "from"),
    ("/v1/watch?from=%D9%A3", None, "from"),
    ("/v1/watch", b"Last-Event-ID: \xc2\xb2", "Last-Event-ID"),
    ("/v1/watch", b"Last-Event-ID: \xd9\xa3", "Last-Event-ID"),
])
async def test_a_unicode_digit_in_a_query_parameter_or_last_event_id_is_400_naming_the_field(
        policed: Running, target: str, header: bytes | None, field: str) -> None:
    raw = (f"GET {target} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKENS['alice']}\r\n".encode()
           + (header + b"\r\n" if header else b"") + b"Connection: close\r\n\r\n")
    got = await asyncio.to_thread(exchange, policed, raw)
    assert status_of(got) == 400, got[:300]
    assert f'"field":"{field}"'.encode() in got


@pytest.mark.parametrize("value", [b"Bearer \xff\xfe", b"\xc3(", b"Bearer tok\xe9n", b"\x80"])
async def test_a_non_utf8_authorization_header_is_401_not_500(policed: Running, value: bytes) -> None:
    raw = b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: " + value + b"\r\nConnection: close\r\n\r\n"
    with ServerErrors() as errors:
        got = await asyncio.to_thread(exchange, policed, raw)
    assert status_of(got) == 401, got[:300]
    assert b'"code":"unauthenticated"' in got
    assert errors.seen == []


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A CA and a server certificate for 127.0.0.1 (tests.service.test_mtls)."""
    return Pki(tmp_path_factory.mktemp("pki"))


def test_silent_connections_to_the_tls_port_stop_neither_a_tls_client_nor_health(
        tmp_path: Path, pki: Pki) -> None:
    """The issue's probe, under 128 descriptors (connections capped at 64): 300 connections that
    never send a ClientHello are counted by the cap (the oldest evicted) and cut after the 5 s
    handshake timeout; a TLS client's health check and authenticated read answer at once."""
    cert, key = pki.server
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(entry_toml("alice", TOKENS["alice"], None))
    tokens.chmod(0o600)
    config = tmp_path / "fleetlog.toml"
    config.write_text(f'[log]\ndir = "{tmp_path / "log"}"\nfsync = "never"\n[auth]\n'
                      f'tokens_file = "{tokens}"\ntls_cert_file = "{cert}"\ntls_key_file = "{key}"\n')
    service = LimitedService(tmp_path / "service.log", ["--config", str(config)], 128).start()
    silent: list[socket.socket] = []
    try:
        port = int(service.address().rsplit(":", 1)[1])
        context = tls_client(pki, None)
        deadline = time.monotonic() + 300
        while acall_tls(f"https://127.0.0.1:{port}/healthz", context)[1].get("status") != "leading":
            assert time.monotonic() < deadline, service.tail()
            time.sleep(0.2)
        for _ in range(300):
            silent.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        time.sleep(0.5)
        started = time.monotonic()
        status, body = acall_tls(f"https://127.0.0.1:{port}/healthz", context)
        assert (status, body["status"]) == (200, "leading")
        status, body = acall_tls(f"https://127.0.0.1:{port}/v1/tenants", context, TOKENS["alice"])
        assert status == 200, body
        assert time.monotonic() - started < 3
        last = silent[-1]  # (not evicted: the newest) cut by the handshake timeout
        cut_after = time.monotonic()
        assert answer(last, 30) == b""
        assert time.monotonic() - cut_after < 15
    finally:
        for sock in silent:
            sock.close()
        assert service.stop() == 0, service.tail()


def acall_tls(url: str, context: ssl.SSLContext, token: str | None = None) -> tuple[int, dict[str, Any]]:
    """A GET over TLS (``(0, {})`` when the connection fails)."""
    try:
        return tls_call(url, context, token)
    except (urllib.error.URLError, ConnectionError, TimeoutError, ssl.SSLError):
        return 0, {}
