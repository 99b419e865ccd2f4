"""The log contract: one suite, bound to memory, file and Kafka in ``conftest.py``."""

from __future__ import annotations

import asyncio

import pytest

from fleetlog.log.base import DEAD_LETTERS, DECISIONS, INPUTS, LogError, LogStore, Message, record_bytes
from fleetlog.log.kafka import KafkaLogStore
from tests.log.conftest import StoreFactory


def msgs(n: int, start: int = 0, prefix: bytes = b"m") -> list[Message]:
    return [
        Message(value=prefix + str(start + i).encode(), key=str(i % 3).encode(), headers=(("h", b"%d" % i),))
        for i in range(n)
    ]


async def read_all(store: LogStore, name: str, start: int = 0) -> list[bytes]:
    log = store.log(name)
    out: list[bytes] = []
    end = await log.end_offset()
    offset = start
    while offset < end:
        batch = await log.read(offset, max_records=1000, timeout_ms=2000)
        if not batch:  # only transaction markers (Kafka) lie between offset and end
            break
        out.extend(r.value for r in batch)
        offset = batch[-1].offset + 1
    return out


async def test_empty_log_has_end_zero_and_reads_nothing(store: LogStore) -> None:
    for name in (INPUTS, DECISIONS, DEAD_LETTERS):
        assert await store.log(name).end_offset() == 0
        assert await store.log(name).read(0, timeout_ms=50) == []


async def test_append_assigns_dense_offsets_from_zero(store: LogStore) -> None:
    log = store.log(INPUTS)
    assert await log.append(msgs(3)) == 0
    assert await log.append(msgs(2, 3)) == 3
    assert await log.end_offset() == 5
    records = await log.read(0, timeout_ms=2000)
    assert [r.offset for r in records] == [0, 1, 2, 3, 4]
    assert [r.value for r in records] == [b"m0", b"m1", b"m2", b"m3", b"m4"]


async def test_empty_append_is_a_no_op(store: LogStore) -> None:
    log = store.log(INPUTS)
    await log.append(msgs(2))
    assert await log.append([]) == 2
    assert await log.end_offset() == 2


async def test_key_headers_and_timestamp_round_trip(store: LogStore) -> None:
    log = store.log(INPUTS)
    await log.append(
        [Message(value=b"v", key=b"k", headers=(("content-type", b"application/json"), ("x", b"")))]
    )
    await log.append([Message(value=b"")])
    first, second = await log.read(0, timeout_ms=2000)
    assert first.key == b"k"
    assert first.header("content-type") == b"application/json"
    assert first.header("x") == b""
    assert first.header("missing") is None
    assert first.timestamp_ms > 0
    assert second.key is None
    assert second.value == b""
    assert second.headers == ()
    assert second.timestamp_ms >= first.timestamp_ms


async def test_read_from_middle_and_max_records(store: LogStore) -> None:
    log = store.log(INPUTS)
    await log.append(msgs(100))
    part = await log.read(37, max_records=5, timeout_ms=2000)
    assert [r.offset for r in part] == [37, 38, 39, 40, 41]
    assert [r.value for r in part] == [b"m37", b"m38", b"m39", b"m40", b"m41"]


async def test_a_read_is_bounded_by_bytes_and_a_huge_record_goes_alone(store: LogStore) -> None:
    """``max_bytes`` bounds what one read returns (values, keys and headers: ``record_bytes``),
    across the log's own batches; a record larger than the bound is read alone, never skipped;
    the next read goes on after the last record returned, neither gap nor repeat."""
    log = store.log(INPUTS)
    small = [Message(value=b"s" * 1000) for _ in range(10)]
    await log.append(small[:4])  # (two appends: the bound cuts across the log's batches)
    await log.append([*small[4:], Message(value=b"H" * 100_000), *small[:3]])
    first = await log.read(0, max_records=1000, timeout_ms=2000, max_bytes=2500)
    assert [r.offset for r in first] == [0, 1]
    assert sum(record_bytes(r) for r in first) <= 2500
    seen = list(first)
    while len(seen) < 14:
        got = await log.read(seen[-1].offset + 1, max_records=1000, timeout_ms=2000, max_bytes=2500)
        assert got, "a read past a record larger than the bound must still return it"
        assert len(got) == 1 or sum(record_bytes(r) for r in got) <= 2500
        seen += got
    assert [r.offset for r in seen] == list(range(14))
    huge = [r for r in seen if len(r.value) == 100_000]
    assert [r.offset for r in huge] == [10]
    assert await log.read(10, max_records=1000, timeout_ms=2000, max_bytes=2500) == [huge[0]]
    unbounded = await log.read(0, max_records=1000, timeout_ms=2000)  # (no max_bytes: as before)
    assert [r.offset for r in unbounded] == list(range(14))


