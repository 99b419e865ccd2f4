"""Faults injected into a real three-node Kafka cluster under load, then checked.

A run (:func:`run_scenario`) starts ``fleetlog run`` (a real child process, talking to the
brokers through the proxy) and a producer of sustained keyed load (talking to them directly),
then does ``rounds`` rounds of: steady load, the fault, the healing, and a wait until decisions
flow again (the service resumes on its own: no restart by hand).  Afterwards the load stops,
the service catches up and :func:`tests.faults.checker.check` counts what was lost,
duplicated or left undecided, and replays the log.  Used by ``tests/faults`` (one round each)
and ``python -m benchmarks.faults`` (the measurement).
"""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
from aiokafka import AIOKafkaConsumer, TopicPartition

from fleetlog.events.codec import encode, envelope
from fleetlog.log.base import DECISIONS, INPUTS, LogError, Message
from fleetlog.log.kafka import KafkaConfig, KafkaLogStore
from fleetlog.service.loadgen import Load, events
from tests.faults.checker import Report, check, latencies_ms, max_stall_s, read_logs
from tests.kafka_cluster import NODES, KafkaCluster
from tests.service.process import ServiceProcess
from tests.service.test_reliability import wait_caught_up

GROUP = "fleetlog-scheduler"
LOAD = Load(nodes=64, submit_share=0.2, keep_jobs=200)
PRODUCER_ID = "fleetlog-faults"
RESUME_WITHIN_S = 90.0
"""A round fails if no decision follows the healing within this long."""


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class KeyedLoad:
    """Sustained load: every ``tick_s`` one append of ``per_tick`` inputs, each with a unique
    envelope key.  An append that succeeds acknowledges its keys; one that fails is *not* sent
    again (an input resent after an ambiguous failure is the duplicate the checker looks for
    in the producer's retries, not in ours): its keys are counted as unacknowledged."""

    def __init__(self, store: KafkaLogStore, per_tick: int = 40, tick_s: float = 0.05) -> None:
        self.store, self.per_tick, self.tick_s = store, per_tick, tick_s
        self.acked: list[str] = []
        self.failed = 0
        self._stream = events(LOAD)
        self._n = 0
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> KeyedLoad:
        self._task = asyncio.create_task(self._run())
        return self

    def _next(self) -> tuple[list[Message], list[str]]:
        messages, keys = [], []
        for _ in range(self.per_tick):
            key = f"k{self._n:09d}"
            self._n += 1
            messages.append(Message(encode(envelope(next(self._stream), PRODUCER_ID, key))))
            keys.append(key)
        return messages, keys

    async def _run(self) -> None:
        while not self._stop.is_set():
            messages, keys = self._next()
            try:
                await self.store.log(INPUTS).append(messages)
            except LogError:
                self.failed += len(keys)
                await asyncio.sleep(0.2)
                continue
            self.acked.extend(keys)
            await asyncio.sleep(self.tick_s)

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task


@dataclass
class Context:
    """What a fault acts on."""

    cluster: KafkaCluster
    store: KafkaLogStore
    services: list[ServiceProcess]
    new_service: Callable[[str], ServiceProcess]
    notes: list[str] = field(default_factory=list)

    async def leader(self, log: str) -> int:
        """The broker leading partition 0 of ``log``'s topic now."""
        topic = self.store.config.topic(log)
        assert self.store._admin is not None
        described = await self.store._admin.describe_topics([topic])
        return int(described[0]["partitions"][0]["leader"])

    async def open_transaction(self, log: str, within_s: float) -> tuple[int, int] | None:
        """Poll partition 0 of ``log`` until a transaction is open on it: (high watermark,
        last stable offset) then, or ``None`` after ``within_s``."""
        tp = TopicPartition(self.store.config.topic(log), 0)
        options = {"bootstrap_servers": self.cluster.direct, "enable_auto_commit": False}
        committed = AIOKafkaConsumer(**options, isolation_level="read_committed")
        uncommitted = AIOKafkaConsumer(**options, isolation_level="read_uncommitted")
        await asyncio.gather(committed.start(), uncommitted.start())
        try:
            deadline = time.monotonic() + within_s
            while time.monotonic() < deadline:
                high, stable = await asyncio.gather(uncommitted.end_offsets([tp]),
                                                    committed.end_offsets([tp]))
                if high[tp] > stable[tp]:
                    return int(high[tp]), int(stable[tp])
            return None
        finally:
            await asyncio.gather(committed.stop(), uncommitted.stop())

    async def sh(self, fn: Callable[..., object], *args: object) -> None:
        await asyncio.to_thread(fn, *args)

    def leading(self) -> ServiceProcess:
        for s in self.services:
            if s.proc is not None and s.proc.poll() is None and (s.health() or {}).get("status") == "leading":
                return s
        raise AssertionError("no service leads")


