"""The service's HTTP server (metrics, health, ingest, job status) on aiohttp's low-level server.

aiohttp parses HTTP/1.1 (llhttp): chunked bodies, keep-alive, and a 400 for a malformed request
line, a negative ``Content-Length`` or a line past ``max_line_bytes``.  What it leaves open is
bounded here, by :class:`HttpLimits`:

* **time** — a connection must deliver a whole request head within ``header_timeout_s`` of
  opening (or of its previous response): aiohttp's keep-alive timer runs from the connection's
  start and is not reset by a trickle of bytes, so idle and slowloris connections are closed;
  a body's first byte must arrive within ``body_first_byte_timeout_s`` of its head and the whole
  body within ``body_timeout_s`` (else 408); a TLS handshake must end within
  ``tls_handshake_timeout_s`` of the connection's opening (else it is closed);
* **size** — at most ``max_headers`` header fields of ``max_field_bytes`` each, and a body of at
  most ``max_body_bytes`` however it is framed (else 413 at once; the rest of the body is then
  read and dropped for up to ``body_timeout_s``, so a client that sends it all before reading
  still gets the answer);
* **count** — at most ``max_connections`` open connections, those still in the TLS handshake
  included: one past the cap closes the oldest connection that is not inside a request (an idle,
  half-sent or handshaking one), or, when all are busy, is answered 503 at once; at most
  ``max_body_requests`` requests with a body are read and handled at a time, and at most
  ``max_body_requests_per_client`` of one client (its principal; unauthenticated, its peer
  address), others get 429 ``busy`` with ``Retry-After``, so body-less requests (health,
  metrics, status) are never queued behind ingest and one client cannot hold every slot;
* **order** — a request is authenticated, then shown (head only) to ``before_body``, which
  authorizes it for its route (a principal the policy names nowhere: 403), before a body slot is
  taken or a byte of its body read.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import ssl
from asyncio import sslproto
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final, cast

import msgspec
from aiohttp import HttpVersion10, HttpVersion11, web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

from fleetlog.service.auth import EXEMPT, Authenticator

# the header is the producers' (defined with them); service.py takes it from here

RETRY_AFTER_S: Final = 1
_BUSY_BODY: Final = (
    b'{"code": "overloaded", "message": "too many open connections, all busy", "field": null, '
    b'"error": "too many open connections, all busy", "reason": "overloaded"}\n'
)
_OVERLOADED: Final = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
    b"Connection: close\r\nContent-Length: " + str(len(_BUSY_BODY)).encode() + b"\r\n\r\n" + _BUSY_BODY
)


class HttpLimits(msgspec.Struct, frozen=True):
    """What one client may hold of the server (see the module docstring)."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    body_first_byte_timeout_s: float = 5.0
    tls_handshake_timeout_s: float = 5.0
    max_connections: int = 256
    max_body_requests: int = 16
    max_body_requests_per_client: int = 4
    max_headers: int = 64
    max_line_bytes: int = 8190
    max_field_bytes: int = 8190
    max_body_bytes: int = 8 * 1024 * 1024


class Request(msgspec.Struct, frozen=True):
    method: str
    path: str
    """Percent-decoded, without the query."""
    headers: dict[str, str]
    body: bytes
    query: dict[str, list[str]] = {}
    """Each query parameter with every value it was given, in order."""
    raw_path: str = ""
    """As sent (percent-encoded): a ``%2F`` inside one segment is not a ``/`` between two."""
    principal: str | None = None
    """Who the client certificate or the bearer token names (fleetlog.service.auth); ``None``: no
    authentication configured, or an exempt route (health)."""
    peer: str | None = None
    """The client's address (what counts an unauthenticated client's share, e.g. of the watch)."""


class Response(msgspec.Struct, frozen=True):
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: dict[str, str] = {}


def json_response(status: int, value: object, headers: dict[str, str] | None = None) -> Response:
    return Response(status, msgspec.json.encode(value) + b"\n", headers=headers or {})


