"""The Kafka log store: one topic per log, one partition per scheduling shard (aiokafka).

Topics are ``f"{topic_prefix}.{name}"`` (``fleetlog.inputs``, ``fleetlog.decisions``,
``fleetlog.dead-letters``) and are created on :meth:`KafkaLogStore.open` if missing, all with
``message.timestamp.type=LogAppendTime`` so a record's time is the broker's append time.

Plain appends go through an idempotent producer (``acks=all``).  Decisions go through a
transactional producer that commits the records together with the consumer group's input offset
(``send_offsets_to_transaction``), so a crash leaves no duplicate and no gap.  Readers use
``read_committed`` consumers with the one partition assigned by hand.

Offsets are Kafka's own: dense for plain appends, but a transaction's commit or abort marker
takes an offset too, so logs written transactionally have gaps.  Offsets are always strictly
increasing; a reader continues at ``last.offset + 1``.  :meth:`KafkaLog.end_offset` is the last
stable offset (the end of committed data, markers included).

Offset queries (end and start offsets) go through a consumer of the store that never fetches
(:meth:`KafkaLogStore.offsets_client`), never through a reader's: a broker answers the requests
of one connection one at a time, in order, and a reader at the end of its partition has a fetch
parked there for up to ``fetch_max_wait_ms`` (aiokafka's 500 ms) — an offset query behind it
waited that long (the p99 of the scaled-out roles' latency, docs/scale-out.md).

The producers start lazily: opening a store to read (replay, explain) never fences the
scheduler that owns the transactional id.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import struct
from collections.abc import Awaitable, Iterator, Mapping, Sequence
from typing import Any, Final

import msgspec
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import (
    CorruptRecordException,
    InvalidProducerEpoch,
    KafkaError,
    ProducerFenced,
    TopicAlreadyExistsError,
    UnsupportedCodecError,
    for_code,
)
from aiokafka.errors import OffsetOutOfRangeError as KafkaOffsetOutOfRange
from aiokafka.helpers import create_ssl_context
from aiokafka.protocol.commit import OffsetFetchRequest
from aiokafka.protocol.fetch import FetchRequest
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import OffsetAndMetadata

from fleetlog.log.base import (
    DECISIONS,
    INPUTS,
    LOG_NAMES,
    NULL_VALUE_HEADER,
    UNREADABLE_HEADER,
    Log,
    LogClosedError,
    LogError,
    LogStore,
    Message,
    OffsetOutOfRangeError,
    Record,
    Shard,
    Target,
    pick_log,
    within_bytes,
)
from fleetlog.retry import Backoff, poll, retry

_TIMESTAMP_TYPE: Final = "message.timestamp.type"
_LOG_APPEND_TIME: Final = "LogAppendTime"
_TOPIC_EXISTS: Final = TopicAlreadyExistsError.errno
_BATCH_HEAD: Final = struct.Struct(">qi")
"""How every record batch (and legacy message) starts: base offset, then the length of the rest."""
_READ_COMMITTED: Final = 1
MAX_KEPT_BATCH_BYTES: Final = 256 * 1024
"""An unreadable batch up to this size travels to the dead-letter log whole (compressed, as the
broker holds it); a larger one is named by its offsets only (it stays in its topic)."""
_UNREADABLE_BATCH: Final = (UnsupportedCodecError, CorruptRecordException)


DECISION_TOPIC_BYTES: Final = 4 << 20
"""The least ``max.message.bytes`` the decisions topic may have: a decision record is at most
3.5 MiB (``fleetlog.events.parts.DECISION_RECORD_BYTES``; this layer does not import the events),
a Kafka batch around it adds well under 1 KiB."""
_MAX_MESSAGE_BYTES: Final = "max.message.bytes"


class FencedError(LogError):
    """Another producer with the same transactional id took over: this store must stop."""


class KafkaConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Where the logs live and how to reach them.  ``repr`` never shows the SASL password."""

    bootstrap_servers: str
    topic_prefix: str = "fleetlog"
    shard: int = 0
    """The partition of every topic this store reads and writes."""
    shards: int = 1
    """Partitions per topic when the store creates the topics."""
    replication_factor: int = 1
    client_id: str = "fleetlog"
    transactional_id: str | None = None
    """Defaults to ``f"{topic_prefix}.shard{shard}"``: one transactional writer per shard."""
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_plain_username: str | None = None
    sasl_plain_password: str | None = None
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    request_timeout_ms: int = 30_000
    transaction_timeout_ms: int = 60_000
    visibility_timeout_ms: int = 30_000
    """How long a committed transaction may take to become visible to readers."""
    max_batch_bytes: int = 1_000_000
    max_decision_bytes: int = DECISION_TOPIC_BYTES
    """The decisions topic's ``max.message.bytes`` when the store creates it, and the transactional
    producer's ``max_request_size``: at least :data:`DECISION_TOPIC_BYTES` (4 MiB), room for the
    largest decision record the scheduler writes (3.5 MiB; a larger step is split over several
    records, ``fleetlog.events.parts``) with Kafka's record and batch headers."""
    fetch_max_bytes: int = 64 * 1024 * 1024
    max_partition_fetch_bytes: int = 16 * 1024 * 1024
    fetch_max_wait_ms: int = 500
    """How long the broker holds a reader's fetch at the end of its partition (aiokafka's
    default): a reader waiting there is woken by the first record a commit makes readable, not
    by this wait, which only spaces an idle reader's fetches.  Offset queries never wait behind
    it (they have a connection of their own: the module docstring)."""
    compression_type: str | None = None
    retention_ms: int | None = None
    """``retention.ms`` of the inputs and decisions topics when the store creates them (``None``:
    the broker's default, 7 days unless changed; -1: forever). Older records are deleted by the
    brokers; replay then starts from the oldest snapshot the logs continue (docs/retention.md):
    keep it well above ``service.snapshot_every_s``."""
    retention_bytes: int | None = None
    """``retention.bytes`` of the inputs and decisions topics (per partition) when the store
    creates them (``None``: the broker's default, unbounded unless changed)."""

    def __post_init__(self) -> None:
        if not 0 < self.fetch_max_wait_ms < self.request_timeout_ms:
            raise ValueError(
                f"fetch_max_wait_ms is {self.fetch_max_wait_ms}; it must be above 0 (a reader at the "
                f"end would ask the broker without pause) and below request_timeout_ms "
                f"({self.request_timeout_ms}: a fetch the broker holds that long times out)"
            )
        if self.max_decision_bytes < DECISION_TOPIC_BYTES:
            raise ValueError(
                f"max_decision_bytes is {self.max_decision_bytes}; the scheduler's decision records "
                f"need at least {DECISION_TOPIC_BYTES}"
            )

    def topic(self, name: str) -> str:
        return f"{self.topic_prefix}.{name}"

    @property
    def effective_transactional_id(self) -> str:
        return self.transactional_id or f"{self.topic_prefix}.shard{self.shard}"

    def client_options(self) -> dict[str, Any]:
        """Connection options shared by producers, consumers and the admin client."""
        options: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap_servers,
            "client_id": self.client_id,
            "request_timeout_ms": self.request_timeout_ms,
            "security_protocol": self.security_protocol,
        }
        if self.sasl_mechanism is not None:
            options["sasl_mechanism"] = self.sasl_mechanism
            options["sasl_plain_username"] = self.sasl_plain_username
            options["sasl_plain_password"] = self.sasl_plain_password
        context = self._ssl_context()
        if context is not None:
            options["ssl_context"] = context
        return options

    def _ssl_context(self) -> ssl.SSLContext | None:
        if "SSL" not in self.security_protocol:
            return None
        context: ssl.SSLContext = create_ssl_context(
            cafile=self.ssl_cafile, certfile=self.ssl_certfile, keyfile=self.ssl_keyfile
        )
        return context

    def __repr__(self) -> str:
        fields = []
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if name == "sasl_plain_password" and value is not None:
                value = "***"
            fields.append(f"{name}={value!r}")
        return f"KafkaConfig({', '.join(fields)})"

    __str__ = __repr__


