"""The scheduler ignores a job's labels, annotations and payload (docs/events.md, "Labels,
annotations and payload"): the fold, its digest, its snapshot and ``decide`` are those of the same
log without them; the dispatcher hands the whole submission on (payload included) and its
snapshot keeps it; a running service parks a hostile producer's records past the bounds in the
dead letters and goes on; and a resend that differs only in them is a duplicate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from fleetlog.core import dispatch as d
from fleetlog.core.decide import decide
from fleetlog.core.digest import digest, restore, snapshot
from fleetlog.core.dispatch import CellMap, DispatchState
from fleetlog.core.dispatch_log import restore_state, snapshot_state
from fleetlog.core.fold import fold
from fleetlog.core.fold_batch import fold_lists
from fleetlog.core.policy import Policy
from fleetlog.core.state import State
from fleetlog.events import DecisionBatch, Event, JobPayload, JobSubmitted, encode, envelope
from fleetlog.events.codec import JSON
from fleetlog.log.base import DEAD_LETTERS, INPUTS, Message
from fleetlog.log.consumer import REASON_HEADER, SOURCE_HEADER
from fleetlog.log.file import FileLogStore
from tests.core.builders import job, node
from tests.core.test_dispatch import summary
from tests.service.test_service import Running, embedded, events_body, serving, start

PAYLOAD = JobPayload(
    command=("python", "train.py", "it's", "$(rm -rf /)"),
    env={"A": "b", "PATH": "/opt/bin"},
    image="registry/img:1",
)


def dressed(event: JobSubmitted, i: int) -> JobSubmitted:
    """``event`` with labels, annotations and a payload (different per job)."""
    return msgspec.structs.replace(
        event,
        labels={"team": f"t{i % 3}", "run": str(i)},
        annotations={"note": f"job {i}\nwith 'text'"},
        payload=msgspec.structs.replace(PAYLOAD, env={"I": str(i)}),
    )


def logs() -> tuple[list[Event], list[Event]]:
    """A log of nodes and jobs, and the same log with every job dressed."""
    plain: list[Event] = [node(f"n{i}") for i in range(4)]
    plain += [job(f"j{i}", tasks=1 + i % 3, gpus=1 + i % 4) for i in range(40)]
    dressed_log = [dressed(e, i) if isinstance(e, JobSubmitted) else e for i, e in enumerate(plain)]
    return plain, dressed_log


def folded(events: list[Event], batched: bool) -> tuple[State, list[object]]:
    """Fold ``events`` (one by one, or as the service's batched fold does), decide, fold the
    decisions; the state and the decisions."""
    state = State()
    times = list(range(1, len(events) + 1))
    if batched:
        fold_lists(state, events, times)
    else:
        for event, at in zip(events, times, strict=True):
            fold(state, event, at)
    decisions = tuple(decide(state, Policy()))
    fold(state, DecisionBatch(as_of=state.offset, digest="", decisions=decisions), state.now_ms)
    return state, list(decisions)


def test_the_fold_digest_snapshot_and_decisions_ignore_labels_annotations_and_payload() -> None:
    """Nothing a decision reads changes; the state keeps the labels and annotations (for the read
    API: ``State.job_meta``) and its snapshot carries them, under one key of their own."""
    plain, dressed_log = logs()
    kept = []
    for batched in (False, True):
        bare, bare_decisions = folded(plain, batched)
        full, full_decisions = folded(dressed_log, batched)
        assert full_decisions == bare_decisions
        assert digest(full) == digest(bare)
        without = msgspec.msgpack.decode(snapshot(full))
        assert without["scalars"].pop("job_meta")
        assert "job_meta" not in msgspec.msgpack.decode(snapshot(bare))["scalars"]
        assert msgspec.msgpack.encode(without) == snapshot(bare)
        assert bare.job_meta == {}
        j7 = full.job_row("j7")  # (event 11 of the log: dressed as the 11th)
        assert full.job_meta[j7] == ({"team": "t2", "run": "11"}, {"note": "job 11\nwith 'text'"})
        assert restore(snapshot(full)).job_meta == full.job_meta
        kept.append(full.job_meta)
    assert kept[0] == kept[1]  # the batched fold keeps what the plain one keeps


def test_the_dispatcher_hands_on_the_whole_submission_and_its_snapshot_keeps_it() -> None:
    state = DispatchState(CellMap((("c000", 0),)))
    submitted = dressed(job("g1", gpus=1), 7)
    for event in (summary("c000", 1), submitted):
        assert d.fold(state, event, state.now_ms + 10) == ""
    restored = restore_state(snapshot_state(state))
    assert restored.jobs["g1"].spec == submitted
    assert snapshot_state(restored) == snapshot_state(state)  # the same bytes: deterministic
    (sent,) = d.dispatch(state).dispatched
    assert sent.job == submitted
    assert sent.job.payload == submitted.payload


# --- a running service: hostile records parked, the next ones folded --------------------------

BAD = [  # what a hostile producer writes straight to the log, past a bound each
    {"labels": {f"k{i}": "v" for i in range(65)}},
    {"labels": {"k": "two words"}},
    {"annotations": {"k": "v" * 65_536}},
    {"payload": {"command": ["p", "a\u0000b"]}},
    {"payload": {"env": {"A;rm -rf /": "x"}}},
    {"payload": {"script": "echo no interpreter"}},
    {"payload": {"command": ["p"], "script": "#!/bin/sh\n"}},
    {"payload": {"command": ["p", *["a" * 32_000] * 9]}},
]


def bad_record(i: int, fields: dict[str, Any], as_json: bool) -> Message:
    event = {"type": "JobSubmitted", "job_id": f"bad-{i}", "tenant": "t1",
             "task_groups": [{"count": 1, "cpu_milli": 1000, "mem_mib": 1024}], **fields}
    doc = {"schema_version": 1, "producer_id": "hostile", "event": event}
    if as_json:
        return Message(json.dumps(doc).encode(), headers=(("content-type", JSON),))
    return Message(msgspec.msgpack.encode(doc))


async def test_the_service_parks_records_past_the_bounds_and_goes_on(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    good = dressed(job("good", gpus=1), 1)
    async with FileLogStore(directory, fsync="never") as store:
        await store.log(INPUTS).append([
            Message(encode(envelope(node("n1"), "t"))),
            *(bad_record(i, fields, as_json=i % 2 == 0) for i, fields in enumerate(BAD)),
            Message(encode(envelope(good, "t"))),
        ])
    running: Running = await start(embedded(directory))
    try:
        await running.until(lambda: running.task.done() or _committed(running) == 2 + len(BAD))
        assert not running.task.done(), "the service stopped"
        status, found = await running.request("/v1/jobs/good")
        assert (status, found["state"]) == (200, "placed")
        for i in range(len(BAD)):
            assert (await running.request(f"/v1/jobs/bad-{i}"))[0] == 404
    finally:
        await running.stop()
    async with FileLogStore(directory, fsync="never") as store:
        parked = await store.log(DEAD_LETTERS).read(0, timeout_ms=100)
    assert [(r.header(REASON_HEADER), r.header(SOURCE_HEADER)) for r in parked] == [
        (b"invalid_event", f"inputs@{1 + i}".encode()) for i in range(len(BAD))
    ]


def _committed(running: Running) -> int:
    loop = running.service.loop
    return -1 if loop is None else loop.committed


async def test_a_resend_with_another_payload_is_a_duplicate_and_the_first_is_kept(tmp_path: Path) -> None:
    first = dressed(job("j1", gpus=1), 1)
    other = dressed(job("j1", gpus=1), 2)  # other labels, annotations, payload: the same spec
    assert first.payload != other.payload
    async with serving(tmp_path / "log") as service:
        assert (await service.request("/v1/events", events_body(node("n1"), first)))[0] == 200
        for _ in range(2):  # appended, maybe not folded yet; then folded
            status, answer = await service.request("/v1/events", events_body(other))
            assert (status, answer["appended"], answer["duplicates"]) == (
                200, 0, [{"index": 0, "job_id": "j1"}])
            await service.until(lambda: service.service.loop is not None and service.service.loop.offset >= 2)
        changed = msgspec.structs.replace(other, priority=5)  # the scheduling spec still counts
        status, answer = await service.request("/v1/events", events_body(changed))
        assert (status, answer["code"]) == (409, "already_exists")
        assert await service.inputs_end() == 2


def test_labels_retire_with_their_job_and_follow_it_through_a_compaction() -> None:
    """``State.job_meta`` is keyed by job row: a retired job's entry goes, and a compaction (rows
    renumbered) moves each live job's entry to its new row; the invariants check both."""
    from fleetlog.core.invariants import check
    from fleetlog.core.state import CoreConfig
    from fleetlog.events import JobCancelled

    config = CoreConfig(node_timeout_ms=4_000, retain_finished_ms=1_000, dedup_window_ms=2_000,
                        compact_min_rows=8)
    state, at = State(config), 0
    fold(state, node("n0", gpus=8), 0)
    for k in range(40):
        at += 10
        fold(state, dressed(job(f"j{k}", gpus=0), k), at)
        if k < 30:
            fold(state, JobCancelled(job_id=f"j{k}"), at)
    fold(state, node("n0", gpus=8), at + 3_000)  # a sweep: the cancelled ones retire, the table compacts
    check(state)
    assert state.jobs.size == 10  # (compacted: the 10 live jobs' rows only)
    assert sorted(state.job_meta) == list(range(10))
    for k in range(30, 40):
        assert state.job_meta[state.job_row(f"j{k}")][0] == {"team": f"t{k % 3}", "run": str(k)}
    assert restore(snapshot(state)).job_meta == state.job_meta


