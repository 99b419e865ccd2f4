"""What only the Kafka log store promises: transactions, fencing, broker time, topic settings."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.structs import OffsetAndMetadata

from fleetlog.log.base import DECISIONS, INPUTS, LOG_NAMES, LogError, Message, OffsetOutOfRangeError
from fleetlog.log.kafka import FencedError, KafkaConfig, KafkaLogStore
from tests.kafka_broker import running_broker

pytestmark = pytest.mark.kafka

ConfigFactory = Callable[..., KafkaConfig]


def values(n: int, prefix: bytes = b"m") -> list[Message]:
    return [Message(value=prefix + b"%d" % i) for i in range(n)]


@pytest.fixture
def make_config(kafka_bootstrap: str) -> ConfigFactory:
    """Configs with a topic prefix of their own, so tests never share topics."""
    prefix = f"kt-{uuid.uuid4().hex[:10]}"

    def make(**overrides: object) -> KafkaConfig:
        options: dict[str, object] = {"bootstrap_servers": kafka_bootstrap, "topic_prefix": prefix}
        options.update(overrides)
        return KafkaConfig(**options)  # type: ignore[arg-type]

    return make


@pytest.fixture
async def admin(kafka_bootstrap: str) -> AsyncIterator[AIOKafkaAdminClient]:
    client = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await client.start()
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def store(make_config: ConfigFactory) -> AsyncIterator[KafkaLogStore]:
    async with KafkaLogStore(make_config()) as s:
        yield s


async def topic_config(admin: AIOKafkaAdminClient, topic: str) -> dict[str, str]:
    (response,) = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    (resource,) = response.to_object()["resources"]
    return {e["config_names"]: e["config_value"] for e in resource["config_entries"]}


# -- (a) aborted and crashed transactions stay invisible ----------------------------------------


async def test_aborted_transaction_is_invisible_to_readers(store: KafkaLogStore) -> None:
    await store.log(INPUTS).append(values(5))
    await store.append_transactional(DECISIONS, values(1, b"ok"), group="g", consumed=2)
    decisions = store.log(DECISIONS).tp
    producer = AIOKafkaProducer(
        bootstrap_servers=store.config.bootstrap_servers, transactional_id=f"{decisions.topic}-rogue"
    )
    await producer.start()
    try:
        await producer.begin_transaction()
        for i in range(3):
            await producer.send_and_wait(decisions.topic, b"aborted%d" % i, partition=decisions.partition)
        offsets = {TopicPartition(store.config.topic(INPUTS), 0): OffsetAndMetadata(5, "")}
        await producer.send_offsets_to_transaction(offsets, "g")
        await producer.abort_transaction()
    finally:
        await producer.stop()
    records = await store.log(DECISIONS).read(0, timeout_ms=1000)
    assert [r.value for r in records] == [b"ok0"]
    assert await store.log(DECISIONS).read(records[-1].offset + 1, timeout_ms=300) == []
    assert await store.committed_offset("g") == 2
    # Markers and aborted records take offsets: the next commit lands past them.
    after = await store.append_transactional(DECISIONS, values(1, b"next"), group="g", consumed=5)
    assert after > records[-1].offset + 4
    got = await store.log(DECISIONS).read(records[-1].offset + 1, timeout_ms=2000)
    assert [(r.offset, r.value) for r in got] == [(after, b"next0")]


_CRASHING_WRITER = """
import asyncio, os, sys
from aiokafka import AIOKafkaProducer
async def main():
    bootstrap, topic, txn_id = sys.argv[1:4]
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=txn_id)
    await p.start()
    await p.begin_transaction()
    for i in range(3):
        await p.send_and_wait(topic, b"half%d" % i, partition=0)
    print("sent", flush=True)
    os._exit(17)  # crash in the middle of the transaction