def shard_config(config: KafkaConfig, shard: Shard) -> KafkaConfig:
    """``config`` for the store of ``shard``: today's single shard unchanged; the global partition
    on ``<prefix>.global.*`` (1 partition, id ``<prefix>-dispatch``); cell partition p on
    partition p of ``<prefix>.cells.*`` (``shards`` partitions, id ``<prefix>-cell-<p>``)."""
    prefix = config.topic_prefix
    if shard.kind == "single":
        return config
    if shard.kind == "global":
        return msgspec.structs.replace(config, topic_prefix=f"{prefix}.global", shard=0, shards=1,
                                       transactional_id=f"{prefix}-dispatch")
    return msgspec.structs.replace(config, topic_prefix=f"{prefix}.cells", shard=shard.partition,
                                   transactional_id=f"{prefix}-cell-{shard.partition}")


@contextlib.contextmanager
def _translated(what: str) -> Iterator[None]:
    """Re-raise aiokafka errors as :class:`LogError` so callers see one error family."""
    try:
        yield
    except (ProducerFenced, InvalidProducerEpoch) as exc:
        raise FencedError(f"{what}: fenced by a newer producer with the same transactional id") from exc
    except KafkaOffsetOutOfRange as exc:
        raise OffsetOutOfRangeError(f"{what}: {exc}") from exc
    except KafkaError as exc:
        raise LogError(f"{what}: {exc!r}") from exc


async def ensure_topic(
    config: KafkaConfig, topic: str, partitions: int, configs: dict[str, str] | None = None
) -> None:
    """Create ``topic`` unless it exists; a :class:`LogError` names it if that fails."""
    admin = AIOKafkaAdminClient(**config.client_options())
    try:
        await admin.start()
        if topic not in set(await admin.list_topics()):
            new = NewTopic(topic, partitions, config.replication_factor, topic_configs=configs or {})
            with contextlib.suppress(TopicAlreadyExistsError):
                await admin.create_topics([new])
    except KafkaError as exc:
        raise LogError(f"create the topic {topic}: {exc!r}") from exc
    finally:
        with contextlib.suppress(KafkaError):
            await admin.close()


