"""Replay a recorded run: fold the inputs and the recorded decision batches in the order the
scheduler did, telling observers (timeline, metrics) what happened on the way.

The state after a batch is the state the scheduler had after publishing it; between batches it
folds inputs in chunks, so an observer sees inputs in order with their log times.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from fleetlog.core.authorize import fold_checked
from fleetlog.core.fold_batch import fold_fast, fold_lists
from fleetlog.core.state import CoreConfig, State
from fleetlog.events.model import DecisionBatch
from fleetlog.log.base import INPUTS
from fleetlog.replay.source import Input, InputReader, Progress, Source, batches, end_offset, instants


class Observer(Protocol):
    """Told about every input chunk (after it was folded) and every decision batch (after)."""

    def inputs(self, state: State, events: Sequence[Input]) -> None: ...

    def decided(self, state: State, batch: DecisionBatch) -> None: ...


@dataclass
class Start:
    """Where a replay begins: a state covering inputs before ``inputs`` and batches before
    ``decisions`` (a fresh state and zeros, or a snapshot)."""

    state: State
    inputs: int = 0
    decisions: int = 0
    snapshot: str | None = None

    @classmethod
    def fresh(cls, core: CoreConfig | None = None) -> Start:
        return cls(State(core))


@dataclass
class Replayed:
    state: State
    inputs_offset: int
    """Every input before this offset was folded."""
    batches: int
    inputs: int


async def fold_inputs(
    reader: InputReader,
    state: State,
    stop: int,
    observers: Sequence[Observer] = (),
    progress: Progress | None = None,
) -> int:
    """Fold inputs up to ``stop``; how many records were consumed.  When an observer asks for it
    (``per_instant``), the inputs are folded and shown one log time at a time."""
    before = reader.offset
    split = any(getattr(observer, "per_instant", False) for observer in observers)
    async for events in reader.until(stop):
        for part in instants(events, state) if split else (events,):
            refused = fold_checked(state, part.events, part.times, part.principals, fold_lists,
                                   part.policy_sets)
            if refused:  # (parked by the scheduler, reason unauthorized: not inputs)
                reader.skipped += len(refused)
            folded = part.without([r.at for r in refused]) if refused else part
            for observer in observers:
                observer.inputs(state, folded)
        if progress is not None:
            progress(len(events))
    return reader.offset - before


async def replay(
    source: Source,
    start: Start,
    stop: int | None = None,
    observers: Sequence[Observer] = (),
    progress: Progress | None = None,
    decisions_stop: int | None = None,
) -> Replayed:
    """Fold from ``start`` to inputs offset ``stop`` (``None``: the end of the log), with every
    recorded batch computed at or before ``stop`` (and before decisions offset ``decisions_stop``)."""
    store, state = source.store, start.state
    target = await end_offset(store, INPUTS) if stop is None else stop
    reader = InputReader(store, start.inputs, state.config.cells)
    count = 0
    async for _, _, batch in batches(store, start.decisions, decisions_stop):
        if batch.as_of > target:
            break
        await fold_inputs(reader, state, batch.as_of, observers, progress)
        fold_fast(state, batch, state.now_ms)
        for observer in observers:
            observer.decided(state, batch)
        count += 1
    await fold_inputs(reader, state, target, observers, progress)
    return Replayed(state, reader.offset, count, reader.offset - start.inputs)