Fault = Callable[[Context], Awaitable[None]]
"""Inject a fault and heal it; returns once the cluster is whole again (all nodes up)."""

KILL_HOLD_S = 5.0
"""How long a killed broker stays down: past its session with the controllers (4 s on the
development cluster), so its partitions have moved before it comes back."""


async def kill_and_restart(ctx: Context, node: int, what: str) -> None:
    await ctx.sh(ctx.cluster.kill, node)
    ctx.notes.append(f"killed node {node} ({what})")
    await asyncio.sleep(KILL_HOLD_S)
    await ctx.sh(ctx.cluster.restart, node)


async def kill_inputs_leader(ctx: Context) -> None:
    await kill_and_restart(ctx, await ctx.leader(INPUTS), "inputs leader")


async def kill_decisions_leader(ctx: Context) -> None:
    """SIGKILL the decisions partition's leader the moment a step's transaction is seen open
    there: its high watermark (``read_uncommitted`` end) above its last stable offset
    (``read_committed`` end) — records of a transaction neither committed nor aborted yet."""
    node = await ctx.leader(DECISIONS)
    pid = ctx.cluster.pid(node)
    assert pid is not None
    seen = await ctx.open_transaction(DECISIONS, within_s=10)
    os.kill(pid, signal.SIGKILL)
    await ctx.sh(ctx.cluster.kill_wait, node)
    ctx.notes.append(f"killed node {node} (decisions leader) " + (
        f"with a transaction open (high watermark {seen[0]} > last stable offset {seen[1]})" if seen
        else "(no open transaction seen within 10 s)"))
    await asyncio.sleep(KILL_HOLD_S)
    await ctx.sh(ctx.cluster.restart, node)


async def kill_controller(ctx: Context) -> None:
    await kill_and_restart(ctx, ctx.cluster.controller(), "active controller")


PAUSE_S = 10.0
"""Longer than every session a paused broker holds: its own with the controllers (4 s on the
development cluster) and the service's leader session (6 s by default)."""


async def pause_broker(ctx: Context) -> None:
    node = await ctx.leader(DECISIONS)
    await ctx.sh(ctx.cluster.pause, node)
    ctx.notes.append(f"paused node {node} (decisions leader) {PAUSE_S:.0f} s")
    await asyncio.sleep(PAUSE_S)
    await ctx.sh(ctx.cluster.resume, node)


CUT_S = 10.0


async def cut_service(ctx: Context) -> None:
    await ctx.sh(ctx.cluster.proxy.cut)
    await asyncio.sleep(CUT_S)
    await ctx.sh(ctx.cluster.proxy.heal)


async def kill_service_and_broker(ctx: Context) -> None:
    leader = ctx.leading()
    node = await ctx.leader(DECISIONS)
    await asyncio.gather(asyncio.to_thread(leader.kill9), ctx.sh(ctx.cluster.kill, node))
    ctx.services.remove(leader)
    ctx.notes.append(f"killed the leading service and node {node}")
    await asyncio.sleep(KILL_HOLD_S)
    await ctx.sh(ctx.cluster.restart, node)
    ctx.services.append(ctx.new_service("standby"))  # what a supervisor does: a new stand-by


