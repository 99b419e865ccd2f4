"""The scale-out events (docs/scale-out.md): bounded and strictly validated at decode like every
event, and refused from outside producers — the ingest endpoint and the inputs log take inputs
only, so a ``JobDispatched`` a client sends never reaches a cell's fold."""

from __future__ import annotations

import json
import re

import msgspec
import pytest

from fleetlog.events import CellSummary, FreeSlots, JobDispatched, JobReturned, Resources, TenantUsage
from fleetlog.events.codec import JSON, InvalidEventError, decode, encode, envelope
from fleetlog.events.model import MAX_SUMMARY_ENTRIES, MAX_SUMMARY_TENANTS
from fleetlog.log.base import Record
from fleetlog.log.consumer import REASON_HEADER, EventConsumer
from fleetlog.log.memory import MemoryLogStore
from fleetlog.service.config import ServiceSettings
from fleetlog.service.ingest import IngestError, ingest_batch
from tests.events.samples import job


def rows(n: int) -> tuple[FreeSlots, ...]:
    """``n`` distinct rows, sorted by (gpu_model, gpus), with 253-character model names."""
    buckets = (0, 1, 2, 4, 8, 16, 32, 64)
    return tuple(FreeSlots(f"{i // 8:0>253}", buckets[i % 8], *[1 << 40] * 5) for i in range(n))


def tenants(n: int) -> tuple[TenantUsage, ...]:
    return tuple(TenantUsage(f"{i:0>253}", 1 << 40, 1 << 40, 64 * 1000 * 1_000_000) for i in range(n))


def summary(free: tuple[FreeSlots, ...] = (), usage: tuple[TenantUsage, ...] = ()) -> CellSummary:
    return CellSummary(
        cell="c" * 253,
        partition=65_535,
        seq=(1 << 63) - 1,
        as_of=(1 << 63) - 1,
        at_ms=1 << 53,
        total=Resources(),
        free=free,
        usage=usage,
    )


@pytest.mark.parametrize("fmt", ["msgpack", "json"])
def test_a_summary_at_its_size_bounds_decodes_and_one_row_past_them_is_refused(fmt: str) -> None:
    content_type = JSON if fmt == "json" else None
    full = summary(rows(MAX_SUMMARY_ENTRIES), tenants(MAX_SUMMARY_TENANTS))
    data = encode(envelope(full, "cell-0"), fmt)  # type: ignore[arg-type]
    assert decode(data, content_type).event == full
    past_rows = msgspec.structs.replace(full, free=rows(MAX_SUMMARY_ENTRIES + 1))
    with pytest.raises(InvalidEventError, match=r"length <= 1024 - at `\$.event.free`"):
        decode(encode(envelope(past_rows, "cell-0"), fmt), content_type)  # type: ignore[arg-type]
    past_tenants = msgspec.structs.replace(full, usage=tenants(MAX_SUMMARY_TENANTS + 1))
    with pytest.raises(InvalidEventError, match=r"length <= 4096 - at `\$.event.usage`"):
        decode(encode(envelope(past_tenants, "cell-0"), fmt), content_type)  # type: ignore[arg-type]


def _raw(event: dict[str, object]) -> bytes:
    return json.dumps({"schema_version": 1, "producer_id": "p", "event": event}).encode()


def _summary_doc(**changes: object) -> dict[str, object]:
    doc = msgspec.to_builtins(summary(rows(3)))
    doc.update(changes)
    return doc


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"free": [["A100", 1, 1, 1, 1], ["A100", 1, 2, 2, 2]]}, "sorted by \\(gpu_model, gpus\\)"),
        ({"free": [["B", 1, 1, 1, 1], ["A", 1, 1, 1, 1]]}, "sorted by \\(gpu_model, gpus\\)"),
        ({"free": [["A100", 3, 1, 1, 1]]}, "3 is not a bucket"),
        ({"usage": [["b", 1, 1, 1], ["a", 1, 1, 1]]}, "sorted by tenant"),
        ({"free": [["A100", 1, -1, 1, 1]]}, ">= 0"),
        ({"free": [["A100", 1, 1, 1, 1, -1]]}, ">= 0 - at `\\$.event.free\\[0\\]\\[5\\]`"),
        (
            {"free": [["A100", 1, 1, 1, 1, 1, (1 << 40) + 1]]},
            "<= 1099511627776 - at `\\$.event.free\\[0\\]\\[6\\]`",
        ),
        ({"free": [["A100", 1, 1, 1, 1, 1, 1, 1]]}, "at most length 7"),
        ({"seq": 0}, ">= 1"),
        ({"partition": 65_536}, "<= 65535 - at `\\$.event.partition`"),
    ],
)
def test_a_malformed_summary_is_refused_saying_what_is_wrong(changes: dict[str, object], says: str) -> None:
    with pytest.raises(InvalidEventError, match=says):
        decode(_raw(_summary_doc(**changes)), JSON)