def _batches(raw: bytes) -> list[tuple[Any, bytes]]:
    """The whole record batches in a fetch's bytes, each with its own bytes (a fetch may end in
    a partial batch: left out)."""
    out: list[tuple[Any, bytes]] = []
    pos = 0
    while pos + _BATCH_HEAD.size <= len(raw):
        _, length = _BATCH_HEAD.unpack_from(raw, pos)
        end = pos + _BATCH_HEAD.size + length
        if length <= 0 or end > len(raw):
            break
        out.append((MemoryRecords(raw[pos:end]).next_batch(), raw[pos:end]))
        pos = end
    return out


def _batch_problem(batch: Any) -> str | None:
    """Why ``batch`` cannot be read (CRC, codec, a record in it), or ``None`` if it can."""
    if not batch.validate_crc():
        return "CRC mismatch: the batch is damaged"
    try:
        for _ in batch:
            pass
    except Exception as exc:  # whatever the parser raises is the reason
        return f"cannot decompress or parse it: {exc!r}"
    return None


def _known(value: str | None) -> bool:
    return value is not None


def _to_record(r: Any) -> Record:
    headers = tuple(r.headers) if r.headers else ()
    value = r.value
    if value is None:  # a tombstone: say so, readers must not mistake it for 0 bytes
        return Record(r.offset, r.timestamp, b"", r.key, (*headers, (NULL_VALUE_HEADER, b"")))
    return Record(r.offset, r.timestamp, value, r.key, headers)


async def _send_all(
    producer: AIOKafkaProducer, tp: TopicPartition, messages: Sequence[Message]
) -> tuple[int, int]:
    """Send ``messages`` in as few record batches as fit; return the first and last offset."""
    futures, last_count = await _enqueue(producer, tp, messages)
    return _span(await asyncio.gather(*futures), last_count)


async def _enqueue(
    producer: AIOKafkaProducer, tp: TopicPartition, messages: Sequence[Message]
) -> tuple[list[asyncio.Future[Any]], int]:
    """Hand ``messages`` to the producer in as few record batches as fit: the batches' futures
    (each resolves to its batch's metadata) and the number of records in the last batch."""
    futures: list[asyncio.Future[Any]] = []
    batch = producer.create_batch()
    count = 0
    for m in messages:
        while batch.append(key=m.key, value=m.value, timestamp=None, headers=list(m.headers)) is None:
            futures.append(await producer.send_batch(batch, tp.topic, partition=tp.partition))
            batch, count = producer.create_batch(), 0
        count += 1
    futures.append(await producer.send_batch(batch, tp.topic, partition=tp.partition))
    return futures, count


def _span(results: Sequence[Any], last_count: int) -> tuple[int, int]:
    """The first and last offset of the records sent as batches with metadata ``results``."""
    return int(results[0].offset), int(results[-1].offset) + last_count - 1


