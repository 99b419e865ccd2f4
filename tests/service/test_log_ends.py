"""Recovery refuses a log that went backwards (issue 14, item 6): a snapshot, a decision batch
or a committed offset past a log's end means the log lost acknowledged records — a truncated
tail, a deleted segment, a recreated Kafka topic — and leading on it would acknowledge new
events at offsets the state already counts as folded.  Real file logs and a real broker."""

from __future__ import annotations

import asyncio
import re
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from fleetlog.core.digest import snapshot
from fleetlog.core.policy import policy_named
from fleetlog.events import encode, envelope
from fleetlog.events.model import Event
from fleetlog.log.base import DECISIONS, INPUTS, LogStore, Message
from fleetlog.log.file import FileLogStore
from fleetlog.log.highwater import HIGH_WATER_NAME, LogShorterError
from fleetlog.log.kafka import KafkaConfig, KafkaLogStore
from fleetlog.log.snapshots import DirectorySnapshots, Snapshot, SnapshotHeader, encode_snapshot
from fleetlog.service.loop import LogBehindError, LoopConfig, SchedulerLoop
from fleetlog.service.service import Service
from fleetlog.service.snapshots import check_ends, recover
from tests.core.builders import job, node
from tests.service.test_service import embedded

GROUP = "fleetlog-scheduler"
POLICY = policy_named("default")


def messages(*events: Event) -> list[Message]:
    return [Message(encode(envelope(e, "test"))) for e in events]


def make_loop(store: LogStore) -> SchedulerLoop:
    return SchedulerLoop(store, POLICY, LoopConfig(group=GROUP))


async def decided(store: LogStore, snapshots: DirectorySnapshots | None = None) -> SchedulerLoop:
    """Inputs 0..3 decided (decisions@0, committed 4), then inputs 4..6 in their own frame,
    folded and committed; a snapshot at inputs 7, decisions 1 if ``snapshots``."""
    await store.log(INPUTS).append(messages(node("n1"), node("n2"), job("j1"), job("j2")))
    loop = make_loop(store)
    await loop.recover()
    assert (await loop.step()).published
    await store.log(INPUTS).append(messages(node("n3"), node("n4"), node("n5")))
    await loop.step()
    await loop.commit()
    if snapshots is not None:
        header = SnapshotHeader(loop.offset, loop.decisions_next, POLICY.name, 0)
        await snapshots.save(encode_snapshot(Snapshot(header, snapshot(loop.state))))
    return loop


async def reopened_without_high_water(directory: Path, said: str, **options: Any) -> FileLogStore:
    """The store, once its open has refused the shorter log (``said``) and ``high-water.json`` is
    moved away (an older log without it): what the checks below catch on their own."""
    with pytest.raises(LogShorterError, match=said):
        await FileLogStore(directory, **options).open()
    (directory / HIGH_WATER_NAME).rename(directory.parent / "high-water.json.old")
    store = FileLogStore(directory, **options)
    await store.open()
    return store


async def refused(store: LogStore, snapshots: DirectorySnapshots) -> str:
    """The LogBehindError of both checks (before ingest, and in recovery itself)."""
    with pytest.raises(LogBehindError) as early:
        await check_ends(store, await snapshots.candidates(), GROUP)
    with pytest.raises(LogBehindError) as late:
        await recover(store, snapshots, make_loop)
    assert str(late.value)
    return str(early.value)


