"""Fuzz targets (issue 22): hostile bytes into the envelope decoder, the ingest body decoder, the
config, tokens and policy parsers, and the HTTP server (with issue 46, every query parameter of
every GET route, ``Last-Event-ID`` and the ``Authorization`` header's bytes, on a service with
``[auth]``); anything but the documented errors is a failure.  ``tests/test_fuzz.py`` runs each
for a few hundred examples in CI; ``python -m benchmarks.fuzz`` runs them for minutes.

Each target is a plain function of one generated input that raises ``AssertionError`` (or any
undocumented exception) when the contract breaks, with the strategy that generates its inputs.
"""

from __future__ import annotations

import logging
import socket
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

from hypothesis import strategies as st

from fleetlog.events import BadEventError, Envelope, decode
from fleetlog.log.location import ConfigError
from fleetlog.service.auth import AuthError, entry_toml, parse
from fleetlog.service.authz import parse_policy
from fleetlog.service.config import ServiceSettings, load_config
from fleetlog.service.ingest import IngestError, ingest_batch
from tests.events.test_poison import CONTENT_TYPES, DOCUMENTED_REASONS, HOSTILE

SECRET: Final = "s3cr3t-Pa55word-never-shown"
"""The SASL password of the config samples: no error message may contain it."""
VOCABULARY: Final = [b"[", b"]", b"{", b"}", b'"', b"=", b"\n", b",", b"\x00", b"\xff", b"[[", b"]]",
                     b"\r\n", b":", b" ", b"-1", b"1e999", b"99999999999999999999", b"true", b"nan",
                     b"[kafka]", b"[service]", b"[log]", b"[auth]", b"[cells]", b"\\u0000", b"'''"]

CONFIG_SAMPLE: Final = f"""\
[kafka]
bootstrap_servers = "127.0.0.1:9092"
security_protocol = "SASL_PLAINTEXT"
sasl_mechanism = "SCRAM-SHA-512"
sasl_plain_username = "fleetlog"
sasl_plain_password = "{SECRET}"
shards = 2

[service]
policy = "default"
http_port = 8080
max_submissions_per_s = 5.0
idle_wait_ms = 20

[cells]
a = 0
b = 1
""".encode()
TOKENS_SAMPLE: Final = (entry_toml("alice", "tok-" + "a" * 40, None)
                        + entry_toml("bob", "tok-" + "b" * 40, "2030-01-01T00:00:00Z")).encode()
POLICY_SAMPLE: Final = b"""[[grant]]
principal = "alice"
roles = ["tenant:a", "reader"]
[[grant]]
principal = "agent"
roles = ["node-agent:c1", "backend:c1", "operator", "quota-admin"]
"""
REQUEST_SAMPLES: Final = [
    b"POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n[]",
    b"POST /v1/events HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n[]\r\n0\r\n\r\n",
    b"GET /v1/jobs?state=pending&limit=5&tenant=a HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /v1/watch?log=inputs&from=0 HTTP/1.1\r\nHost: x\r\n\r\n",
    b"PUT /v1/quotas/a HTTP/1.1\r\nHost: x\r\nContent-Length: 31\r\n\r\n{\"nominal\": {\"gpu_milli\": 800}}",
    b"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer abc\r\n\r\n",
]


@st.composite
def mutated(draw: st.DrawFn, samples: list[bytes]) -> bytes:
    """One of ``samples`` with up to 8 edits: a byte changed, a span cut, doubled, or a token of
    :data:`VOCABULARY` (or random bytes) put in."""
    data = bytearray(draw(st.sampled_from(samples)))
    for _ in range(draw(st.integers(0, 8))):
        at = draw(st.integers(0, len(data)))
        edit = draw(st.integers(0, 4))
        if edit == 0 and at < len(data):
            data[at] = draw(st.integers(0, 255))
        elif edit == 1:
            del data[at:at + draw(st.integers(1, 40))]
        elif edit == 2:
            data[at:at] = data[at:at + draw(st.integers(1, 40))]
        elif edit == 3:
            data[at:at] = draw(st.sampled_from(VOCABULARY))
        else:
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
    return bytes(data)


