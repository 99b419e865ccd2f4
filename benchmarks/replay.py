"""``fleetlog replay`` on a recorded 1,000,000-event file log: verify throughput and state-at latency.

Data: ``fleetlog.service.loadgen`` as in ``benchmarks.service`` (10,000 8-GPU nodes heartbeating
in turn, 1% submissions, as many cancels of old jobs — mostly heartbeats, as in a real fleet)
appended in rounds of 10,000 events
to a file log and decided by the real ``SchedulerLoop`` (one decision batch per round), with a
snapshot every 100,000 inputs (all kept).  Built once per run in a temporary directory.

* **verify** — ``fleetlog.replay.verify.verify`` over the whole log: read, decode, fold, decide
  again at every batch's ``as_of`` and compare digests and decisions.  Input events per second,
  as ``fleetlog replay verify`` runs by default here (``--jobs`` = the CPUs, at most 4: the log
  cut at snapshots into stretches verified by forked processes at once) and in one process
  (``--jobs 1``).  Baseline in the same process: the fold alone (``replay`` of the recorded
  batches, no decide).
* **state-at** — the state at an inputs offset halfway between two snapshots (85% of the log):
  restore the newest snapshot before it and fold the rest.  Baseline: the same point folded from
  the start (``--no-snapshots``).  Medians of ``--repeats`` runs.

``--smoke`` (CI): 12,000 events in rounds of 1,000, a snapshot every 4,000, one repeat — a
test that it runs.

Rates are given per wall-clock second and per CPU second of this process and its children:
on a shared machine the second says what the code does when it gets the CPU.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import emit, machine, parse
from fleetlog.core.digest import snapshot
from fleetlog.core.policy import policy_named
from fleetlog.log.file import FileLogStore
from fleetlog.log.snapshots import DirectorySnapshots, Snapshot, SnapshotHeader, encode_snapshot
from fleetlog.replay.engine import Start, replay
from fleetlog.replay.source import Source, open_file_source
from fleetlog.replay.state_at import Point, state_at
from fleetlog.replay.verify import verify
from fleetlog.service.loadgen import Load, batches
from fleetlog.service.loop import LoopConfig, SchedulerLoop

LOAD = Load(nodes=10_000, submit_share=0.01, keep_jobs=2000)  # the mix of benchmarks.service
ROUND = 10_000
SNAPSHOT_EVERY = 100_000


async def build(
    directory: Path, events: int, round_: int = ROUND, snapshot_every: int = SNAPSHOT_EVERY
) -> dict[str, Any]:
    """Append ``events`` loadgen events in rounds, each decided by the loop; snapshots as we go."""
    started = time.perf_counter()
    now = [1_767_225_600_000]
    store = FileLogStore(directory, clock=lambda: now[0], fsync="never")
    snapshots = DirectorySnapshots(directory / "snapshots", keep=events // snapshot_every + 1)
    await store.open()
    loop = SchedulerLoop(store, policy_named("default"), LoopConfig(max_batch=round_))
    appended = 0
    for messages in batches(LOAD, round_):
        await store.log("inputs").append(messages[: events - appended])
        appended += min(round_, events - appended)
        while (await loop.step()).inputs:
            pass
        now[0] += 1_000
        if appended % snapshot_every == 0:
            header = SnapshotHeader(loop.offset, loop.decisions_next, loop.policy.name, 0)
            await snapshots.save(encode_snapshot(Snapshot(header, snapshot(loop.state))))
        if appended >= events:
            break
    await store.close()
    return {"events": appended, "build_s": round(time.perf_counter() - started, 1)}


async def verify_rate(source: Source, jobs: int = 1) -> tuple[float, float, int]:
    """(events/s wall, events/s CPU of this process and its children, batches)."""
    started, cpu = time.perf_counter(), _cpu()
    report = await verify(source, jobs=jobs)
    assert report.ok, report.divergence
    wall, used = time.perf_counter() - started, _cpu() - cpu
    return report.inputs / wall, report.inputs / used, report.batches


def _cpu() -> float:
    """CPU seconds of this process and of its waited-for children (parallel verify forks)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


async def fold_rate(source: Source) -> tuple[float, float]:
    started, cpu = time.perf_counter(), time.process_time()
    done = await replay(source, Start.fresh())
    return done.inputs / (time.perf_counter() - started), done.inputs / (time.process_time() - cpu)


async def state_at_seconds(source: Source, offset: int, snapshots: bool) -> float:
    started = time.perf_counter()
    found = await state_at(source, Point(offset=offset), use_snapshots=snapshots)
    assert (found.snapshot is not None) == snapshots
    return time.perf_counter() - started


async def measure(directory: Path, events: int, repeats: int, jobs: int) -> dict[str, Any]:
    source = await open_file_source(directory)
    try:
        await verify_rate(source)  # warm up: numba kernels, page cache
        verify_runs = [await verify_rate(source, jobs) for _ in range(max(1, repeats // 2))]
        serial_runs = [await verify_rate(source, 1) for _ in range(max(1, repeats // 2))]
        fold_runs = [await fold_rate(source) for _ in range(max(1, repeats // 2))]
        point = int(events * 0.85)
        fast = [await state_at_seconds(source, point, True) for _ in range(repeats)]
        slow = [await state_at_seconds(source, point, False) for _ in range(max(1, repeats // 2))]
    finally:
        await source.close()
    verify_eps = statistics.median(r[0] for r in verify_runs)
    fold_eps = statistics.median(r[0] for r in fold_runs)
    return {
        "verify_jobs": jobs,
        "verify_events_per_s": round(verify_eps),
        "verify_events_per_cpu_s": round(statistics.median(r[1] for r in verify_runs)),
        "verify_batches": verify_runs[0][2],
        "verify_one_process_events_per_s": round(statistics.median(r[0] for r in serial_runs)),
        "verify_one_process_events_per_cpu_s": round(statistics.median(r[1] for r in serial_runs)),
        "fold_only_events_per_s": round(fold_eps),
        "fold_only_events_per_cpu_s": round(statistics.median(r[1] for r in fold_runs)),
        "verify_vs_fold_only": round(verify_eps / fold_eps, 3),
        "state_at_offset": point,
        "state_at_snapshot_s": round(statistics.median(fast), 4),
        "state_at_from_start_s": round(statistics.median(slow), 4),
        "state_at_speedup": round(statistics.median(slow) / statistics.median(fast), 1),
    }


async def main() -> dict[str, Any]:
    args = parse(__doc__ or "")
    events = 12_000 if args.smoke else 200_000 if args.quick else 1_000_000
    repeats = 1 if args.smoke else 2 if args.quick else args.repeats
    round_, every = (1_000, 4_000) if args.smoke else (ROUND, SNAPSHOT_EVERY)
    with tempfile.TemporaryDirectory(prefix="fleetlog-replay-bench-") as tmp:
        built = await build(Path(tmp) / "log", events, round_, every)
        result = {"benchmark": "replay", "quick": args.quick, "smoke": args.smoke, **built}
        result |= await measure(Path(tmp) / "log", events, repeats, min(4, len(os.sched_getaffinity(0))))
    result["targets"] = {"verify_events_per_s": ">= 500000", "state_at_snapshot_s": "<= 1.0"}
    result["machine"] = machine()
    emit(result, args.json)
    return result


if __name__ == "__main__":
    asyncio.run(main())
