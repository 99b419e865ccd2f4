"""``python -m fleetlog.backends.kubernetes --config FILE`` on a real SASL_SSL listener
(SCRAM-SHA-512 over TLS, a test CA): the backend takes the service's configuration file and
``FLEETLOG_KAFKA_*`` variables, security included, the same way ``fleetlog run`` does; its
node reports reach the inputs topic, and no secret reaches its output."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetlog.events import NodeHeartbeat, decode
from fleetlog.log.base import INPUTS
from fleetlog.log.kafka import KafkaLogStore
from fleetlog.service.config import load_config
from tests.backends.kubernetes.conftest import wipe
from tests.backends.kubernetes.manifests import items, node
from tests.kafka_broker import KafkaBroker
from tests.kube_apiserver import REPO, KubeControlPlane

COMMAND = [sys.executable, "-m", "fleetlog.backends.kubernetes"]
pytestmark = pytest.mark.kafka


@pytest.fixture(scope="module")
def secure_broker() -> Iterator[KafkaBroker]:
    with KafkaBroker(use_env=False, ephemeral=True, sasl=True) as broker:
        yield broker


def config_file(tmp_path: Path, broker: KafkaBroker) -> Path:
    """The service's configuration, with the password file left to ``FLEETLOG_KAFKA_*``."""
    path = tmp_path / "fleetlog.toml"
    path.write_text(
        f"""
[kafka]
bootstrap_servers = "{broker.sasl_bootstrap}"
topic_prefix = "kube-secure-{tmp_path.name[-12:]}"
security_protocol = "SASL_SSL"
sasl_mechanism = "SCRAM-SHA-512"
sasl_plain_username = "fleetlog"
ssl_cafile = "{broker.tls_dir / 'ca.pem'}"
request_timeout_ms = 10000

[service]
policy = "best-fit"
"""
    )
    return path


async def heartbeats(path: Path, env: dict[str, str]) -> list[NodeHeartbeat]:
    async with KafkaLogStore(load_config(path, env).kafka) as store:  # type: ignore[arg-type]
        end = await store.log(INPUTS).end_offset()
        records = await store.log(INPUTS).read(0, 10_000) if end else []
    return [e for e in (decode(r.value).event for r in records) if isinstance(e, NodeHeartbeat)]


async def test_the_backend_takes_the_services_config_and_kafka_variables(
    kube: KubeControlPlane, secure_broker: KafkaBroker, tmp_path: Path
) -> None:
    wipe(kube)
    password_file = secure_broker.tls_dir / "password"
    password_file.chmod(0o600)
    env = {"FLEETLOG_KAFKA_SASL_PLAIN_PASSWORD_FILE": str(password_file)}
    path = config_file(tmp_path, secure_broker)
    kube.kubectl("apply", "-f", "-", stdin=items(node("secure-1", gpus=1)))
    args = ["--config", str(path), "--kubeconfig", str(kube.scheduler_kubeconfig), "--cell", "c1"]
    process = subprocess.Popen([*COMMAND, *args], cwd=REPO, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, **env})
    try:
        deadline = time.monotonic() + 120
        while not await heartbeats(path, env):
            assert process.poll() is None, f"the backend exited: {process.stderr.read()}"  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "no heartbeat on the SASL_SSL broker within 120 s"
            await asyncio.sleep(0.5)
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert {(b.cell, b.node) for b in await heartbeats(path, env)} == {("c1", "secure-1")}
    assert "SASL_SSL/SCRAM-SHA-512 as fleetlog" in err  # the one line saying where the logs are
    assert password_file.read_text().strip() not in err


def test_a_password_file_others_can_read_is_refused_as_the_service_refuses_it(
    secure_broker: KafkaBroker, tmp_path: Path
) -> None:
    loose = tmp_path / "password"
    loose.write_text("secret\n")
    loose.chmod(0o644)
    env = {**os.environ, "FLEETLOG_KAFKA_SASL_PLAIN_PASSWORD_FILE": str(loose)}
    path = config_file(tmp_path, secure_broker)
    for command in ([*COMMAND, "--config", str(path)], [sys.executable, "-m", "fleetlog.cli", "run",
                                                         "--config", str(path)]):
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120, env=env,
                              check=False)
        assert done.returncode == 2, done.stderr
        assert f"{loose} is accessible by others (mode 0644)" in done.stderr
        assert "Traceback" not in done.stderr