def outcome(call: Callable[[], Any], *documented: type[Exception]) -> tuple[Any, Exception | None]:
    """What ``call`` returned, or the documented error it raised (any other propagates)."""
    try:
        return call(), None
    except documented as exc:
        return None, exc


def check_envelope(value: tuple[bytes, bytes | None]) -> None:
    data, content_type = value
    got, error = outcome(lambda: decode(data, content_type), BadEventError)
    if isinstance(error, BadEventError):
        assert error.reason in DOCUMENTED_REASONS, error.reason
        assert error.message
    else:
        assert isinstance(got, Envelope)


SETTINGS: Final = ServiceSettings(max_request_events=50, max_request_tasks=1000)


def check_ingest_body(value: tuple[bytes, bytes | None]) -> None:
    data, content_type = value
    kind = None if content_type is None else content_type.decode()
    batch, error = outcome(lambda: ingest_batch(data, kind, SETTINGS), IngestError)
    if isinstance(error, IngestError):
        assert 400 <= error.status < 500, error.status
        assert error.reason
        assert str(error)
    else:
        assert len(batch.events) == len(batch.messages)


def check_config(data: bytes) -> None:
    with tempfile.TemporaryDirectory(prefix="fleetlog-fuzz-") as tmp:
        path = Path(tmp) / "fleetlog.toml"
        path.write_bytes(data)
        path.chmod(0o600)
        config, error = outcome(lambda: load_config(path, {}), ConfigError)
    assert SECRET not in str(error), "a config error shows the SASL password"
    assert SECRET not in repr(config), "the config's repr shows the SASL password"


def check_tokens(data: bytes) -> None:
    _, error = outcome(lambda: parse(Path("tokens.toml"), data), AuthError)
    assert "tok-" not in str(error), "an error shows a token"


def check_policy(data: bytes) -> None:
    _, error = outcome(lambda: parse_policy(Path("policy.toml"), data), AuthError)
    assert error is None or "policy.toml" in str(error), error


def bodies() -> st.SearchStrategy[bytes]:
    """An ingest body: one hostile envelope, or a JSON array of several."""
    return st.one_of(HOSTILE, st.lists(HOSTILE, max_size=6).map(lambda xs: b"[" + b",".join(xs) + b"]"))


@dataclass(frozen=True)
class Target:
    name: str
    check: Callable[[Any], None]
    inputs: st.SearchStrategy[Any]


# -- issue 46: the API's every query parameter, Last-Event-ID and the Authorization header's bytes --

DIGITS: Final = ["²", "١", "٣", "０", "߁", "1e3", "-1", "+1", " 1", "1 ", "0x10", "9" * 30, "", "start",
                 "end"]
"""Numbers as a client may spell them: ``str.isdigit()`` takes the first five, ``int()`` the
second to fifth (issue 46: ``²`` answered 500, ``١`` was taken as 1)."""


def get_params() -> list[tuple[str, str]]:
    """(route, query parameter) of every GET route of the API (fleetlog.api.routes.ROUTES), and
    ``Last-Event-ID`` (a header the watch reads as ``from``)."""
    from fleetlog.api.routes import ROUTES

    found = [(route.path, param.name) for route in ROUTES if route.method == "GET" for param in route.params]
    return [*found, ("/v1/watch", "Last-Event-ID")]


def _target(path: str) -> str:
    return path.replace("{job_id}", "j%201")


@st.composite
def api_requests(draw: st.DrawFn, token: str) -> bytes:
    """A GET of the API: a route, some of its query parameters (and ``Last-Event-ID``) with
    hostile values, and an ``Authorization`` header: ``token`` (so the parameters are parsed)
    or hostile bytes (none, not UTF-8, not ``Bearer``)."""
    pairs = draw(st.lists(st.sampled_from(get_params()), min_size=1, max_size=4))
    path = pairs[0][0]
    values = st.one_of(st.sampled_from(DIGITS), st.text(max_size=12))
    query, headers = [], []
    for route, name in pairs:
        value = quote(draw(values), safe="")
        if name == "Last-Event-ID" and route == path:
            headers.append(b"Last-Event-ID: " + draw(st.one_of(
                st.sampled_from(DIGITS).map(str.encode), st.binary(max_size=12).filter(_header_safe))))
        elif route == path or draw(st.booleans()):  # (another route's parameter: unknown here)
            query.append(f"{quote(name, safe='')}={value}")
    auth = draw(st.one_of(st.just(b"Bearer " + token.encode()), st.binary(max_size=40).filter(_header_safe),
                          st.sampled_from([b"Bearer \xff\xfe", b"\xc3(", b"Bearer \xc2\xb2", b""])))
    headers.append(b"Authorization: " + auth)
    line = f"GET {_target(path)}{'?' + '&'.join(query) if query else ''} HTTP/1.1\r\n".encode()
    return line + b"Host: x\r\n" + b"".join(h + b"\r\n" for h in headers) + b"\r\n"


