"""``python -m fleetlog.backends.kubernetes``: usage errors, and a real run stopped by SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

from fleetlog.events import NodeHeartbeat, decode
from fleetlog.log.base import INPUTS
from fleetlog.log.file import FileLogStore
from tests.backends.kubernetes.conftest import wipe
from tests.backends.kubernetes.manifests import items, node
from tests.kube_apiserver import REPO, KubeControlPlane

COMMAND = [sys.executable, "-m", "fleetlog.backends.kubernetes"]


def test_usage_error_exits_2_without_a_traceback() -> None:
    done = subprocess.run(COMMAND, capture_output=True, text=True, timeout=60, check=False, cwd=REPO)
    assert done.returncode == 2
    assert "set exactly one place for the logs" in done.stderr
    assert "Traceback" not in done.stderr


async def test_the_command_reports_nodes_and_stops_on_sigterm(kube: KubeControlPlane, tmp_path: Path) -> None:
    wipe(kube)
    log = tmp_path / "log"
    args = ["--log", str(log), "--kubeconfig", str(kube.scheduler_kubeconfig), "--cell", "c1"]
    process = subprocess.Popen([*COMMAND, *args], cwd=REPO, stderr=subprocess.PIPE, text=True)
    try:
        kube.kubectl("apply", "-f", "-", stdin=items(node("cmd-1", gpus=2)))
        deadline = time.monotonic() + 60
        while not (log / INPUTS).exists() or not await heartbeats(log):
            assert process.poll() is None, (
                f"the backend exited: {process.stderr.read() if process.stderr else ''}"
            )
            assert time.monotonic() < deadline, "no heartbeat in the log within 60 s"
            await asyncio.sleep(0.5)
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=30)
    assert code == 0
    beats = await heartbeats(log)
    assert {(b.cell, b.node, b.gpu_count) for b in beats} == {("c1", "cmd-1", 2)}


async def heartbeats(directory: Path) -> list[NodeHeartbeat]:
    """The heartbeats in the file log at ``directory`` (read-only: the backend still writes it)."""
    store = FileLogStore(directory, read_only=True)
    await store.open()
    try:
        records = await store.log(INPUTS).read(0, 10_000)
        return [e for e in (decode(r.value).event for r in records) if isinstance(e, NodeHeartbeat)]
    finally:
        await store.close()
