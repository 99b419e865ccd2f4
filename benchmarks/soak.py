"""Run for months: the state's costs over millions of jobs at a steady live load.

The scheduling loop (``fleetlog.service.loop.SchedulerLoop``, as ``fleetlog run`` drives it)
over the embedded file log, stamped by a virtual clock, fed by a simulated fleet in this
process: ``--nodes`` 8-GPU nodes in four cells heartbeating every 20 s (virtual), jobs arriving
at a steady rate (1 GPU 70%, CPU-only 20%, 4 GPUs 10%; four tenants) with exponential run times
of mean 60 s, so that about ``--live`` jobs are live at a time; each placement read back from
the decisions log as a backend reads it, and the job's ``TaskFinished`` appended when its run
time is over. Ended jobs retire ``--retain-s`` (virtual) after they end and their ids are
remembered ``--dedup-s`` more.

At 10%, 20%, 50% and 100% of ``--jobs`` it measures: RSS, snapshot bytes and time, restore
time, digest time (median of 5), the p50, p99 and max of the loop's step work since the last
point (a step that compacts the tables is among them), and the tables' rows. The growth ratios
are last point over first (flat: 1.0). ``--baseline-jobs N`` runs the same workload first with
retirement off (the state keeping every job, as before) up to N jobs: the same measures, for
the ratio of what history costs.

``--quick``: 2,000 nodes, 10,000 live, 400,000 jobs, ids remembered 120 s (a baseline of
400,000); ``--smoke`` (CI): 200 nodes, 500 live, 6,000 jobs — a test that it runs and prints
every key.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import heapq
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import add_smoke, emit, machine
from fleetlog.backends.simulated.clock import VirtualClock
from fleetlog.core.digest import digest, restore, snapshot
from fleetlog.core.policy import policy_named
from fleetlog.core.state import CoreConfig
from fleetlog.events import JobPlaced, JobSubmitted, NodeHeartbeat, TaskFinished, TaskGroup, encode, envelope
from fleetlog.log.base import DECISIONS, INPUTS, LogStore, Message
from fleetlog.log.consumer import decision_batches
from fleetlog.log.file import FileLogStore
from fleetlog.log.kafka import KafkaConfig, KafkaLogStore
from fleetlog.service.loop import LoopConfig, SchedulerLoop

BEAT_EVERY_MS = 20_000
MEAN_RUN_MS = 60_000
TICK_MS = 1_000
CELLS = 4
POINTS = (0.1, 0.2, 0.5, 1.0)
SHAPES = ((1, 1000, 0.7), (0, 0, 0.2), (4, 1000, 0.1))  # (GPUs, milli per GPU, share)


@dataclass
class Run:
    """One soak: the loop, the fleet's state as the simulated backend sees it, and the points."""

    nodes: int
    live: int
    jobs: int
    core: CoreConfig
    kafka: str | None = None
    """Bootstrap servers: the loop on Kafka topics of its own (log time: the brokers' append
    time, not the driver's virtual clock) instead of the file log."""
    seed: int = 7
    points: list[dict[str, Any]] = field(default_factory=list)
    steps_ms: list[float] = field(default_factory=list)
    submitted: int = 0
    compactions: int = 0
    log_start_ms: int | None = None
    finishes: list[tuple[int, str]] = field(default_factory=list)  # heap of (end ms, job id)

    async def run(self, directory: Path, progress: bool) -> None:
        rng = random.Random(self.seed)
        clock = VirtualClock()
        store: LogStore
        if self.kafka is None:
            store = FileLogStore(directory, clock=clock, fsync="never")
        else:
            store = KafkaLogStore(KafkaConfig(bootstrap_servers=self.kafka,
                                              topic_prefix=f"soak-{uuid.uuid4().hex[:8]}"))
        await store.open()
        loop = SchedulerLoop(store, policy_named("default"), LoopConfig(max_batch=20_000), self.core)
        beats = [_msg(_beat(i)) for i in range(self.nodes)]
        per_tick = self.live * TICK_MS / MEAN_RUN_MS  # arrivals a tick (Little's law)
        beats_per_tick = max(1, self.nodes * TICK_MS // BEAT_EVERY_MS)
        marks = [max(1, int(p * self.jobs)) for p in POINTS]
        await store.log(INPUTS).append(beats)
        read_at, carry, beat_next, started = 0, 0.0, 0, time.perf_counter()
        while self.submitted < self.jobs:
            clock.advance(clock.now_ms + TICK_MS)
            now = clock.now_ms
            out: list[Message] = []
            carry += per_tick
            count = min(int(carry), self.jobs - self.submitted)
            carry -= count
            out.extend(_msg(self._job(rng)) for _ in range(count))
            while self.finishes and self.finishes[0][0] <= now:
                out.append(_msg(TaskFinished(job_id=heapq.heappop(self.finishes)[1], task_index=0)))
            for _ in range(beats_per_tick):
                out.append(beats[beat_next])
                beat_next = (beat_next + 1) % self.nodes
            await store.log(INPUTS).append(out)
            end = await store.log(INPUTS).end_offset()
            while loop.offset < end:
                rows = loop.state.jobs.size
                step = await loop.step(0)
                self.steps_ms.append(step.work_s * 1000)
                self.compactions += loop.state.jobs.size < rows
                if self.log_start_ms is None:
                    self.log_start_ms = loop.state.now_ms
            read_at = await self._placed(store, read_at, loop.decisions_next, now, rng)
            if marks and self.submitted >= marks[0]:
                marks.pop(0)
                self.points.append(self._measure(loop, time.perf_counter() - started))
                self.steps_ms = []
                if progress:
                    print(f"  {self.points[-1]}", file=sys.stderr, flush=True)
        await store.close()

    def _job(self, rng: random.Random) -> JobSubmitted:
        self.submitted += 1
        gpus, milli = _shape(rng.random())
        group = TaskGroup(count=1, cpu_milli=4000, mem_mib=16_384, gpu_count=gpus, gpu_milli=milli)
        return JobSubmitted(job_id=f"soak-{self.submitted:09d}", tenant=f"tenant-{self.submitted % 4}",
                            task_groups=(group,))

    async def _placed(self, store: LogStore, at: int, end: int, now: int, rng: random.Random) -> int:
        """Read the decisions the loop wrote since ``at``: each placed job ends after its run
        time (exponential, mean ``MEAN_RUN_MS``)."""
        while at < end:
            records = await store.log(DECISIONS).read(at, 1_000)
            if not records:
                break
            for _, batch in decision_batches(records):
                for d in batch.decisions:
                    if isinstance(d, JobPlaced):
                        ends = now + 1 + int(rng.expovariate(1 / MEAN_RUN_MS))
                        heapq.heappush(self.finishes, (ends, d.job_id))
            at = records[-1].offset + 1
        return at

    def _measure(self, loop: SchedulerLoop, wall_s: float) -> dict[str, Any]:
        state = loop.state
        gc.collect()
        t0 = time.perf_counter()
        data = snapshot(state)
        snapshot_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        back = restore(data)
        restore_s = time.perf_counter() - t0
        del back
        digests = []
        for _ in range(5):
            t0 = time.perf_counter()
            digest(state)
            digests.append(time.perf_counter() - t0)
        steps = sorted(self.steps_ms)
        return {
            "jobs": self.submitted,
            "inputs": loop.offset,
            "live_jobs": state.live_jobs(),
            "job_rows": state.jobs.size,
            "task_rows": state.tasks.size,
            "dedup_ids": len(state.retired),
            "retired": sum(sum(c) for c in state.retired_counts.values()),
            "rss_mib": _rss_mib(),
            "snapshot_bytes": len(data),
            "snapshot_s": snapshot_s,
            "restore_s": restore_s,
            "digest_ms": statistics.median(digests) * 1000,
            "step_p99_ms": steps[int(0.99 * (len(steps) - 1))] if steps else 0.0,
            "step_p50_ms": steps[len(steps) // 2] if steps else 0.0,
            "step_max_ms": steps[-1] if steps else 0.0,
            "compactions": self.compactions,
            "steps": len(steps),
            "wall_s": wall_s,
            "log_h": (state.now_ms - (self.log_start_ms or 0)) / 3_600_000,
        }


def _shape(u: float) -> tuple[int, int]:
    for gpus, milli, share in SHAPES:
        if u < share:
            return gpus, milli
        u -= share
    return SHAPES[0][0], SHAPES[0][1]


def _beat(i: int) -> NodeHeartbeat:
    cell = f"cell-{i % CELLS}"
    return NodeHeartbeat(cell=cell, node=f"node-{i:05d}", cpu_milli=128_000, mem_mib=1_048_576, gpu_count=8,
                         gpu_model="A100", topology=(f"{cell}-b0", f"{cell}-r{i // 64}", f"node-{i:05d}"))


def _msg(event: Any) -> Message:
    return Message(encode(envelope(event, "soak")))


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _ratio(points: list[dict[str, Any]], key: str) -> float:
    first, last = points[0][key], points[-1][key]
    return float(last / first) if first else 0.0


def summary(points: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "points": points,
        "rss_growth_ratio": _ratio(points, "rss_mib"),
        "snapshot_bytes_growth_ratio": _ratio(points, "snapshot_bytes"),
        "snapshot_s_growth_ratio": _ratio(points, "snapshot_s"),
        "restore_s_growth_ratio": _ratio(points, "restore_s"),
        "digest_growth_ratio": _ratio(points, "digest_ms"),
        "step_p99_growth_ratio": _ratio(points, "step_p99_ms"),
        "rss_mib_max": max(p["rss_mib"] for p in points),
    }


async def soak(nodes: int, live: int, jobs: int, core: CoreConfig, progress: bool,
               kafka: str | None = None) -> dict[str, Any]:
    run = Run(nodes, live, jobs, core, kafka)
    with tempfile.TemporaryDirectory(prefix="fleetlog-soak-") as tmp:
        await run.run(Path(tmp), progress)
    return summary(run.points)


def kafka_run(jobs: int, nodes: int, live: int, progress: bool) -> dict[str, Any]:
    """The soak on a real broker (``FLEETLOG_KAFKA`` or one started for it, stopped by PID).
    The driver does not wait for real time: log time (broker time) runs at the speed the loop
    folds, so the windows are seconds of it (retained 5 s, remembered 10 s more)."""
    from tests.kafka_broker import KafkaBroker

    broker = KafkaBroker(ephemeral=True, heap="1g", jvm_opts="")
    bootstrap = broker.start()
    try:
        core = CoreConfig(retain_finished_ms=5_000, dedup_window_ms=10_000)
        out = asyncio.run(soak(nodes, live, jobs, core, progress, kafka=bootstrap))
    finally:
        broker.close()
    return {"nodes": nodes, "live": live, "jobs": jobs, "retain_s": 5.0, "dedup_s": 10.0,
            "external_broker": broker.external is not None, **out}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quick", action="store_true", help="2,000 nodes, 400,000 jobs (under 3 minutes)")
    add_smoke(parser)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--live", type=int, default=50_000, help="live jobs to hold (about)")
    parser.add_argument("--jobs", type=int, default=10_000_000)
    parser.add_argument("--baseline-jobs", type=int, default=1_000_000,
                        help="jobs of the run with retirement off (0: none)")
    parser.add_argument("--retain-s", type=float, default=60.0, help="retain_finished_ms, in s of log time")
    parser.add_argument("--dedup-s", type=float, default=600.0, help="dedup_window_ms, in s of log time")
    parser.add_argument("--progress", action="store_true", help="each point on stderr as it is measured")
    parser.add_argument("--kafka", action="store_true",
                        help="also one run on Kafka (FLEETLOG_KAFKA, or a broker started for it): 2,000 "
                        "nodes, 10,000 live, --kafka-jobs jobs, the windows 5 s and 10 s of broker time "
                        "(FLEETLOG_SOAK_KAFKA=1 says the same)")
    parser.add_argument("--kafka-jobs", type=int, default=1_000_000)
    args = parser.parse_args()
    args.kafka = args.kafka or os.environ.get("FLEETLOG_SOAK_KAFKA") == "1"
    size = "full"
    if args.quick:  # (a window the first point has filled: 40,000 jobs come in 240 s of log time)
        size, args.nodes, args.live, args.jobs, args.baseline_jobs = "quick", 2_000, 10_000, 400_000, 400_000
        args.dedup_s = 120.0
    if args.smoke:
        size, args.nodes, args.live, args.jobs, args.baseline_jobs = "smoke", 200, 500, 6_000, 6_000
        args.retain_s, args.dedup_s, args.kafka_jobs = 10.0, 20.0, 3_000
    for name in ("nodes", "live", "jobs"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    core = CoreConfig(retain_finished_ms=int(args.retain_s * 1000), dedup_window_ms=int(args.dedup_s * 1000))
    out: dict[str, Any] = {"benchmark": "soak", "size": size, "nodes": args.nodes, "live": args.live,
                           "jobs": args.jobs, "retain_s": args.retain_s, "dedup_s": args.dedup_s}
    if args.baseline_jobs > 0:
        kept = asyncio.run(soak(args.nodes, args.live, args.baseline_jobs,
                                CoreConfig(retain_finished_ms=None), args.progress))
        out["baseline"] = kept
    out.update(asyncio.run(soak(args.nodes, args.live, args.jobs, core, args.progress)))
    if args.kafka:
        out["kafka"] = kafka_run(args.kafka_jobs, 200 if args.smoke else 2_000, 500 if args.smoke else 10_000,
                                 args.progress)
    out["machine"] = machine()
    emit(out, args.json)


if __name__ == "__main__":
    main()
