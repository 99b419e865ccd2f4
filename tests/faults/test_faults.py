"""fleetlog on a real three-node Kafka cluster under real faults (issue 18).

The cluster (``infra/kafka/kafka.sh cluster``) and Toxiproxy in front of it are started once for
this module and stopped by PID. Each fault scenario of ``tests/faults/harness.py`` runs one round
under load here (``python -m benchmarks.faults`` runs five of each and records the table); every
one must lose no acknowledged input, duplicate none, leave no decision gap or duplicate, replay
bit-exactly, and decide again after the healing without a restart by hand.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from fleetlog.events import DecisionBatch, JobPlaced, JobSubmitted, TaskGroup, TaskPlacement
from fleetlog.events.codec import encode, envelope
from fleetlog.log.base import DECISIONS, INPUTS, Message
from fleetlog.log.kafka import KafkaConfig, KafkaLogStore
from fleetlog.log.memory import MemoryLogStore
from tests.faults.checker import check, max_stall_s, read_logs
from tests.faults.harness import SCENARIOS, run_scenario, wait_replicated
from tests.kafka_cluster import NODES, PORTS_SPAN, REPO, KafkaCluster, free_port_range

pytestmark = pytest.mark.kafka

STALL_LIMIT_S = {
    # broker kills: the benchmark's target is 10 s (measured at most 9.6 s: a node that was the
    # active controller as well costs a controller election before the 4 s broker session
    # starts, docs/service.md "On a replicated Kafka cluster"); here 15 s, room for a suite
    # running beside this one on two cores
    "kill-inputs-leader": 15, "kill-decisions-leader": 15, "kill-controller": 15,
    # the stand-by leads once the dead leader's session (6 s by default) has expired, and that
    # session starts afresh when the killed broker was the group's coordinator (measured: at
    # most 14.9 s alone; 20.8 s in a CI run with three other sessions on the two cores)
    "kill-service-and-broker": 25,
    # the fault itself lasts 10 s; then the service's next try (its back-off is at most 5 s)
    "pause-broker": 20, "cut-service": 20, "blackhole-broker": 20,
    "rolling-restart": 10,
}


@pytest.fixture(scope="module")
def cluster() -> Iterator[KafkaCluster]:
    with KafkaCluster() as started:
        yield started


@pytest.fixture
async def store(cluster: KafkaCluster) -> AsyncIterator[KafkaLogStore]:
    s = KafkaLogStore(KafkaConfig(bootstrap_servers=cluster.direct, topic_prefix=f"c{uuid.uuid4().hex[:8]}",
                                  replication_factor=3))
    await s.open()
    try:
        yield s
    finally:
        await s.close()


async def test_topics_are_replicated_three_times_with_two_in_sync_and_no_unclean_election(
    store: KafkaLogStore,
) -> None:
    await store.log(INPUTS).append([Message(b"x")])
    assert store._admin is not None
    topic = store.config.topic(INPUTS)
    (described,) = await store._admin.describe_topics([topic])
    assert [sorted(p["replicas"]) for p in described["partitions"]] == [[1, 2, 3]]
    admin = AIOKafkaAdminClient(bootstrap_servers=store.config.bootstrap_servers)
    await admin.start()
    try:
        keys = {"min.insync.replicas": None, "unclean.leader.election.enable": None}
        resource = ConfigResource(ConfigResourceType.TOPIC, topic, configs=keys)
        (response,) = await admin.describe_configs([resource])
    finally:
        await admin.close()
    found = {e["config_names"]: e["config_value"]
             for r in response.to_object()["resources"] for e in r["config_entries"]}
    assert found == {"min.insync.replicas": "2", "unclean.leader.election.enable": "false"}


async def test_kill_restart_pause_resume_act_on_the_named_node(
    cluster: KafkaCluster, store: KafkaLogStore
) -> None:
    assert cluster.status() == {1: "running", 2: "running", 3: "running"}
    assert cluster.controller() in NODES
    old = cluster.pid(2)
    await asyncio.to_thread(cluster.pause, 2)
    assert cluster.status()[2] == "paused"
    await asyncio.to_thread(cluster.resume, 2)
    assert cluster.status()[2] == "running"
    await asyncio.to_thread(cluster.kill, 2)
    assert cluster.status()[2] == "stopped"
    # two of three in sync: an acks=all append still succeeds
    await store.log(INPUTS).append([Message(b"while node 2 is down")])
    await asyncio.to_thread(cluster.restart, 2)
    assert cluster.status()[2] == "running"
    assert cluster.pid(2) != old
    await wait_replicated(store)


def _roundtrip_s(port: int) -> float:
    """Seconds for a Kafka ApiVersions request and its answer on a new connection to ``port``."""
    request = bytes.fromhex("00000012" "0012" "0000" "00000001" "0008" "6661756c7473") + b"\x00\x00\x00\x00"
    request = len(request[4:]).to_bytes(4, "big") + request[4:]
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        started = time.monotonic()
        s.sendall(request)
        head = s.recv(4)
        assert len(head) == 4
        return time.monotonic() - started


def test_the_proxy_delays_cuts_and_blackholes_one_broker(cluster: KafkaCluster) -> None:
    proxy, front = cluster.proxy, cluster.port(1, 3)
    try:
        assert _roundtrip_s(front) < 0.2
        proxy.latency(1, 400)
        assert _roundtrip_s(front) >= 0.4
        assert _roundtrip_s(cluster.port(2, 3)) < 0.2  # only broker 1's proxy is slowed
        assert _roundtrip_s(cluster.port(1, 0)) < 0.2  # and the direct listener never
        proxy.heal()
        proxy.blackhole(1)
        with pytest.raises(TimeoutError):
            _roundtrip_s(front)
        proxy.heal()
        proxy.cut((1,))
        with pytest.raises((ConnectionError, AssertionError)):  # refused, or closed at once
            _roundtrip_s(front)
    finally:
        proxy.heal()
    assert _roundtrip_s(front) < 0.2


def _submitted(n: int) -> Message:
    job = JobSubmitted(job_id=f"j{n}", tenant="t", task_groups=(
        TaskGroup(count=1, cpu_milli=1000, mem_mib=1024, gpu_count=1, gpu_milli=1000),))
    return Message(encode(envelope(job, "test", f"k{n}")))


async def test_the_checker_counts_what_is_lost_duplicated_and_undecided() -> None:
    """The checker can fail: a hostile log (an input twice, an acknowledged one missing, a
    step twice, a step with a part missing, a job never decided) is counted as such."""
    store = MemoryLogStore()
    await store.open()
    await store.log(INPUTS).append([_submitted(0), _submitted(1), _submitted(1), _submitted(2)])
    def placed(job: str) -> JobPlaced:
        return JobPlaced(job_id=job, cell="c", tasks=(TaskPlacement(task_index=0, node="n"),))

    def step(as_of: int, decisions: tuple[JobPlaced, ...], part: int = 0, parts: int = 1) -> Message:
        batch = DecisionBatch(as_of=as_of, digest="d", decisions=decisions, part=part, parts=parts)
        return Message(encode(envelope(batch, "test")))

    await store.log(DECISIONS).append([
        step(2, (placed("j0"), placed("j1"))),
        step(2, ()),  # the step at 2 again
        step(4, (placed("j0"),), 0, 2),  # j0 placed again without a preemption; part 1 of 2 missing
    ])
    report = await check(store, ["k0", "k1", "k2", "k3"], replay=False)
    assert (report.acked_inputs, report.lost, report.duplicated) == (4, 1, 1)
    assert report.decision_duplicates == 1 + 1  # the step at 2 twice; j0 placed twice
    assert report.decision_gaps == 1 + 1  # the part missing at 4; j2 never decided
    assert not report.clean
    logs = await read_logs(store)
    assert max_stall_s(logs.steps, logs.steps[0].timestamp_ms - 3000, logs.steps[-1].timestamp_ms) >= 3.0


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s != "cut-service"])
async def test_a_fault_under_load_loses_nothing_and_the_service_decides_again(
    cluster: KafkaCluster, scenario: str, tmp_path: Path
) -> None:
    """(``cut-service`` runs through the benchmark's command line, below.)"""
    result = await run_scenario(cluster, scenario, rounds=1, work=tmp_path, calm_s=2, warmup_s=3)
    report = result.report
    assert report.clean, report
    assert report.acked_inputs > 1000
    assert report.undecided == 0
    assert result.max_stall_s <= STALL_LIMIT_S[scenario], result


def test_the_benchmark_runs_the_baseline_and_a_cut_and_prints_every_key(cluster: KafkaCluster) -> None:
    """``python -m benchmarks.faults --json --smoke`` on this module's cluster (named by the
    variables it reads, so it starts none and leaves this one running): the keys the README's
    table documents, and the cut (the service's connections through the proxy, 10 s) with
    nothing lost, duplicated or left undecided."""
    env = {**os.environ, "FLEETLOG_KAFKA_CLUSTER_PORT": str(cluster.base),
           "FLEETLOG_KAFKA_CLUSTER_DIR": str(cluster.data_dir)}
    done = subprocess.run([sys.executable, "-m", "benchmarks.faults", "--json", "--smoke"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout[-2000:]
    result = json.loads(lines[0])
    assert {"scenarios", "acked_inputs", "lost", "duplicated", "decision_gaps", "max_stall_s"} <= set(result)
    assert set(result["scenarios"]) == {"none", "cut-service"}
    cut = result["scenarios"]["cut-service"]
    assert {"rounds", "acked_inputs", "lost", "duplicated", "decision_gaps", "max_stall_s",
            "p99_fault_ms", "p99_no_fault_ms"} <= set(cut)
    assert (result["lost"], result["duplicated"], result["decision_gaps"]) == (0, 0, 0)
    assert cut["acked_inputs"] > 1000
    assert 9 <= cut["max_stall_s"] <= STALL_LIMIT_S["cut-service"]  # the cut lasts 10 s
    assert set(cluster.status().values()) == {"running"}  # not stopped: it was not the benchmark's


def test_the_cluster_ports_are_free_and_below_the_ephemeral_range() -> None:
    """No "any free port" of another process can take a killed node's port before it restarts."""
    first_ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(20):
        base = free_port_range()
        assert base + PORTS_SPAN <= first_ephemeral
        for k in range(PORTS_SPAN):
            with socket.socket() as s:
                s.bind(("127.0.0.1", base + k))
