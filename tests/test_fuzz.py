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

from tests.fuzzing import REQUESTS, TARGETS, ServerErrors, Target, check_http, healthy
from tests.service.test_service import serving

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
