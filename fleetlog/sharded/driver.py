"""The dispatcher and the cell shards in one process, joined in memory as their partitions join
them: no log, the pure core only, log time from a virtual clock this driver owns.

One :meth:`ShardedFleet.step`, in a fixed order (so a run is reproduced from its inputs):

1. the dispatcher folds what reached the global partition since its last step (submissions,
   cancellations, quotas, the cells' returns and summaries), each at its log time, refusing bad
   input with a reason (:attr:`ShardedFleet.refused`, the dead letters);
2. it dispatches: each ``JobDispatched`` and each forwarded ``JobCancelled`` is appended to the
   chosen cell's partition at the current virtual time;
3. every cell shard, in partition order, folds its partition's new records (dispatches,
   heartbeats, task observations), decides, folds its decision batch (the service loop's step,
   ``fleetlog.service.loop``), and appends to the global partition the jobs it handed back since
   its last step (``cellshard.returns``) and, per cell it holds, a ``CellSummary`` when one is
   due (``cellshard.summary_due``).

Cell shards run in groups (:class:`LocalShards` here; ``fleetlog.sharded.procs`` runs a group
in a child process): the driver sends each group its partitions' new records, then collects
what each wrote, in partition order — the same records whichever process stepped them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import msgspec

from fleetlog.core import dispatch as d
from fleetlog.core.cellshard import SummaryRule, cell_summary, returns, summary_due
from fleetlog.core.decide import decide
from fleetlog.core.digest import digest
from fleetlog.core.fold_batch import fold_fast, fold_lists
from fleetlog.core.invariants import check
from fleetlog.core.policy import Policy
from fleetlog.core.state import CoreConfig, State
from fleetlog.events.model import (
    CellSummary,
    DecisionBatch,
    Event,
    JobCancelled,
    JobDispatched,
    JobPlaced,
    JobReturned,
    JobSubmitted,
    QuotaSet,
)

Record = tuple[Event, int]
"""One record of a partition: the event and its log time (ms)."""
GLOBAL_KINDS = (JobSubmitted, JobCancelled, QuotaSet)
"""What a client may write to the global partition (returns and summaries are the cells')."""
_ENCODER = msgspec.msgpack.Encoder()


@dataclass(frozen=True)
class FleetConfig:
    """What the fleet runs: the cell map (one shard per partition), the cells' policy, their
    hold time and summary rule, the core settings every shard shares."""

    cells: d.CellMap
    policy: Policy = field(default_factory=Policy)
    hold_ms: int = 30_000
    summary: SummaryRule = field(default_factory=SummaryRule)
    core: CoreConfig = field(default_factory=CoreConfig)
    check: bool = False
    """Check each shard's invariants (``core.invariants.check``) after its folds (tests)."""
    keep_decisions: bool = True
    """Hand each step's decisions back to the caller (a world that starts tasks needs them);
    ``False``: counts only (the benchmark, and groups in other processes)."""
    pipeline: bool = False
    """The dispatcher's step k+1 runs while the cell shards run step k (:meth:`ShardedFleet.step`):
    it folds what the cells wrote up to step k-1, one step staler than in lock step."""

    def partitions(self) -> dict[int, tuple[str, ...]]:
        """Partition -> the cells it holds, sorted both ways."""
        out: dict[int, list[str]] = {}
        for cell, partition in self.cells.partitions:
            out.setdefault(partition, []).append(cell)
        return {p: tuple(out[p]) for p in sorted(out)}


@dataclass
class ShardOut:
    """What one cell shard wrote in one step."""

    partition: int
    placed: int = 0
    decisions: list[object] = field(default_factory=list)
    to_global: list[Event] = field(default_factory=list)
    """Its summaries, then its returns, in the order written."""


class CellShard:
    """One cell partition's shard: the service loop's step over a ``State``, no log."""

    def __init__(self, partition: int, cells: tuple[str, ...], config: FleetConfig) -> None:
        self.partition, self.cells, self.config = partition, cells, config
        core = msgspec.structs.replace(config.core, cells=cells, hold_ms=config.hold_ms)
        self.state = State(core)
        self.since = 0
        """The input offset folded at the previous step: returns folded from there are new."""
        self.seq: dict[str, int] = {}
        self.last: dict[str, CellSummary] = {}
        self.transcript = hashlib.sha256()
        """Everything this shard wrote (decision batches, returns, summaries), in order."""

    def step(self, records: Sequence[Record]) -> ShardOut:
        """Fold ``records`` (its partition's new records), decide, write."""
        out = ShardOut(self.partition)
        if not records:
            return out
        state = self.state
        fold_lists(state, [e for e, _ in records], [at for _, at in records])
        if self.config.check:
            check(state)
        decisions = decide(state, self.config.policy)
        if decisions:
            batch = DecisionBatch(as_of=state.offset, digest=digest(state), decisions=tuple(decisions),
                                  policy=self.config.policy.name,
                                  typical_pods=self.config.policy.typical_pods)
            self.transcript.update(_ENCODER.encode(batch))
            fold_fast(state, batch, state.now_ms)
            if self.config.check:
                check(state)
            out.placed = sum(1 for x in decisions if isinstance(x, JobPlaced))
            if self.config.keep_decisions:
                out.decisions = list(decisions)
        # Summaries before returns: the dispatcher then takes the summary written with a return
        # as already seen when the return arrives (``Job.returned``), so it does not send the job
        # straight back to the cell on the room that summary shows (its slots cannot say why
        # the job did not fit, e.g. topology); the cell's next summary may.
        out.to_global = [*self._summaries(), *returns(state, self.since)]
        self.since = state.offset
        for event in out.to_global:
            self.transcript.update(_ENCODER.encode(event))
        return out

    def _summaries(self) -> list[CellSummary]:
        """Per cell, its summary now, when one is due (then it is the cell's last)."""
        out = []
        for cell in self.cells:
            seq = self.seq.get(cell, 0) + 1
            fresh = cell_summary(self.state, cell, self.partition, seq)
            if summary_due(self.last.get(cell), fresh, self.config.summary):
                self.seq[cell], self.last[cell] = seq, fresh
                out.append(fresh)
        return out


class ShardGroup(Protocol):
    """Cell shards stepped together (in this process or another): :meth:`send` each its new
    records, then :meth:`receive` what each wrote, in partition order."""

    partitions: tuple[int, ...]

    def send(self, records: dict[int, list[Record]]) -> None: ...

    def receive(self) -> list[ShardOut]: ...

    def transcripts(self) -> dict[int, str]: ...


class LocalShards:
    """Cell shards stepped in this process."""

    def __init__(self, shards: Iterable[CellShard]) -> None:
        self.shards = {s.partition: s for s in shards}
        self.partitions = tuple(sorted(self.shards))
        self._next: dict[int, list[Record]] = {}

    def send(self, records: dict[int, list[Record]]) -> None:
        self._next = records

    def receive(self) -> list[ShardOut]:
        records, self._next = self._next, {}
        return [self.shards[p].step(records.get(p, [])) for p in self.partitions]

    def transcripts(self) -> dict[int, str]:
        return {p: s.transcript.hexdigest() for p, s in self.shards.items()}


@dataclass
class FleetStep:
    """What one fleet step did."""

    dispatched: tuple[JobDispatched, ...]
    cancels: tuple[tuple[str, JobCancelled], ...]
    waiting: tuple[tuple[str, str, str], ...]
    placed: int
    outs: list[ShardOut]


class ShardedFleet:
    """The global dispatcher and the cell shards, in one process (some shard groups may run in
    child processes: :mod:`fleetlog.sharded.procs`)."""

    def __init__(self, config: FleetConfig, groups: Sequence[ShardGroup] | None = None) -> None:
        self.config = config
        self.now_ms = 0
        self.dispatcher = d.DispatchState(config.cells)
        self.global_in: list[Record] = []
        self.cell_in: dict[int, list[Record]] = {p: [] for p in config.partitions()}
        self.groups: Sequence[ShardGroup] = groups if groups is not None else [
            LocalShards(CellShard(p, cells, config) for p, cells in config.partitions().items())
        ]
        covered = sorted(p for g in self.groups for p in g.partitions)
        if covered != sorted(self.cell_in):
            raise ValueError(f"shard groups cover partitions {covered}, the cell map {sorted(self.cell_in)}")
        self.refused: list[tuple[Event, str]] = []
        self.transcript = hashlib.sha256()
        """What the dispatcher wrote (dispatches, forwarded cancels), in order."""
        self.steps = 0

    # --- inputs ---------------------------------------------------------------------------

    def advance(self, ms: int) -> None:
        """Move the virtual clock (log time of every record appended from now on)."""
        if ms < 0:
            raise ValueError(f"the virtual clock does not go back ({ms} ms)")
        self.now_ms += ms

    def submit(self, *events: Event) -> None:
        """Client input to the global partition: submissions, cancellations, quotas."""
        for e in events:
            if not isinstance(e, GLOBAL_KINDS):
                raise TypeError(f"{type(e).__name__} does not go to the global partition (a cell's input?)")
            self.global_in.append((e, self.now_ms))

    def to_cell(self, cell: str, *events: Event) -> None:
        """Observations of ``cell`` (heartbeats, removals, task events) to its partition."""
        partition = self.config.cells.partition_of(cell)
        if partition is None:
            raise ValueError(f"cell {cell!r} is not in the cell map")
        self.cell_in[partition].extend((e, self.now_ms) for e in events)

    # --- the step -------------------------------------------------------------------------

    def step(self) -> FleetStep:
        """Dispatcher fold and dispatch, then every cell shard's step (see the module doc).
        Pipelined (``FleetConfig.pipeline``): the cells' records are sent first — a group in
        another process starts on them — then the dispatcher folds and dispatches into the
        cells' next records, then the groups' outputs are collected: the same records in the
        same order whichever process steps a group, so one and two processes write the same."""
        if not self.config.pipeline:
            dispatched = self._dispatch()
        records, self.cell_in = self.cell_in, {p: [] for p in self.cell_in}
        for group in self.groups:
            group.send({p: records[p] for p in group.partitions if records[p]})
        if self.config.pipeline:
            dispatched = self._dispatch()
        outs = sorted((o for g in self.groups for o in g.receive()), key=lambda o: o.partition)
        for out in outs:
            self.global_in.extend((e, self.now_ms) for e in out.to_global)
        self.steps += 1
        placed = sum(o.placed for o in outs)
        return FleetStep(dispatched.dispatched, dispatched.cancels, dispatched.waiting, placed, outs)

    def _dispatch(self) -> d.Step:
        self._fold_global()
        dispatched = d.dispatch(self.dispatcher)
        self._route(dispatched)
        return dispatched

    def _fold_global(self) -> None:
        records, self.global_in = self.global_in, []
        for i, why in d.fold_all(self.dispatcher, records):
            self.refused.append((records[i][0], why))

    def _route(self, step: d.Step) -> None:
        """Dispatches and forwarded cancellations to the chosen cells' partitions, now."""
        update, encode, now = self.transcript.update, _ENCODER.encode, self.now_ms
        partition_of, cell_in = self.config.cells.partition_of, self.cell_in
        for e in step.dispatched:  # (to_cell's, inline: one per job; the dispatcher names map cells only)
            update(encode(e))
            cell_in[partition_of(e.cell)].append((e, now))  # type: ignore[index]
        for cell, cancel in step.cancels:
            self.transcript.update(_ENCODER.encode((cell, cancel)))
            self.to_cell(cell, cancel)

    def run_until_idle(self, most: int = 1_000) -> int:
        """Step until a step moves nothing (no input folded anywhere, nothing dispatched);
        the number of steps taken."""
        for n in range(1, most + 1):
            busy = bool(self.global_in) or any(self.cell_in.values())
            self.step()
            if not busy:
                return n
        return most

    def digest(self) -> str:
        """One digest of everything every shard wrote: the dispatcher's, then each partition's."""
        parts = [self.transcript.hexdigest()]
        shards: dict[int, str] = {}
        for group in self.groups:
            shards |= group.transcripts()
        parts += [f"{p}:{shards[p]}" for p in sorted(shards)]
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()

    def local_shards(self) -> dict[int, CellShard]:
        """The shards stepped in this process, by partition."""
        out: dict[int, CellShard] = {}
        for group in self.groups:
            if isinstance(group, LocalShards):
                out |= group.shards
        return out


def returned_in(outs: Sequence[ShardOut]) -> list[JobReturned]:
    """The returns the shards wrote in one step."""
    return [e for o in outs for e in o.to_global if isinstance(e, JobReturned)]
