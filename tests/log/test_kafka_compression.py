"""Compressed batches from a non-Python producer (Debian's ``kcat``, librdkafka) on the real broker.

Every codec Kafka defines (gzip, snappy, lz4, zstd) is read; a batch that still cannot be read
(here: read by a process without the codec libraries, as every install was before cramjam became
a dependency; or a record aiokafka cannot parse) is parked in the dead-letter log with its reason
and the offsets it covers, and the records after it are read — never an endless loop.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable

import pytest
from aiokafka import TopicPartition

from fleetlog.events import JobCancelled, encode, envelope
from fleetlog.log.base import DEAD_LETTERS, INPUTS, UNREADABLE_HEADER, LogStore, Message
from fleetlog.log.consumer import ERROR_HEADER, REASON_HEADER, SOURCE_HEADER, EventConsumer
from fleetlog.log.kafka import KafkaConfig, KafkaLogStore
from fleetlog.service.leader import LEADER_TOPIC, KafkaElection
from tests.service.process import REPO

pytestmark = pytest.mark.kafka

KAFKA_CODECS = ["gzip", "snappy", "lz4", "zstd"]
CODEC_IDS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def kcat() -> str:
    found = shutil.which("kcat") or shutil.which("kafkacat")
    assert found, "kcat is missing: scripts/test installs it (apt_install kcat)"
    return found


def cancel_lines(prefix: str, n: int) -> bytes:
    """``n`` JSON envelopes, one per line, alike enough to compress well."""
    return b"".join(
        encode(envelope(JobCancelled(job_id=f"{prefix}-{i}", reason="x" * 200), "kcat"), "json") + b"\n"
        for i in range(n)
    )


def produce(bootstrap: str, topic: str, lines: bytes, codec: str | None, *options: str) -> None:
    """One kcat run: the lines as records of one partition, batched (linger) and compressed;
    ``options`` are headers (``k=v``) or kcat flags (``-X``, ``batch.size=...``)."""
    argv = [kcat(), "-P", "-b", bootstrap, "-t", topic, "-p", "0", "-X", "linger.ms=200"]
    argv += ["-z", codec] if codec else []
    flag = False
    for option in options:
        argv += [option] if option.startswith("-") or flag else ["-H", option]
        flag = option.startswith("-")
    subprocess.run(argv, input=lines, check=True, timeout=60, capture_output=True)


@pytest.fixture
def make_store(kafka_bootstrap: str) -> Callable[[], KafkaLogStore]:
    prefix = f"kz-{uuid.uuid4().hex[:10]}"
    return lambda: KafkaLogStore(KafkaConfig(bootstrap_servers=kafka_bootstrap, topic_prefix=prefix))


async def read_all(store: LogStore, name: str, want: int) -> list[object]:
    """Poll through the consumer until ``want`` records (good or parked) are behind us."""
    consumer, offset, events, parked = EventConsumer(store), 0, [], 0
    for _ in range(100):
        polled = await consumer.poll(offset, timeout_ms=2000)
        events += [d.envelope.event for d in polled.events]
        parked += polled.dead_lettered
        offset = polled.next_offset
        if len(events) + parked >= want:
            break
    return events


@pytest.mark.parametrize("codec", KAFKA_CODECS)
async def test_every_kafka_codec_from_kcat_is_read(
    codec: str, make_store: Callable[[], KafkaLogStore]
) -> None:
    async with make_store() as store:
        topic = store.config.topic(INPUTS)
        produce(store.config.bootstrap_servers, topic, cancel_lines(codec, 50), codec,
                "content-type=application/json")
        produce(store.config.bootstrap_servers, topic, cancel_lines(f"{codec}-plain", 3), None)
        batches = await store.log(INPUTS)._raw_batches(0)
        assert {b.compression_type for b, _ in batches} >= {CODEC_IDS[codec]}  # kcat did compress
        events = await read_all(store, INPUTS, 53)
        assert events == [JobCancelled(job_id=f"{codec}-{i}", reason="x" * 200) for i in range(50)] + [
            JobCancelled(job_id=f"{codec}-plain-{i}", reason="x" * 200) for i in range(3)
        ]
        assert await store.log(DEAD_LETTERS).read(0, timeout_ms=200) == []


_WITHOUT_CODECS = """
import asyncio, json, sys
sys.modules["cramjam"] = None  # an install without the codec libraries (main before this fix)
from fleetlog.log.base import DEAD_LETTERS, INPUTS
from fleetlog.log.consumer import EventConsumer
from fleetlog.log.kafka import KafkaConfig, KafkaLogStore

async def main():
    config = KafkaConfig(bootstrap_servers=sys.argv[1], topic_prefix=sys.argv[2])
    async with KafkaLogStore(config) as store:
        consumer, offset, events, parked = EventConsumer(store), 0, [], 0
        for _ in range(50):
            polled = await consumer.poll(offset, timeout_ms=2000)
            events += [d.envelope.event.job_id for d in polled.events]
            parked += polled.dead_lettered
            offset = polled.next_offset
            if len(events) + parked >= int(sys.argv[3]):
                break
        print(json.dumps({"events": events, "parked": parked, "next": offset}))