asyncio.run(main())
"""


async def test_crash_mid_transaction_leaves_nothing_and_successor_recovers(
    make_config: ConfigFactory,
) -> None:
    config = make_config()
    async with KafkaLogStore(config) as store:
        await store.log(INPUTS).append(values(3))
        await store.append_transactional(DECISIONS, values(1, b"before"), group="g", consumed=1)
    topic = config.topic(DECISIONS)
    args = [sys.executable, "-c", _CRASHING_WRITER, config.bootstrap_servers, topic]
    crashed = await asyncio.to_thread(
        subprocess.run, [*args, config.effective_transactional_id], capture_output=True, timeout=120
    )
    assert crashed.returncode == 17, crashed.stderr
    async with KafkaLogStore(config) as successor:
        decisions = successor.log(DECISIONS)
        # The open transaction holds the stable end back: nothing of it is readable.
        assert [r.value for r in await decisions.read(0, timeout_ms=500)] == [b"before0"]
        assert await successor.committed_offset("g") == 1
        # The successor's transactional producer fences the crashed one and aborts its transaction.
        first = await successor.append_transactional(DECISIONS, values(1, b"after"), group="g", consumed=3)
        got = await decisions.read(0, timeout_ms=2000)
        assert [r.value for r in got] == [b"before0", b"after0"]
        assert got[-1].offset == first
        assert await successor.committed_offset("g") == 3


# -- (b) event time is the broker's append time ---------------------------------------------------


async def test_inputs_use_log_append_time(store: KafkaLogStore, admin: AIOKafkaAdminClient) -> None:
    settings = await topic_config(admin, store.config.topic(INPUTS))
    assert settings["message.timestamp.type"] == "LogAppendTime"
    producer = AIOKafkaProducer(bootstrap_servers=store.config.bootstrap_servers)
    await producer.start()
    try:  # a client that claims the year 1970 does not decide the event time
        await producer.send_and_wait(store.config.topic(INPUTS), b"old", partition=0, timestamp_ms=1000)
    finally:
        await producer.stop()
    before = time.time_ns() // 1_000_000
    await store.log(INPUTS).append(values(1))
    after = time.time_ns() // 1_000_000
    old, mine = await store.log(INPUTS).read(0, timeout_ms=2000)
    assert old.value == b"old"
    assert old.timestamp_ms > 1_600_000_000_000
    assert before - 5_000 <= mine.timestamp_ms <= after + 5_000
    assert mine.timestamp_ms >= old.timestamp_ms


# -- (c) topics ---------------------------------------------------------------------------------


async def test_topics_are_created_with_the_right_settings(
    make_config: ConfigFactory, admin: AIOKafkaAdminClient
) -> None:
    config = make_config(shards=3, shard=2)
    async with KafkaLogStore(config) as store:
        await store.log(INPUTS).append(values(2))
        assert (await store.log(INPUTS).read(0, timeout_ms=2000))[-1].offset == 1
        assert store.log(INPUTS).tp == TopicPartition(f"{config.topic_prefix}.inputs", 2)
    described = {t["topic"]: t for t in await admin.describe_topics([config.topic(n) for n in LOG_NAMES])}
    assert sorted(described) == sorted(f"{config.topic_prefix}.{n}" for n in LOG_NAMES)
    for name, topic in described.items():
        assert topic["error_code"] == 0
        assert len(topic["partitions"]) == 3
        assert all(len(p["replicas"]) == 1 for p in topic["partitions"])
        assert (await topic_config(admin, name))["message.timestamp.type"] == "LogAppendTime"
    async with KafkaLogStore(config):  # reopening finds the topics as they are
        pass


async def test_retention_settings_reach_the_inputs_and_decisions_topics_and_deleted_records_move_the_start(
    make_config: ConfigFactory, admin: AIOKafkaAdminClient
) -> None:
    """``kafka.retention_ms``/``retention_bytes`` become the two logs' topic settings; once the
    brokers delete the oldest records, ``start_offset`` says where the log begins and a read
    before it is refused (what replay starts from: docs/retention.md)."""
    from aiokafka.admin.records_to_delete import RecordsToDelete

    config = make_config(retention_ms=3_600_000, retention_bytes=1 << 30)
    async with KafkaLogStore(config) as store:
        for name in (INPUTS, DECISIONS):
            found = await topic_config(admin, config.topic(name))
            assert (found["retention.ms"], found["retention.bytes"]) == ("3600000", str(1 << 30))
        assert (await topic_config(admin, config.topic("dead-letters")))["retention.ms"] != "3600000"
        await store.log(INPUTS).append(values(10))
        assert await store.log(INPUTS).start_offset() == 0
        tp = TopicPartition(config.topic(INPUTS), 0)
        await admin.delete_records({tp: RecordsToDelete(before_offset=6)})
        assert await store.log(INPUTS).start_offset() == 6
        assert [r.offset for r in await store.log(INPUTS).read(6, timeout_ms=2000)] == [6, 7, 8, 9]
        with pytest.raises(OffsetOutOfRangeError, match="before the start of the log"):
            await store.log(INPUTS).read(2, timeout_ms=2000)


async def test_a_shard_past_the_partitions_is_refused(make_config: ConfigFactory) -> None:
    async with KafkaLogStore(make_config(shards=1)):
        pass
    with pytest.raises(LogError, match="partitions"):
        await KafkaLogStore(make_config(shard=1)).open()


async def test_inputs_topic_without_log_append_time_is_refused(
    make_config: ConfigFactory, admin: AIOKafkaAdminClient
) -> None:
    config = make_config()
    await admin.create_topics([NewTopic(config.topic(INPUTS), 1, 1)])
    store = KafkaLogStore(config)
    with pytest.raises(LogError, match="LogAppendTime"):
        await store.open()
    with pytest.raises(LogError):
        store.log(INPUTS)


# -- (d) fencing ----------------------------------------------------------------------------------


async def test_second_transactional_writer_fences_the_first(make_config: ConfigFactory) -> None:
    config = make_config()
    async with KafkaLogStore(config) as first, KafkaLogStore(config) as second:
        await first.log(INPUTS).append(values(4))
        await first.append_transactional(DECISIONS, values(1, b"a"), group="g", consumed=1)
        await second.append_transactional(DECISIONS, values(1, b"b"), group="g", consumed=2)
        with pytest.raises(FencedError):
            await first.append_transactional(DECISIONS, values(1, b"zombie"), group="g", consumed=4)
        assert await second.committed_offset("g") == 2
        got = await second.log(DECISIONS).read(0, timeout_ms=2000)
        assert [r.value for r in got] == [b"a0", b"b0"]


async def test_readers_never_fence_the_writer(make_config: ConfigFactory) -> None:
    config = make_config()
    async with KafkaLogStore(config) as writer:
        await writer.append_transactional(DECISIONS, values(1), group="g", consumed=0)
        async with KafkaLogStore(config) as reader:
            assert [r.value for r in await reader.log(DECISIONS).read(0, timeout_ms=2000)] == [b"m0"]
            assert await reader.committed_offset("g") == 0
        await writer.append_transactional(DECISIONS, values(1), group="g", consumed=0)


# -- reading ----------------------------------------------------------------------------------------


async def test_transactional_offsets_increase_and_readers_continue_past_markers(
    store: KafkaLogStore,
) -> None:
    firsts = [
        await store.append_transactional(DECISIONS, values(2, b"%d-" % i), group="g", consumed=0)
        for i in range(3)
    ]
    assert firsts == sorted(set(firsts))
    assert firsts[1] - firsts[0] == 3  # two records and a commit marker
    end = await store.log(DECISIONS).end_offset()
    assert end == firsts[-1] + 3
    seen, offset = [], 0
    while batch := await store.log(DECISIONS).read(offset, max_records=1, timeout_ms=0):
        seen.append(batch[0].value)
        offset = batch[-1].offset + 1
    assert seen == [b"0-0", b"0-1", b"1-0", b"1-1", b"2-0", b"2-1"]


async def test_read_with_zero_timeout_returns_committed_records(store: KafkaLogStore) -> None:
    await store.log(INPUTS).append(values(3))
    assert [r.offset for r in await store.log(INPUTS).read(1)] == [1, 2]
    assert await store.log(INPUTS).read(3) == []


async def test_read_past_the_end_waits_and_returns_nothing(store: KafkaLogStore) -> None:
    await store.log(INPUTS).append(values(2))
    started = time.monotonic()
    assert await store.log(INPUTS).read(50, timeout_ms=200) == []
    assert time.monotonic() - started >= 0.15
    assert [r.value for r in await store.log(INPUTS).read(0, timeout_ms=2000)] == [b"m0", b"m1"]


async def test_offset_queries_never_wait_behind_a_fetch_parked_at_the_end(
    make_config: ConfigFactory,
) -> None:
    """A reader at the end of its partition has a fetch parked at the broker for
    ``fetch_max_wait_ms``, and a broker answers one request of a connection at a time: an offset
    query sent on the reader's connection waited that long (every idle read, every step's
    ``end_offset`` — the scaled-out roles' latency had a p99 near aiokafka's 500 ms).  With the
    wait at 20 s, each query here would take seconds; they take far less."""
    async with KafkaLogStore(make_config(fetch_max_wait_ms=20_000)) as store:
        log = store.log(INPUTS)
        await log.append(values(2))
        assert len(await log.read(0, timeout_ms=5000)) == 2
        await asyncio.sleep(0.3)  # the reader's next fetch is parked at offset 2 now
        offsets = await store.offsets_client()
        assert offsets is not log._consumer
        assert not offsets.assignment()  # it never fetches
        started = time.monotonic()
        assert await log.end_offset() == 2
        assert await log.read(2, timeout_ms=0) == []  # (asks the stable end)
        assert time.monotonic() - started < 5


async def test_a_waiting_reader_wakes_at_a_commit_not_at_its_fetch_wait(make_config: ConfigFactory) -> None:
    """``read_committed``: the broker answers the parked fetch when a commit's markers make the
    records readable (it does not hold it for the rest of ``fetch_max_wait_ms``, 20 s here),
    and the waiting read returns them then, not at its own timeout."""
    config = make_config(fetch_max_wait_ms=20_000)
    async with KafkaLogStore(config) as reader, KafkaLogStore(config) as writer:
        await writer.log(INPUTS).append(values(1))
        log = reader.log(DECISIONS)
        assert await log.read(0, timeout_ms=0) == []
        waiting = asyncio.create_task(log.read(0, timeout_ms=25_000))
        await asyncio.sleep(0.3)  # parked
        started = time.monotonic()
        await writer.append_transactional(DECISIONS, values(2, b"d"), group="g", consumed=1)
        assert [r.value for r in await asyncio.wait_for(waiting, 30)] == [b"d0", b"d1"]
        assert time.monotonic() - started < 5


def test_a_fetch_wait_outside_its_bounds_is_refused() -> None:
    for wait in (0, 30_000, 40_000):
        with pytest.raises(ValueError, match="fetch_max_wait_ms"):
            KafkaConfig(bootstrap_servers="b:9092", fetch_max_wait_ms=wait)
    assert KafkaConfig(bootstrap_servers="b:9092").fetch_max_wait_ms == 500


async def test_read_before_the_log_start_is_an_error(
    store: KafkaLogStore, admin: AIOKafkaAdminClient
) -> None:
    from aiokafka.admin import RecordsToDelete

    await store.log(INPUTS).append(values(5))
    await admin.delete_records({store.log(INPUTS).tp: RecordsToDelete(3)})
    with pytest.raises(OffsetOutOfRangeError):
        await store.log(INPUTS).read(1, timeout_ms=1000)
    assert [r.offset for r in await store.log(INPUTS).read(3, timeout_ms=2000)] == [3, 4]


# -- configuration and restarts -----------------------------------------------------------------------


def test_config_never_shows_the_password() -> None:
    config = KafkaConfig(
        bootstrap_servers="b:9092",
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_plain_username="svc",
        sasl_plain_password="hunter2",
    )
    for text in (repr(config), str(config), repr(KafkaLogStore(config)), f"{config}"):
        assert "hunter2" not in text
        assert "svc" in text
    assert config.client_options()["sasl_plain_password"] == "hunter2"
    assert config.effective_transactional_id == "fleetlog.shard0"
    assert config.topic(DECISIONS) == "fleetlog.decisions"


async def test_records_and_commits_survive_a_broker_restart() -> None:
    with running_broker(use_env=False) as broker:
        config = KafkaConfig(bootstrap_servers=broker.bootstrap, topic_prefix="restart")
        async with KafkaLogStore(config) as store:
            await store.log(INPUTS).append(values(3))
            await store.append_transactional(DECISIONS, values(1), group="g", consumed=3)
        await asyncio.to_thread(broker.restart)
        async with KafkaLogStore(config) as store:
            got = await store.log(INPUTS).read(0, timeout_ms=5000)
            assert [r.value for r in got] == [b"m0", b"m1", b"m2"]
            assert await store.committed_offset("g") == 3
            assert await store.log(INPUTS).append(values(1)) == 3