def refusal(
    status: int, reason: str, error: str, field: str | None = None, extra: dict[str, object] | None = None,
    retry_after_s: int = RETRY_AFTER_S,
) -> Response:
    """The API's one error shape, ``{"code", "message", "field"}`` (fleetlog.api.routes.Error),
    with the same code and message also under the names the first API used (``reason``,
    ``error``) and any ``extra``; 429 and 503 carry ``Retry-After`` (``retry_after_s``)."""
    retry = {"Retry-After": str(retry_after_s)} if status in (429, 503) else None
    body: dict[str, object] = {"code": reason, "message": error, "field": field}
    body.update(error=error, reason=reason)
    body.update(extra or {})
    return json_response(status, body, retry)


class Stream:
    """A 200 answer written as it is produced (Server-Sent Events): each chunk of ``chunks`` is
    written, and the client has taken it (TCP back-pressure), before the next is asked for, so
    one client holds at most a chunk in the server's memory however slowly it reads.  The stream
    ends when ``chunks`` ends, the client goes away, or the server stops.  With
    ``write_timeout_s``, a chunk the client has not taken in that long ends it too: ``farewell()``
    (its last words, e.g. where to resume) is queued behind what the client has not read, the
    connection closed once that is sent, and cut if it is still not sent ``write_timeout_s`` later,
    so a client that stopped reading holds nothing for long."""

    def __init__(self, chunks: AsyncIterator[bytes], content_type: str = "text/event-stream",
                 headers: dict[str, str] | None = None, write_timeout_s: float | None = None,
                 farewell: Callable[[], bytes] | None = None) -> None:
        self.chunks, self.content_type, self.headers = chunks, content_type, headers or {}
        self.write_timeout_s, self.farewell = write_timeout_s, farewell


def unrouted(request: Request, elsewhere: bool) -> Response:
    """404 ``no_route``, or 405 when the path is a route for another method
    (fleetlog.api.routes.route_for)."""
    if elsewhere:
        return refusal(405, "method_not_allowed", f"{request.method} {request.path}: see /v1/openapi.json")
    return refusal(404, "no_route", f"no route {request.path} (the routes: /v1/openapi.json)")


Handler = Callable[[Request], Awaitable["Response | Stream"]]
BeforeBody = Callable[[Request], Awaitable["Response | Stream | None"]]
"""Shown a request with a body by its head alone (``body`` empty), authenticated: the answer to
give without reading the body (a refusal, or the answer of a route that takes no body), or
``None`` to read the body and call the handler."""


class _ClientFault(logging.Filter):
    """Drops aiohttp's error log of a request it could not parse: the client's fault, answered
    400 — a flood of them must not flood the service's log."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, HttpProcessingError)


_SERVER_LOG: Final = logging.getLogger("fleetlog.http")
_SERVER_LOG.addFilter(_ClientFault())


class _CappedServer(web.Server):
    """aiohttp's server with a cap on open connections (oldest idle one evicted first).  With
    ``tls`` each accepted connection first goes through :class:`_Handshake`: asyncio's own TLS
    server hands a connection to aiohttp only once its handshake ends, so the cap would not see
    the connections that never send a ClientHello, and they would wait 60 s each."""

    def __init__(self, handler: Any, max_connections: int, tls: ssl.SSLContext | None = None,
                 handshake_timeout_s: float = 5.0, **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self.max_connections, self.tls, self.handshake_timeout_s = max_connections, tls, handshake_timeout_s
        self.open: dict[RequestHandler, asyncio.BaseTransport] = {}  # oldest first (handshaking ones too)
        self.busy: set[RequestHandler] = set()
        self.handshaking: dict[RequestHandler, asyncio.Transport] = {}
        """TLS connections in their handshake (in :attr:`open` too), by their handler to be."""

    def __call__(self) -> Any:
        """The protocol of a new connection (asyncio calls this on accept)."""
        return _Handshake(self) if self.tls is not None else super().__call__()

    def admit(self, key: RequestHandler, transport: asyncio.BaseTransport) -> bool:
        """Count a new connection, evicting the oldest idle one at the cap; ``False`` when every
        one is inside a request (the caller refuses it)."""
        if len(self.open) >= self.max_connections and not self._evict_idle():
            return False
        self.open[key] = transport
        return True

    def handshake_done(self, handler: RequestHandler, waiter: asyncio.Future[None]) -> None:
        """A TLS handshake ended (:class:`_Handshake`): a failed one is forgotten (its transport
        is closed by then); a good one stays counted, now as the request handler's."""
        tcp = self.handshaking.pop(handler, None)
        if waiter.cancelled() or waiter.exception() is not None:
            self.open.pop(handler, None)
            if tcp is not None:
                tcp.close()

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        if handler in self.open:  # (its TLS handshake was counted: now the TLS transport is)
            self.open[handler] = transport
            return
        if not self.admit(handler, transport):
            if self.tls is None:
                transport.write(_OVERLOADED)
            transport.close()

    def connection_lost(self, handler: RequestHandler, exc: BaseException | None = None) -> None:
        self.open.pop(handler, None)
        self.busy.discard(handler)
        super().connection_lost(handler, exc)

    def _evict_idle(self) -> bool:
        for handler, transport in self.open.items():
            if handler not in self.busy:
                del self.open[handler]
                transport.close()
                return True
        return False


