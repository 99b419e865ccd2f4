"""The cell shard's service loop (fleetlog/service/cellshard.py; docs/scale-out.md, "The cell
shard's loop") over the real file log and a real Kafka broker: places what is dispatched to its
cells, hands back at the bound and summarises into the global partition in the step's own
transaction, parks other partitions' events, and recovers (restart, crash, snapshot) without a
summary or a return duplicated or lost — the same outputs as a run that never stopped, and the
same as the cell partition's log alone gives again."""

from __future__ import annotations

import asyncio
import gc
import os
import random
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import msgspec
import pytest

from fleetlog.core.cellshard import SummaryRule
from fleetlog.core.digest import digest, restore, snapshot
from fleetlog.core.dispatch import CellMap
from fleetlog.core.fold_batch import fold_fast
from fleetlog.core.policy import Policy
from fleetlog.core.state import CoreConfig
from fleetlog.events import (
    CellSummary,
    JobDispatched,
    JobPending,
    JobPlaced,
    JobReturned,
    NodeRemoved,
    TaskFinished,
    encode,
    envelope,
)
from fleetlog.events.codec import CONTENT_TYPE_HEADER, MSGPACK
from fleetlog.events.model import (
    GPU_BUCKETS,
    INPUT_TYPES,
    MAX_SUMMARY_ENTRIES,
    MAX_SUMMARY_TENANTS,
    DecisionBatch,
    Event,
    FreeSlots,
    Resources,
    TenantUsage,
)
from fleetlog.log.base import DEAD_LETTERS, DECISIONS, INPUTS, LogStore, Message, Shard
from fleetlog.log.consumer import ERROR_HEADER, REASON_HEADER, EventConsumer, decision_batches
from fleetlog.log.file import OUTBOX_NAME, FileLogStore
from fleetlog.log.kafka import KafkaConfig
from fleetlog.log.location import LogConfig
from fleetlog.log.snapshots import Snapshot, SnapshotHeader, encode_snapshot
from fleetlog.replay.verify import verify
from fleetlog.service.cellshard import CellShardLoop, check_outputs, recover_cell_shard, shard_snapshots
from fleetlog.service.loop import LoopConfig
from fleetlog.service.snapshots import recover
from tests.core.builders import job, node, quota

CELLS = CellMap((("a", 0), ("b", 1), ("c", 0)))
"""Partition 0 holds cells a and c, partition 1 cell b."""
HOLD = 10_000
RULE = SummaryRule(every_ms=5_000)
GLOBAL_TYPES = (*INPUT_TYPES, JobReturned, CellSummary)


class Located(msgspec.Struct, frozen=True):
    """Where the logs are, as the service's configuration says it."""

    directory: Path
    kafka: KafkaConfig | None = None

    @property
    def log(self) -> LogConfig:
        return LogConfig(dir=str(self.directory))


class Clock:
    """The file log's append time (log time), moved by the test."""

    def __init__(self) -> None:
        self.ms = 1_000

    def __call__(self) -> int:
        return self.ms


def msg(event: Event) -> Message:
    return Message(encode(envelope(event, "test")), headers=((CONTENT_TYPE_HEADER, MSGPACK),))


def dispatched(job_id: str, cell: str, seq: int, attempt: int = 1, **kw: object) -> JobDispatched:
    return JobDispatched(job=job(job_id, **kw), cell=cell, attempt=attempt, seq=seq, as_of=seq)  # type: ignore[arg-type]


def unplaceable(seq: int, attempt: int = 1) -> JobDispatched:
    """A gang of 3 x 8 GPUs on one rack of two 8-GPU nodes: never placed in cell a."""
    return dispatched("gang", "a", seq, attempt, tasks=3, gpus=8, topology="rack")


def cell_nodes(cell: str = "a", n: int = 4) -> list[Event]:
    return [node(f"{cell}-n{i}", cell=cell, rack=f"r{i // 2}") for i in range(n)]


def make_loop(store: LogStore, partition: int = 0, hold_ms: int = HOLD, **kw: object) -> CellShardLoop:
    return CellShardLoop(store, Policy(), partition, CELLS, LoopConfig(check_invariants=True),
                         CoreConfig(hold_ms=hold_ms), kw.get("rule", RULE))  # type: ignore[arg-type]


async def global_events(store: LogStore) -> list[Event]:
    """What the cell shards wrote to the global partition, in order (decoded as the dispatcher
    reads them)."""
    polled = await EventConsumer(store, accepts=GLOBAL_TYPES).poll(0, 100_000, park=False)
    assert polled.dead_lettered == 0
    return [d.envelope.event for d in polled.events]


