"""A job's labels, annotations and payload (docs/events.md, "Labels, annotations and payload"):
every bound taken at its limit and refused one past it, in JSON and msgpack, on the diagnosed path
and the msgpack fast path alike; the JSON Schema says the same; old records decode unchanged; and
none of the three is part of a submission's identity."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import msgspec
import pytest

from fleetlog.events import JobDispatched, JobPayload, JobSubmitted, TaskGroup, decode, encode, envelope
from fleetlog.events.codec import JSON, MAX_EVENT_BYTES, BadEventError, InvalidEventError, decode_many
from fleetlog.events.model import (
    MAX_ANNOTATION_CHARS,
    MAX_ARG_CHARS,
    MAX_COMMAND_ARGS,
    MAX_ENV_VARS,
    MAX_IMAGE_CHARS,
    MAX_JOB_ANNOTATIONS,
    MAX_JOB_LABELS,
    MAX_JOB_METADATA_BYTES,
    MAX_PAYLOAD_CHARS,
    metadata_bytes,
)
from fleetlog.events.schema import NOT_IN_SCHEMA, json_schema
from fleetlog.events.spec import same_submission, spec_differences, submission_spec

VALIDATOR = jsonschema.Draft202012Validator(json_schema())
GROUP = {"count": 1, "cpu_milli": 1000, "mem_mib": 1024}
WIDE = "\U0001f680"  # four bytes of UTF-8: the worst case of a character count
EIGHT_FULL = ["p", *["a" * MAX_ARG_CHARS] * 8]  # 256,001 characters


def doc(**fields: Any) -> dict[str, Any]:
    """An input envelope of a JobSubmitted with ``fields`` on top of the least one."""
    event = {"type": "JobSubmitted", "job_id": "j", "tenant": "t", "task_groups": [GROUP], **fields}
    return {"schema_version": 1, "producer_id": "p", "event": event}


def payload(**fields: Any) -> dict[str, Any]:
    return doc(payload=fields)


def both_formats(d: dict[str, Any]) -> list[tuple[bytes, bytes | None]]:
    return [(json.dumps(d).encode(), JSON), (msgspec.msgpack.encode(d), None)]


def refusal(d: dict[str, Any]) -> str:
    """The message of the ``invalid_event`` refusal of ``d``, the same in JSON and msgpack, by
    :func:`decode` and by the consumer's :func:`decode_many`."""
    messages = set()
    for data, content_type in both_formats(d):
        with pytest.raises(InvalidEventError) as caught:
            decode(data, content_type)
        (many,) = decode_many([(data, content_type)])
        assert isinstance(many, InvalidEventError), many
        assert many.message == caught.value.message
        messages.add(caught.value.message)
    (message,) = messages
    return message


def taken(d: dict[str, Any]) -> JobSubmitted:
    events = set()
    for data, content_type in both_formats(d):
        event = decode(data, content_type).event
        (many,) = decode_many([(data, content_type)])
        assert not isinstance(many, BadEventError), many
        assert isinstance(event, JobSubmitted)
        assert many.event == event
        events.add(encode(envelope(event, "p")))
    assert len(events) == 1
    return event


def labels(n: int, key: str = "k", value: str = "v") -> dict[str, str]:
    return {f"{key}{i}": value for i in range(n)}


# --- at every bound, and one past it -------------------------------------------------------------

