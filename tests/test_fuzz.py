"""Fuzzing in CI (issue 22), short: each target of :mod:`tests.fuzzing` for a few hundred
generated inputs, and raw HTTP requests against a real service that must answer under 500 (or
close) and stay healthy.  ``python -m benchmarks.fuzz`` runs the same targets for minutes."""

from __future__ import annotations

import asyncio
import socket
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from tests.fuzzing import (
    REQUESTS,
    TARGETS,
    ServerErrors,
    Target,
    api_requests,
    check_http,
    get_params,
    healthy,
)
from tests.service.test_http import TOKENS, policed_config
from tests.service.test_service import serving, start

EXAMPLES = 300


@pytest.mark.parametrize("target", TARGETS, ids=[t.name for t in TARGETS])
def test_only_documented_errors_come_out(target: Target) -> None:
    seen = []

    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(value=target.inputs)
    def run(value: object) -> None:
        seen.append(1)
        target.check(value)

    run()
    assert len(seen) >= EXAMPLES // 2  # it ran (hypothesis may stop early only on a small space)


def test_the_checks_can_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each kind of broken contract fails its check: a secret in a config error, an undocumented
    exception, a 500 answer."""
    from fleetlog.log.location import ConfigError
    from tests import fuzzing

    def leaky(path: Path, env: object) -> None:
        raise ConfigError(f"bad password {fuzzing.SECRET}")

    monkeypatch.setattr(fuzzing, "load_config", leaky)
    with pytest.raises(AssertionError, match="shows the SASL password"):
        fuzzing.check_config(fuzzing.CONFIG_SAMPLE)

    def broken(data: bytes, content_type: object) -> None:
        raise KeyError("event")

    monkeypatch.setattr(fuzzing, "decode", broken)
    with pytest.raises(KeyError):
        fuzzing.check_envelope((b"{}", None))
    with socket.create_server(("127.0.0.1", 0)) as server:
        def answer() -> None:
            conn, _ = server.accept()
            with conn:
                conn.recv(1000)
                conn.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n")

        thread = threading.Thread(target=answer)
        thread.start()
        with pytest.raises(AssertionError, match="500"):
            check_http(server.getsockname()[1], fuzzing.REQUEST_SAMPLES[0])
        thread.join()


async def test_raw_http_requests_get_an_answer_under_500_and_the_server_stays_healthy(tmp_path: Path) -> None:
    async with serving(tmp_path / "log") as running:
        port = running.service.http.port

        @settings(max_examples=EXAMPLES, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(raw=REQUESTS)
        def run(raw: bytes) -> None:
            check_http(port, raw)

        with ServerErrors() as errors:
            await asyncio.to_thread(run)
        assert await asyncio.to_thread(healthy, port)
        assert errors.seen == []  # no request a handler did not expect (a client gone mid-answer)


def test_the_api_requests_reach_every_query_parameter_of_every_get_route() -> None:
    """The generator's (route, parameter) pairs are the API's own table (a new parameter is fuzzed
    without a change here), and each is drawn."""
    from fleetlog.api.routes import ROUTES

    pairs = set(get_params())
    for route in ROUTES:
        if route.method == "GET":
            assert {(route.path, p.name) for p in route.params} <= pairs, route.path
    assert ("/v1/watch", "Last-Event-ID") in pairs
    drawn: set[str] = set()

    # (derandomized: a fixed draw of 300 proves the generator reaches them, every run alike — a
    # random one missed the header once in a CI run; the fuzz tests below draw at random)
    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck),
              derandomize=True)
    @given(raw=api_requests("tok"))
    def run(raw: bytes) -> None:
        line, _, rest = raw.partition(b"\r\n")
        target = line.split(b" ")[1].decode()
        path, _, query = target.partition("?")
        drawn.update(f"{path}?{kv.split('=')[0]}" for kv in query.split("&") if kv)
        drawn.update(f"?{h.split(b':')[0].decode()}" for h in rest.split(b"\r\n") if h.startswith(b"Last-"))

    run()
    assert "?Last-Event-ID" in drawn
    assert {"/v1/jobs?page_token", "/v1/jobs?limit", "/v1/watch?from", "/v1/nodes?page_token"} <= drawn, drawn


async def test_hostile_queries_and_authorization_bytes_on_a_service_with_auth_get_4xx(tmp_path: Path) -> None:
    """Issue 46's probes, fuzzed: every GET route's every query parameter (a Unicode digit in
    ``page_token``, ``from``, ``Last-Event-ID``…) with a valid token, and hostile bytes as the
    ``Authorization`` header: an answer under 500, nothing logged as an error, health unharmed."""
    running = await start(policed_config(tmp_path))
    try:
        port = running.service.http.port

        @settings(max_examples=EXAMPLES, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(raw=api_requests(TOKENS["alice"]))
        def run(raw: bytes) -> None:
            check_http(port, raw)

        with ServerErrors() as errors:
            await asyncio.to_thread(run)
        assert await asyncio.to_thread(healthy, port)
        assert errors.seen == []
    finally:
        await running.stop()
