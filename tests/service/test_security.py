"""The service and the client on a real SASL_SSL listener (SCRAM-SHA-512 over TLS, a test CA):
security settings pass through from the configuration file, and no secret reaches a log."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetlog.client import Client
from fleetlog.service.config import load_config
from tests.core.builders import job, node
from tests.kafka_broker import KafkaBroker
from tests.service.process import REPO, ServiceProcess


@pytest.fixture(scope="module")
def secure_broker() -> Iterator[KafkaBroker]:
    with KafkaBroker(use_env=False, ephemeral=True, sasl=True) as broker:
        yield broker


def config_file(tmp_path: Path, broker: KafkaBroker, password_file: Path) -> Path:
    password_file.chmod(0o600)  # a password file others can read is refused
    path = tmp_path / "fleetlog.toml"
    path.write_text(
        f"""
[kafka]
bootstrap_servers = "{broker.sasl_bootstrap}"
topic_prefix = "secure-{tmp_path.name[-12:]}"
security_protocol = "SASL_SSL"
sasl_mechanism = "SCRAM-SHA-512"
sasl_plain_username = "fleetlog"
sasl_plain_password_file = "{password_file}"
ssl_cafile = "{broker.tls_dir / 'ca.pem'}"
request_timeout_ms = 10000

[service]
leader_session_timeout_ms = 3000
"""
    )
    return path


def wait_for(predicate: object, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.2)
    raise AssertionError("condition not reached in time")


async def test_service_and_client_over_sasl_ssl_with_scram(
    secure_broker: KafkaBroker, tmp_path: Path
) -> None:
    password = (secure_broker.tls_dir / "password").read_text()
    path = config_file(tmp_path, secure_broker, secure_broker.tls_dir / "password")
    service = ServiceProcess(tmp_path / "service.log", ["--config", str(path)], {}).start()
    try:
        await asyncio.to_thread(service.wait_leading, 120)
        async with await Client.connect(load_config(path, {})) as client:
            await client.send([node("n1"), node("n2"), job("secure-job", gpus=4)])
        await asyncio.to_thread(wait_for, lambda: (service.health() or {}).get("inputs_offset") == 3)
        for _ in range(60):  # (the step that places it may come a moment after the inputs are folded)
            status = await asyncio.to_thread(
                subprocess.run, [sys.executable, "-m", "fleetlog.cli", "status", "secure-job", "--config",
                                 str(path), "--json"], cwd=REPO, capture_output=True, text=True, timeout=120)
            assert status.returncode == 0, status.stderr
            if json.loads(status.stdout)["state"] != "pending":
                break
            await asyncio.sleep(1)
        assert json.loads(status.stdout)["state"] == "placed"
    finally:
        assert service.stop() == 0, service.tail()
    assert password not in service.log_path.read_text()
    assert any(line.get("event") == "decision_batch" for line in service.lines())


async def test_a_wrong_password_is_retried_with_a_clear_error_and_never_logged(
    secure_broker: KafkaBroker, tmp_path: Path
) -> None:
    wrong = tmp_path / "wrong-password"
    wrong.write_text("not-the-password-42\n")
    path = config_file(tmp_path, secure_broker, wrong)
    service = ServiceProcess(tmp_path / "service.log", ["--config", str(path)], {}).start()
    try:
        await asyncio.to_thread(
            wait_for, lambda: any(line.get("event") == "loop_interrupted" for line in service.lines()), 90
        )
        health = service.health() or {}
        assert health.get("status") == "retrying"  # a fault that may pass: retried, and said so
        assert health["problem"]["status"] == "retrying"
        assert "not-the-password" not in json.dumps(health)
    finally:
        assert service.stop() == 0, service.tail()
    text = service.log_path.read_text()
    assert "not-the-password-42" not in text
    assert "Authentication failed" in text
