"""Replay of the global dispatcher: fold the global partition, re-run every recorded step.

The dispatcher's service loop recovers with :class:`DispatchReplay` (its state after a crash is
the state an uncrashed dispatcher had at its last commit), and :func:`verify_dispatcher` walks the
same way to say whether every recorded step is reproduced bit-exactly, and which one is not.
``dispatch()`` changes the state (a job sent is held, a changed reason is remembered, forwarded
cancellations are taken), so a recorded step is not *applied*: it is computed again at its
``as_of``, which both rebuilds the state and checks the record.  A step that decided nothing
changed nothing, and is not recorded.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import msgspec

from fleetlog.core.dispatch import CellMap, DispatchInputError, DispatchState, dispatch, fold
from fleetlog.core.dispatch_log import (
    GLOBAL_INPUTS,
    StepRecord,
    StepRecordError,
    decode_record,
    is_empty,
    join_parts,
    record_of,
    state_digest,
)
from fleetlog.log.base import DECISIONS, INPUTS, LogStore
from fleetlog.log.consumer import Delivered, EventConsumer

READ_RECORDS = 1000


class DispatchDivergence(msgspec.Struct, frozen=True):
    """The first recorded step that replay does not reproduce."""

    decisions_offset: int
    """The step's (first) record in the global partition's decisions log."""
    as_of: int
    what: str


class DispatchVerifyReport(msgspec.Struct, frozen=True):
    steps: int
    """Recorded steps reproduced (before a divergence, if any)."""
    inputs: int
    """Global-partition offset folded to."""
    digest: str
    divergence: DispatchDivergence | None = None


class DispatchDivergenceError(RuntimeError):
    """Recovery met a recorded step it does not reproduce: it refuses to go on from there."""


def fold_delivered(
    state: DispatchState, events: Sequence[Delivered], next_offset: int
) -> list[tuple[int, str]]:
    """Fold ``events`` (the good records of one read) in log order: ``state.offset`` is the log's
    offset, not a count of events folded (a bad record in between is skipped, not folded).
    Returns the refusals: (offset, ``code: message``)."""
    refused: list[tuple[int, str]] = []
    for d in events:
        state.offset = d.offset
        try:
            reason = fold(state, d.envelope.event, d.timestamp_ms)
        except DispatchInputError as exc:
            reason = f"invalid_event: {exc}"
        if reason:
            refused.append((d.offset, reason))
    state.offset = max(state.offset, next_offset)
    return refused


def compare(recorded: StepRecord, again: StepRecord) -> str:
    """What differs between a recorded step and the same step computed again (``""``: nothing)."""
    for name in ("digest", "dispatched", "cancels", "waiting"):
        was, now = getattr(recorded, name), getattr(again, name)
        if was != now:
            if isinstance(was, tuple):
                pairs = enumerate(zip(was, now, strict=False))
                at = next((i for i, (a, b) in pairs if a != b), min(len(was), len(now)))
                shown = (was[at] if at < len(was) else None, now[at] if at < len(now) else None)
                return f"{name} differ at entry {at}: recorded {shown[0]}, replayed {shown[1]}"
            return f"{name} differ: recorded {was}, replayed {now}"
    return ""


class DispatchReplay:
    """Folds the global partition and recomputes recorded steps (recovery and verify)."""

    def __init__(self, store: LogStore, cells: CellMap, state: DispatchState | None = None) -> None:
        self.store = store
        self.state = state or DispatchState(cells)
        self.decisions_next = 0
        """The decisions offset after the last step record read."""
        self.consumer = EventConsumer(store, accepts=GLOBAL_INPUTS, warn=False)

    async def fold_until(self, as_of: int) -> None:
        """Fold the global partition up to (excluding) ``as_of``, parking nothing. A read counts
        records, not offsets: on Kafka the cell shards' transactions leave commit markers between
        the records, so a read of ``as_of - offset`` records can reach past ``as_of`` — what it
        read from ``as_of`` on is left for later."""
        while self.state.offset < as_of:
            wanted = min(READ_RECORDS * 10, as_of - self.state.offset)
            polled = await self.consumer.poll(self.state.offset, wanted, park=False)
            if polled.next_offset == self.state.offset:
                if await self.store.log(INPUTS).end_offset() >= as_of:  # (Kafka) only markers left
                    fold_delivered(self.state, [], as_of)
                    return
                raise DispatchDivergenceError(
                    f"the dispatcher's records refer to global inputs up to {as_of}; the global inputs "
                    f"log ends at {self.state.offset}: it lost acknowledged records")
            events = [d for d in polled.events if d.offset < as_of]
            fold_delivered(self.state, events, min(polled.next_offset, as_of))

    async def fold_to_end(self) -> None:
        """Fold every record the global partition holds. Its end offset may lie past its last
        record (on Kafka, a transaction's commit marker): a read that finds nothing more ends it."""
        end = await self.store.log(INPUTS).end_offset()
        while self.state.offset < end:
            polled = await self.consumer.poll(self.state.offset, READ_RECORDS * 10, park=False)
            if polled.next_offset == self.state.offset:
                return
            events = [d for d in polled.events if d.offset < end]
            fold_delivered(self.state, events, min(polled.next_offset, end))

    async def steps(self, start: int = 0) -> AsyncIterator[tuple[int, StepRecord]]:
        """Each recorded step (parts joined) from decisions offset ``start``, with the offset of
        its first record."""
        log = self.store.log(DECISIONS)
        end, at = await log.end_offset(), start
        parts: list[StepRecord] = []
        first = at
        while at < end:
            records = await log.read(at, READ_RECORDS)
            if not records:
                break
            for record in records:
                if not record.value:
                    continue
                try:
                    part = decode_record(record.value)
                except StepRecordError as exc:
                    raise DispatchDivergenceError(f"decisions@{record.offset}: {exc}") from None
                if not parts:
                    first = record.offset
                parts.append(part)
                if part.part == part.parts - 1:
                    self.decisions_next = record.offset + 1
                    yield first, _joined(first, parts)
                    parts = []
            at = records[-1].offset + 1
        if parts:
            raise DispatchDivergenceError(f"decisions@{first}: a step of {parts[0].parts} parts ends after "
                                          f"{len(parts)}")

    async def redo(self, recorded: StepRecord) -> str:
        """Fold to the step's ``as_of`` and compute it again: ``""`` when it is the recorded one."""
        if recorded.as_of < self.state.offset:
            return f"recorded at global offset {recorded.as_of}, before the {self.state.offset} folded"
        await self.fold_until(recorded.as_of)
        step = dispatch(self.state)
        if is_empty(step):
            return "the recorded step decides nothing when computed again"
        return compare(recorded, record_of(step, recorded.as_of, state_digest(self.state)))


def _joined(first: int, parts: list[StepRecord]) -> StepRecord:
    try:
        return join_parts(parts)
    except StepRecordError as exc:
        raise DispatchDivergenceError(f"decisions@{first}: {exc}") from None


async def verify_dispatcher(store: LogStore, cells: CellMap) -> DispatchVerifyReport:
    """Replay the global partition against the dispatcher's step records; stop at the first step
    that differs (digest, dispatches, forwarded cancellations or reasons) and name it."""
    replay = DispatchReplay(store, cells)
    count = 0
    async for offset, recorded in replay.steps():
        what = await replay.redo(recorded)
        if what:
            divergence = DispatchDivergence(offset, recorded.as_of, what)
            return DispatchVerifyReport(count, replay.state.offset, state_digest(replay.state), divergence)
        count += 1
    await replay.fold_to_end()
    return DispatchVerifyReport(count, replay.state.offset, state_digest(replay.state))
