"""The scheduling loop over a real log store: publish, recover, replay-verify, detect divergence."""

from __future__ import annotations

import msgspec

from fleetlog.core.digest import digest
from fleetlog.core.policy import Policy
from fleetlog.events import DecisionBatch, Event, JobPlaced, TaskFinished, encode, envelope
from fleetlog.events.codec import CONTENT_TYPE_HEADER, MSGPACK
from fleetlog.log.base import DEAD_LETTERS, DECISIONS, INPUTS, LogStore, Message
from fleetlog.log.consumer import decision_batches
from fleetlog.log.memory import MemoryLogStore
from fleetlog.replay.verify import verify
from fleetlog.service.loop import LoopConfig, SchedulerLoop
from tests.core.builders import job, node, quota
from tests.log.conftest import StoreFactory


def msg(event: Event) -> Message:
    return Message(encode(envelope(event, "test")))


ROUNDS: list[list[Event]] = [
    [node(f"n{i}", gpus=8, rack=f"r{i % 2}") for i in range(4)]
    + [quota("a", 16, cohort="c"), quota("b", 16, cohort="c")],
    [job(f"a{i}", tenant="a", gpus=4) for i in range(6)]
    + [job("gang", tenant="b", tasks=2, gpus=8, topology="rack")],
    [TaskFinished(job_id="a0", task_index=0), job("late", tenant="b", gpus=2, priority=5)],
    [node(f"n{i}", gpus=8, rack=f"r{i % 2}") for i in range(4)],
]


async def drive(store: LogStore) -> SchedulerLoop:
    loop = SchedulerLoop(store, Policy(), LoopConfig(check_invariants=True))
    for round_ in ROUNDS:
        await store.log(INPUTS).append([msg(e) for e in round_] + [Message(b"\xc1 garbage")])
        await loop.step(timeout_ms=1000)
    return loop


async def test_loop_publishes_batches_with_as_of_and_commits(store: LogStore) -> None:
    loop = await drive(store)
    records = await store.log(DECISIONS).read(0, timeout_ms=2000)
    batches = [b for _, b in decision_batches(records)]
    assert len(batches) >= 2
    assert all(r.header(CONTENT_TYPE_HEADER) == MSGPACK for r in records)
    placed = [d for b in batches for d in b.decisions if isinstance(d, JobPlaced)]
    assert {p.job_id for p in placed} >= {"a0", "a1", "gang", "late"}
    assert (
        await store.committed_offset("fleetlog-scheduler")
        == loop.offset
        == await store.log(INPUTS).end_offset()
    )
    assert len(await store.log(DEAD_LETTERS).read(0, timeout_ms=2000)) == len(ROUNDS)


async def test_replay_reproduces_every_batch_and_the_final_digest(store: LogStore) -> None:
    loop = await drive(store)
    report = await verify(store)
    assert report.ok, report.divergence
    assert report.batches >= 2
    assert report.final_digest == digest(loop.state)


async def test_recovery_rebuilds_the_same_state(durable_store_factory: StoreFactory) -> None:
    store = durable_store_factory()
    await store.open()
    loop = await drive(store)
    await store.close()
    store = durable_store_factory()
    await store.open()
    try:
        again = SchedulerLoop(store, Policy())
        await again.recover()
        assert digest(again.state) == digest(loop.state)
        assert again.offset == loop.offset
        assert len(await store.log(DEAD_LETTERS).read(0, timeout_ms=2000)) == len(ROUNDS)  # not parked twice
    finally:
        await store.close()


async def test_a_deliberately_divergent_log_is_caught() -> None:
    store = MemoryLogStore()
    await store.open()
    await drive(store)
    log = store.log(DECISIONS)
    records = await log.read(0, 10_000)
    offset, batch = list(decision_batches(records))[1]
    first = batch.decisions[0]
    assert isinstance(first, JobPlaced)  # move the first placement of the second batch to another node
    moved = msgspec.structs.replace(first.tasks[0], node="n3" if first.tasks[0].node != "n3" else "n2")
    tampered = msgspec.structs.replace(
        batch,
        decisions=(msgspec.structs.replace(first, tasks=(moved, *first.tasks[1:])), *batch.decisions[1:]),
    )
    log._records[offset] = msgspec.structs.replace(records[offset], value=encode(envelope(tampered, "x")))
    report = await verify(store)
    assert not report.ok
    assert report.divergence is not None
    assert (report.divergence.what, report.divergence.decisions_offset, report.batches) == (
        "decision #0",
        offset,
        1,
    )
    assert moved.node in report.divergence.recorded


def test_decision_batch_type_is_what_the_loop_writes() -> None:
    assert DecisionBatch.__struct_config__.tag == "DecisionBatch"
