"""The Slurm backend of one cell of a ``[cells]`` map, on a real Slurm cluster and file log: it
reads its cell partition's decisions and the dispatched job's spec there (``JobDispatched``: the
cell partition never holds the submission; its payload comes with it) and reports its heartbeats
and task events there."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import msgspec

from fleetlog.backends.slurm import SlurmBackend, SlurmConfig
from fleetlog.backends.store_args import open_store
from fleetlog.events import (
    DecisionBatch,
    JobPayload,
    JobPlaced,
    NodeHeartbeat,
    TaskFinished,
    TaskPlacement,
    TaskStarted,
    encode,
    envelope,
)
from fleetlog.events.model import JobDispatched
from fleetlog.log.base import DECISIONS, INPUTS, Message, Shard
from fleetlog.log.file import FileLogStore
from fleetlog.log.location import LogConfig
from fleetlog.log.settings import Location
from tests.backends.slurm.harness import job
from tests.slurm_cluster import SlurmCluster
from tests.test_client_routing import on_disk

CELL = "slurm-east"


async def test_a_dispatched_job_runs_and_is_reported_in_its_cells_partition(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    base = tmp_path / "log"
    ran = tmp_path / "ran"
    spec = msgspec.structs.replace(job("routed", tasks=1), payload=JobPayload(command=(
        "/bin/sh", "-c", f'echo "$FLEETLOG_JOB_ID" > {ran}')))  # (run in place of the workload below)
    async with FileLogStore(base, shard=Shard.cell(1)) as cell:  # the dispatcher's and the cell shard's
        await cell.log(INPUTS).append([Message(encode(envelope(
            JobDispatched(job=spec, cell=CELL, attempt=1, seq=1, as_of=0), "dispatcher")))])
        batch = DecisionBatch(as_of=1, digest="-", decisions=(
            JobPlaced(job_id="routed", cell=CELL, tasks=(TaskPlacement(0, "n2", ()),)),))
        await cell.append_transactional(DECISIONS, [Message(encode(envelope(batch, "cell-1")))],
                                        group="g", consumed=1)
    config = Location(log=LogConfig(dir=str(base)), cells=(("other", 0), (CELL, 1)))
    prefix = f"rt{time.time_ns() % 10**9}"
    settings = SlurmConfig(cell=CELL, prefix=prefix, slurm_conf=str(slurm_cluster.conf),
                           heartbeat_ms=1000, poll_ms=100)
    async with open_store(config, CELL) as store:
        backend = SlurmBackend(store, settings, lambda spec, index: "exit 5")
        deadline = time.monotonic() + 60
        while not any(isinstance(e, TaskFinished) for e in (await on_disk(base)).get("cells-1", [])):
            assert time.monotonic() < deadline, (await on_disk(base))
            await backend.step()
            await asyncio.sleep(0.1)
    found = await on_disk(base)
    assert sorted(found) == ["cells-1"]  # nothing anywhere else (no global, no other cell's)
    ours = found["cells-1"]
    beats = {e.node for e in ours if isinstance(e, NodeHeartbeat) and e.cell == CELL}
    assert beats == {"n1", "n2", "n3", "n4"}
    started = [e for e in ours if isinstance(e, TaskStarted)]
    assert started == [TaskStarted(job_id="routed", task_index=0, node="n2")]
    assert [(e.job_id, e.exit_code) for e in ours if isinstance(e, TaskFinished)] == [("routed", 0)]
    assert ran.read_text() == "routed\n"  # the dispatched payload ran
