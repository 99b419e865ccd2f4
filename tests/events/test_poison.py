"""Untrusted bytes never escape the decoders as anything but a documented :class:`BadEventError`.

A fuzz test (bounded: a few seconds in CI) throws hostile values at every decoder — deep
nesting in both formats, huge integers, invalid UTF-8, truncated and mutated msgpack, wrong
types, NaN, a BOM, repeated keys — and asserts that only the documented errors come out.
"""

from __future__ import annotations

import json

import jsonschema
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetlog.events import (
    Envelope,
    JobCancelled,
    JobPayload,
    JobSubmitted,
    NodeHeartbeat,
    NodeLabel,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    PolicySet,
    QuotaSet,
    Resources,
    Taint,
    TaskGroup,
    Toleration,
    encode,
    envelope,
)
from fleetlog.events.codec import (
    JSON,
    MSGPACK,
    BadEventError,
    DuplicateKeyError,
    InvalidEventError,
    TooDeepError,
    decode,
    decode_many,
)
from fleetlog.events.model import ID_FIELDS, ID_TEXT, INPUT_TYPES, PRINTABLE_NAME
from fleetlog.events.schema import json_schema
from fleetlog.log.base import Record
from fleetlog.log.consumer import EventConsumer
from fleetlog.log.memory import MemoryLogStore
from tests.events.samples import ALL_EVENTS, job

DOCUMENTED_REASONS = {
    "undecodable",
    "unknown_content_type",
    "too_large",
    "unsupported_schema_version",
    "unknown_event_type",
    "invalid_event",
    "too_deep",
    "duplicate_key",
}
CONTENT_TYPES = [None, MSGPACK, JSON, b"application/json; charset=utf-8", b"text/plain"]


def deep_json(depth: int, open_: bytes = b"[", close: bytes = b"]") -> bytes:
    return open_ * depth + b"1" + close * depth


def deep_msgpack(depth: int) -> bytes:
    return b"\x91" * depth + b"\x01"  # fixarray of one element, nested


def msgpack_envelope(event: bytes, producer: bytes = b"\xa1p") -> bytes:
    """A msgpack envelope written by hand, so its event may be anything (even unencodable)."""
    return b"\x83\xaeschema_version\x01\xabproducer_id" + producer + b"\xa5event" + event


def json_envelope(event: bytes, producer: bytes = b'"p"') -> bytes:
    return b'{"schema_version":1,"producer_id":' + producer + b',"event":' + event + b"}"


DEPTHS = [10, 100, 999, 1000, 1001, 5000, 100_000]


def poison(depth: int) -> list[tuple[str, bytes, bytes | None]]:
    cancelled = b'{"type":"JobCancelled","job_id":"j","reason":'
    return [
        ("json event", json_envelope(deep_json(depth)), JSON),
        ("json object", json_envelope(deep_json(depth, b'{"a":', b"}")), JSON),
        ("json producer", json_envelope(b"{}", deep_json(depth)), JSON),
        ("json field", json_envelope(cancelled + deep_json(depth) + b"}"), JSON),
        ("json no header", json_envelope(deep_json(depth)), None),
        ("json top", deep_json(depth), JSON),
        ("msgpack event", msgpack_envelope(deep_msgpack(depth)), None),
        ("msgpack producer", msgpack_envelope(b"\x80", deep_msgpack(depth)), None),
        (
            "msgpack field",
            msgpack_envelope(b"\x83\xa4type\xacJobCancelled\xa6job_id\xa1j\xa6reason" + deep_msgpack(depth)),
            MSGPACK,
        ),
        ("msgpack top", deep_msgpack(depth), None),
    ]


@pytest.mark.parametrize("depth", DEPTHS)
def test_deep_nesting_is_a_bad_event_in_every_decoder(depth: int) -> None:
    for case, data, content_type in poison(depth):
        with pytest.raises(BadEventError) as caught:
            decode(data, content_type)
        assert caught.value.reason in DOCUMENTED_REASONS, case
        (result,) = decode_many([(data, content_type)])
        assert isinstance(result, BadEventError), case
        assert result.reason == caught.value.reason, case


