"""Snapshots without stalling the loop (issue 46, "Metadata"): the service copies the state
between steps and encodes and writes the snapshot in a thread, so a state holding 10,000 jobs'
worth of labels and annotations no longer stops health and the fold for seconds each time."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import msgspec

from fleetlog.core.digest import digest, encode_parts, restore, snapshot, snapshot_parts
from fleetlog.core.fold_batch import fold_lists
from fleetlog.core.state import State
from fleetlog.events import JobSubmitted
from fleetlog.log.snapshots import (
    DirectorySnapshots,
    Snapshot,
    SnapshotHeader,
    decode_snapshot,
    encode_snapshot,
)
from fleetlog.service.config import ServiceSettings
from fleetlog.service.metrics import Metrics
from fleetlog.service.snapshots import Snapshotter
from tests.core.builders import job

LABELS = {f"l{i:02d}": "v" * 120 for i in range(64)}


def dressed(i: int, tenant: str = "t1") -> JobSubmitted:
    """A job at the metadata bound's scale: 64 labels and 64 annotations, 15,808 bytes."""
    notes = {f"a{k:02d}": f"{i:06d}" + "w" * 115 for k in range(64)}
    return msgspec.structs.replace(job(f"j{i}", tenant=tenant), labels=dict(LABELS), annotations=notes)


def state_of(jobs: int) -> State:
    state = State()
    fold_lists(state, [dressed(i) for i in range(jobs)], list(range(1, jobs + 1)))
    return state


class Loop:
    """What :meth:`Snapshotter.maybe` reads of the scheduler loop."""

    def __init__(self, state: State) -> None:
        self.state, self.offset, self.decisions_next = state, state.offset, 0


def test_the_parts_taken_between_steps_encode_the_state_as_it_was_then() -> None:
    """The copy is consistent: folds after it (new jobs, and jobs retiring: their metadata
    dropped) change nothing of what is encoded from it afterwards."""
    state = state_of(50)
    before, parts = snapshot(state), snapshot_parts(state)
    more = [dressed(i) for i in range(50, 80)]
    fold_lists(state, more, list(range(51, 81)))
    state.job_meta.clear()  # (what retiring every job does to the map)
    state.recent_shapes.append((9, 9, 9))
    assert encode_parts(parts) == before
    assert digest(restore(before)) == digest(restore(encode_parts(parts)))


async def test_a_snapshot_of_a_large_state_leaves_the_loop_running(tmp_path: Path) -> None:
    """8,000 jobs of 16 KB of metadata (126 MB): on today's main the loop stood still for the
    whole encode and write; now it runs on (a 5 ms ticker never waits half the encode time).
    Generous margin: the bound is half of what the encode alone costs on this machine, now."""
    state = state_of(8_000)
    snapshot(state_of(1))  # (the digest's kernel loaded: not part of what is timed)
    started = time.perf_counter()
    encode_snapshot(Snapshot(SnapshotHeader(state.offset, 0, "default", 0), snapshot(state)))
    encode_s = time.perf_counter() - started  # what today's main did on the loop, before the write
    snapshots = DirectorySnapshots(tmp_path)
    snapshotter = Snapshotter(snapshots, ServiceSettings(), "default", Metrics())
    gaps: list[float] = []

    async def tick() -> None:
        while True:
            at = time.perf_counter()
            await asyncio.sleep(0.005)
            gaps.append(time.perf_counter() - at)

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.05)
    snapshotter.maybe(Loop(state), time.monotonic(), force=True)  # type: ignore[arg-type]
    await snapshotter.finish()
    await asyncio.sleep(0.05)  # (the ticker records the gap it is in)
    ticker.cancel()
    assert max(gaps) < encode_s / 2, (max(gaps), encode_s)
    ((_, load),) = await snapshots.candidates()
    assert decode_snapshot(load()).state == snapshot(state)
