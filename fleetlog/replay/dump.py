"""``dump``: any range of a log as JSON lines — offset, log time, key, headers, and the decoded
event or, for a record that does not decode, the error (so a corrupt record is shown, not hidden).

``key`` is the envelope's idempotency key (what a producer set and the fold deduplicates on); a
record key that differs from it (Kafka's partitioning key) is shown as ``record_key``.  Structs the
wire format packs as arrays (``TaskPlacement``) are shown as objects with field names: a dump is
for people and ``jq``, not for sending back."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec

from fleetlog.events.codec import CONTENT_TYPE_HEADER, BadEventError, decode
from fleetlog.log.base import LOG_NAMES, Record
from fleetlog.replay.source import ReplayError, Source, end_offset, read


def record_json(record: Record) -> dict[str, Any]:
    record_key = record.key.decode("utf-8", "replace") if record.key is not None else None
    out: dict[str, Any] = {
        "offset": record.offset,
        "timestamp_ms": record.timestamp_ms,
        "key": record_key,
        "headers": {k: v.decode("utf-8", "replace") for k, v in record.headers},
    }
    try:
        env = decode(record.value, record.header(CONTENT_TYPE_HEADER))
    except BadEventError as exc:
        out["error"] = {"reason": exc.reason, "message": exc.message, "bytes": len(record.value)}
        return out
    if env.key is not None:
        out["key"] = env.key
        if record_key is not None and record_key != env.key:
            out = _after_key(out, record_key)
    out["producer_id"], out["event"] = env.producer_id, as_objects(env.event)
    return out


def _after_key(out: dict[str, Any], record_key: str) -> dict[str, Any]:
    """``out`` with ``record_key`` right after ``key``."""
    head = {k: v for k, v in out.items() if k in ("offset", "timestamp_ms", "key")}
    return head | {"record_key": record_key} | {k: v for k, v in out.items() if k not in head}


def as_objects(value: Any) -> Any:
    """``msgspec.to_builtins(value)``, except that array-like structs become objects too."""
    if isinstance(value, msgspec.Struct):
        plain = msgspec.to_builtins(value)
        if value.__struct_config__.array_like:
            return {name: as_objects(getattr(value, name)) for name in value.__struct_fields__}
        fields = value.__struct_fields__
        return {k: as_objects(getattr(value, k)) if k in fields else v for k, v in plain.items()}
    if isinstance(value, (list, tuple)):
        return [as_objects(v) for v in value]
    if isinstance(value, dict):
        return {msgspec.to_builtins(k): as_objects(v) for k, v in value.items()}
    return msgspec.to_builtins(value)


async def dump(
    source: Source, log: str, start: int = 0, stop: int | None = None
) -> AsyncIterator[dict[str, Any]]:
    """Records ``start`` to ``stop`` (excluded; ``None``: the end) of log ``log``."""
    if log not in LOG_NAMES:
        raise ReplayError(f"unknown log {log!r}; choose one of {', '.join(LOG_NAMES)}")
    end = await end_offset(source.store, log)
    stop = end if stop is None else stop
    if not 0 <= start <= end or stop < start or stop > end:
        raise ReplayError(f"range {start}..{stop} is out of range: the {log} log has offsets 0 to {end}")
    at = start
    while at < stop:
        records = await read(source.store, log, at, min(10_000, stop - at))
        if not records:
            return
        for record in records:
            if record.offset >= stop:
                return
            yield record_json(record)
        at = records[-1].offset + 1