def test_a_thousand_levels_deep_is_named_too_deep() -> None:
    """The issue's 1 KB poison record: JSON and msgpack nested 1,000 deep."""
    for case, data, content_type in poison(1000):
        if "top" in case:
            continue  # not even an object: refused before any recursion
        with pytest.raises(TooDeepError, match="nested too deeply"):
            decode(data, content_type)


def _mutations(data: bytes) -> st.SearchStrategy[bytes]:
    """Truncations, flipped bytes, inserted bytes of a valid encoding."""
    n = len(data)
    return st.one_of(
        st.integers(0, n).map(lambda i: data[:i]),
        st.tuples(st.integers(0, n - 1), st.integers(0, 255)).map(
            lambda p: data[: p[0]] + bytes([p[1]]) + data[p[0] + 1 :]
        ),
        st.tuples(st.integers(0, n), st.binary(min_size=1, max_size=8)).map(
            lambda p: data[: p[0]] + p[1] + data[p[0] :]
        ),
    )


_VALID = [encode(envelope(e, "p"), fmt) for e in ALL_EVENTS for fmt in ("msgpack", "json")]
_JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
_FIELDS = ["job_id", "tenant", "task_groups", "cell", "node", "cpu_milli", "type", "labels", "count"]


_DOC = json.loads(encode(envelope(job(), "p"), "json"))
_RETYPED = st.tuples(st.sampled_from(_FIELDS), _JSON_VALUES).map(
    lambda p: json.dumps({**_DOC, "event": {**_DOC["event"], p[0]: p[1]}}).encode()
)
"""A valid JSON envelope with one field of its event replaced by an arbitrary value."""


HOSTILE = st.one_of(
    st.binary(max_size=200),
    st.sampled_from(_VALID).flatmap(_mutations),
    st.sampled_from(DEPTHS).map(deep_json),
    st.sampled_from(DEPTHS).map(lambda d: json_envelope(deep_json(d))),
    st.sampled_from(DEPTHS).map(lambda d: msgpack_envelope(deep_msgpack(d))),
    st.sampled_from(DEPTHS).map(deep_msgpack),
    st.integers(min_value=1, max_value=5000).map(lambda k: json_envelope(b"9" * k)),
    st.integers(min_value=1, max_value=5000).map(
        lambda k: json_envelope(b'{"type":"TaskFinished","job_id":"j","task_index":1' + b"0" * k + b"}")
    ),
    st.sampled_from([b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-0", b"1.5"]).map(
        lambda v: json_envelope(b'{"type":"NodeRemoved","cell":"c","node":"n","x":' + v + b"}")
    ),
    st.sampled_from(_VALID).map(lambda d: b"\xef\xbb\xbf" + d),  # a UTF-8 BOM
    st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf4\x90\x80\x80"]).map(
        lambda bad: msgpack_envelope(b"\x82\xa4type\xaaNodeRemoved\xa4cell\xa2" + bad[:2], b"\xa1" + bad[:1])
    ),
    _RETYPED,
    st.text(max_size=60).map(lambda t: t.encode("utf-8", "surrogatepass")),
)


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=HOSTILE, content_type=st.sampled_from(CONTENT_TYPES))
def test_fuzz_only_documented_errors_come_out(data: bytes, content_type: bytes | None) -> None:
    expected: object
    try:
        expected = decode(data, content_type)
    except BadEventError as exc:
        expected = exc
    if isinstance(expected, BadEventError):
        assert expected.reason in DOCUMENTED_REASONS
        assert expected.message
        expected = expected.reason
    else:
        assert isinstance(expected, Envelope)
    (result,) = decode_many([(data, content_type)])
    got = result.reason if isinstance(result, BadEventError) else result
    assert got == expected


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(values=st.lists(HOSTILE, min_size=1, max_size=8), with_good=st.booleans())
def test_fuzz_the_consumer_parks_what_it_cannot_read(values: list[bytes], with_good: bool) -> None:
    """The consumer's two paths (memoised heartbeats, split) over hostile records: no exception,
    every record either an event or a dead letter with a documented reason."""
    good = encode(envelope(NodeHeartbeat(cell="c", node="n", cpu_milli=1, mem_mib=1), "p"))
    values = [*values, good] if with_good else values
    records = [Record(i, 1000 + i, v) for i, v in enumerate(values)]
    consumer = EventConsumer(MemoryLogStore())
    consumer.decode_memoised(records)
    events, bad = consumer.split(records)
    assert len(events) + len(bad) == len(records)
    for message in bad:
        assert dict(message.headers)["fleetlog-dead-letter-reason"].decode() in DOCUMENTED_REASONS
    if with_good:
        assert events[-1].offset == len(values) - 1


