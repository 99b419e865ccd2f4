"""Where a producer's input event goes: the one routing rule of every producer (the client, the
CLI, the backends, a service's ingest) once the configuration has a ``[cells]`` map (issue 17,
docs/scale-out.md "What goes where").

Without a map every event goes to today's single shard (:attr:`Shard.SINGLE`), unchecked: nothing
changes.  With a map:

- ``JobSubmitted``, ``JobCancelled``, ``QuotaSet`` -> the global partition (the dispatcher's; it
  forwards a cancel or a cell's quota to the cell that needs it; a quota of a cell the map does
  not name is refused here, not dead-lettered there);
- ``NodeHeartbeat``, ``NodeRemoved``, ``NodeDrained`` -> the partition the map gives their ``cell``;
- ``TaskStarted``, ``TaskFinished``, ``TaskFailed`` carry no cell: they go to the partition of
  the **producer's** cell (a backend serves one cell; the client takes ``--cell``).

A cell the map does not name is refused (:class:`RoutingError`, ``unknown_cell``, naming the cell
and the map's cells), and a task event from a producer that named no cell too (``cell_needed``):
:meth:`Router.split` routes a whole batch before the caller writes any of it, so a refusal writes
nothing anywhere.  The log layer knows events (its consumers decode them), never the scheduler:
this module imports :mod:`fleetlog.events` only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Final, TypeVar

from fleetlog.events.model import (
    InputEvent,
    JobCancelled,
    JobSubmitted,
    NodeDrained,
    NodeHeartbeat,
    NodeRemoved,
    PolicySet,
    QuotaSet,
    TaskFailed,
    TaskFinished,
    TaskStarted,
)
from fleetlog.log.base import Shard

GLOBAL_EVENTS: Final = (JobSubmitted, JobCancelled, QuotaSet)
"""What clients say about jobs and tenants: the dispatcher's partition."""
CELL_EVENTS: Final = (NodeHeartbeat, NodeRemoved, NodeDrained)
"""What a cell says about its nodes: routed by the event's own ``cell``."""
TASK_EVENTS: Final = (TaskStarted, TaskFinished, TaskFailed)
"""What a cell says about tasks: no cell in the event, routed by the producer's cell."""
CELL_HEADER: Final = "fleetlog-cell"
"""The ingest request header naming the producer's cell (its task events' partition)."""
T = TypeVar("T")
SHOWN_CELLS: Final = 20
"""Cells a refusal lists by name (a map may hold 10,000): the rest are counted."""


class RoutingError(ValueError):
    """An event no partition takes.  ``reason``: ``unknown_cell`` (a cell missing from the map)
    or ``cell_needed`` (a task event from a producer that named no cell); ``cell`` the cell."""

    def __init__(self, message: str, reason: str, cell: str = "") -> None:
        super().__init__(message)
        self.reason, self.cell = reason, cell


Parts = list[tuple[Shard, list[int]]]
"""A batch split by partition: each shard with the indexes of its events, in batch order; the
shards in the order of their first event."""


class Router:
    """The rule above over the map ``cells`` ((cell, partition) pairs: the ``[cells]`` table,
    ``Location.cells``/``Config.cells``), for a producer of cell ``cell`` (``None``: a client that
    named none).  A producer's cell the map does not name is refused here, before any event."""

    def __init__(self, cells: Iterable[tuple[str, int]] = (), cell: str | None = None) -> None:
        self.partitions: dict[str, int] = dict(cells)
        self.cell = cell
        self._home: Shard | None = None
        if self.partitions and cell is not None:
            self._home = Shard.cell(self.partition_of(cell, "the producer's cell"))

    @property
    def routed(self) -> bool:
        """Whether there is a map (else everything is :attr:`Shard.SINGLE`)."""
        return bool(self.partitions)

    def partition_of(self, cell: str, what: str = "cell") -> int:
        """The map's partition of ``cell``; a :class:`RoutingError` naming it if it has none."""
        partition = self.partitions.get(cell)
        if partition is None:
            raise RoutingError(f"{what} {cell[:300]!r} is not in the [cells] map ({self._named()}): add "
                               "it to the map, or fix the cell", "unknown_cell", cell)
        return partition

    def _named(self) -> str:
        cells = sorted(self.partitions)
        shown = ", ".join(cells[:SHOWN_CELLS])
        more = f", … ({len(cells)} cells in all)" if len(cells) > SHOWN_CELLS else ""
        return f"it names {shown}{more}"

    def home(self) -> Shard:
        """The producer's own cell's shard (a backend reads its decisions there)."""
        if not self.routed:
            return Shard.SINGLE
        if self._home is None:
            raise RoutingError("with a [cells] map a cell's producer must say its cell (--cell NAME): task "
                               "events carry none", "cell_needed")
        return self._home

    def shard_of(self, event: InputEvent) -> Shard:
        """The shard whose inputs log takes ``event``."""
        if not self.partitions:
            return Shard.SINGLE
        if isinstance(event, GLOBAL_EVENTS):
            if isinstance(event, QuotaSet) and event.cell:  # the dispatcher forwards it to the cell
                self.partition_of(event.cell, f"QuotaSet of tenant {event.tenant!r}: cell")
            return Shard.GLOBAL
        if isinstance(event, CELL_EVENTS):
            return Shard.cell(self.partition_of(event.cell, f"{type(event).__name__} of node "
                                                f"{event.node[:300]!r}: cell"))
        if isinstance(event, TASK_EVENTS):
            if self._home is None:
                raise RoutingError(f"{type(event).__name__} of job {event.job_id[:300]!r} carries no cell: "
                                   "with a [cells] map its producer must say its cell (--cell NAME, "
                                   "Client(cell=...))", "cell_needed")
            return self._home
        if isinstance(event, PolicySet):
            raise RoutingError("PolicySet: with a [cells] map no process serves the HTTP API the policy "
                               "is for (docs/scale-out.md); give roles in auth.policy_file",
                               "not_served_by_role")
        raise RoutingError(f"{type(event).__name__} is not an input a producer sends", "not_an_input")

    def split(self, events: Sequence[InputEvent]) -> Parts:
        """``events`` by shard (see :data:`Parts`); every event is routed before this returns, so
        a :class:`RoutingError` (naming the event's index) means nothing is to be written."""
        if not self.partitions:
            return [(Shard.SINGLE, list(range(len(events))))] if events else []
        parts: dict[Shard, list[int]] = {}
        for index, event in enumerate(events):
            try:
                shard = self.shard_of(event)
            except RoutingError as exc:
                raise RoutingError(f"event {index}: {exc}; nothing was sent", exc.reason, exc.cell) from None
            parts.setdefault(shard, []).append(index)
        return list(parts.items())


def producer_cell(headers: Mapping[str, str]) -> str | None:
    """The producer's cell an ingest request names (:data:`CELL_HEADER`; header names in lower
    case, as the service's HTTP server gives them), ``None`` if none."""
    return headers.get(CELL_HEADER) or None


def route(router: Router, events: Sequence[InputEvent], items: Sequence[T]) -> list[tuple[Shard, list[T]]]:
    """``items`` (the records of ``events``, one each, e.g. an ingest body's messages) grouped by
    the shard of their event, each group in batch order (:meth:`Router.split`): what a service's
    ingest appends, each group to its shard's inputs log (atomic per partition).  A
    :class:`RoutingError` before any group: refuse the whole request (400, its ``reason``)."""
    if len(items) != len(events):
        raise ValueError(f"{len(items)} records for {len(events)} events")
    return [(shard, [items[i] for i in indexes]) for shard, indexes in router.split(events)]
