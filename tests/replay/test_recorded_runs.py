"""Logs recorded by the real producers of decisions verify cleanly: ``fleetlog simulate`` on the
file log, and ``fleetlog run`` (a child process) on a real Kafka broker — where state-at also goes
through the service's Kafka snapshots."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import pytest

from fleetlog.cli import main
from fleetlog.log.base import INPUTS
from fleetlog.log.kafka import KafkaConfig, KafkaLogStore
from fleetlog.service.loadgen import Load, batches
from tests.service.process import ServiceProcess
from tests.service.test_reliability import wait_caught_up


def test_a_simulated_run_verifies_and_its_state_matches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = str(tmp_path / "log")
    sim = ["simulate", "--log", log, "--report", str(tmp_path / "report"), "--json"]
    assert main([*sim, "--cluster", "synthetic?nodes=8", "--workload", "synthetic?jobs=60"]) == 0
    placed = json.loads(capsys.readouterr().out)["jobs_placed"]
    assert main(["replay", "verify", "--log", log, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"]
    assert report["decisions"] >= placed > 0
    assert main(["replay", "what-if", "--policy", "best-fit", "--log", log, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["recorded"]["jobs_placed"] == placed


async def _produce(store: KafkaLogStore, events: int) -> None:
    load = batches(Load(nodes=32, submit_share=0.2, keep_jobs=100, seed=3), 200)
    for i in range(events // 200):
        await store.log(INPUTS).append(next(load))
        if i % 5 == 0:  # let the service decide in several steps, as under live load
            await wait_caught_up(store)
        await asyncio.sleep(0.02)


@pytest.mark.kafka
async def test_a_kafka_service_log_verifies_and_state_at_uses_its_snapshots(
    kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = f"replay{uuid.uuid4().hex[:8]}"
    env = {
        "FLEETLOG_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "FLEETLOG_KAFKA_TOPIC_PREFIX": prefix,
        "FLEETLOG_SERVICE_SNAPSHOT_EVERY_EVENTS": "1000",
        "FLEETLOG_SERVICE_IDLE_WAIT_MS": "50",
    }
    store = KafkaLogStore(KafkaConfig(bootstrap_servers=kafka_bootstrap, topic_prefix=prefix))
    await store.open()
    service = ServiceProcess(tmp_path / "service.log", [], env).start()
    try:
        await asyncio.to_thread(service.address)  # leading: each round of load gets its own batches
        await _produce(store, 4000)
        end = await wait_caught_up(store)
        assert service.stop() == 0, service.tail()
    finally:
        service.kill_if_running()
        await store.close()
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert await asyncio.to_thread(main, ["replay", "verify", "--kafka", kafka_bootstrap, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"]
    assert report["batches"] > 1
    state_at = ["replay", "state-at", str(end), "--kafka", kafka_bootstrap, "--show", "tenants", "--json"]
    assert await asyncio.to_thread(main, state_at) == 0
    fast = json.loads(capsys.readouterr().out)
    assert await asyncio.to_thread(main, [*state_at, "--no-snapshots"]) == 0
    slow = json.loads(capsys.readouterr().out)
    assert fast["snapshot"] is not None
    assert fast["digest"] == slow["digest"]
    assert fast["inputs_folded"] < slow["inputs_folded"] == end


@pytest.mark.kafka
async def test_a_topic_prefix_with_no_topics_is_an_error_and_creates_nothing(
    kafka_bootstrap: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleetlog.replay.source import kafka_topics

    prefix = f"absent{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("FLEETLOG_KAFKA_TOPIC_PREFIX", prefix)
    assert await asyncio.to_thread(main, ["replay", "verify", "--kafka", kafka_bootstrap]) == 2
    assert f"no topic {prefix}.inputs, {prefix}.decisions" in capsys.readouterr().err
    config = KafkaConfig(bootstrap_servers=kafka_bootstrap, topic_prefix=prefix)
    assert not {t for t in await kafka_topics(config) if t.startswith(prefix)}