# --- identifiers are printable -------------------------------------------------------------

NOT_PRINTABLE = [
    "\x00",
    "\x1b[31m",
    "\n",
    "\r",
    "\t",
    " ",
    "\x7f",
    "\x85",
    "\xa0",
    "\xad",
    "\u061c",
    "\u1680",
    "\u200b",
    "\u200d",
    "\u200e",
    "\u2028",
    "\u2029",
    "\u202a",
    "\u202e",
    "\u2066",
    "\u2069",
    "\u3000",
    "\ufeff",
]


def _cancel_json(job_id: str) -> bytes:
    return json_envelope(b'{"type":"JobCancelled","job_id":' + json.dumps(job_id).encode() + b"}")


@pytest.mark.parametrize("bad", NOT_PRINTABLE, ids=[f"U+{ord(c[0]):04X}" for c in NOT_PRINTABLE])
@pytest.mark.parametrize("where", ["start", "middle", "end"])
def test_ids_refuse_control_space_and_format_characters(bad: str, where: str) -> None:
    job_id = {"start": bad + "job", "middle": "jo" + bad + "b", "end": "job" + bad}[where]
    with pytest.raises(InvalidEventError, match=r"printable identifier .* at `\$\.event\.job_id`"):
        decode(_cancel_json(job_id), JSON)
    packed = msgspec.msgpack.encode(
        {"schema_version": 1, "producer_id": "p", "event": {"type": "JobCancelled", "job_id": job_id}}
    )
    (result,) = decode_many([(packed, None)])  # the msgpack fast path checks it too
    assert isinstance(result, InvalidEventError)


@pytest.mark.parametrize("field", ["tenant", "queue", "allowed_cells", "gpu_models"])
def test_every_id_field_of_a_submission_is_checked(field: str) -> None:
    doc = json.loads(encode(envelope(job(), "p"), "json"))
    if field == "allowed_cells":
        doc["event"]["allowed_cells"] = ["c\u202e1"]
    elif field == "gpu_models":
        doc["event"]["task_groups"][1]["gpu_models"] = ["T4\x00"]
    else:
        doc["event"][field] = "x\ny"
    with pytest.raises(InvalidEventError, match="printable identifier"):
        decode(json.dumps(doc).encode(), JSON)


def test_node_quota_and_label_ids_are_checked() -> None:
    for event in [
        {"type": "NodeHeartbeat", "cell": "c", "node": "n\x1b", "cpu_milli": 1, "mem_mib": 1},
        {
            "type": "NodeHeartbeat",
            "cell": "c",
            "node": "n",
            "cpu_milli": 1,
            "mem_mib": 1,
            "labels": {"k\n": "v"},
        },
        {
            "type": "NodeHeartbeat",
            "cell": "c",
            "node": "n",
            "cpu_milli": 1,
            "mem_mib": 1,
            "gpu_count": 1,
            "gpu_model": "A100\u202e",
        },
        {"type": "QuotaSet", "tenant": "t", "nominal": {}, "cohort": "a b"},
        {"type": "QuotaSet", "tenant": "t", "nominal": {}, "cell": "\u200bc"},
    ]:
        data = json_envelope(json.dumps(event).encode())
        with pytest.raises(InvalidEventError, match="printable identifier"):
            decode(data, JSON)


def test_printable_unicode_ids_are_accepted() -> None:
    for job_id in ["été-训练-42", "job/ns:1", "😀", "a" * 253, "~!@#$%^&*()"]:
        assert decode(_cancel_json(job_id), JSON).event == JobCancelled(job_id=job_id)
    quota = QuotaSet(tenant="t", nominal=Resources(), cell="", cohort="")
    assert decode(encode(envelope(quota, "p"))).event == quota


