"""``python -m fleetlog.backends.kubernetes --log DIR`` next to ``fleetlog run --log DIR``: both
real child processes on one directory, the service holding the file log's writer lock.  The
backend starts (no ``LockedError``), its node reports reach the service, and a pod of fleetlog's
is submitted by the backend, placed by the service and bound by the backend."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from fleetlog.events import JobSubmitted, NodeHeartbeat, decode
from fleetlog.events.model import Event
from fleetlog.log.base import DECISIONS, INPUTS
from fleetlog.log.file import FileLogStore
from tests.backends.kubernetes.conftest import wipe
from tests.backends.kubernetes.manifests import items, node, pod
from tests.kube_apiserver import REPO, KubeControlPlane
from tests.service.process import ServiceProcess

COMMAND = [sys.executable, "-m", "fleetlog.backends.kubernetes"]


async def events(directory: Path, log: str = INPUTS) -> list[Event]:
    """The events of one log (read-only: the service holds the writer lock)."""
    async with FileLogStore(directory, read_only=True) as store:
        records = await store.log(log).read(0, 100_000)
    return [decode(r.value, r.header("content-type")).event for r in records]


async def test_the_backend_runs_beside_the_service_and_its_pods_get_bound(
    kube: KubeControlPlane, tmp_path: Path
) -> None:
    wipe(kube)
    log = tmp_path / "log"
    service = ServiceProcess(tmp_path / "service.out", ["--log", str(log)], {}).start()
    backend: subprocess.Popen[str] | None = None
    try:
        service.address()
        service.wait_leading()
        kube.kubectl("apply", "-f", "-", stdin=items(node("beside-1", gpus=2)))
        args = ["--log", str(log), "--kubeconfig", str(kube.scheduler_kubeconfig), "--cell", "c1"]
        backend = subprocess.Popen([*COMMAND, *args], cwd=REPO, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 90
        while not [e for e in await events(log) if isinstance(e, NodeHeartbeat) and e.node == "beside-1"]:
            assert backend.poll() is None, f"the backend exited: {backend.stderr.read()}"  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "no heartbeat of beside-1 in the service's log within 90 s"
            await asyncio.sleep(0.3)
        kube.kubectl("apply", "-f", "-", stdin=items(pod("p-beside", gpus=1)))
        while not kube.kubectl("get", "pod", "p-beside", "-o", "jsonpath={.spec.nodeName}").strip():
            assert backend.poll() is None, f"the backend exited: {backend.stderr.read()}"  # type: ignore[union-attr]
            assert time.monotonic() < deadline + 60, "pod p-beside not bound within 60 s"
            await asyncio.sleep(0.3)
    finally:
        if backend is not None:
            backend.send_signal(signal.SIGTERM)
            _, err = backend.communicate(timeout=30)
        service.stop()
    assert backend.returncode == 0, err
    assert "Traceback" not in err, err
    assert "LockedError" not in err, err
    assert kube.kubectl("get", "pod", "p-beside", "-o", "jsonpath={.spec.nodeName}").strip() == "beside-1"
    submitted = [e for e in await events(log) if isinstance(e, JobSubmitted)]
    assert [e.job_id.split("/")[:3] for e in submitted] == [["pod", "default", "p-beside"]]
    placed = json.dumps([str(d) for d in await events(log, DECISIONS)])
    assert "beside-1" in placed