# --- what the state holds of them, counted per tenant, and at 10,000 jobs (issue 46) ----------


def test_a_tenants_metadata_is_counted_from_submission_to_retirement() -> None:
    """``State.metadata_bytes`` (what the service's per-tenant bound reads): the held bytes of
    each live job's labels and annotations, the same by the plain and the batched fold, counted
    afresh after a restore, and given back as jobs retire (through a compaction too)."""
    from fleetlog.core.invariants import check
    from fleetlog.core.state import CoreConfig, held_bytes
    from fleetlog.events import JobCancelled

    config = CoreConfig(node_timeout_ms=4_000, retain_finished_ms=1_000, dedup_window_ms=2_000,
                        compact_min_rows=8)
    jobs = [dressed(job(f"j{k}", tenant=f"t{k % 2}", gpus=0), k) for k in range(40)]
    held = {t: sum(held_bytes(j.labels, j.annotations) for j in jobs if j.tenant == t) for t in ("t0", "t1")}
    batched = State(config)
    fold_lists(batched, [node("n0"), *jobs], list(range(41)))
    state = State(config)
    assert state.metadata_bytes("t0") == 0  # (asked before any job: kept by fold from then on)
    for at, e in enumerate([node("n0"), *jobs]):
        fold(state, e, at)
        check(state)  # (the kept count equals a count afresh: invariants.metadata_bytes_match)
    for s in (state, batched, restore(snapshot(state))):
        assert [s.metadata_bytes(t) for t in ("t0", "t1", "t9")] == [held["t0"], held["t1"], 0]
    gone = jobs[:30]
    for e in gone:
        fold(state, JobCancelled(job_id=e.job_id), 50)
    fold(state, node("n0"), 3_050)  # a sweep: the cancelled ones retire, the table compacts
    assert state.jobs.size == 10
    check(state)
    left = {t: held[t] - sum(held_bytes(j.labels, j.annotations) for j in gone if j.tenant == t)
            for t in held}
    assert (state.metadata_bytes("t0"), state.metadata_bytes("t1")) == (left["t0"], left["t1"])
    assert restore(snapshot(state)).metadata_bytes("t1") == left["t1"]


