"""The file log a backend shares with ``fleetlog run --log DIR``.

The service holds the directory's writer lock, so a backend process cannot open it for writing
(it used to die with ``LockedError``).  :class:`SharedFileStore` is what a backend opens instead:

- **reads** (the decisions log, the inputs log) come from a read-only view of the directory: no
  lock, the writer's appends are picked up by polling;
- **appends** to the inputs log (the backend's observations) go where ``fleetlog submit --log
  DIR`` sends its events (:mod:`fleetlog.client`): to the running service's ingest endpoint that
  ``DIR/service.json`` announces, or, while no service runs, to the log itself as a *yielding*
  writer that hands the log over as soon as a service waits for it (``LOCK.intent``).

An append that cannot go anywhere yet (the service is starting, recovering or busy) is retried,
for up to :data:`APPEND_RETRY_S`: observations are facts the scheduler must not lose.  An event
the service refuses for what it says (:data:`REFUSED_EVENT`: a pod group that can never fit the
fleet, a job id submitted before with another spec, ...) is left out with a warning that names
it, and the rest of its request is sent: one such pod must not stop the backend, nor hold back
the heartbeats and task events of every other.  Any other refusal is a
:class:`~fleetlog.log.base.LogError`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from fleetlog.client import (
    ClientError,
    FileTransport,
    HttpTransport,
    StoreTransport,
    Transport,
)
from fleetlog.events.codec import CONTENT_TYPE_HEADER, BadEventError, decode
from fleetlog.events.model import Envelope
from fleetlog.log.base import (
    INPUTS,
    LOG_NAMES,
    Log,
    LogClosedError,
    LogError,
    LogStore,
    Message,
    Record,
    Shard,
)
from fleetlog.log.discovery import ACCEPT_NEVER_FITS, announced
from fleetlog.log.file import FileLogStore, LockedError
from fleetlog.log.location import Located
from fleetlog.log.routing import CELL_HEADER

log = logging.getLogger("fleetlog.backends")

EVENTS_PER_REQUEST: Final = 1000
"""Observations per ingest request: far below the service's ``max_request_events`` (10,000)."""
APPEND_RETRY_S: Final = 300.0
"""How long an append waits for a place to go (a service recovering a large state, …)."""
RETRY_SLEEP_S: Final = 0.2
RETRIED: Final = frozenset({"unreachable", "standby", "busy", "overloaded", "too_much_pending", "timeout",
                              "too_many_submissions"})
"""Reasons of a failed send that pass: nothing was appended, and sending again may work."""
REFUSED_EVENT: Final = frozenset({
    "never_fits", "already_exists", "unknown_job", "already_ended", "not_an_input", "invalid_event",
    "undecodable", "too_deep", "duplicate_key",
})
"""Reasons the service gives for one event's content: that event is left out (see above)."""


