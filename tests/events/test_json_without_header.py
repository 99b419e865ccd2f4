"""JSON without a ``content-type`` header: a value starting with ``{`` is JSON, never msgpack."""

from __future__ import annotations

import json

import pytest

from fleetlog.events import InvalidEventError, UndecodableError, decode, encode, envelope
from fleetlog.events.codec import decode_many, format_of
from fleetlog.events.model import Event
from fleetlog.log.base import INPUTS, Message
from fleetlog.log.consumer import EventConsumer
from fleetlog.log.memory import MemoryLogStore
from tests.events.samples import ALL_EVENTS, job

MSGPACK_MAP_FIRST_BYTES = {*range(0x80, 0x90), 0xDE, 0xDF}


@pytest.mark.parametrize("event", ALL_EVENTS, ids=lambda e: type(e).__name__)
def test_a_msgpack_envelope_never_starts_with_a_brace(event: Event) -> None:
    data = encode(envelope(event, "p", key="k"))
    assert data[0] in MSGPACK_MAP_FIRST_BYTES
    assert data[0] != ord("{")
    assert format_of(None, data) == "msgpack"


@pytest.mark.parametrize("event", ALL_EVENTS, ids=lambda e: type(e).__name__)
def test_json_without_a_header_decodes(event: Event) -> None:
    env = envelope(event, "java-producer", key="k-1")
    assert decode(encode(env, "json")) == env
    assert decode(b" \n\t" + encode(env, "json")) == env


def test_the_header_still_decides_when_present() -> None:
    assert format_of(None, b'{"x": 1}') == "json"
    assert format_of(None, b"\r\n {") == "json"
    assert format_of(None, b"") == "msgpack"
    assert format_of(b"application/msgpack", b'{"x": 1}') == "msgpack"
    with pytest.raises(UndecodableError, match="JSON under content-type application/msgpack"):
        decode(encode(envelope(job(), "p"), "json"), b"application/msgpack")


def test_bad_json_without_a_header_is_diagnosed_as_json() -> None:
    broken = b'{"schema_version": 1, "producer_id": '
    doc = json.loads(encode(envelope(job(), "p"), "json"))
    doc["event"]["task_groups"][0]["mem_mib"] = -5
    negative = json.dumps(doc).encode()
    good = encode(envelope(job("j-ok"), "p"))
    out = decode_many([(broken, None), (negative, None), (good, None)])
    assert isinstance(out[0], UndecodableError)
    assert "not valid json" in out[0].message
    assert isinstance(out[1], InvalidEventError)
    assert "$.event.task_groups[0].mem_mib" in out[1].message
    assert out[2] == envelope(job("j-ok"), "p")


async def test_the_consumer_delivers_header_less_json_instead_of_parking_it() -> None:
    store = MemoryLogStore()
    await store.open()
    text = (
        b'{"schema_version": 1, "producer_id": "bash", "key": "cancel/j1",'
        b' "event": {"type": "JobCancelled", "job_id": "j1", "reason": "from a shell"}}'
    )
    await store.log(INPUTS).append([Message(text), Message(b"{oops")])
    polled = await EventConsumer(store).poll(0)
    assert [d.envelope.key for d in polled.events] == ["cancel/j1"]
    assert polled.dead_lettered == 1
    await store.close()


def test_may_mention_decodes_any_json_and_byte_tests_only_msgpack() -> None:
    """The pre-filter before a decode: exact for msgpack (strings stored as they are), always
    "maybe" for JSON (an id may be spelled with escapes) and for a record of unknown format."""
    from fleetlog.events.codec import may_mention

    packed = encode(envelope(job(), "p"))
    assert may_mention(packed, None, [b"job-1"])
    assert not may_mention(packed, b"application/msgpack", [b"no-such-id"])
    assert not may_mention(packed, None, [])
    assert may_mention(b'{"event": {"job_id": "j\\u00e9"}}', None, [b"no-such-id"])
    assert may_mention(b"{}", b"application/json; charset=utf-8", [b"x"])
    assert may_mention(b"\x00", b"text/plain", [b"x"])  # its decode names the format