def largest_record(i: int, payload: msgspec.Raw) -> bytes:
    """A submission at the bounds: 64 labels and 64 annotations of 16,256 bytes (as much as the
    per-job bound leaves for keys this long) and the largest payload (``payload``, encoded once)."""
    from fleetlog.events.model import MAX_JOB_METADATA_BYTES, metadata_bytes

    labels = {f"l{k:02d}-{i:05d}": "v" * 118 for k in range(64)}
    notes = {f"a{k:02d}-{i:05d}": "w" * 118 for k in range(64)}
    assert MAX_JOB_METADATA_BYTES - 128 <= metadata_bytes(labels, notes) <= MAX_JOB_METADATA_BYTES
    event = {"type": "JobSubmitted", "job_id": f"j{i}", "tenant": "t1", "labels": labels,
             "annotations": notes, "payload": payload,
             "task_groups": [{"count": 1, "cpu_milli": 1000, "mem_mib": 1024}]}
    return msgspec.msgpack.encode({"schema_version": 1, "producer_id": "p", "event": event})


def test_ten_thousand_jobs_at_the_bounds_hold_their_labels_and_annotations_only() -> None:
    """The issue's case: 10,000 jobs with the largest labels, annotations and payload the codec
    takes, decoded and folded one by one as the service does, grow the state by at most 34 KB
    a job (they hold 16 KB of metadata each; the payloads, 256 Ki characters each, are not kept):
    under 340 MB where today's main took 1.1 GB (its bounds let 98 KB of metadata a job in), and
    what the per-tenant bound counts (``held_bytes``) is within 10% of it."""
    import tracemalloc

    from fleetlog.events import decode
    from fleetlog.events.model import MAX_PAYLOAD_CHARS

    payload = msgspec.Raw(msgspec.msgpack.encode({"script": "#!" + "s" * (MAX_PAYLOAD_CHARS - 2)}))
    state, n = State(), 10_000
    fold(state, node("n0"), 0)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(n):
            fold(state, decode(largest_record(i, payload)).event, i + 1)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(state.job_meta) == n
    assert grown < n * 34_000, grown
    assert 0.9 * grown < state.metadata_bytes("t1") < 1.1 * grown, (grown, state.metadata_bytes("t1"))