class RefusedError(LogError):
    """The service refused a request of observations for a reason sending again will not mend
    (``reason``: its code, e.g. ``forbidden`` for a token without the cell's role)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class _RefusedEvent(Exception):
    """The service refused a request for the content of one of its events."""

    def __init__(self, error: ClientError) -> None:
        super().__init__(str(error))
        self.error = error


class _SharedLog(Log):
    """One log of the directory: read from the read-only view; appends only to the inputs log."""

    def __init__(self, store: SharedFileStore, name: str) -> None:
        self.store, self.name = store, name

    async def append(self, messages: Sequence[Message]) -> int:
        if self.name != INPUTS:
            raise LogError(f"a backend beside the service appends only to the inputs log, not {self.name}")
        return await self.store.append_inputs(messages)

    async def read(self, offset: int, max_records: int = 10_000, timeout_ms: int = 0,
                   max_bytes: int | None = None) -> list[Record]:
        return await self.store.reader().log(self.name).read(offset, max_records, timeout_ms, max_bytes)

    async def end_offset(self) -> int:
        return await self.store.reader().log(self.name).end_offset()


class SharedFileStore(LogStore):
    """The file log at ``config.log.dir``, shared with the service that may hold it (see above)."""

    def __init__(self, config: Located, shard: Shard = Shard.SINGLE, cell: str | None = None) -> None:
        assert config.log.dir is not None, "a shared file store needs log.dir"
        self.config, self.directory = config, Path(config.log.dir)
        self.shard = shard
        """The shard it reads and appends to (with a ``[cells]`` map: the backend's cell's)."""
        self.headers = dict([ACCEPT_NEVER_FITS, *([(CELL_HEADER, cell)] if cell is not None else [])])
        """Of every ingest request: a pod group that can never fit is kept and explained; with a
        map, the backend's cell (where its task events go)."""
        self._reader: FileLogStore | None = None
        self._transport: Transport | None = None
        self._logs = {name: _SharedLog(self, name) for name in LOG_NAMES}
        self._waiting = ""

    async def open(self) -> None:
        """Find where appends go first (a direct writer creates a new log), then the reader."""
        if self._reader is not None:
            return
        self._transport = await self._connect(asyncio.get_running_loop().time() + APPEND_RETRY_S)
        reader = FileLogStore(self.directory, shard=self.shard, read_only=True)
        try:
            await reader.open()
        except BaseException:
            await self._transport.close()
            raise
        self._reader = reader

    async def close(self) -> None:
        transport, self._transport = self._transport, None
        reader, self._reader = self._reader, None
        try:
            if transport is not None:
                await transport.close()
        finally:
            if reader is not None:
                await reader.close()

    def reader(self) -> FileLogStore:
        if self._reader is None:
            raise LogClosedError(f"shared file log store {self.directory} is not open")
        return self._reader

    def log(self, name: str) -> Log:
        self.reader()
        if name not in self._logs:
            raise LogError(f"unknown log {name!r}; expected one of {', '.join(LOG_NAMES)}")
        return self._logs[name]

    async def append_transactional(
        self, name: str, messages: Sequence[Message], *, group: str, consumed: int
    ) -> int:
        raise LogError("only the scheduling service appends decisions")

    async def committed_offset(self, group: str) -> int | None:
        return await self.reader().committed_offset(group)

    def describe(self) -> str:
        """Where appends go now, in words (for logs)."""
        return self._transport.describe() if self._transport is not None else "nowhere (closed)"

    # -- appends -------------------------------------------------------------------------------

    async def append_inputs(self, messages: Sequence[Message]) -> int:
        """Send ``messages`` in order, in requests of at most :data:`EVENTS_PER_REQUEST`;
        the offset of the first."""
        self.reader()
        envelopes = [_envelope(m) for m in messages]
        if not envelopes:
            return await self.reader().log(INPUTS).end_offset()
        firsts = [
            await self._send_or_split(envelopes[at : at + EVENTS_PER_REQUEST])
            for at in range(0, len(envelopes), EVENTS_PER_REQUEST)
        ]
        found = [first for first in firsts if first is not None]
        return found[0] if found else await self.reader().log(INPUTS).end_offset()

    async def _send_or_split(self, envelopes: list[Envelope]) -> int | None:
        """Send ``envelopes`` in one request; refused for one event's content, send them one by
        one (in order) and leave out, with a warning, each the service refuses.  The offset of
        the first appended, ``None`` when none was."""
        try:
            return await self._send(envelopes)
        except _RefusedEvent as refused:
            if len(envelopes) == 1:
                event = envelopes[0].event
                log.warning("the service refused the observation %s (key %s): %s; it is left out",
                            type(event).__name__, envelopes[0].key, refused.error)
                return None
        firsts = [await self._send_or_split([one]) for one in envelopes]
        return next((first for first in firsts if first is not None), None)

    async def _send(self, envelopes: list[Envelope]) -> int:
        deadline = asyncio.get_running_loop().time() + APPEND_RETRY_S
        while True:
            assert self._transport is not None
            try:
                first = await self._transport.append(envelopes)
            except ClientError as exc:
                if exc.reason in REFUSED_EVENT:
                    raise _RefusedEvent(exc) from None
                if exc.reason not in RETRIED:
                    why = f"the backend's observations were refused: {exc}"
                    raise RefusedError(why, exc.reason) from None
                self._wait_note(str(exc), deadline)
                await self._transport.close()
                await asyncio.sleep(RETRY_SLEEP_S)
                self._transport = await self._connect(deadline)
                continue
            self._resumed()
            return first

    async def _connect(self, deadline: float) -> Transport:
        """The running service's ingest endpoint, or else the log itself (a yielding writer),
        waiting while another process holds the log and no service is announced."""
        while True:
            found = announced(self.directory)
            if found is not None:
                return HttpTransport.to(found, self.headers)
            store = FileLogStore(self.directory, shard=self.shard, fsync=self.config.log.fsync, yields=True)
            try:
                await store.open()
            except LockedError as exc:  # a service taking the log over, or another writer
                self._wait_note(str(exc), deadline)
                await asyncio.sleep(RETRY_SLEEP_S)
                continue
            shard = "" if self.shard == Shard.SINGLE else f", shard {self.shard}"
            direct = StoreTransport(store, owned=True, what=f"the file log at {self.directory}{shard}")
            return FileTransport(self.config, direct, self.shard, self.headers)

    def _wait_note(self, why: str, deadline: float) -> None:
        """Log the first of a run of waits (and fail once the deadline passed)."""
        if asyncio.get_running_loop().time() > deadline:
            raise LogError(f"no way to append to the file log at {self.directory} for "
                           f"{APPEND_RETRY_S:.0f} s: {why}")
        if not self._waiting:
            log.warning("waiting to append to the inputs log at %s: %s", self.directory, why)
        self._waiting = why

    def _resumed(self) -> None:
        if self._waiting:
            log.info("appending again, to %s", self.describe())
            self._waiting = ""


def _envelope(message: Message) -> Envelope:
    """The envelope a backend's message holds (it encoded it itself: a failure is a bug)."""
    content_type = next((v for k, v in message.headers if k == CONTENT_TYPE_HEADER), None)
    try:
        return decode(message.value, content_type)
    except BadEventError as exc:
        raise LogError(f"a backend observation that does not decode: {exc}") from None
