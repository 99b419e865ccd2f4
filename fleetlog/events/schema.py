"""JSON Schema of the envelope and every event, for producers in any language.

The root is what a producer may send: an envelope whose event is an *input* (exactly one of the
input types); a decision batch is the scheduler's alone, so the root refuses it as the service
does.  Readers of the decisions log validate against ``$defs/DecisionEnvelope``; the scale-out
events shards write for each other against ``$defs/ShardEnvelope``.

The cross-field rules a JSON Schema can say are stated (``if``/``then`` on ``TaskGroup`` and
``NodeHeartbeat``, ``not``/``prefixItems`` on ``JobPayload``); the rest — a job's tasks summed
over its groups, a job's annotations and payload summed, an event's encoded size,
JSON keys repeated, nesting depth — are listed in ``x-fleetlog-rules-not-in-schema`` and in
docs/events.md, next to each other.
"""

from __future__ import annotations

import copy
from typing import Any, Final

import msgspec

from fleetlog.events.model import (
    EVENT_TYPES,
    INPUT_TYPES,
    MAX_ANNOTATION_CHARS,
    MAX_JOB_METADATA_BYTES,
    MAX_PAYLOAD_CHARS,
    MAX_TASKS_PER_JOB,
    SCHEMA_VERSION,
    SHARD_TYPES,
    DecisionBatch,
    Envelope,
)

_GPU_RULES: Final[list[dict[str, Any]]] = [
    {  # no GPU: no share of one (an absent gpu_count is 0)
        "if": {"properties": {"gpu_count": {"const": 0}}},
        "then": {"properties": {"gpu_milli": {"const": 0}}},
    },
    {  # GPUs: a share of each, 1..1000
        "if": {"properties": {"gpu_count": {"minimum": 1}}, "required": ["gpu_count"]},
        "then": {"properties": {"gpu_milli": {"minimum": 1}}, "required": ["gpu_milli"]},
    },
    {  # several GPUs: whole ones
        "if": {"properties": {"gpu_count": {"minimum": 2}}, "required": ["gpu_count"]},
        "then": {"properties": {"gpu_milli": {"const": 1000}}, "required": ["gpu_milli"]},
    },
]
_NODE_RULES: Final[list[dict[str, Any]]] = [
    {  # a node with GPUs names their model
        "if": {"properties": {"gpu_count": {"minimum": 1}}, "required": ["gpu_count"]},
        "then": {"properties": {"gpu_model": {"minLength": 1}}, "required": ["gpu_model"]},
    },
]
_REQUIREMENT_RULES: Final[list[dict[str, Any]]] = [
    {  # In, NotIn: at least one value
        "if": {"properties": {"operator": {"enum": ["In", "NotIn"]}}},
        "then": {"properties": {"values": {"minItems": 1}}, "required": ["values"]},
    },
    {  # Exists, DoesNotExist: none
        "if": {"properties": {"operator": {"enum": ["Exists", "DoesNotExist"]}}},
        "then": {"properties": {"values": {"maxItems": 0}}},
    },
]
_TOLERATION_RULES: Final[list[dict[str, Any]]] = [
    {  # Exists takes no value
        "if": {"properties": {"operator": {"const": "Exists"}}, "required": ["operator"]},
        "then": {"properties": {"value": {"maxLength": 0}}},
    },
    {  # an empty (or absent) key matches every taint: only with Exists
        "if": {"anyOf": [{"not": {"required": ["key"]}}, {"properties": {"key": {"maxLength": 0}}}]},
        "then": {"properties": {"operator": {"const": "Exists"}}, "required": ["operator"]},
    },
]
_PAYLOAD_RULES: Final[list[dict[str, Any]]] = [
    {  # a command or a script, not both
        "not": {"properties": {"command": {"minItems": 1}, "script": {"minLength": 1}},
                "required": ["command", "script"]},
    },
    {  # a command's program is named, and not as an option
        "properties": {"command": {"prefixItems": [{"minLength": 1, "pattern": "^[^-]"}]}},
    },
]
NOT_IN_SCHEMA: Final = (
    f"JobSubmitted: at most {MAX_TASKS_PER_JOB} tasks summed over its task_groups (reason invalid_event)",
    f"JobSubmitted: annotations at most {MAX_ANNOTATION_CHARS} characters, keys and values together "
    "(reason invalid_event)",
    f"JobSubmitted: labels and annotations at most {MAX_JOB_METADATA_BYTES} bytes of UTF-8, keys and values "
    "together (reason invalid_event)",
    f"JobPayload: at most {MAX_PAYLOAD_CHARS} characters over its command, script, env names and values "
    "and image (reason invalid_event)",
    "an encoded envelope is at most 4 MiB (reason too_large)",
    "JSON object keys are unique (reason duplicate_key)",
    "arrays and objects nest no deeper than an event does (reason too_deep)",
    "the ingest endpoint takes input events only; a decision or a shard event (JobDispatched, "
    "JobReturned, CellSummary) is refused (reason not_an_input); so is a Tick: the scheduler appends its own",
    "CellSummary: free sorted by (gpu_model, gpus) without repeats, gpus a bucket (0, 1, 2, 4, 8, 16, "
    "32, 64); usage sorted by tenant without repeats (reason invalid_event)",
    "a job id is submitted once: the same spec again is an idempotent duplicate, another spec is "
    "refused by the service (reason already_exists)",
)
"""Rules the codec or the service enforce that the schema cannot state (docs/events.md)."""