async def test_read_at_end_returns_empty_after_timeout(store: LogStore) -> None:
    log = store.log(INPUTS)
    await log.append(msgs(2))
    assert await log.read(2, timeout_ms=100) == []


async def test_read_waits_for_a_concurrent_append(store: LogStore) -> None:
    log = store.log(INPUTS)

    async def later() -> None:
        await asyncio.sleep(0.05)
        await log.append(msgs(1))

    task = asyncio.create_task(later())
    got = await log.read(0, timeout_ms=5000)
    await task
    assert [r.value for r in got] == [b"m0"]


async def test_a_read_cancelled_as_an_append_wakes_it_ends_cancelled(store: LogStore) -> None:
    """A loop that reads with a timeout is stopped by cancelling it (the scheduler loop, the
    Kubernetes actuator): a cancellation in the same turn as the append that wakes the read must
    still end it.  Python 3.11's ``asyncio.wait_for`` swallowed it: the read returned the record,
    the caller's loop ran on, and a test's teardown waited its full 60 s for it."""
    log = store.log(INPUTS)
    reader = asyncio.create_task(log.read(0, timeout_ms=5000))
    await asyncio.sleep(0.05)  # the read waits
    await log.append(msgs(1))
    waiting = reader.cancel()  # memory, file: the append only woke it; Kafka may have answered
    assert waiting or isinstance(store, KafkaLogStore)
    if waiting:
        with pytest.raises(asyncio.CancelledError):
            await reader
    assert [r.value for r in await log.read(0, timeout_ms=2000)] == [b"m0"]


async def test_negative_offset_is_an_error(store: LogStore) -> None:
    with pytest.raises(LogError):
        await store.log(INPUTS).read(-1)


async def test_unknown_log_name_is_an_error(store: LogStore) -> None:
    with pytest.raises(LogError, match="unknown log"):
        store.log("nope")


async def test_logs_are_independent(store: LogStore) -> None:
    await store.log(INPUTS).append(msgs(3, prefix=b"i"))
    await store.log(DEAD_LETTERS).append(msgs(1, prefix=b"d"))
    assert await read_all(store, INPUTS) == [b"i0", b"i1", b"i2"]
    assert await read_all(store, DEAD_LETTERS) == [b"d0"]
    assert await read_all(store, DECISIONS) == []


async def test_transactional_append_commits_offset_with_records(store: LogStore) -> None:
    assert await store.committed_offset("sched") is None
    await store.log(INPUTS).append(msgs(10))
    first = await store.append_transactional(DECISIONS, msgs(2, prefix=b"d"), group="sched", consumed=4)
    assert first == 0
    assert await store.committed_offset("sched") == 4
    second = await store.append_transactional(DECISIONS, msgs(3, prefix=b"e"), group="sched", consumed=10)
    # Offsets strictly increase but need not be dense: Kafka's commit marker takes an offset.
    assert second >= first + 2
    assert await store.committed_offset("sched") == 10
    assert await store.committed_offset("other") is None
    assert await read_all(store, DECISIONS) == [b"d0", b"d1", b"e0", b"e1", b"e2"]


async def test_transactional_append_of_no_records_still_commits(store: LogStore) -> None:
    await store.log(INPUTS).append(msgs(3))
    await store.append_transactional(DECISIONS, [], group="g", consumed=3)
    assert await store.committed_offset("g") == 3
    assert await store.log(DECISIONS).end_offset() == 0


async def test_large_values_round_trip(store: LogStore) -> None:
    big = bytes(range(256)) * 2048  # 512 KiB
    await store.log(INPUTS).append([Message(value=big)])
    (record,) = await store.log(INPUTS).read(0, timeout_ms=2000)
    assert record.value == big


async def test_many_records_in_order(store: LogStore) -> None:
    log = store.log(INPUTS)
    for chunk in range(10):
        await log.append(msgs(500, chunk * 500))
    values = await read_all(store, INPUTS)
    assert values == [b"m%d" % i for i in range(5000)]


async def test_contents_survive_reopen(durable_store_factory: StoreFactory) -> None:
    s = durable_store_factory()
    await s.open()
    await s.log(INPUTS).append(msgs(7))
    await s.append_transactional(DECISIONS, msgs(1, prefix=b"d"), group="g", consumed=7)
    await s.close()
    s = durable_store_factory()
    await s.open()
    try:
        assert await read_all(s, INPUTS) == [b"m%d" % i for i in range(7)]
        assert await read_all(s, DECISIONS) == [b"d0"]
        assert await s.committed_offset("g") == 7
        assert await s.log(INPUTS).append(msgs(1, 7)) == 7
    finally:
        await s.close()