class _Handshake(asyncio.Protocol):
    """What asyncio's TLS server does on accept, with the connection counted by the cap from the
    start: the TCP transport is handed, within ``connection_made`` (before a byte is read), to an
    :class:`asyncio.sslproto.SSLProtocol` with ``handshake_timeout_s``, which hands aiohttp's
    request handler the TLS transport once the handshake ends.  Until then the connection counts
    as idle (the first evicted at the cap); one that fails or times out is closed and forgotten.
    (Not ``loop.start_tls``: it runs a loop iteration later, after uvloop has begun to read, and
    the ClientHello read in between would be lost.)"""

    def __init__(self, server: _CappedServer) -> None:
        self.server = server

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        server, tcp = self.server, cast(asyncio.Transport, transport)  # (uvloop's: no asyncio subclass)
        assert server.tls is not None
        handler = web.Server.__call__(server)
        if not server.admit(handler, tcp):
            tcp.close()  # (no plain-text 503 on a TLS port)
            return
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        waiter.add_done_callback(lambda done: server.handshake_done(handler, done))
        # (the timeout is float seconds, as loop.create_server takes it; typeshed says int)
        tls = sslproto.SSLProtocol(loop, handler, server.tls, waiter, server_side=True,
                                   ssl_handshake_timeout=server.handshake_timeout_s)  # type: ignore[arg-type]
        server.handshaking[handler] = tcp
        tcp.set_protocol(tls)
        tls.connection_made(tcp)


class BindError(Exception):
    """The HTTP address cannot be bound (a host that does not resolve, a port below 1024…)."""


class PortInUseError(BindError):
    """Another socket listens on the HTTP port."""


