"""``state-at``: the scheduler's state at an inputs offset or a log time, fast through snapshots.

The state "at offset N" has folded every input before N and every decision batch computed at
or before N (``as_of <= N``) — what the scheduler knew and had decided once it had read N inputs.
The state "at time T" is the state at the first input appended after T.  The newest snapshot at
or before the point is restored (a corrupt one is skipped, with a note) and only the rest folded.

Once older history was pruned (Kafka retention, ``fleetlog log prune``), the logs start after
offset 0: a replay starts from the oldest snapshot the retained logs continue
(:func:`first_start`), and a point before it is an error naming the first point available.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from fleetlog.core.digest import SnapshotError, digest, restore
from fleetlog.core.state import CoreConfig, State
from fleetlog.log.base import DECISIONS, INPUTS, LogError
from fleetlog.log.snapshots import decode_snapshot
from fleetlog.replay.engine import Start, replay
from fleetlog.replay.source import (
    Progress,
    ReplayError,
    Source,
    end_offset,
    read,
    start_offset,
    time_to_offset,
)


@dataclass(frozen=True)
class Point:
    """An inputs offset or a log time (milliseconds since the epoch): exactly one is set."""

    offset: int | None = None
    time_ms: int | None = None

    def __str__(self) -> str:
        return f"offset {self.offset}" if self.offset is not None else f"time {self.time_ms} ms"


@dataclass
class StateAt:
    offset: int
    state: State
    snapshot: str | None
    inputs_folded: int
    batches_folded: int
    seconds: float
    notes: list[str] = field(default_factory=list)

    @property
    def digest(self) -> str:
        return digest(self.state)


async def resolve(source: Source, point: Point) -> int:
    """The inputs offset of ``point``; out of range is a :class:`ReplayError`."""
    end = await end_offset(source.store, INPUTS)
    if point.time_ms is not None:
        return await time_to_offset(source.store, point.time_ms)
    assert point.offset is not None
    if not 0 <= point.offset <= end:
        raise ReplayError(f"offset {point.offset} is out of range: the inputs log has offsets 0 to {end}")
    return point.offset


async def history(source: Source) -> tuple[int, int]:
    """The first inputs and decisions offsets the logs still hold ((0, 0) unless pruned)."""
    return await start_offset(source.store, INPUTS), await start_offset(source.store, DECISIONS)


async def first_start(
    source: Source, notes: list[str] | None = None, core: CoreConfig | None = None
) -> Start:
    """Where a replay of the whole retained history starts: a fresh state (of ``core``, else the
    source's settings) when the logs start at offset 0, else the oldest snapshot that the
    retained logs continue (its inputs and decisions at or after the logs' starts) and that
    restores. None: a :class:`ReplayError`."""
    inputs, decisions = await history(source)
    if inputs == 0 and decisions == 0:
        return Start.fresh(core or source.core)
    pruned = (f"the logs start at inputs offset {inputs} and decisions offset {decisions} "
              "(older history was pruned)")
    found = await _snapshots(source, notes if notes is not None else [], inputs, decisions)
    if not found:
        raise ReplayError(f"{pruned}, and no snapshot the retained logs continue was found: "
                          "nothing to replay from")
    for name, snap in reversed(found):  # (oldest first)
        try:
            start = Start(restore(snap.state), snap.header.inputs_offset, snap.header.decisions_offset, name)
        except SnapshotError as exc:
            if notes is not None:
                notes.append(f"snapshot {name} skipped: {exc}")
            continue
        if notes is not None:
            notes.append(f"{pruned}: replay starts from the oldest snapshot they continue, {name} "
                         f"(inputs offset {start.inputs})")
        return start
    raise ReplayError(f"{pruned}, and no snapshot the retained logs continue restores: "
                      "nothing to replay from")


async def _snapshots(source: Source, notes: list[str], inputs: int, decisions: int) -> list[tuple[str, Any]]:
    """The snapshots (name, decoded), newest first, that the logs continue: none covers less
    than what was pruned (a corrupt one is skipped, with a note)."""
    if source.snapshots is None:
        return []
    try:
        candidates = await source.snapshots.candidates()
    except LogError as exc:
        notes.append(f"snapshots unavailable ({exc})")
        return []
    out = []
    for name, load in candidates:
        try:
            snap = decode_snapshot(load())
        except (LogError, OSError) as exc:
            notes.append(f"snapshot {name} skipped: {exc}")
            continue
        if snap.header.inputs_offset >= inputs and snap.header.decisions_offset >= decisions:
            out.append((name, snap))
    return out


async def start_before(
    source: Source, offset: int, notes: list[str], max_decisions: int | None = None
) -> Start:
    """The newest snapshot covering no input at or after ``offset`` (nor decision batch at or
    after ``max_decisions``) that restores; else a fresh state — or, once history was pruned,
    a :class:`ReplayError` naming the first point available."""
    inputs, decisions = await history(source)
    for name, snap in await _snapshots(source, notes, inputs, decisions):
        late = max_decisions is not None and snap.header.decisions_offset > max_decisions
        if snap.header.inputs_offset > offset or late:
            continue
        try:
            return Start(restore(snap.state), snap.header.inputs_offset, snap.header.decisions_offset, name)
        except SnapshotError as exc:
            notes.append(f"snapshot {name} skipped: {exc}")
    if inputs == decisions == 0:
        return Start.fresh(source.core)
    first = await first_start(source)  # (raises when there is none)
    when = await log_time_of(source, first.inputs + 1)
    raise ReplayError(
        f"inputs offset {offset} is before the retained history: the logs were pruned; the first point "
        f"available is inputs offset {first.inputs}" + (f" (log time {when} ms)" if when is not None else "")
        + f", from snapshot {first.snapshot}")


async def state_at(
    source: Source, point: Point, use_snapshots: bool = True, progress: Progress | None = None
) -> StateAt:
    started = time.perf_counter()
    offset = await resolve(source, point)
    notes: list[str] = []
    start = await start_before(source, offset, notes) if use_snapshots else await first_start(source, notes)
    done = await replay(source, start, offset, progress=progress)
    return StateAt(
        offset, done.state, start.snapshot, done.inputs, done.batches, time.perf_counter() - started, notes
    )


async def state_before_batch(source: Source, decisions_offset: int, as_of: int) -> State:
    """The state a decision batch was computed on: inputs before ``as_of``, batches before it."""
    start = await start_before(source, as_of, [], max_decisions=decisions_offset)
    return (await replay(source, start, as_of, decisions_stop=decisions_offset)).state


async def log_time_of(source: Source, offset: int) -> int | None:
    """The append time of the last input before ``offset`` (``None`` at offset 0)."""
    if offset == 0:
        return None
    found = await read(source.store, INPUTS, offset - 1, 1)
    return found[0].timestamp_ms if found else None
