"""``fleetlog schema`` states the cross-field rules the service enforces: checked with a real JSON
Schema validator (jsonschema) against the service's own ingest decoding, on generated envelopes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetlog.events.model import MAX_TASKS_PER_JOB
from fleetlog.events.schema import json_schema
from fleetlog.service.config import ServiceSettings
from fleetlog.service.ingest import IngestError, ingest_batch

ROOT = Path(__file__).resolve().parents[2]
VALIDATOR = jsonschema.Draft202012Validator(json_schema())
ABSENT = object()


def _present(**fields: object) -> dict[str, object]:
    return {k: v for k, v in fields.items() if v is not ABSENT}


def wrapped(event: dict[str, Any]) -> dict[str, Any]:
    return {"schema_version": 1, "producer_id": "p", "event": event}


def service_accepts(doc: dict[str, Any]) -> bool:
    """What ``POST /v1/events`` does with ``doc``: the service's own decoding and checks."""
    try:
        ingest_batch(json.dumps(doc).encode(), "application/json", ServiceSettings())
    except IngestError:
        return False
    return True


def group(gpu_count: object = ABSENT, gpu_milli: object = ABSENT, count: int = 1) -> dict[str, Any]:
    found: dict[str, Any] = {"count": count, "cpu_milli": 1000, "mem_mib": 1024}
    if gpu_count is not ABSENT:
        found["gpu_count"] = gpu_count
    if gpu_milli is not ABSENT:
        found["gpu_milli"] = gpu_milli
    return found


def job(*groups: dict[str, Any]) -> dict[str, Any]:
    return wrapped({"type": "JobSubmitted", "job_id": "j", "tenant": "t", "task_groups": list(groups)})