def test_the_json_schema_states_the_id_pattern() -> None:
    schema = json_schema()
    defs = schema["$defs"]
    assert defs["JobSubmitted"]["properties"]["job_id"]["pattern"] == PRINTABLE_NAME
    assert defs["QuotaSet"]["properties"]["cohort"]["pattern"].startswith("^[^\\x00-\\x20")
    validator = jsonschema.Draft202012Validator(schema)
    cases = [("été-1", True), ("a\u202eb", False), ("a\n", False), ("a\x00", False), ("a b", False)]
    for job_id, ok in cases:
        doc = {"schema_version": 1, "producer_id": "p", "event": {"type": "JobCancelled", "job_id": job_id}}
        assert validator.is_valid(doc) is ok, job_id


# --- repeated keys -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        b'{"schema_version":1,"producer_id":"p","event":{"type":"JobCancelled","job_id":"a","job_id":"b"}}',
        b'{"schema_version":1,"producer_id":"p","event":{"type":"JobCancelled","job_id":"a","job_\\u0069d":"b"}}',
        b'{"schema_version":1,"producer_id":"p","producer_id":"q","event":{"type":"JobCancelled","job_id":"a"}}',
        b'{"schema_version":1,"producer_id":"p","event":{"type":"NodeRemoved","type":"JobCancelled","job_id":"a"}}',
        b'{"schema_version":1,"producer_id":"p","event":{"type":"NodeHeartbeat","cell":"c","node":"n",'
        b'"cpu_milli":1,"mem_mib":1,"labels":{"k":"1","k":"2"}}}',
    ],
)
def test_repeated_json_keys_are_refused(data: bytes) -> None:
    with pytest.raises(DuplicateKeyError, match="repeats the key"):
        decode(data, JSON)
    (result,) = decode_many([(data, None)])  # JSON without a header too
    assert isinstance(result, DuplicateKeyError)
    assert result.reason == "duplicate_key"


def test_distinct_keys_in_different_objects_are_fine() -> None:
    data = json_envelope(
        b'{"type":"NodeHeartbeat","cell":"c","node":"n","cpu_milli":1,"mem_mib":1,'
        b'"labels":{"cell":"x","node":"y"}}'
    )
    assert isinstance(decode(data, JSON).event, NodeHeartbeat)


def test_the_documented_reasons_are_the_codes_of_the_error_classes() -> None:
    from fleetlog.events import codec

    classes = [c for c in vars(codec).values() if isinstance(c, type) and issubclass(c, BadEventError)]
    assert {c.reason for c in classes if c is not BadEventError} == DOCUMENTED_REASONS


def _id_fields_by_schema(struct: type) -> set[str]:
    """The fields of ``struct`` whose type (or item, or key type) carries the identifier pattern."""
    found = set()
    for field in msgspec.inspect.type_info(struct).fields:  # type: ignore[attr-defined]
        text = repr(field.type)
        if PRINTABLE_NAME.replace("\\", "\\\\")[:12] in text or "x00-\\\\x20" in text:
            found.add(field.name)
    return found


def test_the_id_table_lists_every_identifier_field_of_every_input() -> None:
    for event_type in INPUT_TYPES:
        listed = {field for field, _ in ID_FIELDS[event_type]}
        nested = {JobSubmitted: {"task_groups", "payload"}, NodeHeartbeat: {"taints"}}.get(event_type, set())
        by_msgspec = {PolicySet: {"grants"}}.get(event_type, set())  # (Meta(pattern): msgspec checks them)
        assert listed == (_id_fields_by_schema(event_type) - by_msgspec) | nested, event_type.__name__
    # (group_ids: the models and the keys of its constraints)
    assert _id_fields_by_schema(TaskGroup) == {
        "gpu_models", "node_selector", "node_affinity", "tolerations", "preferred_affinity"
    }  # fmt: skip
    for struct in (NodeLabel, NodeSelectorRequirement, Toleration, Taint):
        assert _id_fields_by_schema(struct) == {"key"}, struct.__name__
    assert _id_fields_by_schema(JobPayload) == {"image"}  # (ID_FIELDS: "image")


