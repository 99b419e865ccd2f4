"""``dump``: any range of a log as JSON lines — offset, log time, key, headers, and the decoded
event or, for a record that does not decode, the error (so a corrupt record is shown, not hidden).

``key`` is the envelope's idempotency key (what a producer set and the fold deduplicates on); a
record key that differs from it (Kafka's partitioning key) is shown as ``record_key``.  Structs the
wire format packs as arrays (``TaskPlacement``) are shown as objects with field names: a dump is
for people and ``jq``, not for sending back.
A dispatcher's step record (the global shard's decisions log) is shown as ``step``: its as_of,
digest, dispatches, forwarded cancellations and changed reasons.
A submission of a job id submitted before carries ``"note": "duplicate, ignored: …"``: the
scheduler's fold keeps the first submission of a job id and ignores the others."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec

from fleetlog.core.dispatch_log import StepRecordError, decode_record
from fleetlog.events.codec import CONTENT_TYPE_HEADER, BadEventError, decode
from fleetlog.events.model import JobSubmitted
from fleetlog.log.base import INPUTS, LOG_NAMES, Record
from fleetlog.replay.source import ReplayError, Source, end_offset, read

STEP_HEADER = "fleetlog-record"
"""The header of the dispatcher's step records (``dispatch-step``): not event envelopes."""


def record_json(record: Record) -> dict[str, Any]:
    record_key = record.key.decode("utf-8", "replace") if record.key is not None else None
    out: dict[str, Any] = {
        "offset": record.offset,
        "timestamp_ms": record.timestamp_ms,
        "key": record_key,
        "headers": {k: v.decode("utf-8", "replace") for k, v in record.headers},
    }
    if record.header(STEP_HEADER) == b"dispatch-step":  # the dispatcher's decisions log (global shard)
        try:
            out["step"] = as_objects(decode_record(record.value))
        except StepRecordError as exc:
            out["error"] = {"reason": "invalid_step_record", "message": str(exc), "bytes": len(record.value)}
        return out
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
    submitted = await _submitted_before(source, start) if log == INPUTS else {}
    while at < stop:
        records = await read(source.store, log, at, min(10_000, stop - at))
        if not records:
            return
        for record in records:
            if record.offset >= stop:
                return
            yield _mark_duplicate(record_json(record), submitted) if log == INPUTS else record_json(record)
        at = records[-1].offset + 1


async def _submitted_before(source: Source, start: int) -> dict[str, int]:
    """Job id -> the inputs offset of its (first, folded) submission, for the inputs before ``start``."""
    if start == 0:
        return {}
    from fleetlog.replay.state_at import Point, state_at  # noqa: PLC0415 - the fold: only past offset 0

    state = (await state_at(source, Point(offset=start))).state
    seq = state.jobs.cols["seq"]
    return {name: int(seq[row]) for name, row in state.names["job"].ids.items()}


def _mark_duplicate(line: dict[str, Any], submitted: dict[str, int]) -> dict[str, Any]:
    """Note a submission of a job id the fold already knows (it ignores it), else remember it."""
    event = line.get("event")
    if not isinstance(event, dict) or event.get("type") != _SUBMITTED:
        return line
    job_id = str(event.get("job_id"))
    first = submitted.setdefault(job_id, line["offset"])
    if first != line["offset"]:
        line["note"] = f"duplicate, ignored: job {job_id!r} was first submitted at inputs offset {first}"
    return line


_SUBMITTED = JobSubmitted.__struct_config__.tag
