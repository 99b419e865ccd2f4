"""File log throughput: batched append and sequential read, in events per second.

What it measures, on synthetic data (``value_bytes`` random bytes per event, no key or
headers), in a fresh temporary directory per repetition, median of ``repeats`` runs:

* ``file_append_events_per_s``: :meth:`FileLog.append` of batches of ``batch_records``
  with ``fsync="batch"`` (plain appends are not synced; the final close is, and is timed);
* ``file_append_never_events_per_s``: the same with ``fsync="never"``;
* ``file_append_txn_events_per_s``: :meth:`FileLogStore.append_transactional` of the
  same batches to the decisions log with ``fsync="batch"``: one fdatasync per batch;
* ``file_read_events_per_s``: reopen (recovery included) and read every event from
  offset 0 with ``max_records=read_max_records`` (the page cache is warm: this is the
  decode path, not the disk);
* ``read_vs_target``: the read rate over the 1,000,000 events/s target.

Run: ``.venv/bin/python -m benchmarks.file_bench [--quick | --smoke]`` (prints JSON; ``--smoke``:
2,000 events, one run — a test that it runs).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from fleetlog.log.base import DECISIONS, INPUTS, Message
from fleetlog.log.file import FileLogStore, FsyncPolicy

VALUE_BYTES = 100
BATCH_RECORDS = 1000
READ_MAX_RECORDS = 10_000
REPEATS = 3
READ_TARGET = 1_000_000


def _batch() -> list[Message]:
    return [Message(value=os.urandom(VALUE_BYTES)) for _ in range(BATCH_RECORDS)]


async def _append(directory: Path, events: int, fsync: FsyncPolicy, txn: bool) -> float:
    """Seconds to append ``events`` events in batches (and close the store)."""
    batch = _batch()
    store = FileLogStore(directory, fsync=fsync)
    await store.open()
    started = time.perf_counter()
    for i in range(events // BATCH_RECORDS):
        if txn:
            await store.append_transactional(DECISIONS, batch, group="bench", consumed=i)
        else:
            await store.log(INPUTS).append(batch)
    await store.close()
    return time.perf_counter() - started


async def _read(directory: Path, name: str, events: int) -> float:
    """Seconds to reopen the store and read ``events`` events sequentially from 0."""
    started = time.perf_counter()
    store = FileLogStore(directory, fsync="never")
    await store.open()
    log, offset = store.log(name), 0
    while offset < events:
        batch = await log.read(offset, max_records=READ_MAX_RECORDS)
        if not batch:
            raise RuntimeError(f"read stalled at offset {offset} of {events}")
        offset = batch[-1].offset + 1
    await store.close()
    return time.perf_counter() - started


def _median_rate(events: int, runs: list[float]) -> float:
    return round(events / statistics.median(runs))


def _repeat(make: Callable[[Path], Coroutine[Any, Any, float]], repeats: int) -> list[float]:
    runs: list[float] = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="fleetlog-bench-") as tmp:
            runs.append(asyncio.run(make(Path(tmp) / "log")))
    return runs


def _append_then_read(events: int) -> Callable[[Path], Coroutine[Any, Any, float]]:
    async def run(directory: Path) -> float:
        await _append(directory, events, "never", txn=False)
        return await _read(directory, INPUTS, events)

    return run


def run(quick: bool, smoke: bool = False) -> dict[str, float | int]:
    """Measure; ``quick`` uses 300,000 events instead of 2,000,000, ``smoke`` 2,000 once."""
    events = 2_000 if smoke else 300_000 if quick else 2_000_000
    repeats = 1 if smoke else REPEATS
    append_batch = _repeat(lambda d: _append(d, events, "batch", txn=False), repeats)
    append_never = _repeat(lambda d: _append(d, events, "never", txn=False), repeats)
    append_txn = _repeat(lambda d: _append(d, events, "batch", txn=True), repeats)
    read = _repeat(_append_then_read(events), repeats)
    read_rate = _median_rate(events, read)
    return {
        "file_append_events_per_s": _median_rate(events, append_batch),
        "file_append_never_events_per_s": _median_rate(events, append_never),
        "file_append_txn_events_per_s": _median_rate(events, append_txn),
        "file_read_events_per_s": read_rate,
        "read_vs_target": round(read_rate / READ_TARGET, 2),
        "events": events,
        "value_bytes": VALUE_BYTES,
        "batch_records": BATCH_RECORDS,
        "read_max_records": READ_MAX_RECORDS,
        "repeats": repeats,
    }


if __name__ == "__main__":
    print(json.dumps(run(quick="--quick" in sys.argv[1:], smoke="--smoke" in sys.argv[1:]), indent=2))
