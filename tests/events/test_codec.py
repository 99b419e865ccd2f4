"""Round trips in both formats, the JSON Schema, and a named error for every kind of bad input."""

from __future__ import annotations

import json

import jsonschema
import msgspec
import pytest

from fleetlog.events import (
    BadEventError,
    EventTooLargeError,
    InvalidEventError,
    JobSubmitted,
    TaskGroup,
    UndecodableError,
    UnknownContentTypeError,
    UnknownEventTypeError,
    UnsupportedSchemaVersionError,
    decode,
    encode,
    envelope,
)
from fleetlog.events.codec import JSON, MAX_EVENT_BYTES, decode_many, format_of
from fleetlog.events.model import EVENT_TYPES, SHARD_TYPES, DecisionBatch, Event
from fleetlog.events.schema import json_schema
from tests.events.samples import ALL_EVENTS, job


def test_samples_cover_every_event_type() -> None:
    assert {type(e) for e in ALL_EVENTS} == set(EVENT_TYPES)


@pytest.mark.parametrize("event", ALL_EVENTS, ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("fmt", ["msgpack", "json"])
def test_round_trip(event: Event, fmt: str) -> None:
    env = envelope(event, "producer-1", key="k-1")
    data = encode(env, fmt)  # type: ignore[arg-type]
    assert decode(data, JSON if fmt == "json" else None) == env


@pytest.mark.parametrize("event", ALL_EVENTS, ids=lambda e: type(e).__name__)
def test_json_encoding_validates_against_published_schema(event: Event) -> None:
    """Inputs against the root (what producers send), decisions against ``DecisionEnvelope``,
    scale-out events against ``ShardEnvelope`` (and never the root: producers may not send them)."""
    doc = json.loads(encode(envelope(event, "p"), "json"))
    schema = json_schema()
    if isinstance(event, DecisionBatch):
        schema = {**schema, "$ref": schema["x-fleetlog-decision-envelope"]}
    if isinstance(event, SHARD_TYPES):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.Draft202012Validator(schema).validate(doc)
        schema = {**schema, "$ref": schema["x-fleetlog-shard-envelope"]}
    jsonschema.Draft202012Validator(schema).validate(doc)


def test_schema_rejects_what_the_decoder_rejects() -> None:
    doc = json.loads(encode(envelope(job(), "p"), "json"))
    doc["event"]["task_groups"][0]["cpu_milli"] = -1
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(json_schema()).validate(doc)


def test_hand_written_json_from_another_language_is_accepted() -> None:
    text = b"""{"schema_version": 1, "producer_id": "go-client",
      "event": {"type": "NodeHeartbeat", "cell": "c1", "node": "n1", "cpu_milli": 64000,
                "mem_mib": 262144, "gpu_count": 2, "gpu_model": "P100", "topology": ["b1", "r1", "h1"]}}"""
    env = decode(text, b"application/json; charset=utf-8")
    assert env.producer_id == "go-client"
    assert env.event.cell == "c1"  # type: ignore[union-attr]


def test_absent_content_type_means_msgpack() -> None:
    assert format_of(None) == "msgpack"
    assert decode(encode(envelope(job(), "p"))) == envelope(job(), "p")


# --- bad input: every case gets its own typed error and a message naming the problem ---------


def _json_env(**event: object) -> bytes:
    return json.dumps({"schema_version": 1, "producer_id": "p", "event": event}).encode()


def _valid_job_fields() -> dict[str, object]:
    return {
        "type": "JobSubmitted",
        "job_id": "j",
        "tenant": "t",
        "task_groups": [{"count": 1, "cpu_milli": 1000, "mem_mib": 10}],
    }


def _with_group(**group: object) -> bytes:
    fields = _valid_job_fields()
    fields["task_groups"] = [{"count": 1, "cpu_milli": 1000, "mem_mib": 10, **group}]
    return _json_env(**fields)


BAD_INPUTS: list[tuple[str, bytes, bytes | None, type[BadEventError], str]] = [
    ("garbage bytes msgpack", b"\xc1\xc1\xc1", None, UndecodableError, "not valid msgpack"),
    ("truncated msgpack", encode(envelope(job(), "p"))[:40], None, UndecodableError, "not valid msgpack"),
    ("garbage json", b"{not json", JSON, UndecodableError, "not valid json"),
    ("empty value", b"", None, UndecodableError, "not valid msgpack"),
    ("a JSON array", b"[1,2,3]", JSON, UndecodableError, "a JSON array ('[1,2,3]'"),
    ("a JSON number", b" 42", JSON, UndecodableError, "not a JSON object ('42'"),
    ("a JSON string", b'"job"', JSON, UndecodableError, "not a JSON object"),
    ("plain text as JSON", b"hello", JSON, UndecodableError, "not a JSON object ('hello'"),
    (
        "JSON with a BOM",
        b"\xef\xbb\xbf" + _json_env(**_valid_job_fields()),
        JSON,
        UndecodableError,
        "byte-order mark",
    ),
    # without a content-type header, the first byte would be a msgpack integer: say what it is
    ("plain text, no header", b"hello world\n", None, UndecodableError, "text 'hello world\\n', neither"),
    ("a JSON array, no header", b'[{"schema_version": 1}]', None, UndecodableError, "a JSON array"),
    (
        "JSON with a BOM, no header",
        b"\xef\xbb\xbf" + _json_env(**_valid_job_fields()),
        None,
        UndecodableError,
        "byte-order mark",
    ),
    ("a msgpack array", b"\x93\x01\x02\x03", None, UndecodableError, "0x93 does not start a map"),
    ("a msgpack integer", b"\x05", None, UndecodableError, "0x05 does not start a map"),
    ("JSON, latin-1", b"{}", b"application/json; charset=latin-1", UnknownContentTypeError, "'latin-1'"),
    ("unknown content type", b"{}", b"text/plain", UnknownContentTypeError, "text/plain"),
    (
        "unknown event type",
        _json_env(type="JobTeleported", job_id="j"),
        JSON,
        UnknownEventTypeError,
        "JobTeleported",
    ),
    ("event without type", _json_env(job_id="j"), JSON, InvalidEventError, "no string `type`"),
    (
        "future schema version",
        json.dumps({"schema_version": 2, "producer_id": "p", "event": _valid_job_fields()}).encode(),
        JSON,
        UnsupportedSchemaVersionError,
        "schema_version 2",
    ),
    (
        "missing field",
        _json_env(type="JobSubmitted", job_id="j", tenant="t"),
        JSON,
        InvalidEventError,
        "missing required field `task_groups`",
    ),
    (
        "extra field",
        _json_env(**_valid_job_fields(), colour="blue"),
        JSON,
        InvalidEventError,
        "unknown field `colour`",
    ),
    ("wrong type", _with_group(cpu_milli="lots"), JSON, InvalidEventError, "Expected `int`, got `str`"),
    ("negative resource", _with_group(cpu_milli=-5), JSON, InvalidEventError, "cpu_milli"),
    ("overflowing resource", _with_group(mem_mib=2**70), JSON, InvalidEventError, "mem_mib"),
    (
        "uint64-max schema version in msgpack",
        b"\x83\xaeschema_version\xcf" + b"\xff" * 8 + b"\xabproducer_id\xa1p\xa5event\x80",
        None,
        UnsupportedSchemaVersionError,
        "not supported",
    ),
    ("absurd gang size", _with_group(count=10**9), JSON, InvalidEventError, "count"),
    (
        "fractional gpu on several gpus",
        _with_group(gpu_count=2, gpu_milli=500),
        JSON,
        InvalidEventError,
        "whole GPUs",
    ),
    ("gpu share over 1000", _with_group(gpu_count=1, gpu_milli=1500), JSON, InvalidEventError, "gpu_milli"),
    ("empty job id", _json_env(**{**_valid_job_fields(), "job_id": ""}), JSON, InvalidEventError, "job_id"),
    (
        "too many labels",
        _json_env(
            type="NodeHeartbeat",
            cell="c",
            node="n",
            cpu_milli=1,
            mem_mib=1,
            labels={f"k{i}": "v" for i in range(65)},
        ),
        JSON,
        InvalidEventError,
        "labels",
    ),
    ("oversized event", b"\x00" * (MAX_EVENT_BYTES + 1), None, EventTooLargeError, "limit"),
]


@pytest.mark.parametrize(
    ("case", "data", "content_type", "error", "words"), BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS]
)
def test_bad_input_gets_a_named_error(
    case: str, data: bytes, content_type: bytes | None, error: type[BadEventError], words: str
) -> None:
    with pytest.raises(error) as info:
        decode(data, content_type)
    assert words in str(info.value), f"{case}: message {info.value!s} does not mention {words!r}"
    assert info.value.reason != "bad_event"


