"""The scheduling loop: read inputs, fold, decide, publish decisions — one loop for every log.

``fleetlog simulate`` drives it on a virtual clock over the file log; ``fleetlog run`` drives
it over Kafka.  Each step publishes at most one :class:`DecisionBatch` — split over several
records when it is larger than one record may be (:mod:`fleetlog.events.parts`) — in one
transaction with the input offset it was computed at (``as_of``), so a crash anywhere leaves
neither a duplicate, nor a gap, nor half a step, and replay reproduces every batch.
"""

from __future__ import annotations

import gc
import time
from typing import Final

import msgspec

from fleetlog.core.authorize import fold_checked
from fleetlog.core.decide import decide
from fleetlog.core.digest import digest
from fleetlog.core.fold_batch import fold_fast, fold_lists
from fleetlog.core.invariants import check
from fleetlog.core.policy import Policy
from fleetlog.core.state import CoreConfig, State
from fleetlog.events.codec import CONTENT_TYPE_HEADER, MSGPACK, encode, envelope
from fleetlog.events.model import DecisionBatch, Tick
from fleetlog.events.parts import PartsError, StepJoiner, encode_step
from fleetlog.log.base import DECISIONS, INPUTS, LogStore, Message
from fleetlog.log.consumer import CorruptDecisionsError, EventConsumer, Inputs, decision_batches
from fleetlog.service.observed import ObservationLog

DEFAULT_GROUP: Final = "fleetlog-scheduler"
READ_DECISIONS: Final = 1000
"""Decision records read at a time by recovery."""


class LoopConfig(msgspec.Struct, frozen=True):
    group: str = DEFAULT_GROUP
    producer_id: str = "fleetlog-scheduler"
    max_batch: int = 10_000
    """The most input records folded before one decide (large under load, small when idle)."""
    check_invariants: bool = False
    """Check every invariant after each fold step (tests and simulation)."""
    commit_every: int = 1
    """Commit the consumed offset of a step without decisions only once this many inputs are
    uncommitted (1: every step).  Skipping those commits is safe: nothing was published, and
    recovery folds the same inputs again.  The service commits the rest on a timer."""
    tick_every_ms: int = 0
    """Append a :class:`~fleetlog.events.model.Tick` to the inputs log when no input was read for
    this long (the process's clock): log time is the inputs' append time and moves only with an
    input, so without ticks a node whose heartbeats stopped would stay up until the next input
    came.  A tick is in the log, so replay folds what the leader folded.  0: never (``fleetlog
    simulate`` moves its virtual time with its own inputs)."""


class StepResult(msgspec.Struct, frozen=True):
    inputs: int
    dead_lettered: int
    decisions: int
    as_of: int
    oldest_ms: int = 0
    """The log append time of the oldest input folded in this step (0 when none)."""
    published: bool = False
    """A decision batch was published in this step."""
    work_s: float = 0.0
    """Seconds of work: reading what was there, decoding, folding, deciding, publishing; never
    the wait for input (a step that had to wait starts its clock when its read returned)."""


class SnapshotMismatchError(RuntimeError):
    """A snapshot does not line up with the decisions log (recovery falls back to an older one)."""


class LogBehindError(RuntimeError):
    """A log ends before what a snapshot, a decision batch or a commit proves it once held: it
    lost records (a truncated tail, a deleted segment, a recreated topic).  Recovery refuses to
    lead on it; an operator restores the log or accepts the loss."""


