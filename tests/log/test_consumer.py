"""The consumer parks every bad record in the dead-letter log, with its reason, and goes on."""

from __future__ import annotations

import json

from fleetlog.events import DecisionBatch, NodeHeartbeat, encode, envelope
from fleetlog.events.codec import JSON
from fleetlog.log.base import DEAD_LETTERS, INPUTS, LogStore, Message
from fleetlog.log.consumer import ERROR_HEADER, REASON_HEADER, SOURCE_HEADER, EventConsumer
from tests.events.samples import job


def hb(i: int) -> NodeHeartbeat:
    return NodeHeartbeat(cell="c", node=f"n{i}", cpu_milli=1000, mem_mib=1000)


async def test_bad_records_are_parked_with_reason_and_original_bytes(store: LogStore) -> None:
    bad_json = json.dumps({"schema_version": 1, "producer_id": "p", "event": {"type": "Nope"}}).encode()
    decision = encode(envelope(DecisionBatch(as_of=0, digest="x"), "p"))
    batch = [
        Message(encode(envelope(hb(0), "p"))),
        Message(b"\xc1garbage", key=b"k1", headers=(("trace", b"t1"),)),
        Message(encode(envelope(job(), "p"), "json"), headers=(("content-type", JSON),)),
        Message(bad_json, headers=(("content-type", JSON),)),
        Message(decision),
        Message(encode(envelope(hb(1), "p"))),
    ]
    await store.log(INPUTS).append(batch)
    polled = await EventConsumer(store).poll(0, timeout_ms=2000)
    assert [d.offset for d in polled.events] == [0, 2, 5]
    assert polled.dead_lettered == 3
    assert polled.next_offset == 6
    parked = await store.log(DEAD_LETTERS).read(0, timeout_ms=2000)
    assert [r.header(REASON_HEADER) for r in parked] == [
        b"undecodable",
        b"unknown_event_type",
        b"invalid_event",
    ]
    assert [r.header(SOURCE_HEADER) for r in parked] == [b"inputs@1", b"inputs@3", b"inputs@4"]
    assert parked[0].value == b"\xc1garbage"
    assert parked[0].key == b"k1"
    assert parked[0].header("trace") == b"t1"
    assert b"is a decision, not an input" in (parked[2].header(ERROR_HEADER) or b"")


async def test_timestamps_are_the_logs_append_times(store: LogStore) -> None:
    await store.log(INPUTS).append([Message(encode(envelope(hb(0), "p")))])
    polled = await EventConsumer(store).poll(0, timeout_ms=2000)
    (record,) = await store.log(INPUTS).read(0, timeout_ms=2000)
    assert polled.events[0].timestamp_ms == record.timestamp_ms


async def test_poll_at_end_returns_nothing_and_keeps_offset(store: LogStore) -> None:
    polled = await EventConsumer(store).poll(0, timeout_ms=50)
    assert polled.events == []
    assert polled.next_offset == 0


async def test_poll_inputs_gives_the_events_of_poll_and_parks_the_same(store: LogStore) -> None:
    batch = [
        Message(encode(envelope(hb(0), "p"))),
        Message(b"\xc1garbage"),
        Message(encode(envelope(job(), "p"))),
        Message(encode(envelope(DecisionBatch(as_of=0, digest="x"), "p"))),
        Message(encode(envelope(hb(0), "p"))),
        Message(encode(envelope(job(), "p"), "json"), headers=(("content-type", JSON),)),
    ]
    await store.log(INPUTS).append(batch)
    polled = await EventConsumer(store).poll(0, timeout_ms=2000, park=False)
    inputs = await EventConsumer(store).poll_inputs(0, timeout_ms=2000)
    assert inputs.events == [d.envelope.event for d in polled.events]
    assert inputs.times == [d.timestamp_ms for d in polled.events]
    assert (inputs.dead_lettered, inputs.next_offset) == (2, 6)
    parked = await store.log(DEAD_LETTERS).read(0, timeout_ms=2000)
    assert [r.header(SOURCE_HEADER) for r in parked] == [b"inputs@1", b"inputs@3"]


