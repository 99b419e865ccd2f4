"""The global dispatcher's service loop (issue 17, docs/scale-out.md "The dispatcher's loop").

One shard over the global partition: each :meth:`DispatcherLoop.step` folds what arrived
(submissions, cancellations, quotas, the cell shards' summaries and returns), calls
:func:`fleetlog.core.dispatch.dispatch`, and writes in **one** ``append_transactional_many``:
each ``JobDispatched`` and each forwarded ``JobCancelled`` into its cell's partition inputs, the
step's record into the global partition's decisions log, and the consumed global offset.  A
crash leaves all of a step or none of it; :meth:`DispatcherLoop.recover` recomputes every
recorded step at its ``as_of`` (checking each against its record), so the state is the one an
uncrashed dispatcher had at its last commit: nothing is dispatched twice, nothing is lost.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Sequence
from typing import Final

import msgspec

from fleetlog.core.dispatch import UNKNOWN_CELL, CellMap, DispatchState, Step, dispatch
from fleetlog.core.dispatch_log import (
    GLOBAL_INPUTS,
    DispatchSnapshotError,
    encode_record,
    is_empty,
    record_of,
    restore_state,
    snapshot_state,
    state_digest,
)
from fleetlog.events.codec import CONTENT_TYPE_HEADER, MSGPACK, BadEventError, encode, envelope
from fleetlog.events.model import Event, QuotaSet
from fleetlog.log.base import (
    DEAD_LETTERS,
    DECISIONS,
    INPUTS,
    LogError,
    LogStore,
    Message,
    Record,
    Shard,
    Target,
)
from fleetlog.log.consumer import REASON_HEADER, Delivered, EventConsumer, dead_letter
from fleetlog.log.kafka import FencedError
from fleetlog.log.snapshots import Snapshot, SnapshotHeader, SnapshotStore, decode_snapshot, encode_snapshot
from fleetlog.replay.dispatcher import DispatchDivergenceError, DispatchReplay, fold_delivered
from fleetlog.service.loop import check_ahead

DEFAULT_GROUP: Final = "fleetlog-dispatcher"
STEP_HEADER: Final = "fleetlog-record"
STEP_HEADER_VALUE: Final = b"dispatch-step"
MAX_KEY: Final = 253
LOG: Final = logging.getLogger("fleetlog.dispatcher")


class DispatcherConfig(msgspec.Struct, frozen=True):
    group: str = DEFAULT_GROUP
    """The consumer group whose committed offset says where the global partition was consumed."""
    producer_id: str = "fleetlog-dispatcher"
    max_batch: int = 10_000
    """The most global records folded before one dispatch."""
    commit_every: int = 1
    """Commit the offset of a step that decided nothing only once this many inputs are
    uncommitted (1: every step): recovery folds them again, nothing was written."""
    snapshot_every: int = 0
    """:meth:`DispatcherLoop.run` snapshots the state after this many published steps (0: only
    when it stops); needs a snapshot store."""


class DispatchStepResult(msgspec.Struct, frozen=True):
    inputs: int
    """Records read (good, bad and refused)."""
    dead_lettered: int
    """Records parked: undecodable, not a global-partition kind, or refused by the fold."""
    dispatched: int
    cancels: int
    as_of: int
    published: bool = False
    quotas: int = 0
    """Cell quotas (``QuotaSet`` with a cell) forwarded to their cells' partitions."""


class Refused(BadEventError):
    """A global event the dispatcher's fold refused (``code: message`` from ``dispatch.fold``)."""

    def __init__(self, why: str) -> None:
        code, _, message = why.partition(": ")
        super().__init__(message or why)
        self.reason = code


