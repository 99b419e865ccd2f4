"""A test-only stand-in for the ingest side of ``fleetlog run --log DIR``, on real sockets and a real log.

It implements the contract the producer client is written against: it holds the file log's writer
lock, announces itself in ``DIR/service.json`` (``{"pid": ..., "http": "127.0.0.1:PORT"}``) and
answers ``POST /v1/events`` (one envelope or a JSON array of them as ``application/json``, or one
msgpack envelope) with 200 ``{"appended": n, "first_offset": k}`` or 400 ``{"error", "reason"}``.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

from fleetlog.events.codec import CONTENT_TYPE_HEADER, JSON, MSGPACK, BadEventError, decode, encode
from fleetlog.log.base import INPUTS, Message
from fleetlog.log.discovery import SERVICE_FILE
from fleetlog.log.file import FileLogStore


def _bodies(body: bytes, content_type: bytes) -> list[bytes]:
    if content_type == MSGPACK or not body.lstrip().startswith(b"["):
        return [body]
    return [json.dumps(item).encode() for item in json.loads(body)]


def ingest(store: FileLogStore, body: bytes, content_type: bytes) -> tuple[int, dict[str, Any]]:
    """Decode every envelope first (a bad one rejects the request), then append them all."""
    try:
        envelopes = [decode(part, content_type) for part in _bodies(body, content_type)]
    except BadEventError as exc:
        return 400, {"error": exc.message, "reason": exc.reason}
    except json.JSONDecodeError as exc:
        return 400, {"error": f"body is not JSON: {exc}", "reason": "undecodable"}
    messages = [
        Message(encode(e), key=e.key.encode() if e.key else None, headers=((CONTENT_TYPE_HEADER, MSGPACK),))
        for e in envelopes
    ]
    first = store.log(INPUTS).append_now(messages)
    return 200, {"appended": len(messages), "first_offset": first}


class IngestService:
    """Serves the contract on 127.0.0.1 from a thread; ``requests`` counts what it answered."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.store = FileLogStore(directory)
        self.requests: list[int] = []
        self.lock = threading.Lock()
        self._server = HTTPServer(("127.0.0.1", 0), self._handler())
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                kind = (self.headers.get("content-type") or "application/json").split(";")[0].strip().encode()
                if self.path != "/v1/events":
                    status, answer = 404, {"error": "not found", "reason": "not_found"}
                elif kind not in (JSON, MSGPACK):
                    status, answer = 400, {"error": "bad content-type", "reason": "unknown_content_type"}
                else:
                    with service.lock:
                        status, answer = ingest(service.store, body, kind)
                service.requests.append(status)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler

    def start(self) -> IngestService:
        _run_in_thread(self.store.open)
        self._thread.start()
        (self.directory / SERVICE_FILE).write_text(
            json.dumps({"pid": os.getpid(), "http": f"127.0.0.1:{self.port}"})
        )
        return self

    def stop(self) -> None:
        (self.directory / SERVICE_FILE).unlink(missing_ok=True)
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
        _run_in_thread(self.store.close)

    def __enter__(self) -> IngestService:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _run_in_thread(coroutine_function: Any) -> None:
    """Run an async method to completion on a private event loop (the test's loop may be running)."""
    errors: list[BaseException] = []

    def target() -> None:
        try:
            asyncio.run(coroutine_function())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