async def rolling_restart(ctx: Context) -> None:
    for node in NODES:
        await ctx.sh(ctx.cluster.restart, node)
        await wait_replicated(ctx.store)


async def blackhole_broker(ctx: Context) -> None:
    node = await ctx.leader(DECISIONS)
    await ctx.sh(ctx.cluster.proxy.blackhole, node)
    ctx.notes.append(f"blackholed node {node} (decisions leader) for the service {CUT_S:.0f} s")
    await asyncio.sleep(CUT_S)
    await ctx.sh(ctx.cluster.proxy.heal)


SCENARIOS: dict[str, Fault] = {
    "kill-inputs-leader": kill_inputs_leader,
    "kill-decisions-leader": kill_decisions_leader,
    "kill-controller": kill_controller,
    "pause-broker": pause_broker,
    "cut-service": cut_service,
    "kill-service-and-broker": kill_service_and_broker,
    "rolling-restart": rolling_restart,
    "blackhole-broker": blackhole_broker,
}
STANDBYS = {"kill-service-and-broker": 1}
"""Scenarios that run a stand-by next to the leading service."""


async def wait_replicated(store: KafkaLogStore, timeout_s: float = 120) -> None:
    """Wait until every partition of the cluster has all three replicas in sync (a round
    starts on a whole cluster: a fault on one with a replica still catching up is two)."""
    assert store._admin is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            topics = await store._admin.list_topics()
            described = await store._admin.describe_topics(list(topics))
            if all(len(p["isr"]) == len(NODES) and p["leader"] >= 0
                   for t in described for p in t["partitions"]):
                return
        except Exception:  # a broker on its way back answers with errors: ask again
            pass
        await asyncio.sleep(0.5)
    raise AssertionError(f"the cluster's replicas were not in sync within {timeout_s}s")


class Round(msgspec.Struct, frozen=True):
    fault_start_ms: int
    healed_ms: int
    resumed_ms: int
    notes: tuple[str, ...]


class ScenarioResult(msgspec.Struct, frozen=True, kw_only=True):
    scenario: str
    rounds: int
    report: Report
    max_stall_s: float
    p99_fault_ms: float
    """The p99 decision latency of the inputs appended from a fault's start until decisions
    flowed again after its healing (scenario ``none``: the same windows without a fault)."""
    unacked_inputs: int
    notes: tuple[str, ...]

    def row(self) -> dict[str, object]:
        r = self.report
        return {"scenario": self.scenario, "rounds": self.rounds, "acked_inputs": r.acked_inputs,
                "lost": r.lost, "duplicated": r.duplicated,
                "decision_gaps": r.decision_gaps, "decision_duplicates": r.decision_duplicates,
                "replay_ok": r.replay_ok, "max_stall_s": self.max_stall_s,
                "p99_fault_ms": self.p99_fault_ms,
                "unacked_inputs": self.unacked_inputs, "undecided": r.undecided,
                "examples": list(r.examples), "divergence": r.divergence, "notes": list(self.notes)}


def p99(values: list[int]) -> float:
    if not values:
        return 0.0
    if len(values) < 2:
        return float(values[0])
    return float(statistics.quantiles(values, n=100, method="inclusive")[98])


async def _newest_step_ms(store: KafkaLogStore) -> int | None:
    log = store.log(DECISIONS)
    end = await log.end_offset()
    if end == 0:
        return None
    # a transactional log ends in a commit marker: look back a little for the last record
    records = await log.read(max(0, end - 8), 8, timeout_ms=0)
    return records[-1].timestamp_ms if records else None