class DispatcherLoop:
    """Owns the dispatcher's state over the global partition's store (``Shard.GLOBAL``).

    ``cells`` is the configuration's cell -> partition map.  On the file log the cells' stores
    are ``store.for_shard(Shard.cell(p))`` of the same process (open them before
    :meth:`recover`); on Kafka the transaction writes the cells' topic-partitions itself."""

    def __init__(
        self,
        store: LogStore,
        cells: CellMap,
        config: DispatcherConfig | None = None,
        snapshots: SnapshotStore | None = None,
    ) -> None:
        if store.shard != Shard.GLOBAL:
            raise ValueError(f"the dispatcher runs over the global partition's store, not {store.shard}")
        self.store, self.cells = store, cells
        self.config = config or DispatcherConfig()
        self.replay = DispatchReplay(store, cells)
        self.consumer = EventConsumer(store, accepts=GLOBAL_INPUTS)
        self.committed = 0
        """The global inputs offset last committed."""
        self.fenced = False
        """Another owner took the global shard: this loop must stop."""
        self.snapshots = snapshots
        self.restored_from: str | None = None
        """The snapshot the last :meth:`recover` started from (``None``: the log's start)."""
        self.decisions_next = 0
        """The global decisions offset after the last step record."""
        self._unsnapshotted = 0
        self._broken = True
        """The state is not the logs' (not recovered yet, or a step failed after its fold): the
        next step recovers first."""

    @property
    def state(self) -> DispatchState:
        return self.replay.state

    @property
    def offset(self) -> int:
        """The next global inputs offset to read."""
        return self.replay.state.offset

    async def recover(self) -> None:
        """Finish a crashed cross-partition append (the file log's outbox), then rebuild the state:
        from the newest snapshot that restores and lines up (else from the log's start), every
        recorded step computed again at its ``as_of`` and compared with its record (a mismatch
        raises :class:`DispatchDivergenceError` naming the step), then the inputs up to the
        committed offset folded."""
        await self.store.recover()
        inputs_end = await self.store.log(INPUTS).end_offset()
        for name, load in await self.snapshots.candidates() if self.snapshots is not None else []:
            try:
                snap = decode_snapshot(load())
                state = restore_state(snap.state)
                state.cells = self.cells  # the configured map from here on (a map change: docs)
                await self._rebuild(state, snap.header.decisions_offset, inputs_end)
            except (LogError, OSError, DispatchSnapshotError, DispatchDivergenceError) as exc:
                LOG.warning("dispatcher snapshot %s skipped: %s", name, exc)
                continue
            self.restored_from = name
            return
        self.restored_from = None
        await self._rebuild(DispatchState(self.cells), 0, inputs_end)

    async def _rebuild(self, state: DispatchState, decisions: int, inputs_end: int) -> None:
        """Replay from ``state`` (which covers the decisions before ``decisions``) to the commit."""
        check_ahead("the dispatcher's snapshot covers global inputs", state.offset, INPUTS, inputs_end)
        self.replay = DispatchReplay(self.store, self.cells, state)
        self.replay.decisions_next = decisions
        async for offset, recorded in self.replay.steps(decisions):
            what = await self.replay.redo(recorded)
            if what:
                raise DispatchDivergenceError(f"decisions@{offset} (global as_of {recorded.as_of}): {what}")
        committed = await self.store.committed_offset(self.config.group) or 0
        check_ahead(f"group {self.config.group!r} committed global inputs", committed, INPUTS, inputs_end)
        await self.replay.fold_until(committed)
        self.committed = max(committed, self.offset)
        self.decisions_next = self.replay.decisions_next
        self._broken = False

    async def step(self, timeout_ms: int = 0) -> DispatchStepResult:
        """Fold what arrived (waiting up to ``timeout_ms`` for the first record), dispatch, publish.

        An error after the fold leaves the state ahead of the logs: the next step recovers first.
        :class:`FencedError` (another owner took the shard) sets :attr:`fenced` and propagates."""
        if self.fenced:
            raise FencedError("the dispatcher was fenced: another owner holds the global partition")
        if self._broken:
            await self.recover()
        records = await self._read(timeout_ms)
        if not records:
            return DispatchStepResult(0, 0, 0, 0, self.offset)
        try:
            return await self._fold_and_publish(records)
        except FencedError:
            self.fenced = True
            raise
        except BaseException:
            self._broken = True
            raise

    async def _read(self, timeout_ms: int) -> list[Record]:
        """Up to ``max_batch`` records: everything there is when the first read returns."""
        log, limit = self.store.log(INPUTS), self.config.max_batch
        records = await log.read(self.offset, limit, timeout_ms)  # (what arrived already: at once)
        if records:
            end = await log.end_offset()
            while len(records) < limit and records[-1].offset + 1 < end:
                more = await log.read(records[-1].offset + 1, limit - len(records), 0)
                if not more:
                    break
                records.extend(more)
        return records

    async def _fold_and_publish(self, records: list[Record]) -> DispatchStepResult:
        good, bad = self.consumer.split(records)
        by_offset = {r.offset: r for r in records}
        refusals = fold_delivered(self.state, good, records[-1].offset + 1)
        quotas = self._cell_quotas(good, refusals)
        parked = bad + [dead_letter(by_offset[o], INPUTS, Refused(why)) for o, why in sorted(refusals)]
        if parked:
            await self.store.log(DEAD_LETTERS).append(parked)
            _warn(parked)
        step = dispatch(self.state)
        if is_empty(step) and not quotas:
            if parked or self.offset - self.committed >= self.config.commit_every:
                await self.commit()
            return DispatchStepResult(len(records), len(parked), 0, 0, self.offset)
        await self._publish(step, quotas)
        return DispatchStepResult(len(records), len(parked), len(step.dispatched), len(step.cancels),
                                  self.offset, True, len(quotas))

    def _cell_quotas(
        self, good: list[Delivered], refusals: list[tuple[int, str]]
    ) -> list[tuple[str, Message]]:
        """The read's quotas of one cell, for their cells' partitions (the cell shard applies
        them); a quota of a cell the map does not name joins ``refusals``."""
        out: list[tuple[str, Message]] = []
        for d in good:
            quota = d.envelope.event
            if not isinstance(quota, QuotaSet) or not quota.cell:
                continue
            if self.cells.partition_of(quota.cell) is None:
                refusals.append((d.offset, f"{UNKNOWN_CELL}: a quota of tenant {quota.tenant!r} for cell "
                                           f"{quota.cell!r}, which the cell map does not name"))
                continue
            key = d.envelope.key or record_key("quota", quota.tenant)
            out.append((quota.cell, self._message(quota, key)))
        return out

    async def _publish(self, step: Step, quotas: list[tuple[str, Message]]) -> None:
        """One transaction: the cells' quotas, cancellations and dispatches, the step record (when
        the step decided something), the consumed offset."""
        appends: dict[Target, list[Message]] = {}
        for cell, message in quotas:
            appends.setdefault(self._target(cell), []).append(message)
        for cell, cancel in step.cancels:
            key = record_key("cancel", cancel.job_id)
            appends.setdefault(self._target(cell), []).append(self._message(cancel, key))
        for sent in step.dispatched:
            key = record_key("dispatch", sent.job.job_id, sent.attempt)
            appends.setdefault(self._target(sent.cell), []).append(self._message(sent, key))
        own: list[Message] = []
        if not is_empty(step):
            record = record_of(step, self.offset, state_digest(self.state))
            headers = ((STEP_HEADER, STEP_HEADER_VALUE),)
            own = [Message(v, headers=headers) for v in encode_record(record)]
            appends[(Shard.GLOBAL, DECISIONS)] = own
        firsts = await self.store.append_transactional_many(appends, group=self.config.group,
                                                            consumed=self.offset)
        self.committed = self.offset
        if own:
            self.decisions_next = firsts[(Shard.GLOBAL, DECISIONS)] + len(own)
            self._unsnapshotted += 1

    def _target(self, cell: str) -> Target:
        partition = self.cells.partition_of(cell)
        if partition is None:  # dispatch() chooses among the map's cells only
            raise ValueError(f"cell {cell!r} is not in the cell map")
        return (Shard.cell(partition), INPUTS)

    def _message(self, event: Event, key: str) -> Message:
        value = encode(envelope(event, self.config.producer_id, key))
        return Message(value, key=key.encode(), headers=((CONTENT_TYPE_HEADER, MSGPACK),))

    async def commit(self) -> None:
        """Commit the global inputs folded so far (nothing decided): where a restart resumes."""
        if self.committed == self.offset:
            return
        await self.store.append_transactional(DECISIONS, [], group=self.config.group, consumed=self.offset)
        self.committed = self.offset

    async def snapshot(self) -> str | None:
        """Save the state (committed first: a snapshot covers only what the logs hold); where it
        went, or ``None`` without a snapshot store."""
        if self.snapshots is None:
            return None
        if self._broken:
            await self.recover()
        await self.commit()
        header = SnapshotHeader(inputs_offset=self.offset, decisions_offset=self.decisions_next,
                                policy="dispatch", taken_ms=int(time.time() * 1000))
        where = await self.snapshots.save(encode_snapshot(Snapshot(header, snapshot_state(self.state))))
        self._unsnapshotted = 0
        return where

    async def run(self, stop: asyncio.Event, timeout_ms: int = 100) -> None:
        """Step until ``stop`` is set, then commit (and snapshot, with a snapshot store).  Raises
        :class:`FencedError` when another owner took the global shard (embedded mode runs this
        as a task)."""
        every = self.config.snapshot_every
        while not stop.is_set():
            await self.step(timeout_ms)
            if every and self._unsnapshotted >= every:
                await self.snapshot()
        await self.commit()
        await self.snapshot()


def record_key(kind: str, job_id: str, attempt: int = 0) -> str:
    """``kind/JOB[/ATTEMPT]``: an envelope key holds at most 253 characters, a job id as many, so
    a key that would be longer names the job by a digest of its id instead."""
    key = f"{kind}/{job_id}" + (f"/{attempt}" if attempt else "")
    if len(key) <= MAX_KEY:
        return key
    named = hashlib.blake2b(job_id.encode(), digest_size=16).hexdigest()
    return f"{kind}/#{named}" + (f"/{attempt}" if attempt else "")


def _warn(parked: Sequence[Message]) -> None:
    for message in parked:
        reason = dict(message.headers).get(REASON_HEADER, b"").decode()
        LOG.warning("dead-lettered a global-partition record (%s)", reason)
