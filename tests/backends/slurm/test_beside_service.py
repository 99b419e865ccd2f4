"""``python -m fleetlog.backends.slurm --log DIR`` next to ``fleetlog run --log DIR``: both real
child processes on one directory, the service holding the file log's writer lock.  A job
submitted with ``fleetlog submit --log DIR`` is placed by the service, run by the backend on the
real Slurm cluster, and the backend's observations (started, finished) reach the service: the job
succeeds."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from fleetlog.events import NodeHeartbeat, TaskFinished, TaskStarted, decode
from fleetlog.log.base import INPUTS
from fleetlog.log.file import FileLogStore
from tests.service.process import ServiceProcess
from tests.slurm_cluster import REPO, SlurmCluster

BACKEND = [sys.executable, "-m", "fleetlog.backends.slurm"]


async def inputs(directory: Path) -> list[Any]:
    """The events of the inputs log (read-only: the service holds the writer lock)."""
    async with FileLogStore(directory, read_only=True) as store:
        records = await store.log(INPUTS).read(0, 100_000)
    return [decode(r.value, r.header("content-type")).event for r in records]


def job_state(address: str, job_id: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{address}/v1/jobs/{job_id}", timeout=5) as r:
        answer: dict[str, Any] = json.loads(r.read())
        return answer


def submit(log: Path, job_id: str) -> None:
    argv = [sys.executable, "-m", "fleetlog.cli", "submit", job_id, "--tenant", "t", "--cpu-milli", "1000",
            "--mem-mib", "256", "--duration-ms", "1500", "--log", str(log)]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr


async def wait_for(what: str, check: Any, backend: subprocess.Popen[str], timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert backend.poll() is None, f"the backend exited ({backend.returncode}): {backend.stderr.read()}"  # type: ignore[union-attr]
        assert time.monotonic() < deadline, f"{what} within {timeout_s} s"
        await asyncio.sleep(0.3)


async def test_a_job_runs_through_the_service_and_the_backend_beside_it(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    log = tmp_path / "log"
    service = ServiceProcess(tmp_path / "service.out", ["--log", str(log)], {}).start()
    backend: subprocess.Popen[str] | None = None
    try:
        address = service.address()
        service.wait_leading()
        argv = [*BACKEND, "--log", str(log), "--slurm-conf", str(slurm_cluster.conf), "--prefix", "beside"]
        backend = subprocess.Popen(argv, cwd=REPO, stderr=subprocess.PIPE, text=True)

        async def nodes_reported() -> bool:
            beats = [e for e in await inputs(log) if isinstance(e, NodeHeartbeat)]
            return {b.node for b in beats} == {"n1", "n2", "n3", "n4"}

        await wait_for("the backend's heartbeats in the service's log", nodes_reported, backend)
        submit(log, "beside-1")

        async def finished() -> bool:
            events = await inputs(log)
            started = [e for e in events if isinstance(e, TaskStarted) and e.job_id == "beside-1"]
            ended = [e for e in events if isinstance(e, TaskFinished) and e.job_id == "beside-1"]
            return bool(started and ended)

        await wait_for("job beside-1 started and finished on Slurm", finished, backend)
        deadline = time.monotonic() + 30
        while job_state(address, "beside-1").get("state") != "succeeded":
            assert time.monotonic() < deadline, job_state(address, "beside-1")
            await asyncio.sleep(0.2)
    finally:
        if backend is not None:
            backend.terminate()
            _, err = backend.communicate(timeout=30)
        service.stop()
    assert backend.returncode == 0, err
    assert "Traceback" not in err, err
    assert "LockedError" not in err, err
