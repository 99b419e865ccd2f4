"""JSON Schema of the envelope and every event, for producers in any language."""

from __future__ import annotations

from typing import Any

import msgspec

from fleetlog.events.model import EVENT_TYPES, SCHEMA_VERSION, Envelope


def json_schema() -> dict[str, Any]:
    """One JSON Schema document: the envelope at the root, every event under ``$defs``."""
    (root,), components = msgspec.json.schema_components([Envelope], ref_template="#/$defs/{name}")
    schema: dict[str, Any] = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://fleetlog.dev/schema/v{SCHEMA_VERSION}/envelope.json",
        "title": f"fleetlog event envelope, schema version {SCHEMA_VERSION}",
        **root,
        "$defs": dict(sorted(components.items())),
    }
    schema["x-fleetlog-event-types"] = [t.__name__ for t in EVENT_TYPES]
    return schema
