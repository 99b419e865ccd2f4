"""Where replay reads from: a log store (file log or Kafka) and its snapshots, opened read-only.

Every problem a reader can meet — a missing or corrupt log, an undecodable decision batch, an
offset out of range, a time before the first record — is a :class:`ReplayError` with a one-line
message; the command prints it and exits with 2.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import cast, overload

import msgspec
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from fleetlog.core.state import CoreConfig, State
from fleetlog.events.codec import CONTENT_TYPE_HEADER, BadEventError, may_mention
from fleetlog.events.model import DecisionBatch, InputEvent
from fleetlog.events.parts import PartsError, StepJoiner
from fleetlog.log.base import DECISIONS, INPUTS, LOG_NAMES, LogError, LogStore, Record, Shard
from fleetlog.log.cellinputs import CellInputsConsumer
from fleetlog.log.consumer import (
    CorruptDecisionsError,
    Delivered,
    EventConsumer,
    decision_batches,
    principals_of,
)
from fleetlog.log.file import FileLogStore, RecoveryWarning
from fleetlog.log.kafka import KafkaConfig, KafkaLogStore, shard_config
from fleetlog.log.snapshots import DirectorySnapshots, KafkaSnapshots, SnapshotStore

READ_CHUNK = 10_000
READ_DECISIONS = 1000
"""Decision records read at a time."""
Progress = Callable[[int], None]
"""Called with how many more units of work were done (inputs folded, records read)."""


class ReplayError(Exception):
    """A log, snapshot or argument replay cannot use: one line, exit code 2."""


@dataclass
class Source:
    """An opened store plus its snapshots (``None``: replay folds from the start)."""

    store: LogStore
    snapshots: SnapshotStore | None
    where: str
    warnings: tuple[str, ...] = ()
    reopen: Callable[[], Awaitable[Source]] | None = None
    """Open the same logs again (another process's own handles: parallel verify)."""
    core: CoreConfig | None = None
    """The settings the log was folded with (``service.node_timeout_ms``…); ``None``: defaults."""
    cut: tuple[str, ...] = ()
    """How the decisions log (or any log) was found cut: a torn or corrupt decisions tail, a log
    shorter than its recorded high water (issue 46); ``replay verify`` fails on any."""

    async def close(self) -> None:
        if self.snapshots is not None:
            await self.snapshots.close()
        await self.store.close()


async def open_file_source(
    directory: str | Path, snapshots: bool = True, shard: Shard = Shard.SINGLE
) -> Source:
    """The file log in ``directory`` (of ``shard``: its sub-directory, ``global`` or ``cells-<p>``),
    read-only (a torn tail is ignored and reported, not cut).  The global partition's snapshots
    are the dispatcher's, not a scheduler state's: none are opened for it."""
    path = Path(directory)
    here = path / shard.dirname
    if not here.is_dir() or not any((here / name).is_dir() for name in (INPUTS, DECISIONS)):
        raise ReplayError(f"no file log at {here} (expected {', '.join(LOG_NAMES)} directories)")
    store = FileLogStore(path, shard=shard, read_only=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RecoveryWarning)
        await _opened(store, str(here))
    notes = tuple(str(w.message) for w in caught if issubclass(w.category, RecoveryWarning))
    snaps = DirectorySnapshots(here / "snapshots") if snapshots and shard != Shard.GLOBAL else None
    where = f"file log {path}" + (f" shard {shard}" if shard != Shard.SINGLE else "")
    cut = tuple(str(t) for t in store.recovery.truncations if t.log == DECISIONS)
    cut += () if store.shorter is None else (str(store.shorter),)
    return Source(store, snaps, where, notes, lambda: open_file_source(path, snapshots, shard), cut=cut)


async def open_kafka_source(
    config: KafkaConfig, snapshots: bool = True, shard: Shard = Shard.SINGLE
) -> Source:
    """The Kafka topics of ``config`` (of ``shard``: ``<prefix>.global.*`` or partition p of
    ``<prefix>.cells.*``; producers start lazily: reading never fences the scheduler).  Replay
    creates nothing: a prefix whose topics do not exist is an error, not an empty log."""
    topics = await kafka_topics(config)
    own = shard_config(config, shard)
    missing = [own.topic(name) for name in (INPUTS, DECISIONS) if own.topic(name) not in topics]
    if missing:
        raise ReplayError(
            f"no topic {', '.join(missing)} on Kafka at {config.bootstrap_servers} "
            "(is the topic prefix right? --config or FLEETLOG_KAFKA_TOPIC_PREFIX)"
        )
    store = KafkaLogStore(config, shard)
    await _opened(store, config.bootstrap_servers)
    wanted = snapshots and shard != Shard.GLOBAL and own.topic("snapshots") in topics
    snaps = KafkaSnapshots(own) if wanted else None
    where = f"Kafka {config.bootstrap_servers} topics {own.topic_prefix}.*"
    if shard.kind == "cell":
        where += f" partition {shard.partition}"
    return Source(store, snaps, where)


async def kafka_topics(config: KafkaConfig) -> set[str]:
    """The topics the brokers have; an unreachable broker is a :class:`ReplayError`."""
    admin = AIOKafkaAdminClient(**config.client_options())
    try:
        await admin.start()
        return set(await admin.list_topics())
    except KafkaError as exc:
        raise ReplayError(f"cannot reach Kafka at {config.bootstrap_servers}: {exc!r}") from None
    finally:
        with contextlib.suppress(KafkaError):
            await admin.close()


async def _opened(store: LogStore, where: str) -> None:
    try:
        await store.open()
    except (LogError, OSError) as exc:
        raise ReplayError(f"cannot open the log at {where}: {exc}") from None


# --- reading -----------------------------------------------------------------------------


async def end_offset(store: LogStore, name: str) -> int:
    try:
        return await store.log(name).end_offset()
    except LogError as exc:
        raise ReplayError(f"cannot read the {name} log: {exc}") from None


async def start_offset(store: LogStore, name: str) -> int:
    """The first offset log ``name`` still holds (above 0 once older history was pruned)."""
    try:
        return await store.log(name).start_offset()
    except LogError as exc:
        raise ReplayError(f"cannot read the {name} log: {exc}") from None


async def read(store: LogStore, name: str, offset: int, limit: int = READ_CHUNK) -> list[Record]:
    """Records of log ``name`` from ``offset``; a log error becomes a :class:`ReplayError`."""
    try:
        return await store.log(name).read(offset, limit)
    except LogError as exc:
        raise ReplayError(f"cannot read the {name} log at offset {offset}: {exc}") from None


async def mentioning(
    store: LogStore, job_id: str, progress: Progress | None = None, accepts: tuple[type, ...] | None = None
) -> AsyncIterator[Delivered]:
    """The decodable input records that may mention ``job_id``, in log order: a pre-filter
    (:func:`~fleetlog.events.codec.may_mention`), so a job's story decodes little more than its own
    records (bad ones are skipped).  ``accepts``: the event types of the log (a shard's)."""
    needles = (job_id.encode(),)
    consumer = EventConsumer(store) if accepts is None else EventConsumer(store, accepts=accepts)
    end, at = await end_offset(store, INPUTS), await start_offset(store, INPUTS)
    while at < end:
        records = await read(store, INPUTS, at)
        if not records:
            break
        kept = [r for r in records if may_mention(r.value, r.header(CONTENT_TYPE_HEADER), needles)]
        for delivered in consumer.split(kept)[0]:
            yield delivered
        at = records[-1].offset + 1
        if progress is not None:
            progress(len(records))


async def batches(
    store: LogStore, start: int | None = None, stop: int | None = None
) -> AsyncIterator[tuple[int, Record, DecisionBatch]]:
    """(offset, record, batch) of every step's decision batch from ``start`` (to ``stop``,
    excluded): a step split over several records is joined back into one batch, given with the
    offset and record of its first part (:mod:`fleetlog.events.parts`). ``start`` ``None``: from
    the first record the log holds — after a prune, the parts of a step cut by it are skipped."""
    end = await end_offset(store, DECISIONS) if stop is None else stop
    cut = start is None
    at = await start_offset(store, DECISIONS) if start is None else start
    cut = cut and at > 0
    joiner, first = StepJoiner(), None
    while at < end:
        records = await read(store, DECISIONS, at, READ_DECISIONS)
        if not records:
            break
        for record in records:
            if record.offset >= end:
                break
            batch = decode_batch(record)
            if cut and batch.part != 0:
                continue  # (the rest of a step whose first parts were pruned)
            cut = False
            first = record if first is None else first
            try:
                step = joiner.add(record.offset, batch)
            except PartsError as exc:
                raise ReplayError(f"the decisions log is corrupt: {exc}") from None
            if step is not None:
                yield step[0], first, step[2]
                first = None
        at = records[-1].offset + 1
    if joiner.pending:
        raise ReplayError(f"the decisions log is corrupt: {joiner.incomplete()}")


def decode_batch(record: Record) -> DecisionBatch:
    try:
        return next(decision_batches([record]))[1]
    except (BadEventError, CorruptDecisionsError, msgspec.DecodeError) as exc:
        raise ReplayError(f"the decisions log is corrupt at offset {record.offset}: {exc}") from None


Input = tuple[int, InputEvent, int]
"""(offset, event, log time in ms) of one decoded input."""
_TIMESTAMP = attrgetter("timestamp_ms")
_OFFSET = attrgetter("offset")


class Chunk(Sequence[Input]):
    """Decoded inputs as three parallel lists (what ``fold_lists`` takes); a sequence of
    :data:`Input` for observers (no tuple per event is kept)."""

    __slots__ = ("events", "offsets", "policy_sets", "records", "times")

    def __init__(self, offsets: Sequence[int], events: list[InputEvent], times: list[int],
                 records: Sequence[Record] = (), policy_sets: bool = True) -> None:
        self.offsets, self.events, self.times = offsets, events, times
        self.records = records
        """Each event's record (its principal: ``fleetlog.core.authorize.fold_checked``)."""
        self.policy_sets = policy_sets
        """Whether ``events`` may hold a ``PolicySet`` (``False``: the reader decoded none)."""

    def principals(self) -> list[str | None]:
        """Each event's principal, as the scheduling loop reads it (``principals_of`` its records)."""
        return principals_of(self.records)

    def without(self, left_out: Sequence[int]) -> Chunk:
        """This chunk less the events at the places ``left_out`` (what the fold's gate refused)."""
        out = set(left_out)
        keep = [i for i in range(len(self.events)) if i not in out]
        return Chunk([self.offsets[i] for i in keep], [self.events[i] for i in keep],
                     [self.times[i] for i in keep], [self.records[i] for i in keep], self.policy_sets)

    def __len__(self) -> int:
        return len(self.events)

    @overload
    def __getitem__(self, i: int) -> Input: ...
    @overload
    def __getitem__(self, i: slice) -> list[Input]: ...
    def __getitem__(self, i: int | slice) -> Input | list[Input]:
        if isinstance(i, slice):
            return list(zip(self.offsets[i], self.events[i], self.times[i], strict=True))
        return self.offsets[i], self.events[i], self.times[i]

    def __iter__(self) -> Iterator[Input]:
        return zip(self.offsets, self.events, self.times, strict=True)


def instants(chunk: Chunk, state: State) -> Iterator[Chunk]:
    """``chunk`` in parts, each folded into ``state`` before the next is cut: the inputs of one
    log time at a time, except that a run of steady heartbeats (the fold's fast path: they move
    no job, free no GPU, bring no node up or down) before the next node sweep is one part, so
    an observer that samples the state after each part sees every change at its log time,
    whatever the chunking of the reads, for about the cost of one fold. One log time split over
    two reads is two parts; the second one's sample replaces the first's."""
    events, times, n, i = chunk.events, chunk.times, len(chunk.events), 0
    while i < n:
        j, steady, sweep = i, state.derived.steady_ids, state.next_sweep_ms
        while j < n and id(events[j]) in steady and times[j] < sweep:
            j += 1
        if j == i:
            j = i + 1
            while j < n and times[j] == times[i]:
                j += 1
        whole = (i, j) == (0, n)
        yield chunk if whole else Chunk(chunk.offsets[i:j], events[i:j], times[i:j], chunk.records[i:j],
                                        chunk.policy_sets)
        i = j


class InputReader:
    """Reads and decodes the inputs log in order; skips what the scheduler skipped (records that
    do not decode, decisions in the inputs log: the dead letters), decoding as the scheduler's
    consumer does (:meth:`EventConsumer.decode_memoised`: steady heartbeats decoded once, and
    the fold handed the very object it saw last time)."""

    def __init__(self, store: LogStore, offset: int = 0, cells: tuple[str, ...] = ()) -> None:
        """``cells``: a cell shard's (``CoreConfig.cells``): its inputs are read as its loop reads
        them (``JobDispatched`` too; other cells' events skipped, as the loop parked them)."""
        self.store = store
        self.offset = offset
        self.skipped = 0
        self._consumer = CellInputsConsumer(store, 0, cells) if cells else EventConsumer(store)

    async def until(self, stop: int) -> AsyncIterator[Chunk]:
        """Chunks of decoded inputs from the current offset up to ``stop`` (excluded)."""
        while self.offset < stop:
            found = await read(self.store, INPUTS, self.offset, min(READ_CHUNK, stop - self.offset))
            records = found if not found or found[-1].offset < stop else [r for r in found if r.offset < stop]
            if found and not records:  # a gap in the offsets (Kafka) reaches past ``stop``
                self.offset = stop
                return
            if not records:
                if stop <= await end_offset(self.store, INPUTS):  # (a commit marker at the tail: Kafka)
                    self.offset = stop
                    return
                raise ReplayError(
                    f"the inputs log ends at offset {self.offset}, but offset {stop} is needed "
                    "(a truncated log?)"
                )
            self.offset = records[-1].offset + 1
            yield self.decode(records)

    def decode(self, records: list[Record]) -> Chunk:
        events = self._consumer.decode_memoised(records)
        if events is None:  # some record is skipped: decode them one by one (never parked here)
            good, bad = self._consumer.split(records)
            self.skipped += len(bad)
            kept = [cast(InputEvent, d.envelope.event) for d in good]  # split keeps inputs only
            by_offset = {r.offset: r for r in records}
            return Chunk([d.offset for d in good], kept, [d.timestamp_ms for d in good],
                         [by_offset[d.offset] for d in good], self._consumer.saw_policy_set)
        times = list(map(_TIMESTAMP, records))
        first, last = records[0].offset, records[-1].offset
        offsets: Sequence[int] = (
            range(first, last + 1) if last - first + 1 == len(records) else list(map(_OFFSET, records))
        )
        return Chunk(offsets, cast(list[InputEvent], events), times, records, self._consumer.saw_policy_set)


async def time_to_offset(store: LogStore, at_ms: int) -> int:
    """The first inputs offset whose log time is after ``at_ms`` (so the state "at" that time has
    folded every input appended at or before it).  Log time is append time: it never goes back."""
    end = await end_offset(store, INPUTS)
    first = await read(store, INPUTS, await start_offset(store, INPUTS), 1)
    if not first:
        raise ReplayError("the inputs log is empty: there is no state at any time")
    if at_ms < first[0].timestamp_ms:
        raise ReplayError(
            f"time {at_ms} ms is before the first input (appended at {first[0].timestamp_ms} ms)"
        )
    lo, hi = first[0].offset, end  # invariant: record at lo is at or before at_ms; answer in (lo, hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        found = await read(store, INPUTS, mid, 1)
        if not found or found[0].timestamp_ms > at_ms:
            hi = mid
        else:
            lo = found[0].offset
    return hi