AT_THE_BOUNDS = [
    pytest.param(doc(labels=labels(MAX_JOB_LABELS)), id="64-labels"),
    pytest.param(doc(labels={"k" * 253: "v" * 253}), id="label-key-and-value-253"),
    pytest.param(doc(labels={WIDE * 253: WIDE * 253}), id="label-253-wide-characters"),
    pytest.param(doc(labels={"app.kubernetes.io/name": "", "é-训练": "x"}), id="label-value-empty"),
    pytest.param(doc(annotations=labels(MAX_JOB_ANNOTATIONS)), id="64-annotations"),
    pytest.param(doc(annotations={"k": "v" * (MAX_ANNOTATION_CHARS - 1)}), id="annotations-16384-chars"),
    pytest.param(doc(annotations={"a": "x" * 8_000, "b": "y" * (MAX_ANNOTATION_CHARS - 8_002)}),
                 id="annotations-16384-chars-over-two"),
    pytest.param(doc(labels=labels(MAX_JOB_LABELS, value="v" * 200),  # 64 x 202 or 203 bytes: 12,982
                     annotations={"a": WIDE * 849, "b": "é" * 2}),  # 3,397 + 5 bytes: 16,384 in all
                 id="metadata-16384-bytes"),
    pytest.param(doc(annotations={"note": "free text: spaces, 'quotes', $(x)\n\ttabs\r\n", "e": ""}),
                 id="annotation-any-text"),
    pytest.param(payload(command=["p", *["a"] * (MAX_COMMAND_ARGS - 1)]), id="4096-arguments"),
    pytest.param(payload(command=["p", "a" * MAX_ARG_CHARS]), id="argument-32000"),
    pytest.param(payload(command=["p", "", "it's \"x\" $(rm -rf /) `id`\n\r\n"]), id="argument-any-text"),
    pytest.param(payload(env={f"V{i}": "v" for i in range(MAX_ENV_VARS)}), id="256-env"),
    pytest.param(payload(env={"_a1": "v" * MAX_ARG_CHARS, "A": ""}), id="env-value-32000"),
    pytest.param(payload(env={"A" * 253: "v"}), id="env-name-253"),
    pytest.param(payload(image="i" * MAX_IMAGE_CHARS), id="image-1024"),
    pytest.param(payload(script="#!" + "s" * (MAX_PAYLOAD_CHARS - 2)), id="script-262144"),
    pytest.param(payload(script="#! /usr/bin/env python3\nprint('hi')\r\n"), id="script-blank-before-interp"),
    pytest.param(payload(command=["p", "a" * 30_000], env={"A": "b" * 30_000}, image="i" * 1000),
                 id="payload-mixed"),
    pytest.param(payload(command=EIGHT_FULL, env={"AB": "c" * (MAX_PAYLOAD_CHARS - 256_003)}),
                 id="payload-262144-chars"),
    pytest.param(doc(payload={}), id="payload-empty"),
    pytest.param(doc(payload=None), id="payload-null"),
]


@pytest.mark.parametrize("d", AT_THE_BOUNDS)
def test_a_submission_at_every_bound_is_taken_and_valid_by_the_schema(d: dict[str, Any]) -> None:
    event = taken(d)
    assert VALIDATOR.is_valid(d), next(iter(VALIDATOR.iter_errors(d)))
    assert len(encode(envelope(event, "p"))) < MAX_EVENT_BYTES


