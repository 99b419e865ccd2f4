"""A backend with a ``[cells]`` map (fleetlog.backends.cell_store): it reads the decisions of its
cell's partition and writes its observations there (a pod group's submission to the global
partition), on a real file log; a cell the map does not name stops the command with exit 2."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from fleetlog.backends.cell_store import CellStore
from fleetlog.backends.kubernetes.ledger import read_ledger
from fleetlog.backends.shared_log import SharedFileStore
from fleetlog.backends.simulated import CellBehaviour, Cluster, NodeSpec, SimulatedCell, Timers
from fleetlog.backends.simulated.clock import VirtualClock
from fleetlog.backends.store_args import open_store
from fleetlog.events import (
    DecisionBatch,
    JobDispatched,
    JobPlaced,
    JobSubmitted,
    NodeHeartbeat,
    TaskGroup,
    TaskPlacement,
    TaskStarted,
    encode,
    envelope,
)
from fleetlog.log.base import DECISIONS, INPUTS, Message, Shard
from fleetlog.log.file import FileLogStore
from fleetlog.log.kafka import KafkaConfig, KafkaLogStore
from fleetlog.log.location import LogConfig
from fleetlog.log.settings import Location
from fleetlog.simulation.metrics import Recorder
from tests.test_client_routing import on_disk, read

REPO = Path(__file__).resolve().parents[2]
MAP = (("east", 0), ("lab", 1), ("west", 1))


def placed(job_id: str, cell: str, node: str) -> JobPlaced:
    return JobPlaced(job_id=job_id, cell=cell, tasks=(TaskPlacement(0, node, (0,)),))


async def decide(base: Path, shard: Shard, *decisions: JobPlaced) -> None:
    """A cell shard's decision batch in ``shard``'s decisions log."""
    async with FileLogStore(base, shard=shard) as store:
        batch = DecisionBatch(as_of=0, digest="-", decisions=decisions)
        await store.append_transactional(DECISIONS, [Message(encode(envelope(batch, "test")))],
                                         group="g", consumed=0)


def west() -> Cluster:
    nodes = tuple(NodeSpec(f"w{i}", 16_000, 65_536, 2, "T4", ("b", "r", f"w{i}")) for i in range(2))
    return Cluster("west", nodes, CellBehaviour(10_000, 500, 0, 600_000))


async def test_the_simulated_cell_reads_and_writes_its_cells_partition(tmp_path: Path) -> None:
    base = tmp_path / "log"
    config = Location(log=LogConfig(dir=str(base)), cells=MAP)
    await decide(base, Shard.cell(0), placed("east-job", "east", "w0"))  # another partition's: unseen
    await decide(base, Shard.cell(1), placed("west-job", "west", "w1"), placed("lab-job", "lab", "l0"))
    clock = VirtualClock()
    timers = Timers(clock)
    recorder = Recorder(west().gpu_milli)
    cell = SimulatedCell(west(), timers, 7, recorder)
    store = open_store(config, "west")
    assert isinstance(store, CellStore)
    assert store.shard == Shard.cell(1)
    async with store:
        await store.log(INPUTS).append(cell.start().messages)
        assert await cell.consume(store) == 2  # its partition's batch: its cell's and lab's (shared)
        assert set(cell.gangs) == {"west-job"}  # lab's placement is not this cell's to run
        while (at := timers.next_time()) is not None and at <= 600:
            emitted = timers.fire_next()
            if emitted.messages:
                await store.log(INPUTS).append(emitted.messages)
    found = await on_disk(base)
    assert sorted(found) == ["cells-0", "cells-1"]
    assert found["cells-0"] == []  # the east partition got nothing of this backend
    assert [e.node for e in found["cells-1"] if isinstance(e, NodeHeartbeat)] == ["w0", "w1"]
    assert [e for e in found["cells-1"] if isinstance(e, TaskStarted)] == [
        TaskStarted(job_id="west-job", task_index=0, node="w1")]
    assert {e.cell for e in found["cells-1"] if isinstance(e, NodeHeartbeat)} == {"west"}


async def test_a_backends_submission_goes_global_and_its_heartbeats_to_its_cell(tmp_path: Path) -> None:
    base = tmp_path / "log"
    config = Location(log=LogConfig(dir=str(base)), cells=MAP)
    job = JobSubmitted(job_id="pod-1", tenant="ns", allowed_cells=("lab",),
                       task_groups=(TaskGroup(count=1, cpu_milli=1, mem_mib=1),))
    beat = NodeHeartbeat(cell="lab", node="l0", cpu_milli=1000, mem_mib=1024)
    started = TaskStarted(job_id="pod-1", task_index=0, node="l0")
    store = open_store(config, "lab")
    assert isinstance(store, CellStore)
    async with store:
        first = await store.log(INPUTS).append([Message(encode(envelope(e, "kube")))
                                                for e in (beat, job, started)])
        assert first == 0
        assert isinstance(store.others[Shard.GLOBAL], SharedFileStore)  # opened for the submission
        assert await store.log(INPUTS).end_offset() == 2  # reads are its cell's partition
    assert await on_disk(base) == {"global": [job], "cells-1": [beat, started]}


async def test_without_a_map_the_backend_opens_todays_store(tmp_path: Path) -> None:
    config = Location(log=LogConfig(dir=str(tmp_path / "log")))
    store = open_store(config, "any-cell")
    assert isinstance(store, SharedFileStore)
    assert store.shard == Shard.SINGLE


def test_a_backend_of_a_cell_missing_from_the_map_exits_2_writing_nothing(tmp_path: Path) -> None:
    path = tmp_path / "fleetlog.toml"
    path.write_text('[cells]\neast = 0\nwest = 1\n')
    log = tmp_path / "log"
    done = subprocess.run([sys.executable, "-m", "fleetlog.backends.slurm", "--config", str(path), "--log",
                           str(log), "--cell", "north"], cwd=REPO, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    assert done.stderr == ("python -m fleetlog.backends.slurm: error: the producer's cell 'north' is not in "
                           "the [cells] map (it names east, west): add it to the map, or fix the cell\n")
    assert not log.exists()


async def test_the_kubernetes_ledger_reads_its_dispatched_pod_groups_as_said(tmp_path: Path) -> None:
    """After a restart the Kubernetes backend must not submit a pod group again that its cell's
    partition holds as dispatched (the submission itself is in the global partition)."""
    job = JobSubmitted(job_id="pod-1", tenant="ns", allowed_cells=("lab",),
                       task_groups=(TaskGroup(count=2, cpu_milli=1, mem_mib=1),))
    dispatched = JobDispatched(job=job, cell="lab", attempt=1, seq=1, as_of=0)
    async with FileLogStore(tmp_path / "log", shard=Shard.cell(1)) as store:
        await store.log(INPUTS).append([Message(encode(envelope(dispatched, "dispatcher")))])
        ledger, offset = await read_ledger(store, "lab")
    assert (ledger.jobs, offset) == ({"pod-1": 2}, 1)
    assert not ledger.says_new(job)


@pytest.mark.kafka
async def test_on_kafka_a_backend_writes_its_cells_partition_and_the_global_one(
    kafka_bootstrap: str,
) -> None:
    prefix = f"cr-{uuid.uuid4().hex[:10]}"
    kafka = KafkaConfig(bootstrap_servers=kafka_bootstrap, topic_prefix=prefix, shards=2)
    config = Location(kafka=kafka, cells=MAP)
    job = JobSubmitted(job_id="pod-k", tenant="ns", allowed_cells=("west",),
                       task_groups=(TaskGroup(count=1, cpu_milli=1, mem_mib=1),))
    beat = NodeHeartbeat(cell="west", node="w0", cpu_milli=1000, mem_mib=1024)
    async with open_store(config, "west") as store:
        assert isinstance(store, CellStore)
        await store.log(INPUTS).append([Message(encode(envelope(e, "kube"))) for e in (job, beat)])
    assert await read(KafkaLogStore(kafka, Shard.GLOBAL)) == [job]
    assert await read(KafkaLogStore(kafka, Shard.cell(1))) == [beat]
    assert await read(KafkaLogStore(kafka, Shard.cell(0))) == []