async def test_a_deleted_last_inputs_segment_is_refused_not_led(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    store = FileLogStore(directory, fsync="never", segment_bytes=200)  # a segment per frame
    await store.open()
    snapshots = DirectorySnapshots(directory / "snapshots")
    await decided(store, snapshots)
    await store.close()
    last = sorted((directory / INPUTS).glob("*.log"))[-1]
    assert last.name == f"{4:020d}.log"
    last.unlink()
    store = await reopened_without_high_water(directory, "the inputs log ends at 4 but once held 7 records",
                                              fsync="never", segment_bytes=200)
    try:
        assert await store.log(INPUTS).end_offset() == 4
        message = await refused(store, snapshots)
        assert "committed inputs up to offset 7, but the inputs log ends at 4" in message
    finally:
        await store.close()


async def test_a_decisions_log_that_lost_its_batches_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    store = FileLogStore(directory, fsync="never")
    await store.open()
    snapshots = DirectorySnapshots(directory / "snapshots")
    await decided(store, snapshots)
    await store.close()
    inputs_commit_free = tmp_path / "decisions-gone"
    shutil.move(directory / DECISIONS, inputs_commit_free)  # the batches and the commits with them
    store = await reopened_without_high_water(
        directory, "the decisions log ends at 0 but once held 1 records", fsync="never")
    try:
        message = await refused(store, snapshots)
        assert "snapshot-00000000000000000007.bin covers decisions up to offset 1" in message
        assert "the decisions log ends at 0" in message
    finally:
        await store.close()


async def test_without_snapshots_a_batch_past_the_inputs_end_is_a_log_behind_error(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    store = FileLogStore(directory, fsync="never", segment_bytes=150)
    await store.open()
    await store.log(INPUTS).append(messages(node("n1"), node("n2")))
    await store.log(INPUTS).append(messages(job("j1"), job("j2")))
    loop = make_loop(store)
    await loop.recover()
    assert (await loop.step(timeout_ms=0)).published
    await store.close()
    sorted((directory / INPUTS).glob("*.log"))[-1].unlink()  # inputs 2..3, which decisions@0 saw
    store = await reopened_without_high_water(directory, "the inputs log ends at 2 but once held 4 records",
                                              fsync="never", segment_bytes=150)
    try:
        with pytest.raises(LogBehindError, match="inputs log ends at 2"):
            await make_loop(store).recover()
    finally:
        await store.close()


async def test_logs_that_line_up_pass_both_checks(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    store = FileLogStore(directory, fsync="never")
    await store.open()
    snapshots = DirectorySnapshots(directory / "snapshots")
    try:
        before = await decided(store, snapshots)
        await check_ends(store, await snapshots.candidates(), GROUP)
        loop, used = await recover(store, snapshots, make_loop)
        assert used is not None
        assert (loop.offset, loop.decisions_next) == (before.offset, before.decisions_next) == (7, 1)
    finally:
        await store.close()


@pytest.mark.kafka
async def test_a_recreated_kafka_inputs_topic_is_refused(kafka_bootstrap: str, tmp_path: Path) -> None:
    config = KafkaConfig(bootstrap_servers=kafka_bootstrap, topic_prefix=f"behind-{uuid.uuid4().hex[:8]}")
    store = KafkaLogStore(config)
    await store.open()
    snapshots = DirectorySnapshots(tmp_path / "snapshots")
    try:
        await decided(store, snapshots)
    finally:
        await store.close()
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.delete_topics([config.topic(INPUTS)])
    finally:
        await admin.close()
    store = KafkaLogStore(config)
    for _ in range(100):  # the deletion completes in the background; open recreates the topic
        try:
            await store.open()
            if await store.log(INPUTS).end_offset() == 0:
                break
        except Exception:  # the topic is still being deleted: try again
            await store.close()
            store = KafkaLogStore(config)
        await asyncio.sleep(0.2)
    try:
        assert await store.log(INPUTS).end_offset() == 0
        message = await refused(store, snapshots)  # Kafka dropped the group's offset with the topic
        assert "decisions@0 was computed at inputs up to offset 4, but the inputs log ends at 0" in message
        for path in tmp_path.glob("snapshots/*.bin"):
            path.unlink()
        with pytest.raises(LogBehindError, match="the inputs log ends at 0"):
            await make_loop(store).recover()
    finally:
        await store.close()


# -- losses no snapshot, batch or commit proves: the high-water record (issue 46) -------------------


async def stalled_health(directory: Path) -> dict[str, Any]:
    """``/healthz`` of a real service on ``directory`` once it has stalled (it must not lead)."""
    service = Service(embedded(directory))
    task = asyncio.create_task(service.run())
    try:
        for _ in range(1200):  # (60 s at most: it stalls at its first open)
            assert service.loop is None, "led on a log that lost acknowledged records"
            if service.problem is not None and service.problem.status == "stalled":
                break
            await asyncio.sleep(0.05)
        health = service.health()
        assert health["status"] == "stalled", health
        return health
    finally:
        service.stop()
        await task


async def test_a_deleted_last_inputs_segment_no_snapshot_covered_stalls_with_the_reason(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "log"
    for producer in range(50):  # 500 acknowledged direct appends (fsync "batch"), no service yet
        store = FileLogStore(directory, segment_bytes=4096)
        await store.open()
        for i in range(10):
            await store.log(INPUTS).append(messages(job(f"p{producer}-{i}")))
        await store.close()
    last = sorted((directory / INPUTS).glob("*.log"))[-1]
    kept = int(last.name.removesuffix(".log"))
    assert 0 < kept < 500
    last.unlink()
    said = f"the inputs log ends at {kept} but once held 500 records (offsets {kept}..499 are gone)"
    health = await stalled_health(directory)
    assert said in health["problem"]["message"]
    assert "move high-water.json away" in health["problem"]["action"]
    with pytest.raises(LogShorterError, match=re.escape(said)):  # a producer appending directly: refused too
        await FileLogStore(directory).open()
    (directory / HIGH_WATER_NAME).rename(tmp_path / "accepted")  # the operator accepts the loss
    async with FileLogStore(directory) as store:
        assert await store.log(INPUTS).end_offset() == kept


async def test_snapshots_and_the_decisions_log_deleted_together_stall_with_the_reason(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    store = FileLogStore(directory, fsync="never")
    await store.open()
    loop = await decided(store, DirectorySnapshots(directory / "snapshots"))
    decisions_end = loop.decisions_next
    await store.close()
    shutil.rmtree(directory / "snapshots")
    shutil.rmtree(directory / DECISIONS)
    health = await stalled_health(directory)
    assert (f"the decisions log ends at 0 but once held {decisions_end} records"
            in health["problem"]["message"])
    async with FileLogStore(directory, read_only=True) as store:  # nothing was decided again
        assert await store.log(DECISIONS).end_offset() == 0
