"""Job metadata at ingest (issue 46, "Metadata"): a job just past the per-job bound is refused
with ``invalid_event`` naming the fields and the bound, one at it is taken; a tenant's labels and
annotations are bounded in all (``max_metadata_bytes_per_tenant``), counting the jobs accepted but
not folded yet, and the next job past it is refused 429 naming the tenant and the bound — other
tenants, and the tenant's jobs without metadata, still go in."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from fleetlog.core.fold import fold
from fleetlog.core.state import State, held_bytes
from fleetlog.events import JobSubmitted
from fleetlog.events.model import MAX_JOB_METADATA_BYTES, metadata_bytes
from fleetlog.service.metadata import metadata_refusal
from tests.core.builders import job, node
from tests.service.test_service import events_body, serving

LABELS = {f"l{i:02d}": "v" * 100 for i in range(64)}  # 64 x 103 bytes: 6,592


def dressed(job_id: str, tenant: str, note_bytes: int) -> JobSubmitted:
    """A job of ``tenant`` with the 64 labels above and one annotation ``n`` making its metadata
    ``6,592 + 1 + note_bytes`` bytes."""
    return msgspec.structs.replace(job(job_id, tenant=tenant), labels=dict(LABELS),
                                   annotations={"n": "é" * (note_bytes // 2) + "x" * (note_bytes % 2)})


def submission(tenant: str, job_id: str, note_bytes: int) -> bytes:
    """A JSON ingest body of one job (the envelope written by hand: past the bound, the event
    could not be built)."""
    event = {"type": "JobSubmitted", "job_id": job_id, "tenant": tenant,
             "task_groups": [{"count": 1, "cpu_milli": 1000, "mem_mib": 1024}], "labels": LABELS,
             "annotations": {"n": "é" * (note_bytes // 2) + "x" * (note_bytes % 2)}}
    return json.dumps([{"schema_version": 1, "producer_id": "p", "event": event}]).encode()


async def test_a_job_just_past_the_metadata_bound_is_refused_naming_it(tmp_path: Path) -> None:
    at_bound = MAX_JOB_METADATA_BYTES - 6_592 - 1  # (the annotation's key: 1 byte)
    biggest = dressed("x", "t", at_bound)
    assert metadata_bytes(biggest.labels, biggest.annotations) == 16_384
    async with serving(tmp_path / "log") as running:
        status, answer = await running.request("/v1/events", submission("t1", "over", at_bound + 1))
        assert (status, answer["code"]) == (400, "invalid_event"), answer
        assert "labels and annotations hold at most 16384 bytes" in answer["message"], answer
        assert "not 16385" in answer["message"]
        assert answer["field"] == "event", answer
        status, answer = await running.request("/v1/events", submission("t1", "at", at_bound))
        assert status == 200, answer


async def test_a_tenant_past_its_metadata_bound_is_refused_and_the_others_go_on(tmp_path: Path) -> None:
    one = held_bytes(dressed("x", "a", 5_000).labels, dressed("x", "a", 5_000).annotations)
    limit = 3 * one + 10
    async with serving(tmp_path / "log", max_metadata_bytes_per_tenant=limit) as running:
        assert (await running.request("/v1/events", events_body(node("n1"))))[0] == 200
        body = events_body(dressed("a1", "a", 5_000), dressed("a2", "a", 5_000))
        assert (await running.request("/v1/events", body))[0] == 200
        await running.until(lambda: running.service.loop is not None
                            and running.service.loop.state.metadata_bytes("a") == 2 * one)
        both = events_body(dressed("a3", "a", 5_000), dressed("a4", "a", 0))  # (a request counts whole)
        assert (await running.request("/v1/events", both))[0] == 429
        third = events_body(dressed("a3", "a", 5_000 + 10))  # (fits to the byte: the 10 to spare)
        assert (await running.request("/v1/events", third))[0] == 200
        status, answer = await running.request("/v1/events", events_body(dressed("a4", "a", 0)))
        assert status == 429, answer
        assert answer["code"] == "too_much_metadata"
        assert (answer["tenant"], answer["bound"]) == ("a", "max_metadata_bytes_per_tenant")
        assert (answer["held"], answer["limit"]) == (limit, limit)
        assert "tenant 'a'" in answer["message"]
        assert "max_metadata_bytes_per_tenant" in answer["message"]
        for other in (job("a5", tenant="a"), dressed("b1", "b", 5_000)):  # no metadata; another tenant
            status, answer = await running.request("/v1/events", events_body(other))
            assert status == 200, answer
        await running.until(lambda: running.service.loop is not None
                            and running.service.loop.state.metadata_bytes("a") == limit)


def test_jobs_accepted_but_not_folded_count_toward_the_bound() -> None:
    """What ingest appended and the loop has not folded yet is counted beside the state's: a
    burst of requests cannot pass the bound before the fold catches up."""
    state = State()
    fold(state, dressed("a0", "a", 5_000), 1)
    one = held_bytes(LABELS, {"n": "é" * 2_500})
    unfolded = {"a1": dressed("a1", "a", 5_000), "b1": dressed("b1", "b", 5_000)}
    assert metadata_refusal(state, unfolded, [dressed("a2", "a", 5_000)], 3 * one) is None
    refused = metadata_refusal(state, unfolded, [dressed("a2", "a", 5_000)], 3 * one - 1)
    assert refused is not None
    assert refused.status == 429
    answer = json.loads(refused.body)
    assert (answer["code"], answer["held"], answer["limit"]) == ("too_much_metadata", 2 * one, 3 * one - 1)
    assert metadata_refusal(state, unfolded, [job("a3", tenant="a")], 1) is None  # (no metadata)