class HttpServer:
    """Serves ``handler`` on ``host:port`` (port 0: any free port, see :attr:`port`); over HTTPS
    with ``ssl_context`` (fleetlog.service.auth.server_tls: its client certificates, verified in
    the handshake, name the principal)."""

    def __init__(self, handler: Handler, host: str = "127.0.0.1", port: int = 0,
                 limits: HttpLimits | None = None, auth: Authenticator | None = None,
                 unauthenticated: Callable[[], None] | None = None,
                 ssl_context: ssl.SSLContext | None = None, before_body: BeforeBody | None = None) -> None:
        self.handler, self.host, self.port = handler, host, port
        self.auth, self.unauthenticated, self.ssl_context = auth, unauthenticated, ssl_context
        self.before_body = before_body
        self.limits = limits or HttpLimits()
        self.body_requests = 0
        self.body_requests_of: dict[str, int] = {}
        """Requests with a body in hand, by client (``principal:NAME`` or ``peer:ADDRESS``)."""
        self._runner: web.ServerRunner | None = None
        self._server: _CappedServer | None = None
        self._closing = asyncio.Event()

    @property
    def serving(self) -> bool:
        return self._runner is not None

    async def start(self) -> None:
        """Bind and serve; a :class:`BindError` (nothing left open) when the address cannot be
        bound, a :class:`PortInUseError` when another socket holds it."""
        lim = self.limits
        self._closing = asyncio.Event()
        self._server = _CappedServer(
            self._dispatch, lim.max_connections, self.ssl_context, lim.tls_handshake_timeout_s,
            keepalive_timeout=lim.header_timeout_s,
            max_headers=lim.max_headers, max_line_size=lim.max_line_bytes,
            max_field_size=lim.max_field_bytes, lingering_time=lim.body_timeout_s, access_log=None,
            handler_cancellation=True, logger=_SERVER_LOG,
        )
        runner = web.ServerRunner(self._server, handle_signals=False)
        await runner.setup()
        try:
            # (TLS is not aiohttp's to do: _CappedServer hands each connection to a _Handshake first)
            await web.TCPSite(runner, self.host, self.port, backlog=lim.max_connections).start()
        except OSError as exc:
            await runner.cleanup()
            where = f"{self.host}:{self.port}"
            if exc.errno == errno.EADDRINUSE:
                raise PortInUseError(f"cannot serve HTTP on {where}: the port is in use") from None
            raise BindError(f"cannot serve HTTP on {where}: {exc.strerror or exc}") from None
        self._runner = runner
        self.port = int(runner.addresses[0][1])

    async def stop(self) -> None:
        self._closing.set()  # open streams end first, so cleanup does not wait on them
        for transport in list(self._server.handshaking.values() if self._server is not None else ()):
            transport.close()  # (aiohttp does not know them yet)
        runner, self._runner = self._runner, None
        if runner is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(runner.cleanup(), 5)

    @property
    def connections(self) -> int:
        return len(self._server.open) if self._server is not None else 0

    async def _dispatch(self, raw: web.BaseRequest) -> web.StreamResponse:
        server = self._server
        assert server is not None
        server.busy.add(raw.protocol)
        try:
            response = await self._answer(raw)
            if isinstance(response, Stream):
                return await self._stream(raw, response)
        finally:
            server.busy.discard(raw.protocol)
        headers = {"Content-Type": response.content_type, **response.headers}
        out = web.Response(status=response.status, body=response.body, headers=headers)
        if raw.can_read_body:  # refused unread: "Connection: close", the rest drained (lingering)
            out.force_close()
        return out

    async def _stream(self, raw: web.BaseRequest, stream: Stream) -> web.StreamResponse:
        out = web.StreamResponse(status=200, headers={
            "Content-Type": stream.content_type, "Cache-Control": "no-cache", "X-Accel-Buffering": "no",
            **stream.headers})
        if raw.version == HttpVersion11:  # an HTTP/1.0 client reads the stream to the close
            out.enable_chunked_encoding()
        try:
            await out.prepare(raw)
        except ConnectionError:  # the client went away before the answer began: nothing to tell it
            aclose = getattr(stream.chunks, "aclose", None)
            if aclose is not None:
                await aclose()
            return out
        closing = asyncio.ensure_future(self._closing.wait())
        chunk: asyncio.Future[bytes] | None = None
        try:
            while True:
                chunk = asyncio.ensure_future(anext(stream.chunks))
                await asyncio.wait({chunk, closing}, return_when=asyncio.FIRST_COMPLETED)
                if not chunk.done():  # the server stops: end the stream (the client resumes elsewhere)
                    break
                try:
                    data = chunk.result()
                except StopAsyncIteration:
                    break
                try:
                    async with asyncio.timeout(stream.write_timeout_s):
                        await out.write(data)
                except ConnectionError:  # the client went away mid-stream
                    break
                except TimeoutError:  # the client takes nothing: drop it (Stream)
                    await _drop(raw, out, stream)
                    break
        finally:  # (also when the client went away: aiohttp cancels this handler)
            closing.cancel()
            if chunk is not None and not chunk.done():  # the producer waits (a long-poll read): stop it
                chunk.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                    await chunk
            aclose = getattr(stream.chunks, "aclose", None)
            if aclose is not None:
                await aclose()
        with contextlib.suppress(ConnectionError, RuntimeError):
            await out.write_eof()
        return out

    async def _answer(self, raw: web.BaseRequest) -> Response | Stream:
        if raw.version not in (HttpVersion10, HttpVersion11):  # (aiohttp parses any "HTTP/x.y")
            version = f"HTTP/{raw.version.major}.{raw.version.minor}"
            return refusal(505, "http_version", f"{version} is not served: HTTP/1.1 or HTTP/1.0")
        principal = None
        if self.auth is not None and raw.path not in EXEMPT:  # before any body is read
            verdict = self.auth.check(raw.headers.get("Authorization"), _peercert(raw))
            if verdict.principal is None:
                if self.unauthenticated is not None:
                    self.unauthenticated()
                return _unauthenticated(verdict.problem)
            principal = verdict.principal
        if not raw.body_exists:
            return await self.handler(_request(raw, b"", principal))
        if self.before_body is not None:  # authorized for the route before a byte of the body is read
            answer = await self.before_body(_request(raw, b"", principal))
            if answer is not None:
                return answer
        client = f"principal:{principal}" if principal is not None else f"peer:{raw.remote}"
        busy = self._busy(client)
        if busy is not None:
            return busy
        self.body_requests += 1
        self.body_requests_of[client] = self.body_requests_of.get(client, 0) + 1
        try:
            body = await self._read_body(raw)
            return body if isinstance(body, Response) else await self.handler(_request(raw, body, principal))
        finally:
            self.body_requests -= 1
            self.body_requests_of[client] -= 1
            if not self.body_requests_of[client]:
                del self.body_requests_of[client]

    def _busy(self, client: str) -> Response | None:
        """429 ``busy`` when every body slot is taken, or ``client``'s share of them."""
        lim = self.limits
        if self.body_requests >= lim.max_body_requests:
            return refusal(429, "busy", f"{self.body_requests} requests with a body in hand; retry later")
        mine = self.body_requests_of.get(client, 0)
        if mine >= lim.max_body_requests_per_client:
            who = client.replace(":", " ", 1)
            return refusal(429, "busy", f"{who} has {mine} requests with a body in hand, its share of "
                           f"{lim.max_body_requests}; retry later",
                           extra={"limit": lim.max_body_requests_per_client})
        return None

    async def _read_body(self, raw: web.BaseRequest) -> bytes | Response:
        """The whole body, or a 413/408 refusal: a body over the limit is refused as soon as its
        ``Content-Length`` (or, chunked, its running size) shows it."""
        limit = self.limits.max_body_bytes
        too_large = refusal(413, "too_large", f"request body over {limit} bytes", extra={"limit": limit})
        if raw.content_length is not None and raw.content_length > limit:
            return too_large
        lim = self.limits
        parts: list[bytes] = []
        size, started = 0, asyncio.get_running_loop().time()
        try:  # the first byte soon (a head alone holds no slot long), then the rest by body_timeout_s
            async with asyncio.timeout(min(lim.body_first_byte_timeout_s, lim.body_timeout_s)) as clock:
                chunk = await raw.content.readany()
                clock.reschedule(started + lim.body_timeout_s)
                while chunk:
                    size += len(chunk)
                    if size > limit:
                        return too_large
                    parts.append(chunk)
                    chunk = await raw.content.readany()
        except TimeoutError:
            if not parts:
                return refusal(408, "timeout", f"no byte of the request body in "
                               f"{min(lim.body_first_byte_timeout_s, lim.body_timeout_s)}s")
            return refusal(408, "timeout", f"request body not received in {lim.body_timeout_s}s")
        return b"".join(parts)