async def wait_deciding(store: KafkaLogStore, after_ms: int, timeout_s: float = RESUME_WITHIN_S) -> int:
    """Wait for a decision record appended after ``after_ms``; its append time."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            stamp = await _newest_step_ms(store)
        except LogError:
            stamp = None
        if stamp is not None and stamp > after_ms:
            return stamp
        await asyncio.sleep(0.2)
    raise AssertionError(f"no decision within {timeout_s}s of the healing")


def service_env(cluster: KafkaCluster, prefix: str) -> dict[str, str]:
    """The service talks to the brokers through the proxy; settings are its defaults except
    the replication the cluster has and a snapshot now and then."""
    return {
        "FLEETLOG_KAFKA_BOOTSTRAP_SERVERS": cluster.proxied,
        "FLEETLOG_KAFKA_TOPIC_PREFIX": prefix,
        "FLEETLOG_KAFKA_REPLICATION_FACTOR": "3",
        "FLEETLOG_SERVICE_SNAPSHOT_EVERY_EVENTS": "5000",
        "FLEETLOG_SERVICE_IDLE_WAIT_MS": "50",
    }


async def run_scenario(cluster: KafkaCluster, name: str, rounds: int, work: Path,
                       calm_s: float = 3.0, warmup_s: float = 5.0) -> ScenarioResult:
    """``rounds`` rounds of scenario ``name`` (``"none"``: calm rounds, the baseline) on
    fresh topics, then the check.  Raises if the service does not resume within
    :data:`RESUME_WITHIN_S` of a healing."""
    fault = SCENARIOS.get(name)
    if fault is None and name != "none":
        raise ValueError(f"unknown scenario {name!r}: one of {', '.join(['none', *SCENARIOS])}")
    prefix = f"f{uuid.uuid4().hex[:8]}"
    store = KafkaLogStore(KafkaConfig(bootstrap_servers=cluster.direct, topic_prefix=prefix,
                                      replication_factor=3))
    await store.open()
    started: list[ServiceProcess] = []

    def new_service(role: str) -> ServiceProcess:
        process = ServiceProcess(work / f"{name}-{prefix}-{role}-{len(started)}.log", [],
                                 service_env(cluster, prefix)).start()
        started.append(process)
        return process

    ctx = Context(cluster, store, [], new_service)
    load = KeyedLoad(store)
    done: list[Round] = []
    try:
        await wait_replicated(store)
        ctx.services.append(new_service("leader"))
        await asyncio.to_thread(ctx.services[0].wait_leading, 120)
        for _ in range(STANDBYS.get(name, 0)):
            ctx.services.append(new_service("standby"))
        load.start()
        await wait_deciding(store, now_ms())
        await asyncio.sleep(warmup_s)  # the first steps compile the kernels: not a calm baseline
        for _ in range(rounds):
            await wait_replicated(store)
            await asyncio.sleep(calm_s)
            ctx.notes.clear()
            start = now_ms()
            if fault is not None:
                await fault(ctx)
            else:
                await asyncio.sleep(6)
            healed = now_ms()
            resumed = await wait_deciding(store, healed)
            done.append(Round(start, healed, resumed, tuple(ctx.notes)))
        await asyncio.sleep(calm_s)
        await load.stop()
        await wait_caught_up(store)
        logs = await read_logs(store)
        report = await check(store, load.acked, logs=logs)
        stall = max((max_stall_s(logs.steps, r.fault_start_ms, r.resumed_ms) for r in done), default=0.0)
        fault_lat = [v for r in done for v in latencies_ms(logs, r.fault_start_ms, r.resumed_ms)]
        return ScenarioResult(scenario=name, rounds=len(done), report=report, max_stall_s=stall,
                              p99_fault_ms=p99(fault_lat),
                              unacked_inputs=load.failed,
                              notes=tuple(n for r in done for n in r.notes))
    except BaseException:
        for s in started:
            print(f"--- {s.log_path.name}\n{s.tail(40)}")
        raise
    finally:
        await load.stop()
        for s in started:
            if s.proc is not None and s.proc.poll() is None:
                s.stop(20)
        await store.close()