PAST_THE_BOUNDS = [  # (doc, where the message points, what it says; "schema": the schema refuses it too)
    pytest.param(doc(labels=labels(MAX_JOB_LABELS + 1)), "$.event.labels", "length <= 64", True,
                 id="65-labels"),
    pytest.param(doc(labels={"k" * 254: "v"}), "$.event.labels", "length <= 253", True, id="label-key-254"),
    pytest.param(doc(labels={"k": "v" * 254}), "$.event.labels", "length <= 253", True, id="label-value-254"),
    pytest.param(doc(labels={"": "v"}), "$.event.labels", "length >= 1", True, id="label-key-empty"),
    pytest.param(doc(labels={"a b": "v"}), "$.event.labels['a b']", "printable", True, id="label-key-space"),
    pytest.param(doc(labels={"k": "two words"}), "$.event.labels['k']", "printable", True,
                 id="label-value-space"),
    pytest.param(doc(labels={"k": "line\n"}), "$.event.labels['k']", "printable", True,
                 id="label-value-newline"),
    pytest.param(doc(labels={"k": "\u202eevil"}), "$.event.labels['k']", "printable", True,
                 id="label-value-bidi"),
    pytest.param(doc(annotations=labels(MAX_JOB_ANNOTATIONS + 1)), "$.event.annotations", "length <= 64",
                 True, id="65-annotations"),
    pytest.param(doc(annotations={"k": "v" * MAX_ANNOTATION_CHARS}), "$.event", "at most 16384 characters",
                 False, id="annotations-16385-chars"),
    pytest.param(doc(annotations={"k": "v" * (MAX_ANNOTATION_CHARS + 1)}), "$.event.annotations",
                 "length <= 16384", True, id="annotation-value-16385"),
    pytest.param(doc(annotations={"a": "x" * 10_000, "b": "y" * 10_000}), "$.event",
                 "at most 16384 characters", False, id="annotations-over-two"),
    pytest.param(doc(labels=labels(MAX_JOB_LABELS, value="v" * 200),
                     annotations={"a": WIDE * 849, "b": "é" * 2 + "x"}),
                 "$.event", "labels and annotations hold at most 16384 bytes", False,
                 id="metadata-16385-bytes"),
    pytest.param(doc(annotations={"a": WIDE * 4_096}), "$.event", "at most 16384 bytes (UTF-8", False,
                 id="metadata-4096-wide-characters"),
    pytest.param(doc(labels={f"{i:02d}" + WIDE * 64: WIDE * 64 for i in range(MAX_JOB_LABELS)}), "$.event",
                 "not 32896", False, id="labels-alone-past-the-bytes"),
    pytest.param(doc(annotations={"k\x1b": "v"}), "$.event.annotations['k\\x1b']", "printable", True,
                 id="annotation-key-escape"),
    pytest.param(payload(command=["p", *["a"] * MAX_COMMAND_ARGS]), "$.event.payload.command",
                 "length <= 4096", True, id="4097-arguments"),
    pytest.param(payload(command=["p", "a" * (MAX_ARG_CHARS + 1)]), "$.event.payload.command[1]",
                 "length <= 32000", True, id="argument-32001"),
    pytest.param(payload(command=["p", "a\x00b"]), "$.event.payload", "NUL", True, id="argument-nul"),
    pytest.param(payload(command=[""]), "$.event.payload", "program", True, id="program-empty"),
    pytest.param(payload(command=["-rf"]), "$.event.payload", "program", True, id="program-option"),
    pytest.param(payload(command=["p"], script="#!/bin/sh\n"), "$.event.payload", "not both", True,
                 id="command-and-script"),
    pytest.param(payload(env={f"V{i}": "v" for i in range(MAX_ENV_VARS + 1)}), "$.event.payload.env",
                 "length <= 256", True, id="257-env"),
    pytest.param(payload(env={"A": "v" * (MAX_ARG_CHARS + 1)}), "$.event.payload.env", "length <= 32000",
                 True, id="env-value-32001"),
    pytest.param(payload(env={"A": "\x00"}), "$.event.payload", "NUL", True, id="env-value-nul"),
    pytest.param(payload(env={"1A": "v"}), "$.event.payload", "shell name", True, id="env-name-digit"),
    pytest.param(payload(env={"A-B": "v"}), "$.event.payload", "shell name", True, id="env-name-dash"),
    pytest.param(payload(env={"A;rm": "v"}), "$.event.payload", "shell name", True, id="env-name-semicolon"),
    pytest.param(payload(env={"A\n": "v"}), "$.event.payload", "shell name", True, id="env-name-newline"),
    pytest.param(payload(env={"A" * 254: "v"}), "$.event.payload.env", "length <= 253", True,
                 id="env-name-254"),
    pytest.param(payload(image="i" * (MAX_IMAGE_CHARS + 1)), "$.event.payload.image", "length <= 1024", True,
                 id="image-1025"),
    pytest.param(payload(image="repo/img:1 --privileged"), "$.event.payload.image", "printable", True,
                 id="image-space"),
    pytest.param(payload(script="#!" + "s" * (MAX_PAYLOAD_CHARS - 1)), "$.event.payload.script",
                 "length <= 262144", True, id="script-262145"),
    pytest.param(payload(script="echo no interpreter\n"), "$.event.payload", "#!", True, id="script-no-#!"),
    pytest.param(payload(script="#!\n"), "$.event.payload", "#!", True, id="script-#!-alone"),
    pytest.param(payload(script="#!/bin/sh\necho \x00"), "$.event.payload", "NUL", True, id="script-nul"),
    pytest.param(payload(command=EIGHT_FULL, env={"AB": "c" * (MAX_PAYLOAD_CHARS - 256_002)}),
                 "$.event.payload", "at most 262144", False, id="payload-262145-chars"),
    pytest.param(payload(script="#!" + "s" * 200_000, image="i" * 1000,
                         env={"A": "b" * 32_000, "B": "c" * 30_000}),
                 "$.event.payload", "at most 262144", False, id="payload-over-mixed"),
    pytest.param(payload(shell="rm -rf /"), "$.event.payload", "unknown field", True, id="payload-unknown"),
    pytest.param(doc(payload="sleep 1"), "$.event.payload", "Expected `object | null`", True,
                 id="payload-a-string"),
    pytest.param(doc(labels=["a", "b"]), "$.event.labels", "Expected `object`", True, id="labels-a-list"),
    pytest.param(doc(labels={"k": 1}), "$.event.labels", "Expected `str`", True, id="label-value-number"),
]


