"""``fleetlog run`` against a real Kafka broker, under load and under faults.

The service runs as a real child process; faults are real: SIGKILL, a stopped broker, a
second service on the same shard, malformed records from another producer.  Afterwards the
logs must hold no duplicate and no gap, and replay must reproduce every decision.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import structlog

from fleetlog.core.digest import digest, snapshot
from fleetlog.core.policy import policy_named
from fleetlog.events import JobCancelled, JobPending, JobPlaced, JobRejected, JobSubmitted, TaskPreempted
from fleetlog.log.base import DEAD_LETTERS, DECISIONS, INPUTS, LogError, LogStore, Message
from fleetlog.log.consumer import REASON_HEADER, EventConsumer, decision_batches
from fleetlog.log.kafka import KafkaConfig, KafkaLogStore
from fleetlog.log.snapshots import KafkaSnapshots, Snapshot, SnapshotHeader, encode_snapshot
from fleetlog.replay.verify import verify
from fleetlog.service.loadgen import Load, batches
from fleetlog.service.loop import LoopConfig, SchedulerLoop
from fleetlog.service.snapshots import recover, restored
from tests.faults.checker import read_all
from tests.kafka_broker import KafkaBroker
from tests.service.process import ServiceProcess

GROUP = "fleetlog-scheduler"
LOAD = Load(nodes=64, submit_share=0.2, keep_jobs=200)


def service_env(bootstrap: str, prefix: str) -> dict[str, str]:
    return {
        "FLEETLOG_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "FLEETLOG_KAFKA_TOPIC_PREFIX": prefix,
        "FLEETLOG_SERVICE_LEADER_SESSION_TIMEOUT_MS": "3000",
        "FLEETLOG_SERVICE_SNAPSHOT_EVERY_EVENTS": "2000",
        "FLEETLOG_SERVICE_IDLE_WAIT_MS": "50",
    }


class Producer:
    """Sustained open-loop load: ``per_tick`` events every ``tick_s`` until stopped."""

    def __init__(self, store: LogStore, per_tick: int = 100, tick_s: float = 0.05) -> None:
        self.store, self.per_tick, self.tick_s = store, per_tick, tick_s
        self.sent = 0
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._batches = batches(LOAD, per_tick)

    def start(self) -> Producer:
        self._task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        pending = next(self._batches)
        while not self._stop.is_set():
            try:
                await self.send(pending)
            except LogError:  # the broker is away: resend (a duplicate input is a counted no-op)
                await asyncio.sleep(0.5)
                continue
            pending = next(self._batches)
            await asyncio.sleep(self.tick_s)

    async def send(self, messages: list[Message]) -> None:
        await self.store.log(INPUTS).append(messages)
        self.sent += len(messages)

    async def stop(self) -> None:
        self._stop.set()
        assert self._task is not None
        await self._task


@pytest.fixture
async def kafka_store(kafka_bootstrap: str) -> AsyncIterator[KafkaLogStore]:
    prefix = f"t{uuid.uuid4().hex[:10]}"
    store = KafkaLogStore(KafkaConfig(bootstrap_servers=kafka_bootstrap, topic_prefix=prefix))
    await store.open()
    try:
        yield store
    finally:
        await store.close()


STARTED: list[ServiceProcess] = []


def start_service(tmp_path: Path, store: KafkaLogStore, name: str = "service") -> ServiceProcess:
    env = service_env(store.config.bootstrap_servers, store.config.topic_prefix)
    process = ServiceProcess(tmp_path / f"{name}.log", [], env).start()
    STARTED.append(process)
    return process


@pytest.fixture(autouse=True)
def _no_service_outlives_its_test() -> Iterator[None]:
    yield
    while STARTED:
        STARTED.pop().kill_if_running()


async def wait_caught_up(store: LogStore, timeout_s: float = 120) -> int:
    """Wait until the scheduler group has committed every input; the inputs end offset."""
    deadline = time.monotonic() + timeout_s
    end = await store.log(INPUTS).end_offset()
    while time.monotonic() < deadline:
        if await store.committed_offset(GROUP) == end:
            return end
        await asyncio.sleep(0.2)
    raise AssertionError(f"committed {await store.committed_offset(GROUP)} of {end} inputs in {timeout_s}s")


async def assert_exactly_once(store: LogStore) -> None:
    """No duplicate batch, no job decided twice without cause, no undecided job; replay
    reproduces every batch and the final state."""
    batches_ = [b for _, b in decision_batches(await read_all(store, DECISIONS))]
    as_of = [b.as_of for b in batches_]
    assert as_of == sorted(set(as_of)), "decision batches must have strictly increasing as_of"
    decisions = [d for b in batches_ for d in b.decisions]
    placed = Counter(d.job_id for d in decisions if isinstance(d, JobPlaced))
    preempted = Counter(d.job_id for d in decisions if isinstance(d, TaskPreempted))
    assert all(n <= 1 + preempted[job] for job, n in placed.items()), "a job placed twice without preemption"
    decided = {d.job_id for d in decisions if isinstance(d, JobPlaced | JobPending | JobRejected)}
    inputs, _ = EventConsumer(store).split(await read_all(store, INPUTS))
    submitted = {e.envelope.event.job_id for e in inputs if isinstance(e.envelope.event, JobSubmitted)}
    cancelled = {e.envelope.event.job_id for e in inputs if isinstance(e.envelope.event, JobCancelled)}
    assert submitted - cancelled <= decided, f"undecided jobs: {sorted(submitted - cancelled - decided)[:5]}"
    report = await verify(store)
    assert report.ok, report.divergence
    assert report.batches == len(batches_) > 0
    replayed = SchedulerLoop(store, policy_named("default"), LoopConfig(group=GROUP))
    await replayed.recover()
    await replayed.catch_up()
    newest = (await KafkaSnapshots(store.config).candidates())[0]  # type: ignore[attr-defined]
    snap = restored(newest[1](), newest[0])
    assert snap.header.inputs_offset == replayed.offset, "the final snapshot covers every input"
    assert digest(snap.state) == digest(replayed.state)


async def test_kill_9_under_load_leaves_no_duplicate_and_no_gap(
    kafka_store: KafkaLogStore, tmp_path: Path
) -> None:
    rng = random.Random(9)
    producer = Producer(kafka_store).start()
    kills = 0
    try:
        for _ in range(10):
            service = start_service(tmp_path, kafka_store)
            end = await kafka_store.log(INPUTS).end_offset()
            await asyncio.to_thread(service.wait_leading, 90, end - 1 if kills else -1)
            await asyncio.sleep(rng.uniform(0.2, 2.0))
            service.kill9()
            kills += 1
    finally:
        await producer.stop()
    final = start_service(tmp_path, kafka_store, "final")
    try:
        await asyncio.to_thread(final.wait_leading, 90)
        await wait_caught_up(kafka_store)
    finally:
        assert final.stop() == 0, final.tail()
    assert kills == 10
    assert producer.sent > 5000
    await assert_exactly_once(kafka_store)


async def test_two_services_on_one_shard_only_one_publishes_and_the_other_takes_over(
    kafka_store: KafkaLogStore, tmp_path: Path
) -> None:
    """The second joins while the first leads (the election is sticky: a joining stand-by never
    takes the lead, tests/service/test_leader.py); both run under load until the first dies."""
    producer = Producer(kafka_store).start()
    first = start_service(tmp_path, kafka_store, "first")
    try:
        await asyncio.to_thread(first.wait_leading, 90)
        second = start_service(tmp_path, kafka_store, "second")
        await asyncio.to_thread(second.wait_status, "standby", 90)
        await asyncio.sleep(2)
        assert (second.health() or {}).get("status") == "standby"
        assert (first.health() or {}).get("status") == "leading"
        assert not [line for line in second.lines() if line.get("event") == "decision_batch"]
        first.kill9()
        started = time.monotonic()
        end = await kafka_store.log(INPUTS).end_offset()
        await asyncio.to_thread(second.wait_leading, 60, end)
        takeover = time.monotonic() - started
        assert takeover < 20, f"take-over took {takeover:.1f}s"
    finally:
        await producer.stop()
    try:
        await wait_caught_up(kafka_store)
    finally:
        second.stop()
    await assert_exactly_once(kafka_store)


async def test_malformed_records_go_to_dead_letters_and_every_valid_input_is_decided(
    kafka_store: KafkaLogStore, tmp_path: Path
) -> None:
    rng = random.Random(5)
    garbage = [b"\xc1", b"{not json", b"\x81\xa1x\x01", b'{"schema_version": 1}', b"", b"\xff" * 40]
    producer = Producer(kafka_store)
    service = start_service(tmp_path, kafka_store)
    try:
        good_batches = batches(LOAD, 100)
        bad_sent = 0
        for _ in range(100):
            messages = list(next(good_batches))
            for _ in range(100):
                messages.insert(rng.randrange(len(messages) + 1), Message(rng.choice(garbage)))
                bad_sent += 1
            await producer.send(messages)
        await wait_caught_up(kafka_store)
    finally:
        assert service.stop() == 0, service.tail()
    assert bad_sent == 10_000
    parked = await read_all(kafka_store, DEAD_LETTERS)
    assert len(parked) == 10_000
    reasons = Counter(r.header(REASON_HEADER) for r in parked)
    assert None not in reasons
    assert set(reasons) <= {b"undecodable", b"invalid_event", b"unknown_event_type"}
    await assert_exactly_once(kafka_store)


async def test_broker_restart_under_load_loses_nothing(tmp_path: Path) -> None:
    with KafkaBroker(use_env=False, ephemeral=True) as broker:
        store = KafkaLogStore(KafkaConfig(bootstrap_servers=broker.bootstrap, topic_prefix="restart"))
        await store.open()
        producer = Producer(store).start()
        service = start_service(tmp_path, store)
        try:
            await asyncio.to_thread(service.wait_leading, 90, 100)
            old_pid = broker.pid()
            await asyncio.to_thread(broker.restart)
            assert broker.pid() != old_pid
            restarted_at = await store.log(INPUTS).end_offset()
            await asyncio.sleep(5)
            await producer.stop()
            await wait_caught_up(store, 180)
        finally:
            assert service.stop() == 0, service.tail()
        try:
            await assert_exactly_once(store)
            batches_ = decision_batches(await read_all(store, DECISIONS))
            after = [b for _, b in batches_ if b.as_of > restarted_at]
            assert after, "the service decided again after the broker came back"
        finally:
            await store.close()


async def test_kafka_snapshots_fall_back_past_a_corrupt_one(kafka_store: KafkaLogStore) -> None:
    loop = SchedulerLoop(kafka_store, policy_named("default"), LoopConfig(group=GROUP))
    producer = Producer(kafka_store)
    for _ in range(3):
        await producer.send(next(batches(LOAD, 50)))
        await loop.step(timeout_ms=2000)
    snapshots = KafkaSnapshots(kafka_store.config)
    header = SnapshotHeader(loop.offset, loop.decisions_next, "default", 0)
    good = encode_snapshot(Snapshot(header, snapshot(loop.state)))
    await snapshots.save(good)
    await snapshots.save(good[:-10] + b"0123456789")  # the newest is damaged
    try:
        with structlog.testing.capture_logs() as logs:
            recovered, used = await recover(kafka_store, snapshots, lambda s: SchedulerLoop(
                s, policy_named("default"), LoopConfig(group=GROUP)))
    finally:
        await snapshots.close()
    assert used == header
    events = [e["event"] for e in logs if e["event"].startswith("snapshot")]
    assert events == ["snapshot_skipped", "snapshot_restored"]
    assert digest(recovered.state) == digest(loop.state)
