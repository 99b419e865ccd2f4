"""A cell partition's inputs consumer: today's inputs plus ``JobDispatched``, and only the events
of the cells the partition holds (issue 17, docs/scale-out.md "Bad input").

A heartbeat, a node removal or a quota of a cell the map gives another partition is
dead-lettered ``wrong_partition``; of a cell missing from the map, ``unknown_cell``; a
``JobDispatched`` to a cell this partition does not hold, ``unknown_cell`` (the core would
ignore and count it; parked, nothing is silently lost). The filter runs after decoding, on every
read (live, recovery and replay alike), so what is folded is a function of the log and the cells
held: recovery and ``replay verify`` skip exactly what the live step parked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from operator import attrgetter
from typing import Final

from fleetlog.events.codec import BadEventError
from fleetlog.events.model import INPUT_TYPES, Event, JobDispatched
from fleetlog.log.base import INPUTS, LogStore, Message, Record
from fleetlog.log.consumer import SOURCE_HEADER, Delivered, EventConsumer, dead_letter

CELL_INPUT_TYPES: Final = (*INPUT_TYPES, JobDispatched)
"""What a cell partition's inputs log holds."""
_CELL = attrgetter("cell")


class WrongPartitionError(BadEventError):
    """A cell's event in a partition the cell map does not give that cell."""

    reason = "wrong_partition"


class UnknownCellError(BadEventError):
    """An event of a cell missing from the cell map, or a dispatch to a cell not held here."""

    reason = "unknown_cell"


def cell_of(event: Event) -> str:
    """The cell an event is about (``""``: none, or every cell: submissions, task observations,
    a quota for every cell). Task observations carry no cell: one for a job this shard never
    held is ignored and counted by fold (``State.ignored``), as on the single shard."""
    return getattr(event, "cell", "")


class CellInputsConsumer(EventConsumer):
    """:class:`EventConsumer` of cell partition ``partition``, holding cells ``held``;
    ``partition_of`` (the configuration's cell map) names where another cell belongs, for the
    error message and the reason code (without it every foreign cell is ``unknown_cell``: how
    replay reads, where only fold-or-skip matters)."""

    def __init__(self, store: LogStore, partition: int, held: Sequence[str],
                 partition_of: Mapping[str, int] | None = None, warn: bool = True) -> None:
        super().__init__(store, INPUTS, warn=warn, accepts=CELL_INPUT_TYPES)
        self.partition, self.held = partition, tuple(held)
        self.partition_of = dict(partition_of or {})
        self._ok = frozenset((*self.held, ""))

    def refusal(self, event: Event) -> BadEventError | None:
        """Why ``event`` does not belong to this partition, or ``None`` when it does."""
        cell = cell_of(event)
        if cell in self._ok:
            return None
        kind = type(event).__name__
        where = self.partition_of.get(cell)
        if isinstance(event, JobDispatched):
            return UnknownCellError(
                f"{kind} of job {event.job.job_id!r} to cell {cell!r}, which cell partition "
                f"{self.partition} does not hold (it holds {', '.join(self.held) or 'no cell'}"
                + (f"; the map gives {cell!r} partition {where})" if where is not None else ")"))
        if where is None:
            return UnknownCellError(
                f"{kind} of cell {cell!r} in cell partition {self.partition}: the cell map does not "
                f"name {cell!r} (add it to the [cells] map, or fix the producer's cell)")
        return WrongPartitionError(
            f"{kind} of cell {cell!r} in cell partition {self.partition}, but the cell map gives "
            f"{cell!r} partition {where}: the producer routed it wrong")

    def decode_memoised(self, records: Sequence[Record]) -> list[Event] | None:
        """As :meth:`EventConsumer.decode_memoised`; ``None`` (decode one by one, parking) when
        some event is not this partition's."""
        events = super().decode_memoised(records)
        if events is None or self._ok.issuperset(map(cell_of, events)):
            return events
        return None

    def split(self, records: Sequence[Record]) -> tuple[list[Delivered], list[Message]]:
        """As :meth:`EventConsumer.split`, with the events of other partitions' cells parked
        (kept in log order with the other dead letters)."""
        good, bad = super().split(records)
        if all(cell_of(d.envelope.event) in self._ok for d in good):
            return good, bad
        by_offset = {r.offset: r for r in records}
        kept: list[Delivered] = []
        refused: list[tuple[int, Message]] = []
        for d in good:
            error = self.refusal(d.envelope.event)
            if error is None:
                kept.append(d)
            else:
                refused.append((d.offset, dead_letter(by_offset[d.offset], self._source, error)))
        return kept, _in_log_order(bad, refused)


def _in_log_order(bad: list[Message], refused: list[tuple[int, Message]]) -> list[Message]:
    """The dead letters of one read in the order of their records (the ``source`` header names
    the offset: ``inputs@N``)."""

    def offset(m: Message) -> int:
        source = dict(m.headers).get(SOURCE_HEADER, b"@0")
        return int(source.rsplit(b"@", 1)[1])

    return sorted([*bad, *(m for _, m in refused)], key=offset)