async def batches(store: LogStore) -> list[DecisionBatch]:
    return [b for _, b in decision_batches(await store.log(DECISIONS).read(0, 100_000))]


class FileShards:
    """The stores of one log directory's shards (one process: the outbox writes into them)."""

    def __init__(self, directory: Path, clock: Clock) -> None:
        self.directory, self.clock = directory, clock
        self.root = FileLogStore(directory, shard=Shard.GLOBAL, clock=clock)

    async def open(self) -> tuple[LogStore, LogStore, LogStore]:
        glob, c0, c1 = self.root, self.root.for_shard(Shard.cell(0)), self.root.for_shard(Shard.cell(1))
        for s in (glob, c0, c1):
            await s.open()
        return glob, c0, c1

    async def close(self) -> None:
        for s in (self.root.for_shard(Shard.cell(1)), self.root.for_shard(Shard.cell(0)), self.root):
            await s.close()

    def reopened(self) -> FileShards:
        return FileShards(self.directory, self.clock)


@pytest.fixture
async def file_shards(tmp_path: Path) -> AsyncIterator[tuple[Clock, LogStore, LogStore, LogStore]]:
    clock = Clock()
    shards = FileShards(tmp_path / "log", clock)
    glob, c0, c1 = await shards.open()
    try:
        yield clock, glob, c0, c1
    finally:
        await shards.close()


async def feed(loop: CellShardLoop, clock: Clock, at_ms: int, *events: Event) -> None:
    clock.ms = at_ms
    await loop.store.log(INPUTS).append([msg(e) for e in events])


# --- place, hand back at the bound, in the step's transaction -----------------------------------------


async def test_places_what_is_dispatched_and_hands_back_exactly_at_the_bound(file_shards) -> None:  # type: ignore[no-untyped-def]
    clock, glob, c0, _ = file_shards
    loop = make_loop(c0)
    await loop.recover()
    await feed(loop, clock, 1_000, *cell_nodes(), dispatched("j1", "a", 1), unplaceable(2))
    first = await loop.step()
    placed = [d for b in await batches(c0) for d in b.decisions if isinstance(d, JobPlaced)]
    assert [(p.job_id, p.cell) for p in placed] == [("j1", "a")]
    assert first.returned == 0
    assert first.summaries == 2
    await feed(loop, clock, 1_000 + HOLD - 1, node("a-n0", cell="a", rack="r0"))
    assert (await loop.step()).returned == 0
    assert not [e for e in await global_events(glob) if isinstance(e, JobReturned)]
    await feed(loop, clock, 1_000 + HOLD, node("a-n0", cell="a", rack="r0"))
    back = await loop.step()
    assert back.returned == 1
    assert back.published
    found = [e for e in await global_events(glob) if isinstance(e, JobReturned)]
    assert [(r.job_id, r.cell, r.attempt, r.reason) for r in found] == [("gang", "a", 1, "never_fits")]
    assert found[0].as_of == loop.state.offset - 1  # the input whose log time ended the hold
    assert f"not placed within {HOLD} ms" in found[0].message
    # in the step's transaction: a batch recorded at the step, the offset committed with it
    assert (await batches(c0))[-1].as_of == loop.offset == await c0.committed_offset(loop.config.group)
    assert (await verify(c0, core=loop.state.config)).ok


async def test_summaries_when_due_and_not_otherwise(file_shards) -> None:  # type: ignore[no-untyped-def]
    clock, glob, c0, _ = file_shards
    loop = make_loop(c0)
    await loop.recover()
    heartbeat = node("a-n0", cell="a", rack="r0")

    async def summaries_at(at_ms: int, *events: Event) -> list[tuple[str, int]]:
        before = len(await global_events(glob))
        await feed(loop, clock, at_ms, *events)
        await loop.step()
        return [(e.cell, e.seq) for e in (await global_events(glob))[before:] if isinstance(e, CellSummary)]

    assert await summaries_at(1_000, *cell_nodes()) == [("a", 4), ("c", 4)]  # first: every held cell
    assert await summaries_at(2_000, heartbeat) == []  # nothing changed
    assert await summaries_at(3_000, dispatched("j1", "a", 1)) == [("a", 6)]  # 1 of 8 slots: material
    assert await summaries_at(3_500, dispatched("j2", "a", 2)) == []  # 1 of 7: not
    assert await summaries_at(4_000, node("a-n9", cell="a", rack="r9")) == [("a", 8)]  # total changed
    assert await summaries_at(5_999, heartbeat) == []
    assert await summaries_at(6_000, heartbeat) == [("c", 10)]  # every_ms since c's last (1,000)
    assert await summaries_at(8_999, heartbeat) == []
    assert await summaries_at(9_000, heartbeat) == [("a", 12)]  # every_ms since a's last (4,000)
    summaries = [e for e in await global_events(glob) if isinstance(e, CellSummary)]
    assert all(s.seq == s.as_of and s.partition == 0 for s in summaries)


