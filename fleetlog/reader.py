"""A Python client that reads the service's API (docs/api.md): lists typed with the API's own
msgspec structs, one job, finished jobs' accounting (``/v1/history``, which ``fleetlog replay
serve`` answers), and a watch of the decisions or inputs log that resumes by itself.

    async with Reader("http://127.0.0.1:9464") as api:
        pending = await api.jobs(state="pending", tenant="t1")
        async for change in api.watch(start="end"):
            print(change.offset, change.type)

:class:`SyncReader` is the same for code without an event loop.  (Producers write with
:mod:`fleetlog.client`.)
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncGenerator, Iterator
from types import TracebackType
from typing import Any, Final
from urllib.parse import quote

import aiohttp
import msgspec

from fleetlog.api.detail import JobDetail
from fleetlog.api.history import Finished, HistoryPage
from fleetlog.api.resources import (
    MAX_LIMIT,
    CellItem,
    CellList,
    JobItem,
    JobPage,
    NodeItem,
    NodePage,
    QueueItem,
    QueueList,
    TenantItem,
    TenantList,
)
from fleetlog.auth_client import auth_headers, refused_why, tls_for, unreachable_why

READ_BUFSIZE: Final = 64 << 20
"""The longest line a watch may carry (aiohttp's read buffer: a line past twice this is refused)."""


class ReaderError(Exception):
    """The API refused a request (``status``, ``code``, ``field`` as it answered) or is unreachable."""

    def __init__(self, message: str, status: int = 0, code: str = "", field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.field = status, code, field


class Change(msgspec.Struct, frozen=True):
    """One record of a watched log: its offset, append time, type and the event as JSON."""

    offset: int
    timestamp_ms: int
    type: str
    event: dict[str, Any] | None = None
    error: str | None = None
    """An ``undecodable`` record: what is wrong with it (``event`` is then ``None``)."""


class Reader:
    def __init__(self, url: str, session: aiohttp.ClientSession | None = None, timeout_s: float = 30) -> None:
        self.url = url.rstrip("/")
        self._session, self._own = session, session is None
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def __aenter__(self) -> Reader:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._own and self._session is not None:
            await self._session.close()
            self._session = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:  # a watched record is one line: a step of 10,000 placements is 0.8 MB
            connector = aiohttp.TCPConnector(ssl=tls_for(self.url) or True)  # https: FLEETLOG_CA_FILE...
            self._session = aiohttp.ClientSession(connector=connector, read_bufsize=READ_BUFSIZE,
                                                  headers=auth_headers())
        return self._session

    async def _get(self, path: str, params: list[tuple[str, str]]) -> bytes:
        try:
            async with self._open().get(self.url + path, params=params, timeout=self._timeout) as r:
                body = await r.read()
                if r.status != 200:
                    raise _refused(r.status, body)
                return body
        except aiohttp.ClientError as exc:
            raise ReaderError(f"cannot read {self.url}{path}: {unreachable_why(self.url, exc)}") from None

    async def _pages(
        self, path: str, page: type[Any], filters: dict[str, Any], limit: int | None
    ) -> list[Any]:
        params = [(k, str(v)) for k, values in filters.items() for v in _many(values)]
        out: list[Any] = []
        token: str | None = None
        while limit is None or len(out) < limit:
            ask = params + ([("page_token", token)] if token else [])
            ask += [("limit", str(min(MAX_LIMIT, limit - len(out))))] if limit is not None else []
            found = msgspec.json.decode(await self._get(path, ask), type=page)
            out += found.items
            token = found.next_page_token
            if token is None:
                break
        return out

    async def jobs(self, limit: int | None = None, **filters: Any) -> list[JobItem]:
        """Jobs in submission order; filters ``tenant``, ``queue``, ``state``, ``reason``, ``cell``
        (each a value or a list of values: any of them); every page up to ``limit``."""
        return await self._pages("/v1/jobs", JobPage, filters, limit)

    async def nodes(self, limit: int | None = None, **filters: Any) -> list[NodeItem]:
        """Nodes in first-seen order; filters ``cell``, ``model``, ``status``."""
        return await self._pages("/v1/nodes", NodePage, filters, limit)

    async def job(self, job_id: str) -> JobDetail:
        """One job, its story included (``GET /v1/jobs/JOB``)."""
        return msgspec.json.decode(await self._get(f"/v1/jobs/{quote(job_id, safe='')}", []), type=JobDetail)

    async def history(self, limit: int | None = None, **filters: Any) -> list[Finished]:
        """Finished jobs' accounting records in the order they ended (``GET /v1/history``, which
        ``fleetlog replay serve`` answers); filters ``tenant``, ``queue``, ``state`` (each a value
        or a list of values: any of them), ``since`` and ``until`` (an ISO 8601 time, or epoch
        milliseconds: an int, or a string ending in ``ms``); every page up to ``limit``."""
        for name in ("since", "until"):
            if isinstance(filters.get(name), int):
                filters[name] = f"{filters[name]}ms"
        return await self._pages("/v1/history", HistoryPage, filters, limit)

    async def tenants(self) -> list[TenantItem]:
        return msgspec.json.decode(await self._get("/v1/tenants", []), type=TenantList).items

    async def queues(self) -> list[QueueItem]:
        return msgspec.json.decode(await self._get("/v1/queues", []), type=QueueList).items

    async def cells(self) -> list[CellItem]:
        return msgspec.json.decode(await self._get("/v1/cells", []), type=CellList).items

    async def watch(self, start: int | str = "end", log: str = "decisions", reconnect_s: float = 1.0
                    ) -> AsyncGenerator[Change, None]:
        """Every record of ``log`` from ``start`` (an offset, ``"start"`` or ``"end"``), for ever: a
        dropped connection is resumed after the last record seen (``Last-Event-ID``), so nothing
        is missed or repeated.  A refusal (a bad offset, a stand-by process) raises."""
        last: int | None = None
        while True:
            headers = {"Last-Event-ID": str(last)} if last is not None else {}
            try:
                params = {"from": str(start), "log": log}
                forever = aiohttp.ClientTimeout(sock_read=None)
                async with self._open().get(self.url + "/v1/watch", params=params, headers=headers,
                                            timeout=forever) as r:
                    if r.status != 200:
                        raise _refused(r.status, await r.read())
                    changes = _changes(r.content)
                    try:
                        async for change in changes:
                            last = change.offset
                            yield change
                    finally:  # closed now, not by the garbage collector on some other loop
                        await changes.aclose()
            except (TimeoutError, aiohttp.ClientError):
                pass
            await asyncio.sleep(reconnect_s)


async def _changes(stream: aiohttp.StreamReader) -> AsyncGenerator[Change, None]:
    """Server-Sent Events (``id``/``event``/``data`` fields, a blank line ends one) as changes.  A
    ``data:`` line is decoded where it lies (JSON allows the space before and the line end after
    it): a record of 10,000 decisions is a line of ~0.9 MB, which copying would cost as much as
    reading."""
    kind, data = "", list[memoryview]()
    async for raw in stream:
        if raw.startswith(b"data:"):
            data.append(memoryview(raw)[5:])
        elif raw.startswith(b"event:"):
            kind = raw[6:].strip().decode()
        elif not raw.strip(b"\r\n"):
            if kind == "dropped":  # (the server dropped a reader too slow: resume after the last change)
                return
            if data:  # (the line ends kept between data lines are the "\n" SSE joins them with)
                body = _json(data[0] if len(data) == 1 else b"".join(data))
                yield Change(body["offset"], body["timestamp_ms"], kind, body.get("event"), body.get("error"))
            kind, data = "", []


def _json(data: memoryview | bytes) -> Any:
    """``data`` decoded with the garbage collector held off.  A record of 10,000 decisions
    decodes to ~40,000 dicts and lists; with the collector on, each 700 of them start a
    collection, and every few a full one walks the whole heap (a client that imported fleetlog
    has a large one): 25 ms a record instead of 5 (benchmarks/README.md, "api").  A decode makes
    no cycles, so nothing waits for the collector that would not wait anyway."""
    if not gc.isenabled():
        return msgspec.json.decode(data)
    gc.disable()
    try:
        return msgspec.json.decode(data)
    finally:
        gc.enable()


def _many(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple, set, frozenset)) else [value]


def _refused(status: int, body: bytes) -> ReaderError:
    try:
        answer = msgspec.json.decode(body)
        message = refused_why(status, str(answer.get("message", answer)))
        return ReaderError(message, status, str(answer.get("code", "")), answer.get("field"))
    except (msgspec.DecodeError, AttributeError):
        return ReaderError(f"HTTP {status}: {body[:200]!r}", status)


class SyncReader:
    """:class:`Reader` for code without an event loop (it runs one of its own)."""

    def __init__(self, url: str, timeout_s: float = 30) -> None:
        self._loop = asyncio.new_event_loop()
        self._reader = Reader(url, timeout_s=timeout_s)

    def __enter__(self) -> SyncReader:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._loop.run_until_complete(self._reader.close())
        self._loop.close()

    def jobs(self, limit: int | None = None, **filters: Any) -> list[JobItem]:
        return self._loop.run_until_complete(self._reader.jobs(limit, **filters))

    def nodes(self, limit: int | None = None, **filters: Any) -> list[NodeItem]:
        return self._loop.run_until_complete(self._reader.nodes(limit, **filters))

    def job(self, job_id: str) -> JobDetail:
        return self._loop.run_until_complete(self._reader.job(job_id))

    def history(self, limit: int | None = None, **filters: Any) -> list[Finished]:
        return self._loop.run_until_complete(self._reader.history(limit, **filters))

    def tenants(self) -> list[TenantItem]:
        return self._loop.run_until_complete(self._reader.tenants())

    def queues(self) -> list[QueueItem]:
        return self._loop.run_until_complete(self._reader.queues())

    def cells(self) -> list[CellItem]:
        return self._loop.run_until_complete(self._reader.cells())

    def watch(self, start: int | str = "end", log: str = "decisions") -> Iterator[Change]:
        changes = self._reader.watch(start, log)
        try:
            while True:
                yield self._loop.run_until_complete(anext(changes))
        finally:
            self._loop.run_until_complete(changes.aclose())
