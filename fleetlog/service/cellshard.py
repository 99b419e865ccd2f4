"""The service loop of one cell partition (issue 17, docs/scale-out.md "The cell shard's loop").

A :class:`CellShardLoop` is today's :class:`SchedulerLoop` over the store of ``Shard.cell(p)``,
whose state holds the cells the map gives partition ``p`` (``CoreConfig.cells``), whose inputs
also hold ``JobDispatched`` (and refuse other partitions' cells:
:class:`fleetlog.log.cellinputs.CellInputsConsumer`), and whose step also writes, into the
global partition's inputs and **in the step's one transaction** with its decisions and consumed
offset, the jobs it handed back (``JobReturned``) and the summaries due (``CellSummary``).

Every step that writes to the global partition is recorded in the partition's decisions log (a
batch without decisions if it decided nothing): recovery folds the recorded steps exactly as the
live loop did, and rebuilds from them the last summary written per cell, so the summaries, their
``seq`` (= ``as_of``) and the returns are a function of the cell partition's log alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from fleetlog.core.cellshard import CapacityMemo, SummaryRule, due_summaries, returns
from fleetlog.core.decide import decide
from fleetlog.core.digest import digest
from fleetlog.core.dispatch import CellMap
from fleetlog.core.fold_batch import fold_fast
from fleetlog.core.invariants import check
from fleetlog.core.policy import Policy
from fleetlog.core.state import CoreConfig, State
from fleetlog.events.codec import CONTENT_TYPE_HEADER, MSGPACK, encode, envelope
from fleetlog.events.model import (
    INPUT_TYPES,
    SHARD_TYPES,
    CellSummary,
    Decision,
    DecisionBatch,
    Event,
    JobReturned,
)
from fleetlog.log.base import DECISIONS, INPUTS, LogStore, Message, Shard, Target, chunks
from fleetlog.log.cellinputs import CellInputsConsumer
from fleetlog.log.consumer import EventConsumer, Inputs
from fleetlog.log.kafka import shard_config
from fleetlog.log.location import Located
from fleetlog.log.snapshots import DirectorySnapshots, KafkaSnapshots, SnapshotHeader, SnapshotStore
from fleetlog.service.loop import LoopConfig, SchedulerLoop, SnapshotMismatchError, StepResult
from fleetlog.service.snapshots import recover

ShardOutput = CellSummary | JobReturned


class CellStepResult(StepResult, frozen=True):
    """A step's result, with what it wrote to the global partition."""

    returned: int = 0
    summaries: int = 0


def held_cells(cells: CellMap, partition: int) -> tuple[str, ...]:
    """The cells the map gives ``partition``, sorted (the map is)."""
    return tuple(c for c, p in cells.partitions if p == partition)


def shard_snapshots(config: Located, shard: Shard) -> SnapshotStore:
    """Where ``shard``'s snapshots are kept: its own directory (``<dir>/cells-<p>/snapshots``) or
    its own partition of ``<prefix>.cells.snapshots`` — never another shard's."""
    if config.kafka is not None:
        return KafkaSnapshots(shard_config(config.kafka, shard))
    assert config.log.dir is not None
    return DirectorySnapshots(Path(config.log.dir) / shard.dirname / "snapshots")