def _unauthenticated(problem: str) -> Response:
    answer = refusal(401, "unauthenticated", problem)
    return Response(401, answer.body, headers={"WWW-Authenticate": 'Bearer realm="fleetlog"'})


def _peercert(raw: web.BaseRequest) -> dict[str, Any] | None:
    """The client certificate the TLS handshake verified (``None``: plain HTTP or none presented;
    one that did not verify never gets this far)."""
    transport = raw.transport
    found = transport.get_extra_info("peercert") if transport is not None else None
    return found if isinstance(found, dict) and found else None


def _request(raw: web.BaseRequest, body: bytes, principal: str | None = None) -> Request:
    headers = {name.lower(): value for name, value in raw.headers.items()}
    query: dict[str, list[str]] = {}
    for name, value in raw.rel_url.query.items():
        query.setdefault(name, []).append(value)
    return Request(raw.method.upper(), raw.path, headers, body, query, raw.rel_url.raw_path, principal,
                   raw.remote)


async def _drop(raw: web.BaseRequest, out: web.StreamResponse, stream: Stream) -> None:
    """End a stream whose client took nothing for ``write_timeout_s`` (:class:`Stream`)."""
    transport = raw.transport
    if stream.farewell is not None:
        with contextlib.suppress(TimeoutError, ConnectionError, RuntimeError):
            async with asyncio.timeout(0):  # (queued at once; the wait for the drain is cut)
                await out.write(stream.farewell())
    if transport is not None:
        transport.close()  # (sends what is queued, then closes) ...
        asyncio.get_running_loop().call_later(stream.write_timeout_s or 0, transport.abort)  # ... or not
