"""The service in embedded mode (file log), in process: ingest, decide, status, metrics, snapshots."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import structlog

from fleetlog.core.digest import digest
from fleetlog.events import encode, envelope
from fleetlog.log.base import INPUTS
from fleetlog.log.file import FileLogStore
from fleetlog.log.kafka import KafkaConfig
from fleetlog.log.snapshots import DirectorySnapshots
from fleetlog.service.config import Config, LogConfig, ServiceSettings
from fleetlog.service.loop import SchedulerLoop
from fleetlog.service.service import Service
from fleetlog.service.snapshots import recover
from tests.core.builders import job, node
from tests.service.process import REPO


def embedded(directory: Path, **settings: Any) -> Config:
    return Config(log=LogConfig(dir=str(directory), fsync="never"),
                  service=ServiceSettings(http_port=0, idle_wait_ms=20, **settings))


class Running:
    def __init__(self, service: Service, task: asyncio.Task[None]) -> None:
        self.service, self.task = service, task

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.service.http.port}"

    async def request(self, path: str, body: bytes | None = None,
                      content_type: str = "application/json") -> tuple[int, Any]:
        def call() -> tuple[int, Any]:
            req = urllib.request.Request(self.url + path, data=body, headers={"content-type": content_type})
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    raw = r.read()
                    return r.status, json.loads(raw) if r.headers["content-type"].endswith("json") else raw
            except urllib.error.HTTPError as exc:
                return exc.code, json.loads(exc.read())
        return await asyncio.to_thread(call)

    async def until(self, predicate: Any, timeout_s: float = 30) -> None:
        for _ in range(int(timeout_s / 0.05)):
            if predicate():
                return
            await asyncio.sleep(0.05)
        raise AssertionError("condition not reached in time")

    async def stop(self) -> None:
        self.service.stop()
        await asyncio.wait_for(self.task, 30)

    async def inputs_end(self) -> int:
        """The end offset of the inputs log the service appends to."""
        assert self.service.store is not None
        return await self.service.store.log(INPUTS).end_offset()


async def start(config: Config) -> Running:
    service = Service(config)
    running = Running(service, asyncio.create_task(service.run()))
    await running.until(lambda: service.loop is not None or running.task.done())
    return running


@asynccontextmanager
async def serving(directory: Path, **settings: Any) -> AsyncIterator[Running]:
    """An embedded service on ``directory``, stopped on the way out."""
    running = await start(embedded(directory, **settings))
    try:
        yield running
    finally:
        if not running.task.done():
            await running.stop()


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[Running]:
    async with serving(tmp_path / "log", snapshot_every_events=5) as running:
        yield running


def events_body(*events: Any) -> bytes:
    return b"[" + b",".join(encode(envelope(e, "test"), "json") for e in events) + b"]"


async def test_ingest_decide_status_and_metrics(service: Running) -> None:
    body = events_body(node("n1"), node("n2"), job("j1", gpus=4))
    status, answer = await service.request("/v1/events", body)
    assert (status, answer) == (200, {"appended": 3, "first_offset": 0})
    loop = service.service.loop
    assert loop is not None
    await service.until(lambda: loop.offset == 3 and loop.committed == 3)
    status, found = await service.request("/v1/jobs/j1")
    assert status == 200
    assert found["state"] == "placed"  # (no backend saw it start)
    assert {t["node"] for t in found["task_nodes"]} <= {"n1", "n2"}
    status, missing = await service.request("/v1/jobs/nope")
    assert (status, missing["reason"]) == (404, "unknown_job")
    status, metrics = await service.request("/metrics")
    text = metrics.decode()
    assert status == 200
    assert "fleetlog_input_events_total 3.0" in text
    assert "fleetlog_decision_batches_total 1.0" in text
    assert "fleetlog_leader 1.0" in text
    assert (await service.request("/healthz"))[1]["status"] == "leading"
    assert (await service.request("/readyz"))[0] == 200


async def test_ingest_rejects_a_bad_event_and_appends_nothing(service: Running) -> None:
    bad = b'[' + encode(envelope(node("n1"), "t"), "json") + b', {"schema_version": 1, "producer_id": "x"}]'
    status, answer = await service.request("/v1/events", bad)
    assert status == 400
    assert answer["reason"] == "invalid_event"
    assert "event 1" in answer["error"]
    status, answer = await service.request("/v1/events", b"[1,", "application/json")
    assert (status, answer["reason"]) == (400, "undecodable")
    status, answer = await service.request("/v1/events", b"x", "text/plain")
    assert (status, answer["reason"]) == (400, "unknown_content_type")
    assert service.service.store is not None
    assert await service.service.store.log(INPUTS).end_offset() == 0
    assert (await service.request("/v1/events"))[0] == 405
    assert (await service.request("/nowhere"))[0] == 404


async def test_restart_restores_the_newest_snapshot_and_folds_only_the_tail(tmp_path: Path) -> None:
    config = embedded(tmp_path / "log", snapshot_every_events=4)
    first = await start(config)
    await first.request("/v1/events", events_body(*[node(f"n{i}") for i in range(4)]))
    await first.request("/v1/events", events_body(*[job(f"j{i}", gpus=2) for i in range(6)]))
    assert first.service.loop is not None
    await first.until(lambda: first.service.loop is not None and first.service.loop.offset == 10)
    before = digest(first.service.loop.state)
    await first.stop()
    assert (tmp_path / "log" / "snapshots" / f"snapshot-{10:020d}.bin").is_file()
    with structlog.testing.capture_logs() as logs:
        second = await start(config)
        try:
            assert second.service.loop is not None
            assert digest(second.service.loop.state) == before
        finally:
            await second.stop()
    restored = [e for e in logs if e["event"] == "snapshot_restored"]
    assert restored
    assert restored[0]["inputs_offset"] == 10


async def test_a_corrupt_snapshot_is_reported_and_the_previous_one_used(tmp_path: Path) -> None:
    config = embedded(tmp_path / "log", snapshot_every_events=3)
    running = await start(config)
    for i in range(3):
        await running.request("/v1/events", events_body(node(f"n{i}"), job(f"a{i}"), job(f"b{i}")))
        await running.until(lambda i=i: running.service.loop is not None
                            and running.service.loop.offset == 3 * (i + 1))
        await asyncio.sleep(0.1)  # let the snapshot task write
    await running.stop()
    snaps = DirectorySnapshots(tmp_path / "log" / "snapshots")
    files = sorted((tmp_path / "log" / "snapshots").glob("*.bin"), reverse=True)
    assert len(files) == 3
    newest = bytearray(files[0].read_bytes())
    newest[len(newest) // 2] ^= 0xFF
    files[0].write_bytes(bytes(newest))
    store = FileLogStore(tmp_path / "log", read_only=True)
    await store.open()
    try:
        with structlog.testing.capture_logs() as logs:
            loop, used = await recover(store, snaps, lambda s: SchedulerLoop(s, running.service.policy))
        assert used is not None
        assert used.inputs_offset == 6
        skipped = [e for e in logs if e["event"] == "snapshot_skipped"]
        assert len(skipped) == 1
        assert "checksum" in skipped[0]["error"]
        for f in files:
            f.write_bytes(b"FLSNAP1\n garbage")
        full, none = await recover(store, snaps, lambda s: SchedulerLoop(s, running.service.policy))
        assert none is None
        assert digest(full.state) == digest(loop.state)
    finally:
        await store.close()


async def test_a_second_embedded_service_stands_by_until_the_first_exits(tmp_path: Path) -> None:
    first = await start(embedded(tmp_path / "log"))
    second_service = Service(embedded(tmp_path / "log"))
    second = Running(second_service, asyncio.create_task(second_service.run()))
    await asyncio.sleep(1.5)
    await second.until(lambda: second_service.warming.done)  # (health says warming until then)
    assert second_service.loop is None
    assert (await second.request("/healthz"))[1]["status"] == "standby"
    assert (await second.request("/v1/events", events_body(node("n1"))))[0] == 503
    await first.stop()
    await second.until(lambda: second_service.loop is not None)
    service_file = json.loads((tmp_path / "log" / "service.json").read_text())
    assert service_file["http"].endswith(f":{second_service.http.port}")
    await second.stop()
    assert not (tmp_path / "log" / "service.json").exists()


async def test_the_start_log_never_shows_the_kafka_password() -> None:
    secret = "s3cr3t-pa55"
    config = Config(
        kafka=KafkaConfig(bootstrap_servers="127.0.0.1:9", security_protocol="SASL_PLAINTEXT",
                          sasl_mechanism="SCRAM-SHA-512", sasl_plain_username="u", sasl_plain_password=secret,
                          request_timeout_ms=1000),
        service=ServiceSettings(http_port=0),
    )
    service = Service(config)
    with structlog.testing.capture_logs() as logs:
        task = asyncio.create_task(service.run())
        await asyncio.sleep(3)
        service.stop()
        await asyncio.wait_for(task, 30)
    assert secret not in repr(logs)
    assert any(e["event"] == "loop_interrupted" for e in logs), "an unreachable broker is retried"
    assert any(e["event"] == "service_started" and e["config"]["kafka"]["sasl_plain_password"] == "***"
               for e in logs)


def fleetlog(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleetlog.cli", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=False)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run"], "set exactly one place for the logs"),
        (["run", "--log", "x", "--policy", "nope"], "unknown policy 'nope'"),
        (["run", "--config", "/nonexistent.toml"], "cannot read config file"),
        (["status", "j1", "--log", "/nonexistent-dir"], "no file log at /nonexistent-dir"),
        (["run", "--log", "x", "--http-port", "70000"], "http_port"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(args: list[str], message: str) -> None:
    result = fleetlog(*args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr


async def test_status_reads_the_logs_and_names_an_unknown_job(service: Running, tmp_path: Path) -> None:
    await service.request("/v1/events", events_body(node("n1"), job("j1", gpus=2), job("big", gpus=64)))
    assert service.service.loop is not None
    await service.until(lambda: service.service.loop is not None and service.service.loop.committed == 3)
    result = await asyncio.to_thread(fleetlog, "status", "j1", "--log", str(tmp_path / "log"), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["state"] == "placed"
    result = await asyncio.to_thread(fleetlog, "status", "big", "--log", str(tmp_path / "log"), "--json")
    assert json.loads(result.stdout)["state"] in {"rejected", "pending"}
    result = await asyncio.to_thread(fleetlog, "status", "ghost", "--log", str(tmp_path / "log"))
    assert result.returncode == 2
    assert "unknown job 'ghost'" in result.stderr