class CellShardLoop(SchedulerLoop):
    """One cell partition's loop: folds its inputs, places in its cells, writes its decisions,
    and hands back and summarises to the global partition in the same transaction."""

    def __init__(
        self,
        store: LogStore,
        policy: Policy,
        partition: int,
        cells: CellMap,
        config: LoopConfig | None = None,
        core: CoreConfig | None = None,
        rule: SummaryRule | None = None,
    ) -> None:
        """``store``: the store of ``Shard.cell(partition)``; ``cells``: the configuration's map;
        ``core``: the shard's settings (``hold_ms``, ...; its ``cells`` are the map's for
        ``partition``); ``rule``: when a summary is due."""
        if store.shard != Shard.cell(partition):
            raise ValueError(f"a cell shard of partition {partition} needs the store of that "
                             f"partition, not of shard {store.shard}")
        held = held_cells(cells, partition)
        core = msgspec.structs.replace(core or CoreConfig(), cells=held)
        super().__init__(store, policy, config, core)
        self.partition, self.cells, self.rule = partition, cells, rule or SummaryRule()
        self.producer = f"{self.config.producer_id}-cell-{partition}"
        self.consumer = CellInputsConsumer(store, partition, held, dict(cells.partitions))
        self.since = 0
        """The state offset folded at the previous step: the returns folded since are this step's."""
        self.memo = CapacityMemo()
        """What the last summaries were computed from: the live step skips the ones that cannot
        be due (recovery recomputes every one: the same outputs, as the tests check)."""
        self.rederived: list[ShardOutput] | None = None
        """When a list: recovery appends to it what each recorded step wrote (the outputs made
        again from the cell partition's log alone, to compare with the global partition's)."""

    @property
    def held(self) -> tuple[str, ...]:
        return self.state.config.cells

    async def recover(self, state: State | None = None, inputs: int = 0, decisions: int = 0) -> None:
        """:meth:`SchedulerLoop.recover`, after finishing a cross-shard append a crash interrupted
        (the file log's outbox); a snapshot of another shard (other cells) is refused
        (:class:`SnapshotMismatchError`: recovery tries an older one)."""
        if state is not None and state.config.cells != self.state.config.cells:
            raise SnapshotMismatchError(
                f"the snapshot is of a shard holding cells {list(state.config.cells)}, not cell "
                f"partition {self.partition}'s {list(self.state.config.cells)}")
        await self.store.recover()
        await super().recover(state, inputs, decisions)
        self.since = self.state.offset

    async def _fold_step(self, first: int, last: int, batch: DecisionBatch) -> None:
        """Fold one recorded step, then make its outputs again (written with it: kept only in
        :attr:`rederived`), so the last summary per cell is the one the live loop wrote."""
        await super()._fold_step(first, last, batch)
        out = self.outputs(memoised=False)
        if self.rederived is not None:
            self.rederived += out

    async def step(self, timeout_ms: int = 0) -> CellStepResult:
        """Fold what arrived, decide, then write the decisions, the returns and the summaries due
        and the consumed offset in one transaction (a step with only returns or summaries writes
        a batch without decisions, so recovery and replay see the step)."""
        polled, started = await self.fold_arrived(timeout_ms)
        if not polled.events:
            if polled.dead_lettered:
                await self.commit()
            return CellStepResult(0, polled.dead_lettered, 0, self.offset,
                                  work_s=time.perf_counter() - started)
        decisions = decide(self.state, self.policy)
        batch = self.batch(decisions) if decisions else None
        if batch is not None:
            fold_fast(self.state, batch, self.state.now_ms)
            if self.config.check_invariants:
                check(self.state)
        out = self.outputs()  # (changes no digested state: the digest of an empty batch is the same)
        if batch is None and out:
            batch = self.batch([])
        published = await self._publish(batch, out, polled)
        returned = sum(isinstance(e, JobReturned) for e in out)
        counts = (len(polled.events), polled.dead_lettered, len(decisions))
        return CellStepResult(*counts, self.offset, polled.times[0], published, time.perf_counter() - started,
                              returned=returned, summaries=len(out) - returned)

    def batch(self, decisions: list[Decision]) -> DecisionBatch:
        """The step's record, at the inputs offset and state digest it was decided at."""
        return DecisionBatch(as_of=self.offset, digest=digest(self.state), decisions=tuple(decisions),
                             policy=self.policy.name, typical_pods=self.policy.typical_pods)

    def outputs(self, memoised: bool = True) -> list[ShardOutput]:
        """What this step writes to the global partition: the summaries due (by cell), then the
        returns folded since the previous step (by ``as_of``, job) — summaries first, so the
        dispatcher does not send a returned job back on the summary written with its return.
        ``memoised=False``: compute every summary (recovery: the same outputs, the slow way)."""
        memo = self.memo if memoised else None
        out: list[ShardOutput] = [*due_summaries(self.state, self.partition, self.rule, memo)]
        out += returns(self.state, self.since)
        self.since = self.state.offset
        return out

    async def _publish(self, batch: DecisionBatch | None, out: list[ShardOutput], polled: Inputs) -> bool:
        """Write the step: nothing but the offset (when due) without decisions or output; else its
        batch, plus its output to the global partition, in one transaction."""
        if batch is None:
            if polled.dead_lettered or self.offset - self.committed >= self.config.commit_every:
                await self.commit()
            return False
        messages = self.batch_messages(batch)
        if out:
            appends: dict[Target, list[Message]] = {
                (self.store.shard, DECISIONS): messages, (Shard.GLOBAL, INPUTS): self.global_messages(out)}
            firsts = await self.store.append_transactional_many(
                appends, group=self.config.group, consumed=self.offset)
            first = firsts[(self.store.shard, DECISIONS)]
        else:
            first = await self.store.append_transactional(
                DECISIONS, messages, group=self.config.group, consumed=self.offset)
        if first < 0:  # (a store that cannot say at return: ask the log)
            first = await self.store.log(DECISIONS).end_offset() - len(messages)
        self.committed, self.decisions_next = self.offset, first + len(messages)
        return True

    def global_messages(self, out: list[ShardOutput]) -> list[Message]:
        """``out`` as envelopes of this shard's producer id, in the inputs' content type."""
        headers = ((CONTENT_TYPE_HEADER, MSGPACK),)
        return [Message(value=encode(envelope(e, self.producer)), headers=headers) for e in out]