@pytest.mark.parametrize(
    ("content_type", "fmt"),
    [
        (b"Application/JSON", "json"),
        (b"APPLICATION/JSON", "json"),
        (b"application/json; charset=utf-8", "json"),
        (b'Application/Json;Charset="UTF-8"', "json"),
        (b"application/json ; charset=US-ASCII ; foo=bar", "json"),
        (b" application/json", "json"),
        (b"Application/MsgPack", "msgpack"),
        (b"application/msgpack; foo=bar", "msgpack"),
    ],
)
def test_content_type_is_case_insensitive_and_takes_parameters(content_type: bytes, fmt: str) -> None:
    env = envelope(job(), "p")
    data = encode(env, "json" if fmt == "json" else "msgpack")
    assert decode(data, content_type) == env
    assert decode_many([(data, content_type)]) == [env]


REFUSED_TYPES = [
    b"text/plain",
    b"application/jsonx",
    b"json",
    b"",
    b"application/json; charset=latin-1",
    b"application/json; charset=utf-16",
]


@pytest.mark.parametrize("content_type", REFUSED_TYPES)
def test_other_content_types_are_refused_by_name(content_type: bytes) -> None:
    with pytest.raises(UnknownContentTypeError) as info:
        decode(b"{}", content_type)
    assert repr(content_type.decode()) in str(info.value)


def test_integer_too_large_for_msgpack_is_refused_by_the_encoder_and_bounded_on_decode() -> None:
    with pytest.raises(OverflowError):
        msgspec.msgpack.encode(2**64)
    JobSubmitted(job_id="j", tenant="t", task_groups=(TaskGroup(count=1, cpu_milli=1, mem_mib=1),))  # valid
    with pytest.raises(msgspec.ValidationError, match="<= 1099511627776"):
        msgspec.convert({"count": 1, "cpu_milli": 2**63, "mem_mib": 1}, TaskGroup)


def test_decode_many_keeps_going_after_bad_records() -> None:
    good = encode(envelope(job(), "p"))
    out = decode_many([(good, None), (b"\xc1", None), (good, None)])
    assert isinstance(out[1], UndecodableError)
    assert out[0] == out[2] == envelope(job(), "p")