async def _all_settled(*waits: Awaitable[Any]) -> list[Any]:
    """The results of ``waits``, run together, once every one has ended (a transaction aborts
    only with nothing of it in flight); the first error (a fencing first) is raised."""
    results = await asyncio.gather(*waits, return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        raise next((e for e in errors if isinstance(e, (ProducerFenced, InvalidProducerEpoch))), errors[0])
    return results


class KafkaLog(Log):
    """One topic-partition: appends through the store's idempotent producer, reads through
    a ``read_committed`` consumer of its own."""

    def __init__(self, store: KafkaLogStore, name: str) -> None:
        self.name = name
        self._store = store
        self.tp = TopicPartition(store.config.topic(name), store.config.shard)
        self._consumer: AIOKafkaConsumer | None = None
        self._assigned = False
        self._position = -1
        self._lock = asyncio.Lock()

    async def append(self, messages: Sequence[Message]) -> int:
        if not messages:
            return await self.end_offset()
        producer = await self._store.idempotent_producer()
        with _translated(f"append to {self.tp.topic}"):
            first, _ = await _send_all(producer, self.tp, messages)
        return first

    async def end_offset(self) -> int:
        await self._settle()
        return await self.stable_end()

    async def stable_end(self) -> int:
        """:meth:`end_offset` without waiting for this store's own last transaction."""
        consumer = await self._store.offsets_client()
        with _translated(f"end offset of {self.tp.topic}"):
            ends = await consumer.end_offsets([self.tp])
        return int(ends[self.tp])

    async def start_offset(self) -> int:
        consumer = await self._store.offsets_client()
        with _translated(f"start offset of {self.tp.topic}"):
            starts = await consumer.beginning_offsets([self.tp])
        return int(starts[self.tp])

    async def read(self, offset: int, max_records: int = 10_000, timeout_ms: int = 0,
                   max_bytes: int | None = None) -> list[Record]:
        if offset < 0:
            raise OffsetOutOfRangeError(f"{self.name}: offset {offset} is before the start of the log")
        await self._settle()
        async with self._lock:
            consumer = await self._reader()
            # (a read that waits and goes on where the last one ended need not ask the stable end:
            # the consumer has fetched from here all along, and its fetch at the end is answered
            # at the first commit)
            continues = self._seek(consumer, offset)
            ask = timeout_ms <= 0 or not continues
            try:
                with _translated(f"read {self.tp.topic} at {offset}"):
                    records = await self._fetch(consumer, max_records, timeout_ms, ask)
            except OffsetOutOfRangeError:
                self._position = -1
                return within_bytes(await self._past_end(offset, timeout_ms), max_bytes)
            kept = within_bytes(records, max_bytes)
            if len(kept) < len(records):  # (the consumer handed out more: it goes on after the kept)
                consumer.seek(self.tp, kept[-1].offset + 1)
        if kept:
            self._position = kept[-1].offset + 1
        return kept

    async def _settle(self) -> None:
        if self._store._unseen is self:
            await self._store.settle()

    async def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            with contextlib.suppress(KafkaError):
                await consumer.stop()

    async def _reader(self) -> AIOKafkaConsumer:
        self._store.check_open()
        if self._consumer is None:
            consumer = AIOKafkaConsumer(**self._store.consumer_options())
            with _translated(f"connect a reader of {self.tp.topic}"):
                await consumer.start()
            self._consumer = consumer
        return self._consumer

    def _seek(self, consumer: AIOKafkaConsumer, offset: int) -> bool:
        """Position the consumer at ``offset`` unless it already continues from there,
        so sequential reads keep the records it prefetched; whether it continues."""
        if not self._assigned:
            consumer.assign([self.tp])
            self._assigned = True
        elif offset == self._position:
            return True
        consumer.seek(self.tp, offset)
        self._position = offset
        return False

    async def _fetch(
        self, consumer: AIOKafkaConsumer, max_records: int, timeout_ms: int, ask: bool
    ) -> list[Record]:
        """What the consumer holds already; else (``ask``) the committed records it has not
        fetched yet, asking the stable end; else whatever its fetch parked at the end brings
        within ``timeout_ms`` (the broker answers that fetch as soon as a commit makes records
        readable).  So an idle reader waiting in turn costs no request of its own."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        hard_deadline = loop.time() + self._store.config.request_timeout_ms / 1000
        records = await self._take(consumer, max_records, 0)
        # Committed records may exist that the consumer has not fetched yet (or only markers,
        # which it steps over): an empty answer is only right once it caught up with the stable end.
        while ask and not records and loop.time() < hard_deadline and await self._behind(consumer):
            records = await self._take(consumer, max_records, 0.05)
        wait = deadline - loop.time()
        if not records and wait > 0:
            records = await self._take(consumer, max_records, wait)
        return records

    async def _take(self, consumer: AIOKafkaConsumer, max_records: int, wait_s: float) -> list[Record]:
        """The records the consumer fetched, waiting up to ``wait_s`` for the first."""
        try:
            fetched = await consumer.getmany(self.tp, timeout_ms=int(wait_s * 1000), max_records=max_records)
        except _UNREADABLE_BATCH as exc:
            return await self._unreadable(consumer, exc)
        except KafkaError:
            raise
        except Exception as exc:  # a record aiokafka cannot parse (a header key not UTF-8, ...)
            return await self._unreadable(consumer, exc)
        return [_to_record(r) for r in fetched.get(self.tp, ())]

    async def _unreadable(
        self, consumer: AIOKafkaConsumer, error: Exception, retried: bool = False
    ) -> list[Record]:
        """aiokafka cannot read a batch at its position (a codec it lacks, a damaged batch, a
        record it cannot parse), and retrying would fail forever.  Read the batches there as the
        broker stores them: if the first is readable, take one record the usual way; else hand
        back one record standing for the bad batch (the reader parks it) and go past it."""
        position = int(await consumer.position(self.tp))
        for batch, raw in await self._raw_batches(position):
            if batch.next_offset <= position or batch.is_control_batch:
                continue
            problem = _batch_problem(batch)
            if problem is None and not retried:
                return await self._one_record(consumer, error)
            if problem is not None:
                consumer.seek(self.tp, batch.next_offset)
                return [self._stand_in(position, batch, raw, f"{problem}; the client said {error!r}")]
        raise LogError(f"read {self.tp.topic} at {position}: {error!r}; no unreadable batch found there")

    async def _one_record(self, consumer: AIOKafkaConsumer, error: Exception) -> list[Record]:
        """The next record, read alone: the bad batch comes later (or the one before it holds
        nothing to read, and then that bad batch is the one at hand)."""
        timeout_ms = self._store.config.request_timeout_ms
        try:
            fetched = await consumer.getmany(self.tp, timeout_ms=timeout_ms, max_records=1)
        except _UNREADABLE_BATCH as exc:
            return await self._unreadable(consumer, exc, retried=True)
        except KafkaError:
            raise
        except Exception as exc:  # as in _take
            return await self._unreadable(consumer, exc, retried=True)
        return [_to_record(r) for r in fetched.get(self.tp, [])]

    async def _raw_batches(self, offset: int) -> list[tuple[Any, bytes]]:
        """The batches from ``offset`` as the partition leader stores them, not decompressed
        (aiokafka hands out only records it parsed, so this asks through a client of its own: the
        offsets client's, whose connection has no fetch parked before it)."""
        client = (await self._store.offsets_client())._client  # aiokafka has no public raw fetch
        config = self._store.config
        request = FetchRequest(
            0, 1, config.fetch_max_bytes, _READ_COMMITTED,
            [(self.tp.topic, [(self.tp.partition, offset, config.max_partition_fetch_bytes)])],
        )
        with _translated(f"fetch the raw batches of {self.tp.topic} at {offset}"):
            leader = client.cluster.leader_for_partition(self.tp)
            if leader is None or leader < 0:
                await client.add_topic(self.tp.topic)
                await client.force_metadata_update()
                leader = client.cluster.leader_for_partition(self.tp)
            response = await client.send(leader, request)
        for _topic, partitions in response.topics:
            for partition, error_code, _highwater, *data in partitions:
                if partition == self.tp.partition and not error_code:
                    return list(_batches(bytes(data[-1] or b"")))
        return []

    def _stand_in(self, start: int, batch: Any, raw: bytes, why: str) -> Record:
        """The record that stands for an unreadable batch: at its last offset (readers go on
        after it), holding its raw bytes if small, saying what it covers and why."""
        last = batch.next_offset - 1
        kept = len(raw) <= MAX_KEPT_BATCH_BYTES
        note = (
            f"offsets {start}..{last} of {self.tp.topic}[{self.tp.partition}] could not be read "
            f"(batch of {len(raw)} bytes, compression codec {batch.compression_type}, "
            f"{'kept here' if kept else 'too large to keep here: still in the topic'}): {why}"
        )
        value = raw if kept else b""
        return Record(last, batch.max_timestamp, value, None, ((UNREADABLE_HEADER, note[:2000].encode()),))

    async def _behind(self, consumer: AIOKafkaConsumer) -> bool:
        position = int(await consumer.position(self.tp))
        return position < await self.end_offset()

    async def _past_end(self, offset: int, timeout_ms: int) -> list[Record]:
        """Kafka refuses offsets outside the log: before its start is an error; past its end
        means nothing arrived, as for any other reader at the end."""
        start = await self.start_offset()
        if offset < start:
            raise OffsetOutOfRangeError(
                f"{self.name}: offset {offset} is before the start of the log ({start})")
        await asyncio.sleep(timeout_ms / 1000)
        return []


class KafkaLogStore(LogStore):
    """The three logs of one shard on a Kafka cluster, plus transactional decision commits.

    ``config`` is the configuration of the fleet; ``shard`` picks the partition (and topics and
    transactional id) of this store (:func:`shard_config`)."""

    def __init__(self, config: KafkaConfig, shard: Shard = Shard.SINGLE) -> None:
        self.base = config
        self.shard = shard
        self.config = config = shard_config(config, shard)
        self._ensured: set[Shard] = {shard}
        self._logs = {name: KafkaLog(self, name) for name in LOG_NAMES}
        self._inputs_tp = TopicPartition(config.topic(INPUTS), config.shard)
        self._admin: AIOKafkaAdminClient | None = None
        self._producer: AIOKafkaProducer | None = None
        self._txn_producer: AIOKafkaProducer | None = None
        self._offsets: AIOKafkaConsumer | None = None
        self._offsets_lock = asyncio.Lock()  # (not the producers': starting one can take seconds)
        self._coordinators: dict[str, int] = {}
        self._start_lock = asyncio.Lock()
        self._txn_lock = asyncio.Lock()
        self._unseen: KafkaLog | None = None
        """The log of the last transaction while its markers may still be on their way."""
        self._settling: asyncio.Task[None] | None = None
        self._open = False

    async def __aenter__(self) -> KafkaLogStore:
        await self.open()
        return self

    def __repr__(self) -> str:
        return f"KafkaLogStore({self.config!r}, open={self._open})"

    async def open(self) -> None:
        if self._open:
            return
        admin = AIOKafkaAdminClient(**self.config.client_options())
        with _translated(f"connect to {self.config.bootstrap_servers}"):
            await admin.start()
        self._admin = admin
        self._open = True
        try:
            await self._ensure_topics(admin)
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        self._open = False
        settling, self._settling, self._unseen = self._settling, None, None
        if settling is not None:
            settling.cancel()
            with contextlib.suppress(BaseException):
                await settling
        for log in self._logs.values():
            await log.close()
        offsets, self._offsets = self._offsets, None
        if offsets is not None:
            with contextlib.suppress(KafkaError):
                await offsets.stop()
        producers = (self._producer, self._txn_producer)
        self._producer = self._txn_producer = None
        for producer in producers:
            if producer is not None:
                with contextlib.suppress(KafkaError):
                    await producer.stop()
        admin, self._admin = self._admin, None
        if admin is not None:
            with contextlib.suppress(KafkaError):
                await admin.close()

    def check_open(self) -> None:
        if not self._open:
            raise LogClosedError("Kafka log store is not open")

    def log(self, name: str) -> KafkaLog:
        self.check_open()
        return pick_log(self._logs, name)

    async def append_transactional(
        self, name: str, messages: Sequence[Message], *, group: str, consumed: int
    ) -> int:
        log = self.log(name)
        async with self._txn_lock:
            # A transaction that starts while the previous one's markers are still being written
            # is refused (CONCURRENT_TRANSACTIONS) and the client retries only after a back-off
            # (20 ms, or 100 ms when it opens with the group's offset).
            await self.settle()
            producer = await self._transactional_producer()
            with _translated(f"transactional append to {log.tp.topic}"):
                span = await self._commit(producer, log.tp, messages, group, consumed)
            self._unseen = log
            self._settling = asyncio.create_task(self._await_visible(log, span, group, consumed))
        return span[0] if span is not None else await log.end_offset()

    async def append_transactional_many(
        self, appends: Mapping[Target, Sequence[Message]], *, group: str, consumed: int
    ) -> dict[Target, int]:
        tps = {}
        for shard, name in appends:
            pick_log(self._logs, name)
            config = shard_config(self.base, shard)
            tps[(shard, name)] = TopicPartition(config.topic(name), config.shard)
        for shard in sorted({s for s, _ in appends} - self._ensured, key=str):
            await self._ensure_shard(shard)
        own = [t for t, m in appends.items() if t[0] == self.shard and m]
        log = self.log(own[-1][1] if own else INPUTS)
        async with self._txn_lock:
            await self.settle()
            producer = await self._transactional_producer()
            batches = [(tps[t], m) for t, m in appends.items()]
            topics = ", ".join(sorted({tp.topic for tp in tps.values()}))
            with _translated(f"transactional append to {topics}"):
                spans = await self._commit_many(producer, batches, group, consumed)
            span = dict(zip(appends, spans, strict=True))[own[-1]] if own else None
            self._unseen = log
            self._settling = asyncio.create_task(self._await_visible(log, span, group, consumed))
        return {t: s[0] if s is not None else -1 for t, s in zip(appends, spans, strict=True)}

    async def _ensure_shard(self, shard: Shard) -> None:
        """Create (and check) the topics of ``shard`` before the first transaction writes there."""
        other = KafkaLogStore(self.base, shard)
        try:
            await other.open()
        finally:
            await other.close()
        self._ensured.add(shard)

    async def settle(self) -> None:
        """Wait until the last transaction committed here is visible to every reader.

        The commit returns before the broker has written the transaction's markers (a
        millisecond or more).  The scheduler does not wait for them — the next step reads
        inputs, not decisions — so a task watches for them in the background; the next
        transaction, and every read of this store that could see this one (its log, the
        committed offset), waits for that task first: a caller reads its own writes."""
        task = self._settling
        if task is not None:
            try:
                await asyncio.shield(task)
            finally:
                if self._settling is task and task.done():
                    self._settling = self._unseen = None

    async def committed_offset(self, group: str) -> int | None:
        self.check_open()
        await self.settle()
        return await self._committed_offset(group)

    async def _committed_offset(self, group: str) -> int | None:
        admin = self._admin
        assert admin is not None
        with _translated(f"committed offset of group {group!r}"):
            offsets = await self._group_offsets_retrying(admin, group)
        found = offsets.get(self._inputs_tp)
        if found is None or found.offset < 0:
            return None
        return int(found.offset)

    # -- producers, consumers, admin ---------------------------------------------------------

    def consumer_options(self) -> dict[str, Any]:
        return {
            **self.config.client_options(),
            "group_id": None,
            "enable_auto_commit": False,
            "isolation_level": "read_committed",
            "auto_offset_reset": "none",
            "fetch_max_bytes": self.config.fetch_max_bytes,
            "max_partition_fetch_bytes": self.config.max_partition_fetch_bytes,
            "fetch_max_wait_ms": self.config.fetch_max_wait_ms,
        }

    def _producer_options(self) -> dict[str, Any]:
        return {
            **self.config.client_options(),
            "acks": "all",
            "enable_idempotence": True,
            "linger_ms": 0,
            "max_batch_size": self.config.max_batch_bytes,
            "max_request_size": max(self.config.max_batch_bytes, 1_048_576),
            "compression_type": self.config.compression_type,
        }

    async def offsets_client(self) -> AIOKafkaConsumer:
        """The store's consumer for offset queries (``read_committed``: end offsets are stable
        ends), assigned nothing so it never fetches: its connection has no fetch parked at a
        log's end for a query to wait behind (the module docstring)."""
        self.check_open()
        async with self._offsets_lock:
            if self._offsets is None:
                consumer = AIOKafkaConsumer(**self.consumer_options())
                with _translated("connect the offsets client"):
                    await consumer.start()
                self._offsets = consumer
        return self._offsets

    async def idempotent_producer(self) -> AIOKafkaProducer:
        self.check_open()
        async with self._start_lock:
            if self._producer is None:
                producer = AIOKafkaProducer(**self._producer_options())
                with _translated("start the idempotent producer"):
                    await producer.start()
                self._producer = producer
        return self._producer

    async def fence(self) -> None:
        """Take the shard's transactional id now, not at the first transaction: a former owner's
        open transaction is ended and its producer refused from here on, so a recovery that
        starts after this reads everything the former owner will ever have committed (a new
        owner of a shard fences, then recovers)."""
        producer = await self._transactional_producer()
        with _translated(f"fence the transactional id {self.config.effective_transactional_id}"):
            await producer.begin_transaction()  # (waits for the producer id: the fence)
            await producer.abort_transaction()

    async def _transactional_producer(self) -> AIOKafkaProducer:
        async with self._start_lock:
            if self._txn_producer is None:
                await self._check_decisions_limit()
                producer = AIOKafkaProducer(
                    **(self._producer_options() | {"max_request_size": self.config.max_decision_bytes}),
                    transactional_id=self.config.effective_transactional_id,
                    transaction_timeout_ms=self.config.transaction_timeout_ms,
                )
                with _translated("start the transactional producer"):
                    await producer.start()
                self._txn_producer = producer
        return self._txn_producer

    async def _commit(
        self,
        producer: AIOKafkaProducer,
        tp: TopicPartition,
        messages: Sequence[Message],
        group: str,
        consumed: int,
    ) -> tuple[int, int] | None:
        """One transaction: the records and the group's input offset; aborted on any error."""
        return (await self._commit_many(producer, [(tp, messages)], group, consumed))[0]

    async def _commit_many(
        self,
        producer: AIOKafkaProducer,
        batches: Sequence[tuple[TopicPartition, Sequence[Message]]],
        group: str,
        consumed: int,
    ) -> list[tuple[int, int] | None]:
        """One transaction over every batch's topic-partition and the group's input offset."""
        await producer.begin_transaction()
        try:
            # Every batch handed over before waiting for any (the producer adds all the partitions
            # in one request to the coordinator and sends the batches of one leader together),
            # then the offset once they are written — not side by side: the offset's first request
            # (adding the group to the transaction) changes the coordinator's state, and a produce
            # whose transaction check (Kafka's KIP-890 verification) meets that change is refused
            # with NOT_ENOUGH_REPLICAS, which aiokafka sends again only after its 100 ms back-off
            # (1 transaction in ~15: the p99 of the scaled-out roles, docs/logs.md "Kafka").
            sent = [await _enqueue(producer, tp, m) if m else None for tp, m in batches]
            results = await _all_settled(*(asyncio.gather(*s[0]) for s in sent if s is not None))
            offsets = {self._inputs_tp: OffsetAndMetadata(consumed, "")}
            await producer.send_offsets_to_transaction(offsets, group)
            await producer.commit_transaction()
        except (ProducerFenced, InvalidProducerEpoch):
            raise
        except BaseException:
            with contextlib.suppress(KafkaError):
                await producer.abort_transaction()
            raise
        done = iter(results)
        return [_span(next(done), s[1]) if s is not None else None for s in sent]

    async def _await_visible(
        self, log: KafkaLog, span: tuple[int, int] | None, group: str, consumed: int
    ) -> None:
        """Kafka writes commit markers after the commit returns: wait until readers and
        :meth:`committed_offset` see this transaction (both asked at once each round).  A
        group's offset only grows, so a larger one means a newer writer's commit came after."""

        async def seen() -> bool:
            end, committed = await asyncio.gather(log.stable_end(), self._committed_offset(group))
            return (span is None or end > span[1]) and committed is not None and committed >= consumed

        within_s = self.config.visibility_timeout_ms / 1000
        if not await poll(seen, bool, within_s=within_s, backoff=Backoff(0.001, max_s=0.01)):
            raise LogError(f"transaction to {log.tp.topic} committed but not visible in time")

    async def _group_offsets_retrying(self, admin: AIOKafkaAdminClient, group: str) -> dict[Any, Any]:
        """Retry while the group coordinator is moving or still loading (a fresh cluster creates
        its offsets topic on first use)."""

        def moving(exc: BaseException) -> bool:
            if not isinstance(exc, KafkaError):
                return False
            self._coordinators.pop(group, None)  # ask for the coordinator again
            return bool(getattr(exc, "retriable", False))

        return await retry(lambda: self._group_offsets(admin, group), moving,
                           within_s=self.config.request_timeout_ms / 1000, backoff=Backoff(0.1, factor=1))

    async def _group_offsets(self, admin: AIOKafkaAdminClient, group: str) -> dict[Any, Any]:
        """The group's committed offset of the inputs partition, asked of its coordinator.

        Not through ``admin.list_consumer_group_offsets``: it checks only the partitions' error
        codes, and a broker that is no longer the coordinator (its ``__consumer_offsets``
        partition moved: a broker died, or came back and took its preferred leadership again)
        answers with a response-level ``NOT_COORDINATOR`` and offset -1 — read as "nothing
        committed", every wait for a commit to become visible waited its whole timeout on
        the former coordinator (30 s, found on the three-node cluster: tests/faults)."""
        coordinator = self._coordinators.get(group)
        if coordinator is None:
            coordinator = int(await admin.find_coordinator(group))
            self._coordinators[group] = coordinator
        request = OffsetFetchRequest(group, [(self._inputs_tp.topic, [self._inputs_tp.partition])])
        response = await admin._send_request(request, coordinator)  # (aiokafka has no public form)
        code = int(getattr(response, "error_code", 0) or 0)
        if code:
            raise for_code(code)(f"offsets of group {group!r} asked of broker {coordinator}")
        offsets: dict[Any, Any] = {}
        for topic, partitions in response.topics:
            for partition, offset, metadata, error_code in partitions:
                if error_code:
                    raise for_code(error_code)(f"offset of group {group!r} for {topic}[{partition}]")
                offsets[TopicPartition(topic, partition)] = OffsetAndMetadata(offset, metadata)
        return offsets

    # -- topics ------------------------------------------------------------------------------

    def _new_topic(self, name: str) -> NewTopic:
        configs = {_TIMESTAMP_TYPE: _LOG_APPEND_TIME}
        # (the global partition's inputs hold the cell shards' summaries: up to about 1.5 MiB)
        if name == DECISIONS or (name == INPUTS and self.shard.kind == "global"):
            configs[_MAX_MESSAGE_BYTES] = str(self.config.max_decision_bytes)
        if name in (INPUTS, DECISIONS):
            for key, value in (("retention.ms", self.config.retention_ms),
                               ("retention.bytes", self.config.retention_bytes)):
                if value is not None:
                    configs[key] = str(value)
        return NewTopic(self.config.topic(name), self.config.shards, self.config.replication_factor,
                        topic_configs=configs)

    async def _ensure_topics(self, admin: AIOKafkaAdminClient) -> None:
        with _translated("create topics"):
            existing = set(await admin.list_topics())
            missing = [self._new_topic(n) for n in LOG_NAMES if self.config.topic(n) not in existing]
            if missing:
                response = await admin.create_topics(missing)
                for topic, code, message in response.topic_errors:
                    if code not in (0, _TOPIC_EXISTS):
                        raise LogError(f"cannot create topic {topic}: error {code} {message}")
            await self._check_topics(admin)

    async def _described_topics(self, admin: AIOKafkaAdminClient) -> list[dict[str, Any]]:
        """The topics' metadata once every partition has a leader (new topics need a moment)."""
        topics = [self.config.topic(n) for n in LOG_NAMES]

        async def describe() -> list[dict[str, Any]]:
            described: list[dict[str, Any]] = await admin.describe_topics(topics)
            return described

        def led(described: list[dict[str, Any]]) -> bool:
            return all(p["leader"] >= 0 for t in described for p in t["partitions"]) and not any(
                t["error_code"] for t in described)

        return await poll(describe, led, within_s=self.config.request_timeout_ms / 1000,
                          backoff=Backoff(0.05, factor=1))

    async def _check_topics(self, admin: AIOKafkaAdminClient) -> None:
        for described in await self._described_topics(admin):
            partitions = len(described["partitions"])
            if described["error_code"] or partitions <= self.config.shard:
                raise LogError(
                    f"topic {described['topic']} has {partitions} partitions "
                    f"(error {described['error_code']}); shard {self.config.shard} needs more"
                )
        # (a topic just made may not have reached the metadata of the broker that answers — one
        # resumed after a pause answered with no entry at all: ask again until one is there)
        topic = self.config.topic(INPUTS)
        stamp = await poll(lambda: self._topic_config(admin, topic, _TIMESTAMP_TYPE), _known,
                           within_s=self.config.request_timeout_ms / 1000, backoff=Backoff(0.05, max_s=1))
        if stamp != _LOG_APPEND_TIME:
            raise LogError(
                f"topic {self.config.topic(INPUTS)} has {_TIMESTAMP_TYPE}={stamp}; "
                f"the inputs log needs {_LOG_APPEND_TIME} (event time is the broker's append time)"
            )

    async def _check_decisions_limit(self) -> None:
        """Refuse to write decisions to a topic too small for them (one made by hand with the
        broker's 1 MiB default): the first large step would fail, and every retry with it."""
        admin, topic = self._admin, self.config.topic(DECISIONS)
        assert admin is not None
        with _translated(f"read the configuration of {topic}"):
            found = await self._topic_config(admin, topic, _MAX_MESSAGE_BYTES)
        if found is not None and int(found) < DECISION_TOPIC_BYTES:
            raise LogError(
                f"topic {topic} has {_MAX_MESSAGE_BYTES}={found}; decision records need "
                f"{DECISION_TOPIC_BYTES} (kafka-configs.sh --alter --entity-type topics --entity-name "
                f"{topic} --add-config {_MAX_MESSAGE_BYTES}={DECISION_TOPIC_BYTES})"
            )

    @staticmethod
    async def _topic_config(admin: AIOKafkaAdminClient, topic: str, key: str) -> str | None:
        resource = ConfigResource(ConfigResourceType.TOPIC, topic, configs={key: None})
        (response,) = await admin.describe_configs([resource])
        for resource_entry in response.to_object()["resources"]:
            for entry in resource_entry["config_entries"]:
                if entry["config_names"] == key:
                    return str(entry["config_value"])
        return None