def json_schema() -> dict[str, Any]:
    """One JSON Schema document: the input envelope at the root, every event under ``$defs``."""
    (root,), components = msgspec.json.schema_components([Envelope], ref_template="#/$defs/{name}")
    defs = dict(sorted(components.items()))
    _add_rules(defs)
    _split_envelopes(defs)
    schema: dict[str, Any] = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://fleetlog.dev/schema/v{SCHEMA_VERSION}/envelope.json",
        "title": f"fleetlog input envelope, schema version {SCHEMA_VERSION}",
        **root,
        "$defs": defs,
    }
    schema["x-fleetlog-event-types"] = [t.__name__ for t in EVENT_TYPES]
    schema["x-fleetlog-input-types"] = [t.__name__ for t in INPUT_TYPES]
    schema["x-fleetlog-decision-envelope"] = "#/$defs/DecisionEnvelope"
    schema["x-fleetlog-shard-types"] = [t.__name__ for t in SHARD_TYPES]
    schema["x-fleetlog-shard-envelope"] = "#/$defs/ShardEnvelope"
    schema["x-fleetlog-rules-not-in-schema"] = list(NOT_IN_SCHEMA)
    return schema


def _add_rules(defs: dict[str, Any]) -> None:
    defs["TaskGroup"]["allOf"] = copy.deepcopy(_GPU_RULES)
    defs["NodeHeartbeat"]["allOf"] = copy.deepcopy(_NODE_RULES)
    defs["NodeSelectorRequirement"]["allOf"] = copy.deepcopy(_REQUIREMENT_RULES)
    defs["Toleration"]["allOf"] = copy.deepcopy(_TOLERATION_RULES)
    defs["JobPayload"]["allOf"] = copy.deepcopy(_PAYLOAD_RULES)


def _split_envelopes(defs: dict[str, Any]) -> None:
    """``Envelope``: an input event, exactly one type; ``DecisionEnvelope``: a decision batch;
    ``ShardEnvelope``: a scale-out event one shard writes for another."""
    envelope = defs["Envelope"]
    decisions = copy.deepcopy(envelope)
    inputs = [t.__name__ for t in INPUT_TYPES]
    envelope["properties"]["event"] = {
        "oneOf": [{"$ref": f"#/$defs/{name}"} for name in inputs],
        "discriminator": {"propertyName": "type", "mapping": {n: f"#/$defs/{n}" for n in inputs}},
    }
    envelope["description"] += "\n\nThe event is an input: decisions are written by the scheduler alone."
    decisions["title"] = "DecisionEnvelope"
    decisions["description"] = "An envelope of the decisions log: the scheduler writes it, never a producer."
    decisions["properties"]["event"] = {"$ref": f"#/$defs/{DecisionBatch.__name__}"}
    defs["DecisionEnvelope"] = decisions
    shard = copy.deepcopy(decisions)
    names = [t.__name__ for t in SHARD_TYPES]
    shard["title"] = "ShardEnvelope"
    shard["description"] = ("An envelope of a scale-out event: fleetlog's dispatcher and cell shards "
                            "write it for each other, never a producer (docs/scale-out.md).")
    shard["properties"]["event"] = {
        "oneOf": [{"$ref": f"#/$defs/{name}"} for name in names],
        "discriminator": {"propertyName": "type", "mapping": {n: f"#/$defs/{n}" for n in names}},
    }
    defs["ShardEnvelope"] = shard