# --- bad input --------------------------------------------------------------------------------------


async def test_other_partitions_events_are_dead_lettered_and_the_rest_is_folded(file_shards) -> None:  # type: ignore[no-untyped-def]
    clock, _, c0, _ = file_shards
    loop = make_loop(c0)
    await loop.recover()
    bad = [node("b-n0", cell="b"), node("z-n0", cell="zz"), dispatched("jb", "b", 1),
           NodeRemoved(cell="b", node="b-n0"), msgspec.structs.replace(quota("t1", 8), cell="b")]
    good = [*cell_nodes(), dispatched("ja", "a", 1), quota("t1", 64)]
    await feed(loop, clock, 1_000, good[0], bad[0], good[1], bad[1], bad[2], *good[2:], bad[3], bad[4])
    result = await loop.step()
    assert (result.inputs, result.dead_lettered) == (len(good), len(bad))
    parked = await c0.log(DEAD_LETTERS).read(0, 100)
    reasons = [(r.header(REASON_HEADER), r.header(ERROR_HEADER)) for r in parked]
    assert [r for r, _ in reasons] == [b"wrong_partition", b"unknown_cell", b"unknown_cell",
                                       b"wrong_partition", b"wrong_partition"]
    assert b"cell 'b' in cell partition 0, but the cell map gives 'b' partition 1" in reasons[0][1]
    assert b"the cell map does not name 'zz'" in reasons[1][1]
    assert b"job 'jb' to cell 'b', which cell partition 0 does not hold (it holds a, c" in reasons[2][1]
    placed = [d.job_id for b in await batches(c0) for d in b.decisions if isinstance(d, JobPlaced)]
    assert placed == ["ja"]
    assert loop.state.ignored == 0  # (parked, not ignored by the core)
    again = make_loop(c0)
    await again.recover()  # recovery skips them again, parks nothing twice
    assert digest(again.state) == digest(loop.state)
    assert len(await c0.log(DEAD_LETTERS).read(0, 100)) == len(bad)
    assert (await verify(c0, core=loop.state.config)).ok