@pytest.mark.parametrize("fmt", ["msgpack", "json"])
def test_a_free_row_written_before_the_node_bounds_decodes_without_them(fmt: str) -> None:
    """A summary of the earlier shape (five fields a row) decodes, its ``node_`` fields ``None``
    (the dispatcher then bounds the row by its totals: ``dispatch.row_of``); a row with them
    round-trips."""
    old = _summary_doc(free=[["A100", 1, 3, 96_000, 1024]])
    got = decode(_raw(old), JSON).event
    assert isinstance(got, CellSummary)
    assert got.free == (FreeSlots("A100", 1, 3, 96_000, 1024),)
    assert (got.free[0].node_cpu_milli, got.free[0].node_mem_mib) == (None, None)
    new = msgspec.structs.replace(summary(), free=(FreeSlots("A100", 1, 3, 96_000, 1024, 48_000, 512),))
    assert decode(encode(envelope(new, "p"), fmt), JSON if fmt == "json" else None).event == new  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("event", "path"),
    [
        (
            JobDispatched(
                job=msgspec.structs.replace(job(), job_id="j\u202e"), cell="a", attempt=1, seq=1, as_of=0
            ),
            "$.event.job.job_id",
        ),
        (JobDispatched(job=job(), cell="a b", attempt=1, seq=1, as_of=0), "$.event.cell"),
        (JobReturned(job_id="j", cell="a", attempt=1, reason="no\nroom", as_of=0), "$.event.reason"),
        (
            msgspec.structs.replace(
                summary(), free=(FreeSlots("A1", 1, 1, 1, 1), FreeSlots("A\u200b", 1, 1, 1, 1))
            ),
            "$.event.free[1][0]",
        ),
        (msgspec.structs.replace(summary(), usage=(TenantUsage("t\x00", 0, 0, 0),)), "$.event.usage[0][0]"),
    ],
)
@pytest.mark.parametrize("fmt", ["msgpack", "json"])
def test_every_identifier_of_a_shard_event_must_be_printable(event: object, path: str, fmt: str) -> None:
    data = encode(envelope(event, "p"), fmt)  # type: ignore[arg-type]
    with pytest.raises(InvalidEventError, match=re.escape(f"at `{path}`")):
        decode(data, JSON if fmt == "json" else None)


def test_attempts_are_bounded() -> None:
    doc = msgspec.to_builtins(JobDispatched(job=job(), cell="a", attempt=1, seq=1, as_of=0))
    doc["attempt"] = (1 << 20) + 1
    with pytest.raises(InvalidEventError, match="attempt"):
        decode(_raw(doc), JSON)


SHARD_SAMPLES = [
    JobDispatched(job=job(), cell="cell-a", attempt=1, seq=1, as_of=5),
    JobReturned(job_id="job-1", cell="cell-a", attempt=1, reason="no_fit", as_of=5),
    summary(rows(2)),
]


@pytest.mark.parametrize("event", SHARD_SAMPLES, ids=lambda e: type(e).__name__)
def test_the_ingest_endpoint_refuses_a_shard_event_from_a_producer(event: object) -> None:
    body = encode(envelope(event, "client"), "json")  # type: ignore[arg-type]
    with pytest.raises(IngestError) as caught:
        ingest_batch(body, "application/json", ServiceSettings())
    assert caught.value.reason == "not_an_input"
    assert type(event).__name__ in str(caught.value)


def test_the_inputs_log_parks_a_shard_event_and_keeps_the_rest() -> None:
    good = encode(envelope(job(), "client"))
    records = [Record(i, 1000 + i, encode(envelope(e, "x"))) for i, e in enumerate(SHARD_SAMPLES)]
    records.append(Record(len(records), 2000, good))
    events, bad = EventConsumer(MemoryLogStore(), warn=False).split(records)
    assert [d.envelope.event for d in events] == [job()]
    assert [dict(m.headers)[REASON_HEADER] for m in bad] == [b"invalid_event"] * 3
