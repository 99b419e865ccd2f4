"""``python -m fleetlog.backends.slurm`` as an operator runs it: a process, stopped by a signal."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

from fleetlog.events import NodeHeartbeat
from fleetlog.events.codec import CONTENT_TYPE_HEADER, decode
from fleetlog.log.base import INPUTS, LogError
from fleetlog.log.file import FileLogStore
from tests.slurm_cluster import REPO, SlurmCluster


async def heartbeats(directory: Path) -> list[NodeHeartbeat]:
    try:
        async with FileLogStore(directory, read_only=True) as store:
            records = await store.log(INPUTS).read(0, 10_000)
    except LogError:  # the backend has not made the log yet
        return []
    events = [decode(r.value, r.header(CONTENT_TYPE_HEADER)).event for r in records]
    return [e for e in events if isinstance(e, NodeHeartbeat)]


async def test_the_backend_process_reports_the_cluster_and_stops_on_sigterm(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    log = tmp_path / "log"
    argv = [
        sys.executable,
        "-m",
        "fleetlog.backends.slurm",
        "--log",
        str(log),
        "--slurm-conf",
        str(slurm_cluster.conf),
    ]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for _ in range(300):
            await asyncio.sleep(0.1)
            if len(await heartbeats(log)) >= 4:
                break
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    assert sorted({b.node for b in await heartbeats(log)}) == ["n1", "n2", "n3", "n4"]


def test_a_usage_error_exits_2_with_a_message() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fleetlog.backends.slurm", "--slurm-conf", "x"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "set exactly one place for the logs" in done.stderr
    assert "Traceback" not in done.stderr
