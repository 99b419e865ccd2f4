"""A backend's logs when the configuration has a ``[cells]`` map: the one place every backend
(Kubernetes, Slurm, the simulated cell) finds its cell's partition (issue 17).

A backend serves one cell.  It reads the decisions of its cell's partition
(``Shard.cell(map[cell])``) and its inputs (its own earlier reports, the cancellations the
dispatcher forwards); what it appends goes where the routing rule (:mod:`fleetlog.log.routing`)
sends each event: its heartbeats, node removals and task events to its cell's partition, a pod
group's submission or cancellation (Kubernetes) to the global partition, whose store is opened on
the first such event.  Without a map nothing changes: the backend opens today's single store.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fleetlog.events.codec import CONTENT_TYPE_HEADER, BadEventError, decode
from fleetlog.events.model import INPUT_TYPES, InputEvent
from fleetlog.log.base import INPUTS, Log, LogError, LogStore, Message, Record, Shard
from fleetlog.log.routing import Router, RoutingError

StoreMaker = Callable[[Shard], LogStore]
"""The (unopened) store of a shard over the backend's logs (Kafka, or the shared file log)."""


class _RoutedInputs(Log):
    """The inputs log of a :class:`CellStore`: reads its cell's partition, routes appends."""

    def __init__(self, store: CellStore) -> None:
        self.store = store

    async def append(self, messages: Sequence[Message]) -> int:
        return await self.store.append_inputs(messages)

    async def read(self, offset: int, max_records: int = 10_000, timeout_ms: int = 0,
                   max_bytes: int | None = None) -> list[Record]:
        return await self.store.cell.log(INPUTS).read(offset, max_records, timeout_ms, max_bytes)

    async def end_offset(self) -> int:
        return await self.store.cell.log(INPUTS).end_offset()


class CellStore(LogStore):
    """The store of the backend's cell (``router.home()``), its inputs' appends routed (above)."""

    def __init__(self, router: Router, make: StoreMaker) -> None:
        self.router, self.make = router, make
        self.shard = router.home()
        self.cell: LogStore = make(self.shard)
        self.others: dict[Shard, LogStore] = {}
        """The other shards' stores it opened for appends (the global one), closed with it."""
        self._inputs = _RoutedInputs(self)

    async def open(self) -> None:
        await self.cell.open()

    async def close(self) -> None:
        others, self.others = list(self.others.values()), {}
        try:
            for store in others:
                await store.close()
        finally:
            await self.cell.close()

    def log(self, name: str) -> Log:
        return self._inputs if name == INPUTS else self.cell.log(name)

    async def append_transactional(
        self, name: str, messages: Sequence[Message], *, group: str, consumed: int
    ) -> int:
        raise LogError("only the scheduling service appends decisions")

    async def committed_offset(self, group: str) -> int | None:
        return await self.cell.committed_offset(group)

    async def append_inputs(self, messages: Sequence[Message]) -> int:
        """Each message to its shard's inputs log (each shard's part in one append, in order:
        atomic per partition); the offset of the first message in its shard."""
        if not messages:
            return await self.cell.log(INPUTS).end_offset()
        try:
            parts = self.router.split([_event(m) for m in messages])
        except RoutingError as exc:
            raise LogError(f"the backend's observation has no partition: {exc}") from None
        firsts: dict[int, int] = {}
        for shard, indexes in parts:
            store = await self._store(shard)
            firsts[indexes[0]] = await store.log(INPUTS).append([messages[i] for i in indexes])
        return firsts[0]

    async def _store(self, shard: Shard) -> LogStore:
        if shard == self.shard:
            return self.cell
        found = self.others.get(shard)
        if found is None:
            found = self.make(shard)
            await found.open()
            self.others[shard] = found
        return found

    def describe(self) -> str:
        return f"cell {self.router.cell} in shard {self.shard}"


def _event(message: Message) -> InputEvent:
    """The input event a backend's message holds (it encoded it itself: a failure is a bug)."""
    content_type = next((v for k, v in message.headers if k == CONTENT_TYPE_HEADER), None)
    try:
        event = decode(message.value, content_type).event
    except BadEventError as exc:
        raise LogError(f"a backend observation that does not decode: {exc}") from None
    if not isinstance(event, INPUT_TYPES):
        raise LogError(f"a backend appends input events, not {type(event).__name__}")
    return event


def backend_store(config: object, cell: str, make: StoreMaker) -> LogStore:
    """The (unopened) store of a backend of ``cell`` over ``config``'s logs: without a ``[cells]``
    map today's single store; with one, a :class:`CellStore` (a :class:`RoutingError`
    ``unknown_cell`` if the map does not name ``cell``)."""
    router = Router(getattr(config, "cells", ()), cell)
    return CellStore(router, make) if router.routed else make(Shard.SINGLE)