def test_a_loop_needs_its_partitions_store(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs the store of that partition, not of shard cells-0"):
        CellShardLoop(FileLogStore(tmp_path, shard=Shard.cell(0)), Policy(), 1, CELLS)


# --- restart, crash, snapshot: nothing duplicated, nothing lost ---------------------------------------

SCRIPT: list[tuple[int, list[Event]]] = [
    (1_000, [*cell_nodes("a"), *cell_nodes("c", 2)]),
    (2_000, [dispatched("j1", "a", 1), unplaceable(2)]),
    (3_000, [dispatched("j2", "c", 1, gpus=8), node("a-n0", cell="a", rack="r0")]),
    (7_000, [node("a-n0", cell="a", rack="r0")]),
    (12_000, [node("a-n1", cell="a", rack="r0")]),  # the gang's hold ends: returned
    (13_000, [unplaceable(3, attempt=2)]),  # the dispatcher sends it again: reopened
    (16_000, [TaskFinished(job_id="j1", task_index=0)]),
    (23_000, [node("a-n1", cell="a", rack="r0")]),  # attempt 2 returned
    (24_000, [NodeRemoved(cell="a", node="a-n3")]),
    (24_500, [node("c-n0", cell="c", rack="r0")]),
]


Hook = Callable[[int, CellShardLoop, "FileShards"], Awaitable[CellShardLoop]]


Outcome = tuple[list[Event], list[DecisionBatch], str]


async def run_script(directory: Path, hook: Hook | None = None) -> Outcome:
    """Run SCRIPT on partition 0, one step a round; ``hook(round, loop, shards)`` may restart or
    crash the loop and returns the loop to go on with. The global partition's events, the cell
    partition's batches and the final digest."""
    clock = Clock()
    shards = FileShards(directory, clock)
    _glob, c0, _ = await shards.open()
    loop = make_loop(c0)
    await loop.recover()
    for i, (at_ms, events) in enumerate(SCRIPT):
        await feed(loop, clock, at_ms, *events)
        if hook is not None:
            loop = await hook(i, loop, shards)
        await loop.step()
    found = (await global_events(shards.root), await batches(loop.store), digest(loop.state))
    await shards.close()
    return found


async def reopened(loop: CellShardLoop, shards: FileShards) -> CellShardLoop:
    """Close every store and open them again; a new loop recovers."""
    await shards.close()
    again = shards.reopened()
    _, c0, _ = await again.open()
    shards.root = again.root
    fresh = make_loop(c0)
    await fresh.recover()
    return fresh


async def test_a_restart_between_every_step_changes_no_output(tmp_path: Path) -> None:
    reference = await run_script(tmp_path / "ref")

    async def restart(i: int, loop: CellShardLoop, shards: FileShards) -> CellShardLoop:
        return await reopened(loop, shards)

    assert await run_script(tmp_path / "restarted", restart) == reference
    events, steps, _ = reference
    summaries = [e for e in events if isinstance(e, CellSummary)]
    returned = [(e.job_id, e.attempt) for e in events if isinstance(e, JobReturned)]
    assert returned == [("gang", 1), ("gang", 2)]
    for cell in ("a", "c"):
        seqs = [s.seq for s in summaries if s.cell == cell]
        assert seqs == sorted(set(seqs)), (cell, seqs)  # strictly increasing
        assert len(seqs) >= 3, (cell, seqs)
    assert any(not b.decisions for b in steps)  # (a step with only outputs was recorded)


async def test_a_crash_inside_a_step_loses_and_repeats_nothing(tmp_path: Path) -> None:
    reference = await run_script(tmp_path / "ref")
    crashed: list[int] = []

    async def crash(i: int, loop: CellShardLoop, shards: FileShards) -> CellShardLoop:
        store = loop.store

        async def fail(*args: object, **kwargs: object) -> dict[object, int]:
            raise RuntimeError("injected: the process dies before its step's transaction")

        store.append_transactional_many = fail  # type: ignore[method-assign]
        try:
            await loop.step()  # (a step with outputs dies; one without commits nothing it needs)
        except RuntimeError:
            crashed.append(i)
        finally:
            del store.append_transactional_many  # type: ignore[method-assign]
        fresh = make_loop(store)
        await fresh.recover()
        return fresh

    assert await run_script(tmp_path / "crashed", crash) == reference
    assert len(crashed) >= 4  # (every step with outputs died once)


async def test_recovery_from_a_snapshot_rebuilds_the_last_summaries(tmp_path: Path) -> None:
    reference = await run_script(tmp_path / "ref")

    async def via_snapshot(i: int, loop: CellShardLoop, shards: FileShards) -> CellShardLoop:
        if i not in (4, 8):
            return loop
        snaps = shard_snapshots(Located(tmp_path / "snap"), Shard.cell(0))
        header = SnapshotHeader(loop.offset, loop.decisions_next, "fgd", 0)
        await snaps.save(encode_snapshot(Snapshot(header, snapshot(loop.state))))
        assert restore(snapshot(loop.state)).summaries == loop.state.summaries
        fresh, used = await recover_cell_shard(loop.store, snaps, lambda s: make_loop(s, hold_ms=1))
        assert used is not None
        assert fresh.state.config == loop.state.config  # (hold_ms came back from the snapshot)
        assert fresh.state.summaries == loop.state.summaries
        return fresh

    assert await run_script(tmp_path / "snap", via_snapshot) == reference


async def test_another_shards_snapshot_is_refused(tmp_path: Path) -> None:
    clock = Clock()
    shards = FileShards(tmp_path / "log", clock)
    _, c0, c1 = await shards.open()
    try:
        other = make_loop(c1, partition=1)
        await other.recover()
        await feed(other, clock, 1_000, *cell_nodes("b"))
        await other.step()
        header = SnapshotHeader(other.offset, other.decisions_next, "fgd", 0)
        snaps = shard_snapshots(Located(tmp_path), Shard.cell(0))
        await snaps.save(encode_snapshot(Snapshot(header, snapshot(other.state))))
        loop, used = await recover(c0, snaps, make_loop)
        assert used is None  # skipped: cells ['b'], not partition 0's ['a', 'c']
        assert loop.state.config.cells == ("a", "c")
        assert shard_snapshots(Located(tmp_path), Shard.cell(1)).directory != snaps.directory  # type: ignore[attr-defined]
    finally:
        await shards.close()


async def test_the_cell_log_alone_gives_the_outputs_again_and_replay_verifies(tmp_path: Path) -> None:
    events, steps, final = await run_script(tmp_path / "ref")
    shards = FileShards(tmp_path / "ref", Clock())
    glob, c0, _ = await shards.open()
    try:
        loop = make_loop(c0)
        loop.rederived = []
        await loop.recover()
        assert loop.rederived == events  # bit-exact: the same events in the same order
        assert digest(loop.state) == final
        report = await verify(c0, core=loop.state.config)
        assert report.ok, report.divergence
        assert report.batches == len(steps)
        assert not (await verify(c0)).ok  # (without the shard's CoreConfig, dispatches are not inputs)
        assert (await check_outputs(make_loop(c0), glob)).ok
        # an output the log does not give (a forged or doubled summary) is named
        forged = msgspec.structs.replace(events[0], seq=10**6)
        await glob.log(INPUTS).append([Message(encode(envelope(forged, loop.producer)))])
        found = await check_outputs(make_loop(c0), glob)
        n = len(events)
        assert (found.written, found.rederived, found.first_difference) == (n + 1, n, n)
        assert "seq=1000000" in found.recorded
        assert found.replayed == "(nothing)"
    finally:
        await shards.close()


# --- two partitions, file log and Kafka ---------------------------------------------------------------

SHORT_HOLD = 400


class Shards:
    """The global and two cell stores over one storage; ``later(ms)`` moves log time."""

    def __init__(self, kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
        self.kind, self.clock = kind, Clock()
        if kind == "file":
            root = FileLogStore(tmp_path / "log", shard=Shard.GLOBAL, clock=self.clock)
            self.make: Callable[[Shard], LogStore] = root.for_shard
        else:
            from fleetlog.log.kafka import KafkaLogStore

            bootstrap: str = request.getfixturevalue("kafka_bootstrap")
            prefix = f"cs-{uuid.uuid4().hex[:10]}"
            config = KafkaConfig(bootstrap_servers=bootstrap, topic_prefix=prefix, shards=2)
            self.make = lambda shard: KafkaLogStore(config, shard)

    async def later(self, ms: int) -> None:
        """Log time moves ``ms`` on: the file log's clock, or the broker's (it is wall time)."""
        if self.kind == "file":
            self.clock.ms += ms
        else:
            await asyncio.sleep(ms / 1000)


async def outputs_of(glob: LogStore, producer: str, at_least: int) -> list[Event]:
    """The global partition's events of one cell shard, once there are ``at_least`` (a reader of
    another store sees a Kafka transaction when its markers are written)."""
    for _ in range(200):
        polled = await EventConsumer(glob, accepts=GLOBAL_TYPES).poll(0, 100_000, park=False)
        found = [d.envelope.event for d in polled.events if d.envelope.producer_id == producer]
        if len(found) >= at_least:
            return found
        await asyncio.sleep(0.05)
    raise AssertionError(f"{producer}: {len(found)} outputs, not {at_least}")


@pytest.mark.parametrize("kind", ["file", pytest.param("kafka", marks=pytest.mark.kafka)])
async def test_two_partitions_run_independently_and_recover(kind: str, tmp_path: Path,
                                                          request: pytest.FixtureRequest) -> None:
    env = Shards(kind, tmp_path, request)
    glob, c0, c1 = env.make(Shard.GLOBAL), env.make(Shard.cell(0)), env.make(Shard.cell(1))
    for s in (glob, c0, c1):
        await s.open()
    try:
        p0, p1 = make_loop(c0, 0, SHORT_HOLD), make_loop(c1, 1, SHORT_HOLD)
        for loop in (p0, p1):
            await loop.recover()
        first = [*cell_nodes("a"), dispatched("ja", "a", 1), unplaceable(2)]
        await c0.log(INPUTS).append([msg(e) for e in first])
        await c1.log(INPUTS).append([msg(e) for e in [*cell_nodes("b"), dispatched("jb", "b", 1)]])
        assert (await p0.step()).decisions == 2  # ja placed, the gang pending
        assert (await p1.step()).decisions == 1
        await env.later(SHORT_HOLD + 50)
        await c0.log(INPUTS).append([msg(node("a-n0", cell="a", rack="r0"))])
        assert (await p0.step()).returned == 1
        for loop, cells in ((p0, {"a", "c"}), (p1, {"b"})):
            steps = await batches(loop.store)
            placed = {d.cell for b in steps for d in b.decisions if isinstance(d, JobPlaced)}
            assert placed == cells - {"c"}
        out0 = await outputs_of(glob, p0.producer, 3)  # summaries a and c, the return
        out1 = await outputs_of(glob, p1.producer, 1)
        assert {(e.cell, e.partition) for e in out1 if isinstance(e, CellSummary)} == {("b", 1)}
        assert [e.job_id for e in out0 if isinstance(e, JobReturned)] == ["gang"]
        # partition 0 restarts (a new owner: a new store, recovery), partition 1 goes on
        await c0.close()
        c0 = env.make(Shard.cell(0))
        await c0.open()
        p0 = make_loop(c0, 0, SHORT_HOLD)
        await p0.recover()
        await env.later(6_000 if kind == "file" else 10)
        await c0.log(INPUTS).append([msg(node("a-n9", cell="a", rack="r9"))])  # total changed
        assert (await p0.step()).summaries >= 1
        out0 = await outputs_of(glob, p0.producer, len(out0) + 1)
        seqs = [e.seq for e in out0 if isinstance(e, CellSummary) and e.cell == "a"]
        assert seqs == sorted(set(seqs))
        assert len(seqs) >= 2
        for loop in (p0, p1):
            again = make_loop(loop.store, loop.partition, SHORT_HOLD)
            again.rederived = []
            await again.recover()
            assert again.rederived == await outputs_of(glob, loop.producer, 0)
            report = await verify(loop.store, core=loop.state.config)
            assert report.ok, report.divergence
    finally:
        for s in (c0, c1, glob):
            await s.close()


# --- limits -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("hold_ms", [0, 1 << 62, (1 << 63) - 1])
async def test_hold_ms_at_its_extremes(hold_ms: int, file_shards) -> None:  # type: ignore[no-untyped-def]
    clock, glob, c0, _ = file_shards
    loop = make_loop(c0, hold_ms=hold_ms)
    await loop.recover()
    await feed(loop, clock, 1_000, *cell_nodes(), dispatched("j1", "a", 1))
    assert (await loop.step()).decisions == 1  # placed in its own step, before any later input
    await feed(loop, clock, 1_000, unplaceable(2))
    await loop.step()
    await feed(loop, clock, 1_000, node("a-n0", cell="a", rack="r0"))  # the same log time
    assert (await loop.step()).returned == (1 if hold_ms == 0 else 0)  # 0: at the next input
    await feed(loop, clock, 1_000 + 10**12, node("a-n0", cell="a", rack="r0"))  # 31 years later
    await loop.step()
    returned = [e.job_id for e in await global_events(glob) if isinstance(e, JobReturned)]
    assert returned == (["gang"] if hold_ms < 1 << 40 else [])
    assert (await verify(c0, core=loop.state.config)).ok


async def test_a_return_whose_message_and_names_are_at_their_bounds(file_shards) -> None:  # type: ignore[no-untyped-def]
    clock, glob, c0, _ = file_shards
    loop = make_loop(c0)
    await loop.recover()
    long_id = "g" * 253
    gang = dispatched(long_id, "a", 1, tasks=3, gpus=8, topology="rack")
    await feed(loop, clock, 1_000, *cell_nodes(), gang)
    await loop.step()
    # the longest explanation a JobPending may carry, folded as fold takes a decision
    longest = JobPending(job_id=long_id, reason="never_fits", message="why " * 1_024)
    batch = DecisionBatch(as_of=loop.offset, digest="", decisions=(longest,))
    fold_fast(loop.state, batch, loop.state.now_ms)
    await feed(loop, clock, 1_000 + HOLD, node("a-n0", cell="a", rack="r0"))
    assert (await loop.step()).returned == 1
    (back,) = [e for e in await global_events(glob) if isinstance(e, JobReturned)]
    assert back.job_id == long_id
    assert len(back.message) == 4_096  # cut at the event's bound, and it decodes


@pytest.mark.parametrize("kind", ["file", pytest.param("kafka", marks=pytest.mark.kafka)])
async def test_a_summary_at_its_row_bounds_is_written(kind: str, tmp_path: Path,
                                                      request: pytest.FixtureRequest) -> None:
    env = Shards(kind, tmp_path, request)
    glob, c0 = env.make(Shard.GLOBAL), env.make(Shard.cell(0))
    for s in (glob, c0):
        await s.open()
    try:
        loop = make_loop(c0)
        free = tuple(FreeSlots(f"m{i:04d}", b, 1, 1, 1) for i in range(128) for b in GPU_BUCKETS)
        usage = tuple(TenantUsage(f"{i:05d}" + "t" * 248, 1, 1, 1) for i in range(MAX_SUMMARY_TENANTS))
        big = CellSummary(cell="a" * 253, partition=0, seq=1, as_of=1, at_ms=1, total=Resources(),
                          free=free[:MAX_SUMMARY_ENTRIES], usage=usage)
        await c0.log(INPUTS).append([msg(node("a-n0", cell="a"))])
        messages = loop.global_messages([big])
        await c0.append_transactional_many({(Shard.GLOBAL, INPUTS): messages, (c0.shard, DECISIONS): []},
                                           group=loop.config.group, consumed=1)
        assert await outputs_of(glob, loop.producer, 1) == [big]
    finally:
        for s in (c0, glob):
            await s.close()


async def test_a_partition_of_many_cells_summarises_them_all_in_one_step(tmp_path: Path) -> None:
    cells = CellMap(tuple((f"cell{i:03d}", 0) for i in range(100)))
    clock = Clock()
    root = FileLogStore(tmp_path / "log", shard=Shard.GLOBAL, clock=clock)
    c0 = root.for_shard(Shard.cell(0))
    for s in (root, c0):
        await s.open()
    try:
        loop = CellShardLoop(c0, Policy(), 0, cells, core=CoreConfig(hold_ms=HOLD), rule=RULE)
        await loop.recover()
        await feed(loop, clock, 1_000, *[node(f"{c}-n0", cell=c, model=f"M{i % 70}")
                                       for i, c in enumerate(cells.cells)])
        assert (await loop.step()).summaries == 100
        found = [e for e in await global_events(root) if isinstance(e, CellSummary)]
        assert [s.cell for s in found] == list(cells.cells)
        assert all(s.total.gpu_milli == 8_000 for s in found)
    finally:
        for s in (c0, root):
            await s.close()


@pytest.mark.parametrize("seed", [1, 2])
async def test_generated_rounds_give_the_same_outputs_from_the_log_alone(seed: int, tmp_path: Path) -> None:
    """Random rounds (heartbeats, reshaped and silent nodes, dispatches that fit or not, task ends,
    removals) at random log times: the live loop (which skips the summaries that cannot be due)
    and a recovery from the log alone (which computes every one) write the same outputs."""
    rng = random.Random(seed)
    clock = Clock()
    shards = FileShards(tmp_path / "log", clock)
    glob, c0, _ = await shards.open()
    try:
        loop = make_loop(c0, rule=SummaryRule(every_ms=8_000, material_milli=rng.choice([1, 125])))
        await loop.recover()
        seq, placed = 0, []
        for _ in range(60):
            clock.ms += rng.choice([1, 200, 500, 1_000, 4_000])
            events: list[Event] = []
            for _ in range(rng.randint(1, 6)):
                kind = rng.random()
                if kind < 0.4:
                    cell = rng.choice("ac")
                    name, rack = f"{cell}-n{rng.randint(0, 5)}", f"r{rng.randint(0, 2)}"
                    events.append(node(name, cell=cell, rack=rack, gpus=8 if rng.random() < 0.9 else 4))
                elif kind < 0.7:
                    seq += 1
                    gpus = rng.choice([1, 2, 8])
                    cell, tasks = rng.choice("ac"), rng.choice([1, 3])
                    events.append(dispatched(f"j{seq}", cell, seq, tasks=tasks, gpus=gpus))
                elif kind < 0.85 and placed:
                    events.append(TaskFinished(job_id=placed.pop(rng.randrange(len(placed))), task_index=0))
                else:
                    events.append(NodeRemoved(cell="a", node=f"a-n{rng.randint(0, 5)}"))
            await c0.log(INPUTS).append([msg(e) for e in events])
            await loop.step()
            placed += [d.job_id for d in (await batches(c0))[-1].decisions if isinstance(d, JobPlaced)]
        written = await outputs_of(glob, loop.producer, 1)
        again = make_loop(c0, rule=loop.rule)
        again.rederived = []
        await again.recover()
        assert again.rederived == written
        assert sum(isinstance(e, JobReturned) for e in written) >= 1
    finally:
        await shards.close()


@pytest.mark.kafka
async def test_a_new_owner_fences_the_old_one_and_seq_goes_on(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    from fleetlog.log.kafka import FencedError

    env = Shards("kafka", tmp_path, request)
    glob, old_store = env.make(Shard.GLOBAL), env.make(Shard.cell(0))
    for s in (glob, old_store):
        await s.open()
    new_store = env.make(Shard.cell(0))
    try:
        old = make_loop(old_store)
        await old.recover()
        await old_store.log(INPUTS).append([msg(e) for e in [*cell_nodes("a"), dispatched("j1", "a", 1)]])
        assert (await old.step()).summaries == 2
        await new_store.open()  # the partition moves: the new owner recovers and writes
        new = make_loop(new_store)
        await new.recover()
        await new_store.log(INPUTS).append([msg(node("a-n9", cell="a", rack="r9"))])
        assert (await new.step()).summaries == 1  # total changed
        await old_store.log(INPUTS).append([msg(node("a-n8", cell="a", rack="r9"))])
        with pytest.raises(FencedError):
            await old.step()  # the zombie's step (and its summaries) is refused as a whole
        assert (await new.step()).summaries == 1
        written = await outputs_of(glob, new.producer, 4)
        await asyncio.sleep(0.5)
        assert await outputs_of(glob, new.producer, 4) == written  # nothing of the zombie's
        seqs = [e.seq for e in written if isinstance(e, CellSummary) and e.cell == "a"]
        assert seqs == sorted(set(seqs))
        again = make_loop(new_store)
        again.rederived = []
        await again.recover()
        assert again.rederived == written
    finally:
        for s in (new_store, old_store, glob):
            await s.close()
    # aiokafka leaves the fenced batches' futures unretrieved: their "never retrieved" report at
    # collection must come now, not inside a later import (CPython 3.11's ast.parse then fails)
    gc.collect()


# --- kill -9 inside a step's cross-directory commit (file log) ------------------------------------------

_CHILD = textwrap.dedent("""
    import asyncio, os, signal, sys
    from pathlib import Path
    from fleetlog.log.file import FileLogStore
    from tests.service.test_cellshard import SCRIPT, Clock, FileShards, feed, make_loop

    directory, last = Path(sys.argv[1]), int(sys.argv[2])
    armed, original = [False, 0], FileLogStore._commit_frame

    def commit_frame(self, *args):
        if armed[0]:
            armed[1] += 1
            if armed[1] == 2:  # the cell's commit frame is written, the global partition's not yet
                os.kill(os.getpid(), signal.SIGKILL)
        return original(self, *args)

    FileLogStore._commit_frame = commit_frame

    async def main():
        clock = Clock()
        shards = FileShards(directory, clock)
        _, c0, _ = await shards.open()
        loop = make_loop(c0)
        await loop.recover()
        for i, (at_ms, events) in enumerate(SCRIPT[:last + 1]):
            await feed(loop, clock, at_ms, *events)
            armed[0] = i == last
            await loop.step()

    asyncio.run(main())
""")


@pytest.mark.parametrize("last", [1, 4])  # the first summaries; the first return
async def test_a_kill_between_the_cell_and_the_global_frame_is_finished_by_recovery(
    last: int, tmp_path: Path
) -> None:
    reference = await run_script(tmp_path / "ref")
    directory = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([sys.executable, "-c", _CHILD, str(directory), str(last)], env=env,
                          capture_output=True, timeout=300, check=False)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-3000:]
    assert (directory / "cells-0" / OUTBOX_NAME).exists()  # committed in the cell, not yet global
    clock = Clock()
    shards = FileShards(directory, clock)
    glob, c0, _ = await shards.open()
    try:
        loop = make_loop(c0)
        await loop.recover()  # finishes the outbox: the step's outputs reach the global partition
        assert not (directory / "cells-0" / OUTBOX_NAME).exists()
        for at_ms, events in SCRIPT[last + 1:]:
            await feed(loop, clock, at_ms, *events)
            await loop.step()
        assert (await global_events(glob), await batches(c0), digest(loop.state)) == reference
    finally:
        await shards.close()


def test_each_shard_has_its_own_snapshots(tmp_path: Path) -> None:
    kafka = KafkaConfig(bootstrap_servers="127.0.0.1:1", topic_prefix="fl", shards=4)
    on_kafka = [shard_snapshots(Located(tmp_path, kafka), Shard.cell(p)) for p in (0, 3)]
    wanted = [("fl.cells.snapshots", 0), ("fl.cells.snapshots", 3)]
    assert [(s.tp.topic, s.tp.partition) for s in on_kafka] == wanted  # type: ignore[attr-defined]
    shards = (Shard.cell(0), Shard.cell(1), Shard.SINGLE)
    on_file = [shard_snapshots(Located(tmp_path), shard) for shard in shards]
    assert [s.directory for s in on_file] == [  # type: ignore[attr-defined]
        tmp_path / "cells-0" / "snapshots", tmp_path / "cells-1" / "snapshots", tmp_path / "snapshots"]
