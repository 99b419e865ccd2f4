"""Kafka log throughput against a real broker, in events per second.

What it measures, median of ``REPEATS`` runs, each on fresh topics (deleted afterwards):

* ``kafka_produce_events_per_s``: :meth:`KafkaLog.append` of batches of ``BATCH_RECORDS``
  events through the idempotent producer (``acks=all``), awaited batch by batch;
* ``kafka_consume_events_per_s``: :meth:`KafkaLog.read` of every event from offset 0 with
  ``max_records=READ_MAX_RECORDS`` by a ``read_committed`` consumer (records converted to
  :class:`~fleetlog.log.base.Record`);
* ``aiokafka_getmany_events_per_s``: the same read with bare ``AIOKafkaConsumer.getmany`` and
  no conversion: the ceiling set by aiokafka itself;
* ``kafka_append_txn_events_per_s``: :meth:`KafkaLogStore.append_transactional` of
  ``BATCH_RECORDS`` events per transaction to the decisions log (commit and visibility wait
  included).

Values are JSON-like heartbeat payloads of 100-200 bytes, keyed by node.  The broker is the one
named by ``FLEETLOG_KAFKA`` or one started for the run (``tests/kafka_broker.py``); both the broker
and this process share the machine's cores.

Run: ``.venv/bin/python -m benchmarks.kafka_bench [--quick | --smoke]`` (prints JSON; ``--smoke``:
2,000 events, 3 transactions, one run — a test that it runs).
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import sys
import time
import uuid
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient

from fleetlog.log.base import DECISIONS, INPUTS, LOG_NAMES, Message
from fleetlog.log.kafka import KafkaConfig, KafkaLogStore
from tests.kafka_broker import KafkaBroker

BATCH_RECORDS = 10_000
READ_MAX_RECORDS = 50_000
TXN_BATCHES = 100
REPEATS = 3
CONSUME_TARGET = 150_000


def _values(n: int, seed: int = 11) -> list[Message]:
    """``n`` heartbeat-like events of 100-200 bytes; keys spread over 10,000 nodes."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        node = f"node-{rng.randrange(10_000):05d}"
        body = (
            f'{{"type":"node_heartbeat","cell":"cell-{i % 4}","node":"{node}",'
            f'"cpu_milli":{rng.randrange(96_000)},"mem_mib":{rng.randrange(786_432)},"gpus":8,"seq":{i}'
        )
        pad = max(0, rng.randrange(100, 201) - len(body) - 2)
        out.append(Message(value=(body + ',"p":"' + "x" * pad + '"}').encode(), key=node.encode()))
    return out


async def _produce(store: KafkaLogStore, messages: list[Message]) -> float:
    log = store.log(INPUTS)
    started = time.perf_counter()
    for i in range(0, len(messages), BATCH_RECORDS):
        await log.append(messages[i : i + BATCH_RECORDS])
    return time.perf_counter() - started


async def _consume(store: KafkaLogStore, events: int) -> float:
    log = store.log(INPUTS)
    started = time.perf_counter()
    offset = 0
    while offset < events:
        batch = await log.read(offset, max_records=READ_MAX_RECORDS, timeout_ms=5_000)
        if not batch:
            raise RuntimeError(f"read stalled at offset {offset} of {events}")
        offset = batch[-1].offset + 1
    return time.perf_counter() - started


async def _getmany(store: KafkaLogStore, events: int) -> float:
    tp = store.log(INPUTS).tp
    consumer = AIOKafkaConsumer(**store.consumer_options())
    await consumer.start()
    try:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        started = time.perf_counter()
        seen = 0
        while seen < events:
            got = await consumer.getmany(tp, timeout_ms=5_000, max_records=READ_MAX_RECORDS)
            if not got:
                raise RuntimeError(f"getmany stalled after {seen} of {events}")
            seen += len(got[tp])
        return time.perf_counter() - started
    finally:
        await consumer.stop()


async def _transactions(store: KafkaLogStore, messages: list[Message], batches: int) -> float:
    started = time.perf_counter()
    for i in range(batches):
        chunk = messages[i * BATCH_RECORDS % len(messages) :][:BATCH_RECORDS]
        await store.append_transactional(DECISIONS, chunk, group="bench", consumed=i)
    return time.perf_counter() - started


async def _drop_topics(config: KafkaConfig) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=config.bootstrap_servers)
    await admin.start()
    try:
        await admin.delete_topics([config.topic(n) for n in LOG_NAMES])
    finally:
        await admin.close()


async def _one_run(bootstrap: str, messages: list[Message], txn_batches: int) -> dict[str, float]:
    config = KafkaConfig(bootstrap_servers=bootstrap, topic_prefix=f"bench-{uuid.uuid4().hex[:8]}")
    events = len(messages)
    try:
        async with KafkaLogStore(config) as store:
            times = {"produce": await _produce(store, messages)}
            times["consume"] = await _consume(store, events)
            times["getmany"] = await _getmany(store, events)
            if txn_batches:
                times["txn"] = await _transactions(store, messages, txn_batches)
    finally:
        await _drop_topics(config)
    return times


def _rate(events: int, seconds: list[float]) -> float:
    return round(events / statistics.median(seconds))


async def _measure(bootstrap: str, events: int, repeats: int, txn_batches: int) -> dict[str, Any]:
    messages = _values(events)
    runs = [await _one_run(bootstrap, messages, txn_batches) for _ in range(repeats)]
    txn_events = txn_batches * min(BATCH_RECORDS, events)
    consume = _rate(events, [r["consume"] for r in runs])
    return {
        "kafka_produce_events_per_s": _rate(events, [r["produce"] for r in runs]),
        "kafka_consume_events_per_s": consume,
        "aiokafka_getmany_events_per_s": _rate(events, [r["getmany"] for r in runs]),
        "kafka_append_txn_events_per_s": _rate(txn_events, [r["txn"] for r in runs]),
        "consume_vs_target": round(consume / CONSUME_TARGET, 2),
        "runs_seconds": runs,
        "mean_value_bytes": round(sum(len(m.value) for m in messages) / events, 1),
    }


def run(quick: bool, smoke: bool = False) -> dict[str, Any]:
    """Start (or reuse ``FLEETLOG_KAFKA``) a broker, measure, stop it; the result as a dict."""
    events = 2_000 if smoke else 100_000 if quick else 1_000_000
    repeats, txn_batches = (1, 3) if smoke else (REPEATS, TXN_BATCHES)
    broker = KafkaBroker(ephemeral=True, heap="1g", jvm_opts="")
    bootstrap = broker.start()
    try:
        measured = asyncio.run(_measure(bootstrap, events, repeats, txn_batches))
    finally:
        broker.close()
    return {
        "benchmark": "kafka",
        "events": events,
        "batch_records": BATCH_RECORDS,
        "read_max_records": READ_MAX_RECORDS,
        "repeats": repeats,
        "external_broker": broker.external is not None,
        **measured,
    }


if __name__ == "__main__":
    print(json.dumps(run(quick="--quick" in sys.argv[1:], smoke="--smoke" in sys.argv[1:]), indent=2))
