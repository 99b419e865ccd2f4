"""Steps whose decisions outgrow one record (issue 14, item 1): valid input that makes the scheduler
emit tens of megabytes in one step.  After each: every record is within the bound and decodes, a
restart recovers the same state, a second process takes over, and ``replay verify`` is clean."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import msgspec
import pytest

from fleetlog.core.digest import digest, snapshot
from fleetlog.core.policy import Policy
from fleetlog.events import DecisionBatch, Event, JobPending, JobPlaced, decode, encode, envelope
from fleetlog.events.model import MAX_TASKS_PER_JOB
from fleetlog.events.parts import DECISION_RECORD_BYTES, encode_step
from fleetlog.log.base import DEAD_LETTERS, DECISIONS, INPUTS, LogStore, Message, Record
from fleetlog.log.consumer import CorruptDecisionsError
from fleetlog.log.file import FileLogStore
from fleetlog.log.snapshots import DirectorySnapshots, Snapshot, SnapshotHeader, encode_snapshot
from fleetlog.replay.parallel import verify_in_parallel
from fleetlog.replay.source import ReplayError, open_file_source
from fleetlog.replay.verify import verify
from fleetlog.service.loop import LoopConfig, SchedulerLoop, StepResult
from fleetlog.service.snapshots import recover
from tests.core.builders import job, node, quota
from tests.log.conftest import StoreFactory

LONG = "n" * 190


def make_loop(store: LogStore) -> SchedulerLoop:
    return SchedulerLoop(store, Policy())  # long node names and job ids make big decisions
TAKE_OVER = textwrap.dedent(
    """
    import asyncio, sys
    from fleetlog.core.digest import digest, snapshot
    from fleetlog.core.policy import Policy
    from fleetlog.log.file import FileLogStore
    from fleetlog.service.loop import SchedulerLoop

    async def main() -> None:
        async with FileLogStore(sys.argv[1]) as store:
            loop = SchedulerLoop(store, Policy())
            await loop.recover()
            print(digest(loop.state), loop.offset, loop.decisions_next)

    asyncio.run(main())
    """
)


async def append(store: LogStore, events: list[Event]) -> None:
    for start in range(0, len(events), 50_000):
        chunk = events[start : start + 50_000]
        await store.log(INPUTS).append([Message(encode(envelope(e, "test"))) for e in chunk])


async def step(loop: SchedulerLoop) -> StepResult:
    return await loop.step(timeout_ms=1000)


async def decision_records(store: LogStore, start: int = 0) -> list[Record]:
    return await store.log(DECISIONS).read(start, 100_000)


def parts_of(records: list[Record]) -> list[DecisionBatch]:
    """Every record within the bound, decoded (``decode`` refuses anything over 4 MiB)."""
    assert all(len(r.value) <= DECISION_RECORD_BYTES for r in records)
    found = [decode(r.value).event for r in records]
    assert all(isinstance(b, DecisionBatch) for b in found)
    return found  # type: ignore[return-value]


async def check_restart(factory: StoreFactory, loop: SchedulerLoop, steps: int) -> None:
    """A fresh scheduler on the same logs recovers the state the first one had, and replay
    verify finds every step reproduced (a step in parts counts as one batch)."""
    store = factory()
    await store.open()
    try:
        again = SchedulerLoop(store, Policy())
        await again.recover()
        assert (digest(again.state), again.offset, again.decisions_next) == (
            digest(loop.state), loop.offset, loop.decisions_next
        )
        report = await verify(store)
        assert report.ok, report.divergence
        assert report.final_digest == digest(loop.state)
        assert report.batches == steps
    finally:
        await store.close()


def take_over_in_child(directory: Path, loop: SchedulerLoop) -> None:
    """Another process recovers from the file log alone, and ``fleetlog replay verify`` (the
    command) is clean."""
    out = subprocess.run(
        [sys.executable, "-c", TAKE_OVER, str(directory)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == [digest(loop.state), str(loop.offset), str(loop.decisions_next)]
    cli = subprocess.run(
        [sys.executable, "-c", "from fleetlog.cli import main; main()",
         "replay", "verify", "--log", str(directory), "--json"],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert cli.returncode == 0, (cli.stdout[-2000:], cli.stderr[-2000:])
    assert json.loads(cli.stdout)["final_digest"] == digest(loop.state)


def over_the_limit() -> Message:
    """A job of MAX_TASKS_PER_JOB + 1 tasks as a hostile producer writes it (no validation)."""
    raw = msgspec.msgpack.decode(encode(envelope(job("over", tasks=2, gpus=0, cpu=100, mem=100), "test")))
    raw["event"]["task_groups"][0]["count"] = MAX_TASKS_PER_JOB + 1
    return Message(msgspec.msgpack.encode(raw))


async def test_twenty_jobs_at_the_task_limit_place_over_many_records(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    factory: StoreFactory = lambda: FileLogStore(directory)  # noqa: E731
    store = factory()
    await store.open()
    try:
        loop = SchedulerLoop(store, Policy(), LoopConfig(max_batch=100_000))
        await append(store, [node(f"{LONG}{i:04d}", gpus=0, cpu=96_000) for i in range(256)])
        await store.log(INPUTS).append([over_the_limit()])
        big = [job(f"big{i}", tasks=MAX_TASKS_PER_JOB, gpus=0, cpu=100, mem=100) for i in range(20)]
        await append(store, big)
        result = await step(loop)
        assert (result.dead_lettered, result.decisions, result.published) == (1, 20, True)
        parts = parts_of(await decision_records(store))
        assert len(parts) == 20  # a JobPlaced of 10,000 tasks on these nodes is 2 MB: one per record
        assert [(p.part, p.parts) for p in parts] == [(i, 20) for i in range(20)]
        placed = [d for p in parts for d in p.decisions]
        assert all(isinstance(d, JobPlaced) and len(d.tasks) == MAX_TASKS_PER_JOB for d in placed)
        dead = await store.log(DEAD_LETTERS).read(0)
        assert len(dead) == 1
        assert f"at most {MAX_TASKS_PER_JOB} tasks" in str(dead[0].headers)
    finally:
        await store.close()
    await check_restart(factory, loop, 1)
    take_over_in_child(directory, loop)


async def test_200k_pending_jobs_and_a_quota_set(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    factory: StoreFactory = lambda: FileLogStore(directory)  # noqa: E731
    store = factory()
    await store.open()
    try:
        loop = SchedulerLoop(store, Policy(), LoopConfig(max_batch=1_000_000))
        await append(store, [node(f"n{i}", gpus=8) for i in range(4)])
        await append(store, [job(f"j{i:07d}", tenant="a", gpus=8) for i in range(200_000)])
        await step(loop)
        first = len(await decision_records(store))
        await append(store, [quota("a", 0)])
        result = await step(loop)
        assert result.decisions == 200_000 - 4
        parts = parts_of(await decision_records(store, first))
        assert len(parts) > 5
        assert sum(len(msgspec.msgpack.encode(p)) for p in parts) > 30_000_000
        reasons = {d.reason for p in parts for d in p.decisions if isinstance(d, JobPending)}
        assert reasons == {"quota_exhausted"}
    finally:
        await store.close()
    await check_restart(factory, loop, 2)
    take_over_in_child(directory, loop)


async def mass_requeue(factory: StoreFactory, jobs: int, snapshots: Path | None = None) -> SchedulerLoop:
    """``jobs`` single-GPU jobs with long ids run on 8-GPU nodes, then every node reports
    unhealthy: all of them are requeued in one step, and wait (nothing else has room).  With
    ``snapshots``, one is taken between the two steps (as the service does)."""
    store = factory()
    await store.open()
    try:
        nodes = jobs // 8
        loop = SchedulerLoop(store, Policy(), LoopConfig(max_batch=1_000_000))
        await append(store, [node(f"n{i}", gpus=8) for i in range(nodes)])
        await append(store, [job(f"{LONG}{i:07d}", gpus=1) for i in range(jobs)])
        placed = await step(loop)
        assert placed.decisions == jobs
        before = loop.decisions_next
        if snapshots is not None:
            header = SnapshotHeader(loop.offset, loop.decisions_next, loop.policy.name, 0)
            await DirectorySnapshots(snapshots).save(encode_snapshot(Snapshot(header, snapshot(loop.state))))
        await append(store, [node(f"n{i}", gpus=8, healthy=False) for i in range(nodes)])
        requeued = await step(loop)
        assert requeued.decisions == jobs
        parts = parts_of(await decision_records(store, before))
        assert len(parts) > 1
        assert sum(isinstance(d, JobPending) for p in parts for d in p.decisions) == jobs
    finally:
        await store.close()
    await check_restart(factory, loop, 2)
    return loop


def cli(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", "from fleetlog.cli import main; main()", *args],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert out.returncode == 0, (args, out.stdout[-2000:], out.stderr[-2000:])
    return out.stdout


async def test_a_mass_requeue_on_the_file_log(tmp_path: Path) -> None:
    """Every reader of the decisions log handles the split step: status, explain, state-at,
    what-if and dump, each in its own process."""
    directory = tmp_path / "log"
    loop = await mass_requeue(lambda: FileLogStore(directory), 40_000, directory / "snapshots")
    take_over_in_child(directory, loop)
    async with FileLogStore(directory) as store:  # the service's restart: the snapshot, then the tail
        again, used = await recover(store, DirectorySnapshots(directory / "snapshots"), make_loop)
        assert used is not None
        assert digest(again.state) == digest(loop.state)
    source = await open_file_source(directory)  # parallel verify: cut at the snapshot
    try:
        both = await verify_in_parallel(source, None, None, 2)
    finally:
        await source.close()
    assert both is not None
    assert both.ok, both.divergence
    assert both.final_digest == digest(loop.state)
    where, last = ("--log", str(directory)), f"{LONG}{40_000 - 1:07d}"
    assert json.loads(cli("status", last, *where, "--json"))["state"] == "pending"
    story = json.loads(cli("replay", "explain", last, *where, "--json", "--no-why"))
    assert [s["what"].split(":")[0] for s in story["steps"] if s["log"] == DECISIONS] == ["placed", "pending"]
    state = json.loads(cli("replay", "state-at", str(loop.offset), *where, "--json"))
    assert state["digest"] == digest(loop.state)
    other = json.loads(cli("replay", "what-if", *where, "--policy", "fgd", "--json"))
    assert other["recorded"]
    assert other["replayed"]
    dumped = cli("replay", "dump", *where, "--from-log", "decisions").splitlines()
    dumped = [json.loads(line) for line in dumped]
    assert all("error" not in d for d in dumped)
    assert [d["event"].get("part", 0) for d in dumped].count(0) == 2  # two steps, each in parts
    assert len(dumped) > 2


@pytest.mark.kafka
async def test_a_mass_requeue_on_kafka(kafka_bootstrap: str, tmp_path: Path) -> None:
    """The split write, read back and verified on a real broker: the parts of one step are one
    transaction, recovery joins them, replay verify is clean."""
    from fleetlog.log.kafka import KafkaConfig, KafkaLogStore

    config = KafkaConfig(bootstrap_servers=kafka_bootstrap, topic_prefix=f"big-steps-{tmp_path.name}")
    await mass_requeue(lambda: KafkaLogStore(config), 40_000)


async def test_a_step_of_70_mib_is_one_transaction_on_the_file_log(tmp_path: Path) -> None:
    """Twenty full parts (70 MiB): one frame, past the 64 MiB frame limit there was; a reader
    in another store sees every part and the commit, or (before the write) nothing."""
    parts = encode_step_of(20)
    async with FileLogStore(tmp_path / "log", fsync="never") as store:
        first = await store.append_transactional(DECISIONS, parts, group="g", consumed=7)
    async with FileLogStore(tmp_path / "log", read_only=True) as reader:
        records = await reader.log(DECISIONS).read(0, 100)
        assert (first, len(records), await reader.committed_offset("g")) == (0, 20, 7)
        assert [r.value for r in records] == [m.value for m in parts]
        assert [(b.part, b.parts) for b in parts_of(records)] == [(i, 20) for i in range(20)]


def encode_step_of(n: int) -> list[Message]:
    """A step that splits into ``n`` full parts."""
    per_part = DECISION_RECORD_BYTES // 3100
    decisions = tuple(
        JobPending(job_id=f"j{i:08d}", reason="no_capacity", message="m" * 3000)
        for i in range(per_part * n - 5)
    )
    batch = DecisionBatch(as_of=7, digest="d", decisions=decisions, policy="default")
    values = encode_step(batch, "test")
    assert len(values) == n
    return [Message(v) for v in values]


@pytest.mark.kafka
async def test_a_decisions_topic_too_small_for_a_record_is_refused_before_writing(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """A decisions topic made by hand with the broker's 1 MiB default: the scheduler says so
    (and how to fix it) instead of failing on its first large step, and on every retry."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    from fleetlog.log.base import LogError
    from fleetlog.log.kafka import KafkaConfig, KafkaLogStore

    config = KafkaConfig(bootstrap_servers=kafka_bootstrap, topic_prefix=f"small-{tmp_path.name}")
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(config.topic(DECISIONS), 1, 1)])
    finally:
        await admin.close()
    async with KafkaLogStore(config) as store:
        with pytest.raises(LogError, match=r"max.message.bytes=1048588; decision records need 4194304"):
            await store.append_transactional(DECISIONS, encode_step_of(1), group="g", consumed=0)
        assert await store.log(DECISIONS).end_offset() == 0


async def test_a_step_missing_its_last_part_is_corrupt_for_recovery_and_replay(tmp_path: Path) -> None:
    """The scheduler never writes half a step; a log that holds one (a foreign writer, a bad
    copy) is named as corrupt, with the offsets, by recovery and by replay."""
    async with FileLogStore(tmp_path / "log") as store:
        await store.append_transactional(DECISIONS, encode_step_of(3)[:2], group="g", consumed=0)
        half = r"the step at decisions@0 has 3 parts, only 2 are in the log"
        with pytest.raises(CorruptDecisionsError, match=half):
            await SchedulerLoop(store, Policy()).recover()
        with pytest.raises(ReplayError, match=f"corrupt: {half}"):
            await verify(store)