asyncio.run(main())
"""


async def test_a_batch_this_install_cannot_decompress_is_parked_and_reading_goes_on(
    make_store: Callable[[], KafkaLogStore],
) -> None:
    """A reader without the lz4 library (aiokafka raised UnsupportedCodecError on every poll,
    forever): the batch is parked whole, with the offsets it covers, and the records after it
    are read."""
    async with make_store() as store:
        topic, bootstrap = store.config.topic(INPUTS), store.config.bootstrap_servers
        produce(bootstrap, topic, cancel_lines("before", 2), None)
        produce(bootstrap, topic, cancel_lines("lz4", 20), "lz4")
        produce(bootstrap, topic, cancel_lines("after", 2), None)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _WITHOUT_CODECS, bootstrap, store.config.topic_prefix, "5",
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 120)
        assert proc.returncode == 0, err.decode()
        result = json.loads(out)
        assert result["events"] == ["before-0", "before-1", "after-0", "after-1"]
        assert (result["parked"], result["next"]) == (1, 24)
        (parked,) = await store.log(DEAD_LETTERS).read(0, timeout_ms=2000)
        assert parked.header(REASON_HEADER) == b"unreadable"
        assert parked.header(SOURCE_HEADER) == b"inputs@21"
        note = (parked.header(ERROR_HEADER) or b"").decode()
        assert "offsets 2..21 of" in note
        assert "compression codec 3" in note
        assert "UnsupportedCodecError" in note
        assert parked.header(UNREADABLE_HEADER) is not None
        # the parked value is the compressed batch as the broker holds it: nothing is lost
        (batch, raw), *_ = await store.log(INPUTS)._raw_batches(2)
        assert parked.value == raw
        assert [r.offset for r in batch] == list(range(2, 22))


async def test_a_record_aiokafka_cannot_parse_is_parked(make_store: Callable[[], KafkaLogStore]) -> None:
    """A header key that is not UTF-8 (kcat sends bytes as given; aiokafka decodes header keys
    strictly): parked, and the good records on both sides are read."""
    async with make_store() as store:
        topic, bootstrap = store.config.topic(INPUTS), store.config.bootstrap_servers
        await store.log(INPUTS).append([Message(encode(envelope(JobCancelled(job_id="a"), "p")))])
        produce(bootstrap, topic, cancel_lines("bad-header", 1), "zstd", "\udcff=x")
        await store.log(INPUTS).append([Message(encode(envelope(JobCancelled(job_id="b"), "p")))])
        events = await read_all(store, INPUTS, 3)
        assert events == [JobCancelled(job_id="a"), JobCancelled(job_id="b")]
        (parked,) = await store.log(DEAD_LETTERS).read(0, timeout_ms=2000)
        assert parked.header(REASON_HEADER) == b"unreadable"
        assert b"offsets 1..1" in (parked.header(ERROR_HEADER) or b"")


async def test_an_unreadable_record_on_the_leader_topic_does_not_end_the_election(
    make_store: Callable[[], KafkaLogStore],
) -> None:
    """The election polls its topic only to stay a member; a record there that aiokafka cannot
    parse ended the polling task (and with it the membership) for good."""
    async with make_store() as store:
        election = KafkaElection(store.config, "member-1", session_timeout_ms=6000)
        await election.start()
        try:
            await asyncio.wait_for(election.leader.wait(), 60)
            topic = store.config.topic(LEADER_TOPIC)
            assert election._consumer is not None  # its position is settled before the records come
            await election._consumer.position(TopicPartition(topic, 0))
            produce(store.config.bootstrap_servers, topic, b"x\n", "zstd", "\udcff=x")
            produce(store.config.bootstrap_servers, topic, b"y\n", None, "\udcfe=y")
            await asyncio.sleep(3)  # several polls
            assert election._task is not None
            assert not election._task.done(), election._task
            assert election.leader.is_set()
        finally:
            await election.stop()


async def test_an_unreadable_batch_too_large_to_keep_is_named_by_its_offsets(
    make_store: Callable[[], KafkaLogStore],
) -> None:
    """Over 256 KiB compressed (incompressible values): the dead letter names the offsets; the
    bytes stay in the topic."""
    async with make_store() as store:
        topic, bootstrap = store.config.topic(INPUTS), store.config.bootstrap_servers
        noise = b"".join(base64.b64encode(os.urandom(900)) + b"\n" for _ in range(400))
        produce(bootstrap, topic, noise, "zstd", "-X", "batch.size=2000000")  # lz4 would send it plain
        produce(bootstrap, topic, cancel_lines("after", 1), None)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _WITHOUT_CODECS, bootstrap, store.config.topic_prefix, "2",
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 120)
        assert proc.returncode == 0, err.decode()
        result = json.loads(out)
        assert result["events"] == ["after-0"]
        parked = await store.log(DEAD_LETTERS).read(0, timeout_ms=2000)
        assert [p.value for p in parked] == [b""] * len(parked)
        notes = [(p.header(ERROR_HEADER) or b"").decode() for p in parked]
        assert all("too large to keep here: still in the topic" in n for n in notes)
        assert notes[0].startswith("offsets 0..")
        assert sum(int(n.split("..")[1].split(" ")[0]) - int(n[8:].split("..")[0]) + 1 for n in notes) == 400
