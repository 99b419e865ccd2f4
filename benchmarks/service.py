"""``fleetlog run`` on a real Kafka broker: throughput, decision latency, restart time.

* **throughput** — a backlog of input events (``fleetlog.service.loadgen``: 10,000 8-GPU
  nodes heartbeating in turn, 1% job submissions, 1% cancels of old jobs) is appended first;
  then the service (in this process, uvloop) drains it end to end: read_committed consume,
  decode, fold, decide, one Kafka transaction per decision batch with the input offset.
  Events per second from the first read to the last input committed — the rate the service
  sustains when it is the bottleneck.  One uncounted round of 200,000 events warms the broker
  first (a JVM that has just started runs its hot paths interpreted).
* **latency** — the service as a child process with 10,000 nodes (1,000 of them H100, full)
  and 10,000 pending jobs that wait for H100s; node heartbeats stream at 1,000/s while probe
  jobs (1 A100 GPU) are submitted at 50/s.  Latency per probe: from the broker's append time
  of the submission to the moment a reader in this process sees its ``JobPlaced``.
* **restart** — a history of N input events decided by the service with snapshots; recovery
  from the newest snapshot + tail, against recovery by folding the whole history (the
  baseline), both in this process; and ``fleetlog run`` from spawn to leading again.

The broker is ``FLEETLOG_KAFKA`` or one started for the run (``tests/kafka_broker.py``).
``--smoke`` (CI): 20,000-event rounds, 1,000 nodes and pending jobs, 3 s of probes — a test
that it runs.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import structlog
import uvloop

from benchmarks import auth as auth_bench
from benchmarks.common import emit, machine, parse
from fleetlog.core.policy import policy_named
from fleetlog.events import JobPlaced, JobSubmitted, NodeHeartbeat, TaskGroup, encode, envelope
from fleetlog.log.base import DECISIONS, INPUTS, Message
from fleetlog.log.consumer import decision_batches
from fleetlog.log.kafka import KafkaConfig, KafkaLogStore
from fleetlog.service.config import Config, ServiceSettings
from fleetlog.service.loadgen import Load, batches
from fleetlog.service.loop import LoopConfig, SchedulerLoop
from fleetlog.service.service import Service
from fleetlog.service.snapshots import recover, snapshot_store
from tests.kafka_broker import KafkaBroker
from tests.service.process import ServiceProcess

GROUP = "fleetlog-scheduler"
MIX = Load(nodes=10_000, submit_share=0.01, keep_jobs=2000)
WARM_UP_EVENTS = 200_000


def _config(bootstrap: str, prefix: str, **settings: Any) -> Config:
    return Config(kafka=KafkaConfig(bootstrap_servers=bootstrap, topic_prefix=prefix),
                  service=ServiceSettings(http_port=0, **settings))


async def _preload(store: KafkaLogStore, events: int, load: Load = MIX) -> float:
    started = time.perf_counter()
    for chunk in itertools.islice(batches(load, 10_000), events // 10_000):
        await store.log(INPUTS).append(chunk)
    return events / (time.perf_counter() - started)


async def _drain(config: Config, events: int) -> dict[str, float]:
    """Run the service until it has committed ``events`` inputs; the rate after it leads."""
    service = Service(config)
    task = asyncio.create_task(service.run())
    while service.loop is None:
        await asyncio.sleep(0.005)
    started, loop = time.perf_counter(), service.loop
    while loop.committed < events:
        await asyncio.sleep(0.005)
    seconds = time.perf_counter() - started
    decisions = service.metrics.decisions._value.get()
    service.stop()
    await task
    return {"events_per_s": events / seconds, "seconds": seconds, "decisions": decisions}


async def throughput(bootstrap: str, events: int) -> dict[str, Any]:
    prefix = f"bench-tp-{uuid.uuid4().hex[:8]}"
    config = _config(bootstrap, prefix, snapshot_every_events=10**9, snapshot_every_s=3600.0)
    assert config.kafka is not None
    async with KafkaLogStore(config.kafka) as store:
        produce_rate = await _preload(store, events)
    drained = await _drain(config, events)
    return {"events": events, "nodes": MIX.nodes, "produce_events_per_s": produce_rate, **drained}


# -- latency --------------------------------------------------------------------------------


def _node(i: int, h100: bool) -> NodeHeartbeat:
    return NodeHeartbeat(cell="cell-a", node=f"node-{i:05d}", cpu_milli=128_000, mem_mib=1_048_576,
                         gpu_count=8, gpu_model="H100" if h100 else "A100",
                         topology=("block-0", f"rack-{i // 32:04d}", f"node-{i:05d}"))


def _job(job_id: str, gpus: int, model: str) -> JobSubmitted:
    group = TaskGroup(count=1, cpu_milli=1000, mem_mib=4096, gpu_count=gpus, gpu_milli=1000,
                      gpu_models=(model,))
    return JobSubmitted(job_id=job_id, tenant="bench", task_groups=(group,))


def _msgs(events: list[Any]) -> list[Message]:
    return [Message(encode(envelope(e, "bench"))) for e in events]


async def _setup_pending(store: KafkaLogStore, nodes: int, pending: int) -> None:
    h100 = nodes // 10
    fleet = [_node(i, i < h100) for i in range(nodes)]
    fill = [_job(f"fill-{i}", 8, "H100") for i in range(h100)]
    wait = [_job(f"wait-{i}", 8, "H100") for i in range(pending)]
    messages = _msgs(fleet + fill + wait)
    for at in range(0, len(messages), 10_000):
        await store.log(INPUTS).append(messages[at : at + 10_000])


async def _reader(store: KafkaLogStore, seen: dict[str, float], stop: asyncio.Event, at: int) -> None:
    log = store.log(DECISIONS)
    while not stop.is_set():
        records = await log.read(at, 1000, timeout_ms=200)
        now = time.time()
        for _, batch in decision_batches(records):
            for d in batch.decisions:
                if isinstance(d, JobPlaced) and d.job_id.startswith("probe-"):
                    seen.setdefault(d.job_id, now)
        if records:
            at = records[-1].offset + 1


async def _probe(store: KafkaLogStore, nodes: int, seconds: float, rate: float) -> dict[str, float]:
    """Probes and heartbeats for ``seconds``; the append time of every probe (broker time)."""
    appended: dict[str, int] = {}
    beats = itertools.cycle(range(nodes))
    h100 = nodes // 10
    tick, n = 0.02, 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        started = time.monotonic()
        beat = [_node(i, i < h100) for i in itertools.islice(beats, int(1000 * tick))]
        probe_id = f"probe-{n}"
        n += 1
        offset = await store.log(INPUTS).append(_msgs([_job(probe_id, 1, "A100"), *beat]))
        appended[probe_id] = offset
        await asyncio.sleep(max(0.0, 1 / rate - (time.monotonic() - started)))
    times: dict[str, float] = {}
    for probe_id, offset in appended.items():
        (record,) = await store.log(INPUTS).read(offset, 1, timeout_ms=5000)
        times[probe_id] = record.timestamp_ms / 1000
    return times


async def latency(bootstrap: str, nodes: int, pending: int, seconds: float) -> dict[str, Any]:
    prefix = f"bench-lat-{uuid.uuid4().hex[:8]}"
    config = KafkaConfig(bootstrap_servers=bootstrap, topic_prefix=prefix)
    env = {"FLEETLOG_KAFKA_BOOTSTRAP_SERVERS": bootstrap, "FLEETLOG_KAFKA_TOPIC_PREFIX": prefix}
    async with KafkaLogStore(config) as store:
        await _setup_pending(store, nodes, pending)
        end = await store.log(INPUTS).end_offset()
        with tempfile.TemporaryDirectory() as tmp:
            service = ServiceProcess(Path(tmp) / "service.log", [], env).start()
            try:
                await asyncio.to_thread(service.wait_leading, 300, end - 1)
                seen: dict[str, float] = {}
                stop = asyncio.Event()
                # Where the reader starts is read before the first probe, so no probe's decision
                # can come before it (connecting the reader takes longer than the first steps).
                start = await store.log(DECISIONS).end_offset()
                reader = asyncio.create_task(_reader(store, seen, stop, start))
                appended = await _probe(store, nodes, seconds, 50)
                await asyncio.sleep(2)
                stop.set()
                await reader
                health = service.health() or {}
            finally:
                service.stop()
    waits = sorted((seen[p] - t) * 1000 for p, t in appended.items() if p in seen)
    q = statistics.quantiles(waits, n=100) if len(waits) > 1 else [float("nan")] * 99
    return {"nodes": nodes, "pending_jobs": pending, "probes": len(appended), "placed": len(waits),
            "p50_ms": q[49], "p99_ms": q[98], "max_ms": waits[-1] if waits else float("nan"),
            "inputs_offset": health.get("inputs_offset")}


# -- restart --------------------------------------------------------------------------------


async def _recover_seconds(config: Config, with_snapshots: bool) -> tuple[float, int]:
    assert config.kafka is not None
    store = KafkaLogStore(config.kafka)
    await store.open()
    snapshots = snapshot_store(config)
    try:
        started = time.perf_counter()

        def make(s: Any) -> SchedulerLoop:
            return SchedulerLoop(s, policy_named("default"), LoopConfig(group=GROUP))

        if with_snapshots:
            loop, _ = await recover(store, snapshots, make)
        else:
            loop = make(store)
            await loop.recover()
        return time.perf_counter() - started, loop.offset
    finally:
        await snapshots.close()
        await store.close()


async def restart(bootstrap: str, events: int) -> dict[str, Any]:
    prefix = f"bench-rs-{uuid.uuid4().hex[:8]}"
    config = _config(bootstrap, prefix, snapshot_every_events=max(events // 10, 1000))
    assert config.kafka is not None
    async with KafkaLogStore(config.kafka) as store:
        await _preload(store, events)
    await _drain(config, events)
    snap_s, snap_offset = await _recover_seconds(config, True)
    full_s, full_offset = await _recover_seconds(config, False)
    assert snap_offset == full_offset == events
    env = {"FLEETLOG_KAFKA_BOOTSTRAP_SERVERS": bootstrap, "FLEETLOG_KAFKA_TOPIC_PREFIX": prefix}
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        service = ServiceProcess(Path(tmp) / "service.log", [], env).start()
        try:
            await asyncio.to_thread(service.wait_leading, 300, events - 1)
            spawn_to_leading = time.perf_counter() - started
            recovered = [line for line in service.lines() if line.get("event") == "recovered"]
        finally:
            service.stop()
    return {"events": events, "recover_from_snapshot_s": snap_s, "recover_full_replay_s": full_s,
            "speedup": full_s / snap_s, "process_spawn_to_leading_s": spawn_to_leading,
            "process_recovery_s": recovered[-1]["seconds"] if recovered else None}


# -- main -----------------------------------------------------------------------------------


async def measure(bootstrap: str, quick: bool, smoke: bool = False) -> dict[str, Any]:
    events = 20_000 if smoke else 200_000 if quick else 1_000_000
    rounds = 1 if quick or smoke else 3
    # Not counted: a broker's JVM runs interpreted until its hot paths are compiled, which takes
    # seconds of traffic; a freshly started broker made the first round up to 2.5x slower.
    warm_up = await throughput(bootstrap, 10_000 if smoke else WARM_UP_EVENTS)
    runs = [await throughput(bootstrap, events) for _ in range(rounds)]
    rates = sorted(r["events_per_s"] for r in runs)
    size = 1_000 if smoke else 10_000
    lat = await latency(bootstrap, size, size, 3 if smoke else 10 if quick else 30)
    rst = await restart(bootstrap, 20_000 if smoke else 200_000 if quick else 1_000_000)
    auth = await _auth(quick, smoke)
    return {
        "benchmark": "service",
        "machine": machine(),
        "throughput": {"median_events_per_s": statistics.median(rates), "runs": runs,
                       "target_events_per_s": 100_000, "warm_up": warm_up},
        "latency": {**lat, "target_p99_ms": 50},
        "restart": {**rst, "target_s": 2.0},
        **auth,
    }


async def _auth(quick: bool, smoke: bool) -> dict[str, Any]:
    """``ingest_auth_ratio`` (HTTP ingest with bearer tokens on over off, alternated runs, same
    process) and ``authz_check_p99_us`` (one request's token, roles and rules): benchmarks.auth."""
    requests, rounds = (20, 2) if smoke else (200, 4) if quick else (500, 6)
    with tempfile.TemporaryDirectory(prefix="fleetlog-auth-bench-") as tmp:
        ingest = await auth_bench.ingest_ratio(Path(tmp), requests, rounds)
        p99 = auth_bench.check_p99_us(Path(tmp), 1_000 if smoke else 100_000)
    return {"ingest_auth_ratio": ingest["ingest_auth_ratio"], "authz_check_p99_us": p99["authz_check_p99_us"],
            "auth": {**ingest, **p99, "authz_check_is": auth_bench.CHECK_IS}}


def run(quick: bool, smoke: bool = False) -> dict[str, Any]:
    return on_broker(measure, quick, smoke)


def on_broker(measured: Callable[[str, bool, bool], Awaitable[dict[str, Any]]], quick: bool,
              smoke: bool) -> dict[str, Any]:
    """``measured(bootstrap, quick, smoke)`` on ``FLEETLOG_KAFKA``, or on a broker started for it."""
    external = os.environ.get("FLEETLOG_KAFKA")
    broker = None if external else KafkaBroker(ephemeral=True, heap="1g", jvm_opts="")
    bootstrap = external or broker.start()  # type: ignore[union-attr]
    try:
        return uvloop.run(measured(bootstrap, quick, smoke))
    finally:
        if broker is not None:
            broker.close()


def main() -> None:
    args = parse(__doc__ or "")
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr),
                        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    emit(run(args.quick, args.smoke), args.json)


if __name__ == "__main__":
    main()
