"""A small HTTP/1.1 server on asyncio streams: metrics, health and event ingest.

One request per connection (``Connection: close``); bodies up to :data:`MAX_BODY` bytes.
No framework: the service needs four routes and must not pull a web stack into the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Final

import msgspec

MAX_BODY: Final = 64 * 1024 * 1024
_REASONS: Final = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
                   413: "Payload Too Large", 503: "Service Unavailable"}


class Request(msgspec.Struct, frozen=True):
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class Response(msgspec.Struct, frozen=True):
    status: int
    body: bytes
    content_type: str = "application/json"


def json_response(status: int, value: object) -> Response:
    return Response(status, msgspec.json.encode(value) + b"\n")


Handler = Callable[[Request], Awaitable[Response]]


class HttpServer:
    """Serves ``handler`` on ``host:port`` (port 0: any free port, see :attr:`port`)."""

    def __init__(self, handler: Handler, host: str = "127.0.0.1", port: int = 0) -> None:
        self.handler, self.host, self.port = handler, host, port
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 2)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await _read_request(reader)
            response = await self.handler(request) if isinstance(request, Request) else request
            writer.write(_render(response))
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


async def _read_request(reader: asyncio.StreamReader) -> Request | Response:
    line = (await reader.readline()).decode("latin-1").strip()
    parts = line.split()
    if len(parts) != 3:
        return json_response(400, {"error": f"bad request line {line[:80]!r}", "reason": "bad_request"})
    headers: dict[str, str] = {}
    while (raw := (await reader.readline()).decode("latin-1").strip()) != "":
        name, _, value = raw.partition(":")
        headers[name.strip().lower()] = value.strip()
    try:
        length = int(headers.get("content-length", "0"))
    except ValueError:
        return json_response(400, {"error": "content-length is not an integer", "reason": "bad_request"})
    if length > MAX_BODY:
        return json_response(413, {"error": f"body over {MAX_BODY} bytes", "reason": "too_large"})
    body = await reader.readexactly(length) if length else b""
    return Request(parts[0].upper(), parts[1], headers, body)


def _render(response: Response) -> bytes:
    head = (
        f"HTTP/1.1 {response.status} {_REASONS.get(response.status, 'Status')}\r\n"
        f"Content-Type: {response.content_type}\r\nContent-Length: {len(response.body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode("latin-1") + response.body