def preferring(weight: object, term: object = ABSENT) -> dict[str, Any]:
    """A task group with one soft affinity term of ``weight`` (on ``term``, else zone In a)."""
    if term is ABSENT:
        term = {"match_expressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    return {**group(), "preferred_affinity": [_present(weight=weight, preference=term)]}


def spread(level: object) -> dict[str, Any]:
    doc = job(group(count=2))
    doc["event"]["spread"] = level
    return doc


def node(gpu_count: object = ABSENT, gpu_model: object = ABSENT) -> dict[str, Any]:
    found: dict[str, Any] = {"type": "NodeHeartbeat", "cell": "c", "node": "n", "cpu_milli": 1, "mem_mib": 1}
    if gpu_count is not ABSENT:
        found["gpu_count"] = gpu_count
    if gpu_model is not ABSENT:
        found["gpu_model"] = gpu_model
    return wrapped(found)


REFUSED_BY_BOTH = [
    pytest.param(wrapped({"type": "DecisionBatch", "as_of": 0, "digest": ""}), id="decision-as-input"),
    pytest.param(job(group(2, 500)), id="several-gpus-fractional"),
    pytest.param(job(group(ABSENT, 500)), id="gpu-milli-without-gpus"),
    pytest.param(job(group(0, 1)), id="gpu-milli-with-zero-gpus"),
    pytest.param(job(group(1, 0)), id="gpus-without-share"),
    pytest.param(job(group(1)), id="gpus-share-absent"),
    pytest.param(job(group(64, 999)), id="64-gpus-not-whole"),
    pytest.param(node(2), id="node-gpus-without-model"),
    pytest.param(node(1, ""), id="node-gpus-empty-model"),
    pytest.param(job(preferring(0)), id="preferred-weight-0"),
    pytest.param(job(preferring(101)), id="preferred-weight-101"),
    pytest.param(job(preferring(ABSENT)), id="preferred-weight-absent"),
    pytest.param(job(preferring(1, {"match_expressions": []})), id="preferred-empty-term"),
    pytest.param(spread("rack"), id="spread-rack"),
    pytest.param(spread(""), id="spread-empty"),
]


@pytest.mark.parametrize("doc", REFUSED_BY_BOTH)
def test_the_schema_refuses_what_the_service_refuses(doc: dict[str, Any]) -> None:
    assert not service_accepts(doc)
    assert not VALIDATOR.is_valid(doc)


@pytest.mark.parametrize(
    "doc",
    [
        pytest.param(job(group(2, 1000), group(1, 1), group(ABSENT, 0), group()), id="gpu-shapes"),
        pytest.param(job(group(64, 1000), group(1, 1000), group(0, 0)), id="at-the-limits"),
        pytest.param(node(), id="cpu-node"),
        pytest.param(node(8, "A100"), id="gpu-node"),
        pytest.param(node(0, ""), id="no-gpus-no-model"),
        pytest.param(job(preferring(1), preferring(100)), id="preferred-weights-1-and-100"),
        pytest.param(spread("host"), id="spread-host"),
        pytest.param(spread(None), id="spread-null"),
    ],
)
def test_the_schema_takes_what_the_service_takes(doc: dict[str, Any]) -> None:
    assert service_accepts(doc)
    assert VALIDATOR.is_valid(doc), list(VALIDATOR.iter_errors(doc))


GPU_COUNTS = st.sampled_from([ABSENT, 0, 1, 2, 8, 64, 65, -1])
GPU_MILLIS = st.sampled_from([ABSENT, 0, 1, 250, 999, 1000, 1001, -1])


@settings(max_examples=300, deadline=None)
@given(
    groups=st.lists(st.tuples(GPU_COUNTS, GPU_MILLIS, st.integers(1, 100)), min_size=1, max_size=3),
    nodes=st.tuples(GPU_COUNTS, st.sampled_from([ABSENT, "", "H100"])),
)
def test_schema_and_service_agree_on_generated_envelopes(
    groups: list[tuple[object, object, int]], nodes: tuple[object, object]
) -> None:
    """Every generated envelope the service accepts validates, and every one it refuses does
    not (the sum of tasks over groups, which no JSON Schema can state, kept within its limit)."""
    for doc in (job(*(group(c, m, n) for c, m, n in groups)), node(*nodes)):
        assert VALIDATOR.is_valid(doc) == service_accepts(doc), doc


def test_what_the_schema_cannot_say_is_listed_and_documented() -> None:
    """A job of 2 x 6,000 tasks passes the schema and not the service: the rule is named in the
    schema's ``x-fleetlog-rules-not-in-schema`` and in docs/events.md."""
    doc = job(group(count=6000), group(count=6000))
    assert VALIDATOR.is_valid(doc)
    assert not service_accepts(doc)
    rules = json_schema()["x-fleetlog-rules-not-in-schema"]
    assert any(f"at most {MAX_TASKS_PER_JOB} tasks summed" in rule for rule in rules)
    docs = (ROOT / "docs" / "events.md").read_text()
    for reason in ("not_an_input", "already_exists", "too_deep", "duplicate_key", "too_large"):
        assert reason in docs


def test_the_schema_command_prints_what_is_validated_here() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fleetlog.cli", "schema", "--compact"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    schema = json.loads(done.stdout)
    jsonschema.Draft202012Validator.check_schema(schema)
    assert not jsonschema.Draft202012Validator(schema).is_valid(job(group(2, 500)))


MAYBE = st.sampled_from([ABSENT, "", "k", "nvidia.com/gpu"])


@settings(max_examples=300, deadline=None)
@given(
    key=MAYBE,
    operator=st.sampled_from([ABSENT, "Equal", "Exists", "Bogus"]),
    value=st.sampled_from([ABSENT, "", "v"]),
    effect=st.sampled_from([ABSENT, "", "NoSchedule", "NoExecute", "Never"]),
    req_op=st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist", "Gt"]),
    values=st.sampled_from([ABSENT, [], ["a"], ["a", "b"]]),
    weight=st.sampled_from([ABSENT, -1, 0, 1, 50, 100, 101, 1.5, "1", None]),
    level=st.sampled_from([ABSENT, None, "host", "rack", "block", "", "Host", 1]),
)
def test_schema_and_service_agree_on_generated_constraints(
    key: object,
    operator: object,
    value: object,
    effect: object,
    req_op: str,
    values: object,
    weight: object,
    level: object,
) -> None:
    """Tolerations (empty key only with Exists, Exists without a value), affinity requirements
    (In/NotIn with values, Exists/DoesNotExist without), soft affinity (a weight 1..100, given,
    and a term of such requirements) and a job's spread (``"host"`` or null): the schema says
    what the service does."""
    toleration = _present(key=key, operator=operator, value=value, effect=effect)
    requirement = _present(key="zone", operator=req_op, values=values)
    for extra in (
        {"tolerations": [toleration]},
        {"node_affinity": [{"match_expressions": [requirement]}]},
        {"node_selector": [{"key": "zone", "value": "a"}], "node_affinity": []},
        {"preferred_affinity": [_present(weight=weight, preference={"match_expressions": [requirement]})]},
    ):
        doc = job({**group(), **extra})
        assert VALIDATOR.is_valid(doc) == service_accepts(doc), doc
    doc = job(group(count=2))
    doc["event"] |= _present(spread=level)
    assert VALIDATOR.is_valid(doc) == service_accepts(doc), doc