class SchedulerLoop:
    """Owns the state; each :meth:`step` folds what arrived and publishes one decision batch."""

    def __init__(
        self,
        store: LogStore,
        policy: Policy,
        config: LoopConfig | None = None,
        core: CoreConfig | None = None,
    ) -> None:
        self.store, self.policy = store, policy
        self.config = config or LoopConfig()
        self.state = State(core)
        self.offset = 0  # the next inputs offset to read
        self.committed = 0  # the inputs offset last committed
        self.decisions_next = 0  # the decisions offset after the last batch folded
        self.consumer = EventConsumer(store)
        self.producer = self.config.producer_id
        """Who the records this loop writes to the inputs log (its ticks) say they come from."""
        self.heard_at = time.monotonic()
        """When the loop last read an input (or appended a tick): :meth:`tick_if_quiet`."""
        self.observed = ObservationLog()
        """The (producer, reason) pairs of ignored task reports already logged (live folds only)."""

    async def recover(self, state: State | None = None, inputs: int = 0, decisions: int = 0) -> None:
        """Rebuild the state from the logs: every decision batch folded after the inputs it saw.

        With a snapshot (``state`` covering inputs before ``inputs`` and decisions before
        ``decisions``) only the tail is read; a snapshot that does not line up with the
        decisions log raises :class:`SnapshotMismatchError`."""
        if state is not None:
            self.state, self.offset, self.decisions_next = state, inputs, decisions
        log, joiner = self.store.log(DECISIONS), StepJoiner()
        inputs_end = await self.store.log(INPUTS).end_offset()
        end, at = await log.end_offset(), self.decisions_next
        check_ahead("a snapshot covers inputs", self.offset, INPUTS, inputs_end)
        check_ahead("a snapshot covers decisions", self.decisions_next, DECISIONS, end)
        while at < end or joiner.pending:  # a read may stop inside a step: read the rest of it
            records = await log.read(at, READ_DECISIONS)
            if not records:
                break
            for offset, part in decision_batches(records):
                try:
                    step = joiner.add(offset, part)
                except PartsError as exc:
                    raise CorruptDecisionsError(str(exc)) from None
                if step is not None:
                    await self._fold_step(*step)
            at = records[-1].offset + 1
        if joiner.pending:
            raise CorruptDecisionsError(joiner.incomplete())
        committed = await self.store.committed_offset(self.config.group)
        check_ahead(f"group {self.config.group!r} committed inputs", committed or 0, INPUTS, inputs_end)
        await self._fold_inputs_until(committed or 0)
        self.committed = max(committed or 0, self.offset)

    async def _fold_step(self, first: int, last: int, batch: DecisionBatch) -> None:
        """Fold one recorded step (records ``first`` to ``last``) after the inputs it saw."""
        if batch.as_of <= self.offset and self.offset:
            raise SnapshotMismatchError(
                f"decisions@{first} was computed at inputs offset {batch.as_of}, "
                f"not after the {self.offset} already folded"
            )
        await self._fold_inputs_until(batch.as_of)
        fold_fast(self.state, batch, self.state.now_ms)
        self.decisions_next = last + 1

    async def catch_up(self) -> None:
        """Fold every input there is, deciding nothing (read-only views: status, state-at)."""
        await self._fold_inputs_until(await self.store.log(INPUTS).end_offset())

    async def _fold_inputs_until(self, as_of: int) -> None:
        while self.offset < as_of:
            polled = await self.consumer.poll_inputs(
                self.offset, min(self.config.max_batch, as_of - self.offset), park=False, before=as_of
            )
            if polled.next_offset == self.offset:
                if await self.store.log(INPUTS).end_offset() >= as_of:  # (Kafka) only markers left
                    self.offset = as_of
                    return
                raise LogBehindError(
                    f"decisions refer to inputs up to {as_of}; the inputs log ends at {self.offset}: "
                    f"it lost acknowledged records from offset {self.offset}"
                )
            await self.fold(polled, park=False)
            self.offset = polled.next_offset

    async def fold(self, polled: Inputs, park: bool = True) -> None:
        """Fold one read's inputs through the log policy's gate (``fleetlog.core.authorize``):
        a record whose principal may not make its event is left out and, live (``park``),
        parked in the dead-letter log with reason ``unauthorized`` and counted in
        ``polled.dead_lettered``; recovery (``park=False``) parked it the first time."""
        since, first = self.state.observations.seq, self.state.offset
        refused = fold_checked(self.state, polled.events, polled.times, polled.principals, fold_lists,
                               polled.policy_sets)
        if park and self.state.observations.seq != since:  # (a task report not applied as written)
            left_out = {r.at for r in refused}
            self.observed.note(self.state, since, first, polled.records, left_out, self.producer)
        if refused and park:
            await self.consumer.park(self.consumer.refused(polled.records, refused))
            polled.dead_lettered += len(refused)

    async def step(self, timeout_ms: int = 0) -> StepResult:
        """Fold the inputs that arrived (waiting up to ``timeout_ms``), decide, publish."""
        polled, started = await self.fold_arrived(timeout_ms)
        if not polled.events and polled.dead_lettered == 0:
            return StepResult(0, 0, 0, self.offset, work_s=time.perf_counter() - started)
        oldest = polled.times[0] if polled.times else 0
        decisions = decide(self.state, self.policy) if polled.events else []
        if not decisions:
            if polled.dead_lettered or self.offset - self.committed >= self.config.commit_every:
                await self.commit()
            work = time.perf_counter() - started
            return StepResult(len(polled.events), polled.dead_lettered, 0, self.offset, oldest, work_s=work)
        batch = DecisionBatch(
            as_of=self.offset, digest=digest(self.state), decisions=tuple(decisions), policy=self.policy.name,
            typical_pods=self.policy.typical_pods,
        )
        messages = self.batch_messages(batch)
        first = await self.store.append_transactional(
            DECISIONS, messages, group=self.config.group, consumed=self.offset
        )
        self.committed, self.decisions_next = self.offset, first + len(messages)
        fold_fast(self.state, batch, self.state.now_ms)
        if self.config.check_invariants:
            check(self.state)
        work = time.perf_counter() - started
        counts = (len(polled.events), polled.dead_lettered, len(decisions))
        return StepResult(*counts, self.offset, oldest, True, work)

    async def fold_arrived(self, timeout_ms: int) -> tuple[Inputs, float]:
        """Read what arrived (waiting up to ``timeout_ms`` when nothing had) and fold it: the
        inputs and when the step's work began (a step that had to wait starts its clock when its
        read returned: the wait for input is not work)."""
        started = time.perf_counter()
        await self.tick_if_quiet()
        # (one read: a read that waits returns what arrived already at once, and each read of an
        # idle Kafka log asks the broker for the stable end)
        polled = await self.consumer.poll_inputs(self.offset, self.config.max_batch, timeout_ms)
        if timeout_ms > 0:
            started = polled.read_at
        if polled.next_offset != self.offset:
            self.heard_at = time.monotonic()
        await self.fold(polled)
        if self.config.check_invariants:
            check(self.state)
        self.offset = polled.next_offset
        return polled, started

    async def tick_if_quiet(self) -> bool:
        """Append a tick to the inputs log when nothing was read for ``tick_every_ms`` (the step
        about to read then folds it: log time moves on, silent nodes go down on time).  A tick
        alone publishes no batch unless the fold changed what is decided (a node went down)."""
        every, now = self.config.tick_every_ms, time.monotonic()
        if every <= 0 or (now - self.heard_at) * 1000 < every:
            return False
        self.heard_at = now  # (a tick slow to be read is not followed by another at once)
        value = encode(envelope(Tick(), self.producer))
        await self.store.log(INPUTS).append([Message(value=value, headers=((CONTENT_TYPE_HEADER, MSGPACK),))])
        return True

    async def commit(self) -> None:
        """Commit the inputs folded so far (no decisions): where a restart resumes."""
        if self.committed == self.offset:
            return
        await self.store.append_transactional(DECISIONS, [], group=self.config.group, consumed=self.offset)
        self.committed = self.offset

    def batch_messages(self, batch: DecisionBatch) -> list[Message]:
        """The records of one step: one, or its parts when it is larger than a record may be."""
        headers = ((CONTENT_TYPE_HEADER, MSGPACK),)
        return [Message(value=v, headers=headers) for v in encode_step(batch, self.config.producer_id)]


def check_ahead(what: str, offset: int, name: str, end: int) -> None:
    """:class:`LogBehindError` if the ``name`` log ends before ``offset``, which something
    durable (a snapshot, a decision batch, a commit) says it reached."""
    if offset > end:
        raise LogBehindError(
            f"{what} up to offset {offset}, but the {name} log ends at {end}: it lost acknowledged "
            f"records (offsets {end}..{offset - 1} at least; a truncated tail, a deleted segment or a "
            "recreated topic); restore the log, or accept the loss by moving what is ahead away"
        )


def keep_recovered() -> None:
    """After a recovery (the single shard's, the dispatcher's, a cell shard's): the state just
    rebuilt is long-lived, so keep the cyclic GC from re-scanning it in every full collection
    (about 0.15 s per 400,000 objects, in the middle of a step)."""
    gc.collect()
    gc.freeze()
