"""``fleetlog demo``: a seeded round trip through the embedded file log.

It writes a synthetic fleet (node heartbeats, quotas, gang jobs) plus a share of
malformed records from misbehaving producers into the inputs log, reads the log
back through the consumer (bad records go to the dead-letter log with a reason),
and reports what it found and how fast.  It needs no server.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import msgspec

from fleetlog.events import (
    Event,
    JobSubmitted,
    NodeHeartbeat,
    QuotaSet,
    Resources,
    TaskGroup,
    encode,
    envelope,
)
from fleetlog.events.codec import CONTENT_TYPE_HEADER, JSON
from fleetlog.log.base import DEAD_LETTERS, INPUTS, LogStore, Message
from fleetlog.log.consumer import REASON_HEADER, EventConsumer
from fleetlog.log.file import FileLogStore
from fleetlog.log.logdir import prepare_log_dir

GPU_MODELS = ("A100", "H100", "T4")


class DemoResult(msgspec.Struct, frozen=True):
    log_dir: str
    seed: int
    records_written: int
    events_read: dict[str, int]
    dead_letters: dict[str, int]
    gpus_in_fleet: int
    gpus_requested: int
    write_events_per_s: float
    read_events_per_s: float
    wall_s: float


def fleet(rng: random.Random, nodes: int) -> Iterator[Event]:
    """Heartbeats for ``nodes`` GPU nodes in a block/rack/host topology, and three tenants' quotas."""
    for i in range(nodes):
        yield NodeHeartbeat(
            cell="cell-a",
            node=f"node-{i:05d}",
            cpu_milli=96_000,
            mem_mib=786_432,
            gpu_count=8,
            gpu_model=GPU_MODELS[i * len(GPU_MODELS) // nodes],
            topology=(f"block-{i // 256}", f"rack-{i // 16}", f"node-{i:05d}"),
        )
    for t in range(3):
        yield QuotaSet(
            tenant=f"tenant-{t}", nominal=Resources(gpu_milli=nodes * 8000 // 3), weight_milli=1000
        )


def jobs(rng: random.Random, count: int) -> Iterator[Event]:
    """Gang jobs of seeded shapes: fractional, single and multi-GPU, some spanning a rack."""
    for j in range(count):
        gpus = rng.choice((1, 1, 1, 2, 4, 8))
        milli = rng.choice((250, 500, 1000)) if gpus == 1 else 1000
        tasks = rng.choice((1, 1, 2, 4)) if gpus == 8 else 1
        yield JobSubmitted(
            job_id=f"job-{j:06d}",
            tenant=f"tenant-{j % 3}",
            priority=rng.choice((0, 100)),
            task_groups=(
                TaskGroup(
                    count=tasks, cpu_milli=4000 * gpus, mem_mib=16_384 * gpus, gpu_count=gpus, gpu_milli=milli
                ),
            ),
            required_topology="rack" if tasks > 1 else None,
        )


def malformed(rng: random.Random, count: int) -> Iterator[Message]:
    """Records a buggy producer might send: garbage, unknown types, negative sizes, wrong versions."""
    samples = (
        Message(b"\xc1\xc1 not msgpack"),
        Message(
            b'{"schema_version":1,"producer_id":"go","event":{"type":"JobTeleported"}}',
            headers=((CONTENT_TYPE_HEADER, JSON),),
        ),
        Message(
            b'{"schema_version":1,"producer_id":"go","event":{"type":"NodeHeartbeat","cell":"c","node":"n",'
            b'"cpu_milli":-4,"mem_mib":1}}',
            headers=((CONTENT_TYPE_HEADER, JSON),),
        ),
        Message(
            b'{"schema_version":7,"producer_id":"rs","event":{}}', headers=((CONTENT_TYPE_HEADER, JSON),)
        ),
    )
    for _ in range(count):
        yield rng.choice(samples)


def messages(seed: int, nodes: int, job_count: int) -> list[Message]:
    """The seeded input stream: the fleet, then jobs with one bad record in fifty mixed in."""
    rng = random.Random(seed)
    out = [Message(encode(envelope(e, "demo"))) for e in fleet(rng, nodes)]
    bad = malformed(rng, job_count // 50)
    for i, event in enumerate(jobs(rng, job_count)):
        out.append(
            Message(encode(envelope(event, "demo"), "json"), headers=((CONTENT_TYPE_HEADER, JSON),))
            if i % 10 == 0
            else Message(encode(envelope(event, "demo")))
        )
        if i % 50 == 49:
            out.append(next(bad))
    return out


async def _write(store: LogStore, batch: list[Message]) -> float:
    start = time.perf_counter()
    for i in range(0, len(batch), 1000):
        await store.log(INPUTS).append(batch[i : i + 1000])
    return time.perf_counter() - start


async def _read(store: LogStore) -> tuple[Counter[str], int, float]:
    consumer, offset, counts, gpus = EventConsumer(store, warn=False), 0, Counter[str](), 0
    end = await store.log(INPUTS).end_offset()
    start = time.perf_counter()
    while offset < end:
        polled = await consumer.poll(offset, max_records=10_000)
        for d in polled.events:
            counts[type(d.envelope.event).__name__] += 1
            if isinstance(d.envelope.event, JobSubmitted):
                gpus += sum(g.count * g.gpu_count * g.gpu_milli for g in d.envelope.event.task_groups)
        offset = polled.next_offset
    return counts, gpus // 1000, time.perf_counter() - start


async def _dead_letter_reasons(store: LogStore) -> dict[str, int]:
    parked = await store.log(DEAD_LETTERS).read(0, max_records=1_000_000)
    return dict(sorted(Counter((r.header(REASON_HEADER) or b"?").decode() for r in parked).items()))


async def run_demo(
    log_dir: Path, seed: int = 1, nodes: int = 1024, job_count: int = 50_000, *, replace: bool = False
) -> DemoResult:
    """Write the seeded stream to a fresh file log in ``log_dir``, read it back, report.  An
    earlier fleetlog log there is replaced only when ``replace``; anything else is refused."""
    started = time.perf_counter()
    prepare_log_dir(log_dir, replace=replace)
    batch = messages(seed, nodes, job_count)
    async with FileLogStore(log_dir) as store:
        write_s = await _write(store, batch)
        counts, gpus, read_s = await _read(store)
        reasons = await _dead_letter_reasons(store)
    return DemoResult(
        log_dir=str(log_dir),
        seed=seed,
        records_written=len(batch),
        events_read=dict(sorted(counts.items())),
        dead_letters=reasons,
        gpus_in_fleet=nodes * 8,
        gpus_requested=gpus,
        write_events_per_s=round(len(batch) / write_s),
        read_events_per_s=round(len(batch) / read_s),
        wall_s=round(time.perf_counter() - started, 3),
    )