@pytest.mark.parametrize(
    "event", [e for e in ALL_EVENTS if isinstance(e, INPUT_TYPES)], ids=lambda e: type(e).__name__
)
def test_the_fast_check_and_the_locator_agree_on_every_identifier(event: object) -> None:
    """Each identifier of each input, made unprintable in turn: the one-search fast check flags
    it, and the error names its path."""
    assert ID_TEXT[type(event)](event).isprintable()
    for field, how in ID_FIELDS[type(event)]:
        value = getattr(event, field)
        if how == "one":
            bad, path = msgspec.structs.replace(event, **{field: "x\u202e"}), f".{field}"
        elif how == "many":
            bad, path = msgspec.structs.replace(event, **{field: ("ok", "x\n")}), f".{field}[1]"
        elif how == "keys":
            bad, path = msgspec.structs.replace(event, **{field: {"x\x1b": "v"}}), f".{field}['x\\x1b']"
        elif how == "taints":
            taints = (Taint(key="ok", effect="NoSchedule"), Taint(key="bad\u200b", effect="NoExecute"))
            bad, path = msgspec.structs.replace(event, taints=taints), f".{field}[1].key"
        elif how == "values":
            bad, path = msgspec.structs.replace(event, **{field: {"ok": "v", "k": "a b"}}), f".{field}['k']"
        elif how == "image":
            payload = JobPayload(command=("true",), image="registry/x:1\u200b")
            bad, path = msgspec.structs.replace(event, payload=payload), f".{field}.image"
        else:
            group = msgspec.structs.replace(value[0], gpu_models=("A100", "T4 "))
            bad, path = msgspec.structs.replace(event, task_groups=(group,)), f".{field}[0].gpu_models[1]"
        cases = [(bad, path)]
        if how == "groups":  # the keys its constraints name
            plain = msgspec.structs.replace(value[0], gpu_models=())
            term = NodeSelectorTerm(
                (NodeSelectorRequirement("ok", "Exists"), NodeSelectorRequirement("k\n", "Exists"))
            )
            for fields, where in (
                ({"node_selector": (NodeLabel("z\x7f", "v"),)}, ".node_selector[0].key"),
                ({"node_affinity": (term,)}, ".node_affinity[0].match_expressions[1].key"),
                (
                    {"tolerations": (Toleration(operator="Exists"), Toleration(key="t\u2028"))},
                    ".tolerations[1].key",
                ),
            ):
                group = msgspec.structs.replace(plain, **fields)
                cases.append((msgspec.structs.replace(event, task_groups=(group,)), f".{field}[0]{where}"))
        for bad, path in cases:
            with pytest.raises(InvalidEventError) as caught:
                decode(encode(envelope(bad, "p")))
            assert caught.value.message.endswith(f"at `$.event{path}`"), caught.value.message
            (result,) = decode_many([(encode(envelope(bad, "p")), None)])
            assert isinstance(result, InvalidEventError)


_LABEL_KEYS = st.sampled_from(["a", "b", ":", '":', "\\", 'x":"y', "é", "k:v"]) | st.text(
    alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=4
)
_LABEL_VALUES = st.sampled_from(["", ":", '":"', "a: b", "\u2028"]) | st.text(max_size=5)


@settings(max_examples=300, deadline=None)
@given(
    labels=st.lists(st.tuples(_LABEL_KEYS, _LABEL_VALUES), max_size=6),
    repeat_cell=st.booleans(),
    explicit_default=st.booleans(),
    ascii_only=st.booleans(),
)
def test_the_fast_repeated_key_check_agrees_with_a_full_parse(
    labels: list[tuple[str, str]], repeat_cell: bool, explicit_default: bool, ascii_only: bool
) -> None:
    """``:`` counted in the text and in the re-encoded envelope: keys and values full of ``:``
    and quotes, escapes, explicit default values never hide a repeated key (nor invent one)."""
    dumps = lambda v: json.dumps(v, ensure_ascii=ascii_only)  # noqa: E731
    pairs = ", ".join(f"{dumps(k)} : {dumps(v)}" for k, v in labels)
    extra = ', "cell": "c2"' if repeat_cell else ""
    extra += ', "healthy": true, "gpu_count": 0' if explicit_default else ""
    text = (
        '{"schema_version": 1, "producer_id": "p", "event": {"type": "NodeHeartbeat", "cell": "c",'
        f' "node": "n", "cpu_milli": 1, "mem_mib": 1, "labels": {{{pairs}}}{extra}}}}}'
    ).encode()
    repeated = repeat_cell or len({k for k, _ in labels}) != len(labels)
    if repeated:
        with pytest.raises(DuplicateKeyError):
            decode(text, JSON)
    else:
        assert decode(text, JSON).event.labels == dict(labels)
