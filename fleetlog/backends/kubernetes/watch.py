"""List + watch one kind of object, resuming from the last resourceVersion.

A watch that ends is resumed from the last resourceVersion seen (including bookmarks).  A
``410 Gone`` (the version is older than the API server keeps) leads to a relist, and the relist
is handed over whole, so the caller can tell which objects disappeared in between.  An API
server that goes away is retried with a capped backoff, forever, until the task is cancelled.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

from fleetlog.backends.kubernetes.api import KubeApi, KubeApiError, KubeUnreachableError, Query
from fleetlog.backends.kubernetes.objects import BOOKMARK, STATUS, WATCH_EVENT, ListMeta

T = TypeVar("T")
log = logging.getLogger("fleetlog.backends.kubernetes")
PAGE: Final = 500
GONE: Final = 410


class GoneError(Exception):
    """The resourceVersion to resume from is too old: relist."""


@dataclass(frozen=True)
class Kind(Generic[T]):
    """How to list and decode one kind of object."""

    path: str
    decode_list: Callable[[bytes], tuple[list[T], ListMeta]]
    decode_one: Callable[[bytes], T]
    version_of: Callable[[T], str]
    field_selector: str = ""


@dataclass
class Handlers(Generic[T]):
    relisted: Callable[[list[T]], Awaitable[None]]
    """Every object there is now (after a first list or a relist)."""
    changed: Callable[[str, T], Awaitable[None]]
    """A watch event: ``ADDED``, ``MODIFIED`` or ``DELETED`` and the object."""


class Watcher(Generic[T]):
    def __init__(self, api: KubeApi, kind: Kind[T], handlers: Handlers[T], timeout_s: int = 300) -> None:
        self.api, self.kind, self.handlers, self.timeout_s = api, kind, handlers, timeout_s
        self.resource_version = ""
        self.relists = 0
        self.connected = asyncio.Event()
        self.running = True
        """Cleared by the owner before it cancels :meth:`run`, so a cancellation that a client
        library turns into a timeout still ends the loop."""

    def _query(self, extra: Sequence[tuple[str, str]]) -> Query:
        selector = [("fieldSelector", self.kind.field_selector)] if self.kind.field_selector else []
        return [*selector, *extra]

    async def relist(self) -> None:
        """List every object (paged) and hand them over; remember the list's resourceVersion."""
        items: list[T] = []
        token = ""
        while True:
            extra = [("limit", str(PAGE)), *([("continue", token)] if token else [])]
            data = await self.api.request("GET", self.kind.path, self._query(extra))
            page, meta = self.kind.decode_list(data)
            items.extend(page)
            token = meta.continue_
            if not token:
                break
        self.resource_version = meta.resource_version
        self.relists += 1
        await self.handlers.relisted(items)

    async def watch_once(self) -> None:
        """One watch request from the current resourceVersion until the server ends it."""
        extra = [
            ("watch", "1"),
            ("resourceVersion", self.resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(self.timeout_s)),
        ]
        self.connected.set()
        async for line in self.api.stream(self.kind.path, self._query(extra), self.timeout_s + 30):
            await self._line(line)

    async def _line(self, line: bytes) -> None:
        event = WATCH_EVENT.decode(line)
        raw = bytes(event.object)
        if event.type == "BOOKMARK":
            self.resource_version = BOOKMARK.decode(raw).metadata.resource_version
        elif event.type == "ERROR":
            status = STATUS.decode(raw)
            if status.code == GONE:
                raise GoneError(status.message)
            raise KubeApiError(status.code, status.reason, status.message)
        else:
            obj = self.kind.decode_one(raw)
            await self.handlers.changed(event.type, obj)
            self.resource_version = self.kind.version_of(obj) or self.resource_version

    async def run(self) -> None:
        """Watch forever (relisting when needed) until cancelled."""
        backoff = 0.1
        while self.running:
            try:
                if not self.resource_version:
                    await self.relist()
                await self.watch_once()
                backoff = 0.1
            except (GoneError, KubeApiError) as e:
                if isinstance(e, KubeApiError) and e.status != GONE:
                    log.warning("watch %s failed: %s", self.kind.path, e)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 5.0)
                self.resource_version = ""
            except KubeUnreachableError as e:
                self.connected.clear()
                log.warning("API server unreachable (%s); retrying in %.1fs", e, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