@pytest.mark.parametrize(("d", "where", "says", "schema_too"), PAST_THE_BOUNDS)
def test_past_a_bound_is_refused_naming_the_field(d: dict[str, Any], where: str, says: str,
                                                  schema_too: bool) -> None:
    message = refusal(d)
    assert message.startswith("invalid JobSubmitted: "), message
    assert f"`{where}" in message, message
    assert says in message, message
    assert VALIDATOR.is_valid(d) is not schema_too


def test_the_rules_the_schema_cannot_state_are_listed_in_it() -> None:
    rules = json_schema()["x-fleetlog-rules-not-in-schema"]
    assert list(NOT_IN_SCHEMA) == rules
    assert any(f"annotations at most {MAX_ANNOTATION_CHARS} characters" in r for r in rules)
    assert any(f"JobPayload: at most {MAX_PAYLOAD_CHARS} characters" in r for r in rules)


def test_the_schema_names_the_new_fields_and_their_bounds() -> None:
    defs = json_schema()["$defs"]
    fields = defs["JobSubmitted"]["properties"]
    assert fields["labels"]["maxProperties"] == MAX_JOB_LABELS
    assert fields["annotations"]["maxProperties"] == MAX_JOB_ANNOTATIONS
    assert fields["payload"]["anyOf"] == [{"$ref": "#/$defs/JobPayload"}, {"type": "null"}]
    assert "labels" not in defs["JobSubmitted"]["required"]
    payload_fields = defs["JobPayload"]["properties"]
    assert sorted(payload_fields) == ["command", "env", "image", "script"]
    assert payload_fields["env"]["propertyNames"]["pattern"].startswith("^[A-Za-z_]")
    assert payload_fields["command"]["maxItems"] == MAX_COMMAND_ARGS


# --- the largest submission still fits a record, and a dispatch of it ------------------------


def test_a_submission_at_every_new_bound_at_once_fits_one_record_and_its_dispatch_too() -> None:
    """Four-byte characters wherever they are allowed: 1.1 MB, well inside a 4 MiB record, so
    the dispatcher's ``JobDispatched`` of it (the whole submission, docs/scale-out.md) fits too."""
    big = JobSubmitted(
        job_id="j" * 253, tenant="t", task_groups=(TaskGroup(count=1, cpu_milli=1, mem_mib=1),),
        labels={f"{i:02d}" + WIDE * 30: WIDE * 30 for i in range(MAX_JOB_LABELS)},  # 64 x 242 bytes
        annotations={"a": WIDE * 223},  # 893 bytes: 16,381 in all
        payload=JobPayload(script="#!" + WIDE * (MAX_PAYLOAD_CHARS - 2)),
    )
    assert metadata_bytes(big.labels, big.annotations) > MAX_JOB_METADATA_BYTES - 4
    data = encode(envelope(big, "p"))
    assert 1_000_000 < len(data) < 2 << 20
    assert decode(data).event == big
    dispatched = JobDispatched(job=big, cell="c" * 253, attempt=1, seq=1, as_of=0)
    assert decode(encode(envelope(dispatched, "p"))).event == dispatched


# --- evolution ---------------------------------------------------------------------------------


OLD_JOB = {"type": "JobSubmitted", "job_id": "train-42", "tenant": "vision", "task_groups": [GROUP],
           "required_topology": "rack"}


def test_a_record_written_before_the_fields_decodes_and_encodes_byte_for_byte() -> None:
    old = {"schema_version": 1, "producer_id": "billing-svc", "event": OLD_JOB, "key": "submit-42"}
    for data, content_type in both_formats(old):
        env = decode(data, content_type)
        assert isinstance(env.event, JobSubmitted)
        assert (env.event.labels, env.event.annotations, env.event.payload) == ({}, {}, None)
    msgpack_bytes = msgspec.msgpack.encode(old)
    assert encode(decode(msgpack_bytes)) == msgpack_bytes  # defaults are left out on the wire
    assert encode(decode(json.dumps(old, separators=(",", ":")).encode()), "json") == json.dumps(
        old, separators=(",", ":")).encode()


def test_the_defaults_given_explicitly_mean_the_same_and_are_left_out() -> None:
    explicit = taken(doc(labels={}, annotations={}, payload=None))
    assert explicit == taken(doc())
    assert b"labels" not in encode(envelope(explicit, "p"))