def _header_safe(value: bytes) -> bool:
    """Bytes that stay inside one header value (no line break, no NUL: those are framing, tested
    by :data:`REQUESTS`)."""
    return not any(c in value for c in b"\r\n\x00")


def check_history_query(query: dict[str, list[str]]) -> None:
    """``GET /v1/history``'s parameters (answered by ``fleetlog replay serve``): a 4xx naming the
    parameter, or a query."""
    from fleetlog.api.history import history_query
    from fleetlog.api.resources import ApiError
    from fleetlog.replay.history import log_time_ms
    from fleetlog.replay.source import ReplayError

    def parse(text: str) -> int:
        try:
            return log_time_ms(text)
        except ReplayError as exc:
            raise ValueError(str(exc)) from None

    _, error = outcome(lambda: history_query(query, parse), ApiError)
    if isinstance(error, ApiError):
        assert 400 <= error.status < 500, error.status
        assert error.field in query, error.field


HISTORY_QUERIES: Final = st.dictionaries(
    st.sampled_from(["tenant", "queue", "state", "since", "until", "limit", "page_token"]),
    st.lists(st.one_of(st.sampled_from([*DIGITS, "1700000000000ms", "²ms", "١ms", "2026-11-30T01:00:00Z"]),
                       st.text(max_size=12)), min_size=1, max_size=2), max_size=4)


TARGETS: Final = (
    Target("envelope", check_envelope, st.tuples(HOSTILE, st.sampled_from(CONTENT_TYPES))),
    Target("ingest_body", check_ingest_body, st.tuples(bodies(), st.sampled_from(CONTENT_TYPES))),
    Target("config", check_config, st.one_of(mutated([CONFIG_SAMPLE]), st.binary(max_size=300))),
    Target("tokens_file", check_tokens, mutated([TOKENS_SAMPLE])),
    Target("policy_file", check_policy, mutated([POLICY_SAMPLE])),
    Target("history_query", check_history_query, HISTORY_QUERIES),
)
"""The targets that need no server."""
REQUESTS: Final = st.one_of(mutated(REQUEST_SAMPLES), st.binary(max_size=200))
"""Raw bytes for :func:`check_http`."""


def check_http(port: int, raw: bytes) -> None:
    """Send ``raw`` on a fresh connection: the server answers a status under 500, or closes the
    connection, within 5 s; then ``/healthz`` still answers 200 (the caller checks it)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(raw)
        conn.shutdown(socket.SHUT_WR)  # (a request cut short: the server must not wait forever)
        answer = b""
        try:
            while chunk := conn.recv(65536):
                answer += chunk
                if b"\r\n" in answer:
                    break
        except ConnectionResetError:
            return
    if answer:
        status = answer.split(b"\r\n", 1)[0].split(b" ")
        assert status[0].startswith(b"HTTP/"), answer[:100]  # (aiohttp answers in the version asked)
        assert int(status[1]) < 500 or int(status[1]) in (503, 505), answer[:300]


class ServerErrors(logging.Handler):
    """The errors the HTTP server logs (aiohttp's "Error handling request" and the like): a
    request a handler did not expect is a failure even when the client saw no 500."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        cause = record.exc_info[1] if record.exc_info else ""
        self.seen.append(f"{record.name}: {record.getMessage()} {cause}")

    def __enter__(self) -> ServerErrors:
        for name in ("aiohttp", "fleetlog"):
            logging.getLogger(name).addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        for name in ("aiohttp", "fleetlog"):
            logging.getLogger(name).removeHandler(self)


def healthy(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return conn.recv(100).startswith(b"HTTP/1.1 200")