async def recover_cell_shard(
    store: LogStore, snapshots: SnapshotStore, factory: Callable[[LogStore], CellShardLoop]
) -> tuple[CellShardLoop, SnapshotHeader | None]:
    """:func:`fleetlog.service.snapshots.recover` for a cell shard: the newest of its own
    snapshots that restores and lines up (``shard_snapshots``), then the tail."""
    loop, used = await recover(store, snapshots, factory)
    assert isinstance(loop, CellShardLoop)
    return loop, used


class OutputsReport(msgspec.Struct, frozen=True):
    """:func:`check_outputs`: how many outputs the global partition holds from a cell shard, how
    many its own log gives again, and the first that differs (``None``: they agree)."""

    written: int
    rederived: int
    first_difference: int | None = None
    recorded: str = ""
    replayed: str = ""

    @property
    def ok(self) -> bool:
        return self.first_difference is None


async def check_outputs(fresh: CellShardLoop, global_store: LogStore) -> OutputsReport:
    """Compare what the global partition holds from ``fresh``'s producer id with what its cell
    partition's log alone gives again (``fresh``: a loop not recovered yet; it recovers from the
    start). The global partition is read first, so a shard still writing only adds outputs past
    those compared."""
    consumer = EventConsumer(global_store, accepts=(*INPUT_TYPES, *SHARD_TYPES))
    written: list[Event] = []
    async for records in chunks(global_store.log(INPUTS)):
        found, _ = consumer.split(records)
        written += [d.envelope.event for d in found if d.envelope.producer_id == fresh.producer]
    fresh.rederived = []
    await fresh.recover()
    again: list[Event] = list(fresh.rederived)
    for i, (w, r) in enumerate(zip(written, again, strict=False)):
        if w != r:
            return OutputsReport(len(written), len(again), i, repr(w)[:2000], repr(r)[:2000])
    if len(written) > len(again):
        extra = repr(written[len(again)])[:2000]
        return OutputsReport(len(written), len(again), len(again), extra, "(nothing)")
    return OutputsReport(len(written), len(again))
