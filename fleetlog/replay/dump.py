"""``dump``: any range of a log as JSON lines — offset, log time, key, headers, and the decoded
event or, for a record that does not decode, the error (so a corrupt record is shown, not hidden).
A submission of a job id submitted before carries ``"note": "duplicate, ignored: …"``: the
scheduler's fold keeps the first submission of a job id and ignores the others."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec

from fleetlog.events.codec import CONTENT_TYPE_HEADER, BadEventError, decode
from fleetlog.events.model import JobSubmitted
from fleetlog.log.base import INPUTS, LOG_NAMES, Record
from fleetlog.replay.source import ReplayError, Source, end_offset, read


def record_json(record: Record) -> dict[str, Any]:
    out: dict[str, Any] = {
        "offset": record.offset,
        "timestamp_ms": record.timestamp_ms,
        "key": record.key.decode("utf-8", "replace") if record.key is not None else None,
        "headers": {k: v.decode("utf-8", "replace") for k, v in record.headers},
    }
    try:
        env = decode(record.value, record.header(CONTENT_TYPE_HEADER))
    except BadEventError as exc:
        out["error"] = {"reason": exc.reason, "message": exc.message, "bytes": len(record.value)}
        return out
    out["producer_id"], out["event"] = env.producer_id, msgspec.to_builtins(env.event)
    return out


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
