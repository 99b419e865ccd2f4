"""Reason codes that name what is wrong: bytes that are not one envelope (plain text, a JSON
array, a BOM) are ``undecodable``, not an ``invalid_event`` about the integer their first byte
would be; ``content-type`` is read case-insensitively with parameters; a Kafka null value is
parked as a tombstone, not as "0 bytes"."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from fleetlog.events import encode, envelope
from fleetlog.events.codec import JSON
from fleetlog.log.base import DEAD_LETTERS, INPUTS, NULL_VALUE_HEADER, Message
from fleetlog.log.consumer import (
    ERROR_HEADER,
    REASON_HEADER,
    CorruptDecisionsError,
    EventConsumer,
    decision_batches,
)
from fleetlog.log.file import FileLogStore
from fleetlog.log.kafka import KafkaConfig, KafkaLogStore
from tests.core.builders import job, node
from tests.service.test_service import Running, serving

BOM = b"\xef\xbb\xbf"
JOB_JSON = encode(envelope(job("j1", gpus=1), "t"), "json")


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[Running]:
    async with serving(tmp_path / "log") as running:
        yield running


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"hello, scheduler", "event 0: not a JSON object ('hello, scheduler'"),
        (b"42", "event 0: not a JSON object ('42'"),
        (b"[1, 2]", "event 0: not a JSON object ('1'"),
        (b'[[{"schema_version": 1}]]', "event 0: a JSON array"),
        (b'["j1"]', "event 0: not a JSON object"),
        (BOM + JOB_JSON, "event 0: starts with a UTF-8 byte-order mark"),
        (BOM + b"[" + JOB_JSON + b"]", "event 0: starts with a UTF-8 byte-order mark"),
        (b"[" + JOB_JSON + b", 7]", "event 1: not a JSON object ('7'"),
    ],
)
async def test_ingest_calls_what_is_not_an_envelope_undecodable(
    service: Running, body: bytes, says: str
) -> None:
    status, answer = await service.request("/v1/events", body)
    assert (status, answer["reason"]) == (400, "undecodable"), answer
    assert answer["error"].startswith(says), answer
    assert "Expected" not in answer["error"]
    assert await service.inputs_end() == 0


@pytest.mark.parametrize(
    "content_type",
    ["Application/JSON", "APPLICATION/JSON", "application/json; charset=UTF-8",
     'Application/Json;Charset="utf-8"', "application/json ; charset=us-ascii"],
)
async def test_ingest_reads_content_type_case_insensitively_with_parameters(
    service: Running, content_type: str
) -> None:
    status, answer = await service.request("/v1/events", JOB_JSON, content_type)
    assert (status, answer) == (200, {"appended": 1, "first_offset": 0})
    msgpack = encode(envelope(node("n1"), "t"))
    as_msgpack = content_type.split(";", maxsplit=1)[0].replace("json", "msgpack").replace("JSON", "MSGPACK")
    status, answer = await service.request("/v1/events", msgpack, as_msgpack.replace("Json", "MsgPack"))
    assert (status, answer["appended"]) == (200, 1)


@pytest.mark.parametrize("content_type",
                         ["application/json; charset=latin-1", "text/plain", "application/jsonl"])
async def test_ingest_refuses_other_content_types_by_name(service: Running, content_type: str) -> None:
    status, answer = await service.request("/v1/events", JOB_JSON, content_type)
    assert (status, answer["reason"]) == (400, "unknown_content_type")
    assert repr(content_type) in answer["error"]
    assert await service.inputs_end() == 0


async def test_records_that_are_not_envelopes_are_parked_undecodable(tmp_path: Path) -> None:
    """Producers that write the log directly, without a content-type header."""
    bad = [b"hello, scheduler\n", b"[" + JOB_JSON + b"]", BOM + JOB_JSON, b"\x93\x01\x02\x03"]
    async with FileLogStore(tmp_path / "log", fsync="never") as store:
        await store.log(INPUTS).append([Message(value) for value in bad])
        await store.log(INPUTS).append([Message(JOB_JSON, headers=(("content-type", b"Application/JSON"),))])
        polled = await EventConsumer(store).poll(0, timeout_ms=100)
        parked = await store.log(DEAD_LETTERS).read(0, timeout_ms=100)
    assert [d.offset for d in polled.events] == [4]
    assert [r.header(REASON_HEADER) for r in parked] == [b"undecodable"] * 4
    errors = [(r.header(ERROR_HEADER) or b"").decode() for r in parked]
    assert errors[0].startswith("text 'hello, scheduler"), errors
    assert errors[1].startswith("a JSON array"), errors
    assert errors[2].startswith("starts with a UTF-8 byte-order mark"), errors
    assert "0x93 does not start a map" in errors[3], errors
    assert [r.value for r in parked] == bad  # bytes untouched


@pytest.mark.kafka
async def test_a_kafka_null_value_is_parked_as_a_tombstone(kafka_bootstrap: str) -> None:
    config = KafkaConfig(bootstrap_servers=kafka_bootstrap, topic_prefix=f"tomb-{uuid.uuid4().hex[:10]}")
    async with KafkaLogStore(config) as store:
        await store.log(INPUTS).append([Message(JOB_JSON, headers=(("content-type", JSON),))])
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        await producer.start()
        try:  # a tombstone and an empty value: not the same thing, and said differently
            await producer.send_and_wait(config.topic(INPUTS), None, key=b"submit/j1", partition=config.shard)
            await producer.send_and_wait(config.topic(INPUTS), b"", key=b"empty", partition=config.shard)
            await producer.send_and_wait(config.topic("decisions"), None, key=b"x", partition=config.shard)
        finally:
            await producer.stop()
        polled = await EventConsumer(store).poll(0, timeout_ms=5000)
        for _ in range(50):
            parked = await store.log(DEAD_LETTERS).read(0, timeout_ms=200)
            if len(parked) == 2:
                break
        decisions = await store.log("decisions").read(0, timeout_ms=5000)
    assert [d.offset for d in polled.events] == [0]
    tombstone, empty = parked
    assert tombstone.header(REASON_HEADER) == b"undecodable"
    said = (tombstone.header(ERROR_HEADER) or b"").decode()
    assert said.startswith("a null value (a Kafka tombstone"), said
    assert "0 bytes" not in said
    assert (tombstone.key, tombstone.header(NULL_VALUE_HEADER)) == (b"submit/j1", b"")
    assert empty.header(NULL_VALUE_HEADER) is None
    assert "null" not in (empty.header(ERROR_HEADER) or b"").decode()
    with pytest.raises(CorruptDecisionsError, match=r"a null value \(a Kafka tombstone"):
        list(decision_batches(decisions))