def test_an_older_reader_refuses_the_new_fields_by_name() -> None:
    """What docs/events.md warns of: a consumer of the schema before these fields (its
    ``JobSubmitted`` without them) refuses an event that uses them, naming the field."""

    class OldJobSubmitted(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="JobSubmitted",
                          tag_field="type"):
        job_id: str
        tenant: str
        task_groups: list[dict[str, int]]

    with pytest.raises(msgspec.ValidationError, match="unknown field `labels`"):
        msgspec.json.decode(json.dumps(doc(labels={"a": "b"})["event"]), type=OldJobSubmitted)


# --- identity: labels, annotations and payload are no part of a submission's spec ----------------


def _job(**fields: Any) -> JobSubmitted:
    group = TaskGroup(count=2, cpu_milli=1, mem_mib=1)
    return JobSubmitted(job_id="j", tenant="t", task_groups=(group,), **fields)


def test_a_resend_with_other_labels_annotations_or_payload_is_the_same_submission() -> None:
    first = _job(labels={"team": "a"}, annotations={"n": "1"}, payload=JobPayload(command=("run", "a")))
    for other in (
        _job(),
        _job(labels={"team": "b"}),
        _job(annotations={"n": "2"}),
        _job(payload=JobPayload(script="#!/bin/sh\nrm -rf /\n", env={"A": "b"}, image="x")),
    ):
        assert same_submission(first, other)
        assert submission_spec(first) == submission_spec(other)
        assert spec_differences(submission_spec(first), submission_spec(other)) == []
    assert not same_submission(first, _job(priority=1))  # (the scheduling spec still counts)


def test_a_submission_is_a_struct_with_maps_and_its_task_groups_stay_hashable() -> None:
    """A ``JobSubmitted`` holds maps now, so it cannot be hashed (as a ``NodeHeartbeat`` with its
    labels never could); the fold keys runs of submissions by their task groups, still hashable."""
    job = _job(labels={"a": "b"})
    with pytest.raises(TypeError):
        hash(job)
    assert hash(job.task_groups) == hash(_job().task_groups)


# --- what docs/events.md and `fleetlog schema` say -------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "events.md").read_text()
SECTION = DOC.split("## Labels, annotations and payload\n")[1].split("\n## ")[0]


def test_the_docs_example_is_a_valid_submission() -> None:
    event = json.loads(SECTION.split("```json\n")[1].split("```")[0])
    d = {"schema_version": 1, "producer_id": "p", "event": event}
    job = taken(d)
    assert VALIDATOR.is_valid(d)
    assert job.payload is not None
    assert job.payload.command[:2] == ("python", "train.py")


def test_the_docs_table_quotes_the_bounds_of_the_code() -> None:
    for phrase in (
        f"at most {MAX_JOB_LABELS} (`MAX_JOB_LABELS`)",
        f"at most {MAX_JOB_ANNOTATIONS} (`MAX_JOB_ANNOTATIONS`)",
        f"together at most {MAX_ANNOTATION_CHARS:,} characters (`MAX_ANNOTATION_CHARS`)",
        f"keys and values at most {MAX_JOB_METADATA_BYTES:,} bytes of UTF-8 (`MAX_JOB_METADATA_BYTES`)",
        f"at most {MAX_PAYLOAD_CHARS:,} characters over its command's arguments, script, env names and "
        "values and image (`MAX_PAYLOAD_CHARS`)",
        f"at most {MAX_COMMAND_ARGS:,} arguments of at most {MAX_ARG_CHARS:,} characters "
        "(`MAX_COMMAND_ARGS`, `MAX_ARG_CHARS`)",
        f"at most {MAX_ENV_VARS} (`MAX_ENV_VARS`)",
        f"a value at most {MAX_ARG_CHARS:,} characters",
        f"at most {MAX_IMAGE_CHARS:,} characters (`MAX_IMAGE_CHARS`)",
    ):
        assert phrase in SECTION, phrase


def test_fleetlog_schema_prints_the_new_fields() -> None:
    done = subprocess.run([sys.executable, "-m", "fleetlog.cli", "schema", "--compact"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=True)
    defs = json.loads(done.stdout)["$defs"]
    assert {"labels", "annotations", "payload"} <= set(defs["JobSubmitted"]["properties"])
    assert sorted(defs["JobPayload"]["properties"]) == ["command", "env", "image", "script"]