async def test_poll_inputs_decodes_a_repeated_heartbeat_once(store: LogStore) -> None:
    same = Message(encode(envelope(hb(7), "p")))
    await store.log(INPUTS).append([same, Message(encode(envelope(hb(8), "p"))), same])
    consumer = EventConsumer(store)
    first = await consumer.poll_inputs(0, max_records=2, timeout_ms=2000)
    second = await consumer.poll_inputs(first.next_offset, timeout_ms=2000)
    assert first.events == [hb(7), hb(8)]
    assert second.events == [hb(7)]
    assert second.events[0] is first.events[0]


DEEP_JSON = (b'{"schema_version":1,"producer_id":"p","event":{"type":"JobCancelled","job_id":"j","reason":'
             + b"[" * 1000 + b"]" * 1000 + b"}}")
DEEP_MSGPACK = (b"\x83\xaeschema_version\x01\xabproducer_id\xa1p\xa5event" + b"\x91" * 1000 + b"\x01")


async def test_a_poison_record_nested_a_thousand_deep_is_parked_and_the_next_ones_folded(
    store: LogStore,
) -> None:
    """The issue's 1 KB poison record (msgspec raised ``RecursionError`` out of the consumer):
    parked with reason ``too_deep``; the good records after it are still delivered."""
    batch = [
        Message(encode(envelope(hb(0), "p"))),
        Message(DEEP_JSON, key=b"k", headers=(("content-type", JSON),)),
        Message(DEEP_MSGPACK),
        Message(DEEP_JSON),  # JSON without a header
        Message(encode(envelope(job("after"), "p"))),
        Message(encode(envelope(hb(0), "p"))),
    ]
    await store.log(INPUTS).append(batch)
    inputs = await EventConsumer(store).poll_inputs(0, timeout_ms=2000)
    assert inputs.events == [hb(0), job("after"), hb(0)]
    assert (inputs.dead_lettered, inputs.next_offset) == (3, 6)
    parked = await store.log(DEAD_LETTERS).read(0, timeout_ms=2000)
    assert [r.header(REASON_HEADER) for r in parked] == [b"too_deep"] * 3
    assert [r.header(SOURCE_HEADER) for r in parked] == [b"inputs@1", b"inputs@2", b"inputs@3"]
    assert [r.value for r in parked] == [DEEP_JSON, DEEP_MSGPACK, DEEP_JSON]
    assert b"nested too deeply" in (parked[0].header(ERROR_HEADER) or b"")
    polled = await EventConsumer(store).poll(0, timeout_ms=2000, park=False)
    assert [d.offset for d in polled.events] == [0, 4, 5]


async def test_a_shard_log_accepts_its_own_shard_events_and_parks_the_rest(store: LogStore) -> None:
    """A cell shard's inputs hold ``JobDispatched``; today's inputs log refuses it; a decision
    batch is refused by both (with the log's own accepted types named)."""
    from fleetlog.events.model import INPUT_TYPES, JobDispatched

    dispatched = JobDispatched(job=job(), cell="c", attempt=1, seq=1, as_of=0)
    decision = DecisionBatch(as_of=0, digest="x")
    await store.log(INPUTS).append([Message(encode(envelope(e, "p"))) for e in (hb(0), dispatched, decision)])
    for memo in (False, True):
        cell = EventConsumer(store, accepts=(*INPUT_TYPES, JobDispatched))
        polled = await (cell.poll_inputs(0, timeout_ms=2000, park=False) if memo
                        else cell.poll(0, timeout_ms=2000, park=False))
        events = polled.events if memo else [d.envelope.event for d in polled.events]
        assert events == [hb(0), dispatched]
        assert polled.dead_lettered == 1
    single = await EventConsumer(store).poll(0, timeout_ms=2000)
    assert [d.envelope.event for d in single.events] == [hb(0)]
    assert single.dead_lettered == 2
    cell_polled = await EventConsumer(store, accepts=(*INPUT_TYPES, JobDispatched)).poll(0, timeout_ms=2000)
    assert cell_polled.dead_lettered == 1
    parked = await store.log(DEAD_LETTERS).read(0, timeout_ms=2000)
    errors = [r.header(ERROR_HEADER) or b"" for r in parked]
    assert b"JobDispatched is a decision, not an input" in errors[0]
    assert all(b"DecisionBatch is a decision" in e for e in (errors[1], errors[2]))
