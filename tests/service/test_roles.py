"""``fleetlog run --role dispatch|cell|all`` with a ``[cells]`` map, as real processes.

Kafka: cell processes share the cell partitions through the owners group, one dispatcher leads
the global partition; a cell process is killed with SIGKILL under load again and again, its
partitions move to the survivor, and afterwards no job is placed twice or lost and every cell
partition and the dispatcher verify.  A job its first cell cannot place is handed back and
placed in the other cell.  File log: ``--role all`` runs the dispatcher and every cell partition
in one process, stops on SIGTERM with exit code 0 and resumes where it stopped.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetlog.core.dispatch import CellMap
from fleetlog.core.state import CoreConfig
from fleetlog.events import JobPlaced
from fleetlog.events.codec import CONTENT_TYPE_HEADER, MSGPACK, encode, envelope
from fleetlog.events.model import Event, JobDispatched
from fleetlog.log.base import DECISIONS, INPUTS, LogStore, Message, Shard
from fleetlog.log.cellinputs import CELL_INPUT_TYPES
from fleetlog.log.consumer import EventConsumer, decision_batches
from fleetlog.log.file import FileLogStore
from fleetlog.log.kafka import KafkaConfig, KafkaLogStore
from fleetlog.replay.dispatcher import verify_dispatcher
from fleetlog.replay.verify import verify
from fleetlog.service.cellshard import held_cells
from tests.core.builders import job, node
from tests.faults.checker import read_all
from tests.service.process import ServiceProcess

STARTED: list[ServiceProcess] = []


@pytest.fixture(autouse=True)
def _no_service_outlives_its_test() -> Iterator[None]:
    yield
    while STARTED:
        STARTED.pop().kill_if_running()


def msg(event: Event) -> Message:
    return Message(encode(envelope(event, "test")), headers=((CONTENT_TYPE_HEADER, MSGPACK),))


def config_file(tmp_path: Path, place: str, cells: dict[str, int], **service: object) -> Path:
    lines = [place, "[service]", "idle_wait_ms = 20", "leader_session_timeout_ms = 3000",
             "snapshot_every_s = 2.0", "snapshot_every_events = 2000",
             *(f"{k} = {v}" for k, v in service.items()),
             "[cells]", *(f"{c} = {p}" for c, p in cells.items())]
    path = tmp_path / f"fleetlog-{uuid.uuid4().hex[:6]}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def start(tmp_path: Path, name: str, *args: str) -> ServiceProcess:
    process = ServiceProcess(tmp_path / f"{name}.log", list(args), {}).start()
    STARTED.append(process)
    return process


def started(*processes: ServiceProcess) -> None:
    """Wait for each to serve HTTP (a cold numba cache compiles for a minute or more first)."""
    for process in processes:
        process.address(timeout_s=300)


async def placements(stores: dict[int, LogStore]) -> Counter[str]:
    """How often each job was placed, over every cell partition's decisions."""
    placed: Counter[str] = Counter()
    for store in stores.values():
        for _, batch in decision_batches(await read_all(store, DECISIONS)):
            placed.update(d.job_id for d in batch.decisions if isinstance(d, JobPlaced))
    return placed


async def wait_placed(stores: dict[int, LogStore], jobs: set[str], timeout_s: float,
                      alive: list[ServiceProcess]) -> Counter[str]:
    deadline = time.monotonic() + timeout_s
    while True:
        placed = await placements(stores)
        if jobs <= set(placed):
            return placed
        if time.monotonic() > deadline:
            tails = "\n".join(p.tail(15) for p in alive)
            raise AssertionError(f"{len(jobs - set(placed))} of {len(jobs)} jobs not placed, e.g. "
                                 f"{sorted(jobs - set(placed))[:5]}\n{tails}")
        for p in alive:
            p._check_alive()
        await asyncio.sleep(0.3)


async def verify_all(global_store: LogStore, stores: dict[int, LogStore], cells: CellMap,
                     hold_ms: int) -> None:
    """Every cell partition replays to its recorded decisions, and the dispatcher to its steps."""
    for p, store in stores.items():
        report = await verify(store, core=CoreConfig(hold_ms=hold_ms, cells=held_cells(cells, p)))
        assert report.ok, (p, report.divergence)
        assert report.batches > 0, p
    dispatched = await verify_dispatcher(global_store, cells)
    assert dispatched.divergence is None, dispatched.divergence
    assert dispatched.steps > 0


# --- Kafka: cell processes, a dispatcher, kill -9 ----------------------------------------------------

CELLS = {"c0": 0, "c1": 1, "c2": 2, "c3": 3, "c4": 3}
NODES = 6


class Load:
    """Heartbeats for every node of every cell (into its partition) and CPU-only jobs (into the
    global partition), until stopped."""

    def __init__(self, global_store: LogStore, stores: dict[int, LogStore]) -> None:
        self.global_store, self.stores = global_store, stores
        self.jobs: list[str] = []
        self._stop = asyncio.Event()
        self.task = asyncio.create_task(self._run())

    async def heartbeats(self) -> None:
        for cell, p in CELLS.items():
            beats = [node(f"{cell}-n{i}", gpus=0, cell=cell, rack=f"r{i}") for i in range(NODES)]
            await self.stores[p].log(INPUTS).append([msg(b) for b in beats])

    async def _run(self) -> None:
        tick = 0
        while not self._stop.is_set():
            if tick % 5 == 0:
                await self.heartbeats()
            batch = [f"j{len(self.jobs) + i}" for i in range(4)]
            await self.global_store.log(INPUTS).append([msg(job(j, gpus=0, cpu=500, mem=512)) for j in batch])
            self.jobs += batch
            tick += 1
            await asyncio.sleep(0.1)

    async def stop(self) -> None:
        self._stop.set()
        await self.task


async def owned(process: ServiceProcess) -> set[int]:
    found = process.health() or {}
    return {int(p) for p, s in found.get("partitions", {}).items() if s["stepping"]}


async def wait_owned(processes: list[ServiceProcess], wanted: set[int], timeout_s: float = 60,
                     each: bool = False) -> float:
    """Wait until the processes step ``wanted`` between them (``each``: every one steps some);
    the seconds it took."""
    started = deadline = time.monotonic()
    deadline += timeout_s
    while time.monotonic() < deadline:
        sets = [await owned(p) for p in processes]
        union = set().union(*sets)
        disjoint = sum(len(s) for s in sets) == len(union)
        if union == wanted and disjoint and (not each or all(sets)):
            return time.monotonic() - started
        await asyncio.sleep(0.05)
    raise AssertionError(f"partitions {sets}, not {wanted}:\n" + "\n".join(p.tail(20) for p in processes))


async def wait_dispatching(process: ServiceProcess, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not ((process.health() or {}).get("dispatcher") or {}).get("leading"):
        assert time.monotonic() < deadline, process.tail(20)
        await asyncio.sleep(0.1)


@pytest.fixture
def kafka_config(kafka_bootstrap: str) -> KafkaConfig:
    prefix = f"roles{uuid.uuid4().hex[:8]}"
    return KafkaConfig(bootstrap_servers=kafka_bootstrap, topic_prefix=prefix, shards=4)


def kafka_place(config: KafkaConfig) -> str:
    return (f'[kafka]\nbootstrap_servers = "{config.bootstrap_servers}"\n'
            f'topic_prefix = "{config.topic_prefix}"\nshards = {config.shards}')


async def open_stores(config: KafkaConfig, partitions: set[int]) -> tuple[LogStore, dict[int, LogStore]]:
    glob = KafkaLogStore(config, Shard.GLOBAL)
    await glob.open()
    stores: dict[int, LogStore] = {}
    for p in sorted(partitions):
        stores[p] = KafkaLogStore(config, Shard.cell(p))
        await stores[p].open()
    return glob, stores


async def dispatches(stores: dict[int, LogStore]) -> Counter[tuple[str, int]]:
    """How often each (job, attempt) was dispatched, over every cell partition's inputs."""
    sent: Counter[tuple[str, int]] = Counter()
    for store in stores.values():
        polled = await EventConsumer(store, accepts=CELL_INPUT_TYPES).poll(0, 1_000_000, park=False)
        sent.update((d.envelope.event.job.job_id, d.envelope.event.attempt) for d in polled.events
                    if isinstance(d.envelope.event, JobDispatched))
    return sent


@pytest.mark.kafka
async def test_cell_processes_share_the_partitions_and_survive_kill_9(
    tmp_path: Path, kafka_config: KafkaConfig
) -> None:
    path = config_file(tmp_path, kafka_place(kafka_config), CELLS)
    named = set(CELLS.values())
    glob, stores = await open_stores(kafka_config, named)
    load: Load | None = None
    try:
        dispatcher = start(tmp_path, "dispatch", "--config", str(path), "--role", "dispatch")
        cells = [start(tmp_path, f"cell{i}", "--config", str(path), "--role", "cell") for i in range(2)]
        started(dispatcher, *cells)
        load = Load(glob, stores)
        await wait_dispatching(dispatcher)
        await wait_owned(cells, named, each=True)
        takeovers = []
        for kill in range(5):
            victim, survivor = cells[kill % 2], cells[1 - kill % 2]
            await asyncio.sleep(0.5)  # under load
            assert await owned(victim), "the victim steps partitions when it is killed"
            victim.kill9()
            takeovers.append(await wait_owned([survivor], named))  # every partition on the survivor
            cells[kill % 2] = start(tmp_path, f"cell{kill}", "--config", str(path), "--role", "cell")
            await wait_owned(cells, named, each=True)  # the restarted one takes its share again
        await load.stop()
        placed = await wait_placed(stores, set(load.jobs), 60, [dispatcher, *cells])
        print(f"takeover after kill -9: {[round(t, 2) for t in takeovers]} s; {len(load.jobs)} jobs")
        assert placed == Counter(dict.fromkeys(load.jobs, 1)), "no job placed twice, none lost"
        assert await dispatches(stores) == Counter({(j, 1): 1 for j in load.jobs}), "each dispatched once"
        assert max(takeovers) < 15, takeovers  # session 3 s + rebalance + recovery (docs/service.md)
        for p in (*cells, dispatcher):
            assert p.stop() == 0, p.tail()
        await verify_all(glob, stores, CellMap(tuple(CELLS.items())), 30_000)
    finally:
        if load is not None and not load.task.done():
            await load.stop()
        for s in (*stores.values(), glob):
            await s.close()


@pytest.mark.kafka
@pytest.mark.parametrize("roles", [("dispatch", "cell"), ("all",)])
async def test_a_job_its_first_cell_cannot_place_is_placed_in_the_other(
    tmp_path: Path, kafka_config: KafkaConfig, roles: tuple[str, ...]
) -> None:
    """Cell x has 4 nodes of 8 GPUs on 4 racks (most room, but no rack holds the gang); cell y 2
    nodes on one rack.  The gang of 2 x 8 GPUs that needs one rack goes to x first, is handed
    back after the hold, and is placed in y.  Run as a dispatcher and a cell process, and as one
    ``--role all`` process on Kafka."""
    cells = {"x": 0, "y": 1}
    hold = 1500
    path = config_file(tmp_path, kafka_place(kafka_config), cells, cell_hold_ms=hold)
    glob, stores = await open_stores(kafka_config, {0, 1})
    try:
        processes = [start(tmp_path, role, "--config", str(path), "--role", role) for role in roles]
        started(*processes)
        await wait_owned(processes[-1:], {0, 1})
        await wait_dispatching(processes[0])
        x_nodes = [node(f"x{i}", cell="x", rack=f"r{i}") for i in range(4)]
        y_nodes = [node(f"y{i}", cell="y", rack="r0") for i in range(2)]

        async def beat() -> None:
            await stores[0].log(INPUTS).append([msg(n) for n in x_nodes])
            await stores[1].log(INPUTS).append([msg(n) for n in y_nodes])

        await beat()
        await asyncio.sleep(1.0)  # the summaries reach the dispatcher
        await glob.log(INPUTS).append([msg(job("gang", tasks=2, gpus=8, topology="rack", cells=("x", "y")))])
        deadline = time.monotonic() + 30
        while "gang" not in await placements(stores):
            assert time.monotonic() < deadline, "\n".join(p.tail(20) for p in processes)
            await beat()  # log time moves in x: the hold ends
            await asyncio.sleep(0.5)
        placed = await placements(stores)
        assert placed["gang"] == 1
        in_y = [d for _, b in decision_batches(await read_all(stores[1], DECISIONS))
                for d in b.decisions if isinstance(d, JobPlaced)]
        assert [d.job_id for d in in_y] == ["gang"]
        sent = [r for r in await read_all(stores[0], INPUTS) if b"gang" in r.value]
        assert sent, "the gang was dispatched to x first"
        for p in processes:
            assert p.stop() == 0
        await verify_all(glob, stores, CellMap(tuple(cells.items())), hold)
    finally:
        for s in (*stores.values(), glob):
            await s.close()


# --- the file log: --role all with a map, one process -------------------------------------------------


def file_stores(directory: Path, partitions: list[int]) -> tuple[FileLogStore, dict[int, LogStore]]:
    root = FileLogStore(directory, shard=Shard.GLOBAL)
    return root, {p: root.for_shard(Shard.cell(p)) for p in partitions}


async def write_file(directory: Path, partitions: list[int], events: dict[int | None, list[Event]]) -> None:
    """Append while no service runs (the file log has one writer); ``None``: the global partition."""
    root, stores = file_stores(directory, partitions)
    for s in (root, *stores.values()):
        await s.open()
    try:
        for where, evs in events.items():
            await (root if where is None else stores[where]).log(INPUTS).append([msg(e) for e in evs])
    finally:
        for s in (*stores.values(), root):
            await s.close()


async def read_only(directory: Path, partitions: list[int]) -> tuple[LogStore, dict[int, LogStore]]:
    root = FileLogStore(directory, shard=Shard.GLOBAL, read_only=True)
    stores: dict[int, LogStore] = {p: FileLogStore(directory, shard=Shard.cell(p), read_only=True)
                                   for p in partitions}
    for s in (root, *stores.values()):
        await s.open()
    return root, stores


async def test_role_all_with_a_map_runs_every_shard_in_one_process_and_resumes(tmp_path: Path) -> None:
    cells = {"a": 0, "b": 1, "c": 1}
    parts = [0, 1]
    directory = tmp_path / "log"
    path = config_file(tmp_path, f'[log]\ndir = "{directory}"', cells)
    beats = {p: [node(f"{c}-n{i}", gpus=0, cell=c, rack=f"r{i}") for c, q in cells.items() if q == p
                 for i in range(3)] for p in parts}
    first = [f"a{i}" for i in range(20)]
    await write_file(directory, parts, {**beats, None: [job(j, gpus=0, cpu=1000, mem=512) for j in first]})
    service = start(tmp_path, "all", "--config", str(path))
    started(service)
    found = service.wait_leading()
    assert found["role"] == "all"
    assert set(found["partitions"]) == {"0", "1"}
    for route, method, said in [("/v1/jobs", "GET", "serves no read API yet"),
                                ("/v1/events", "POST", "takes no ingest")]:
        body = b"[]" if method == "POST" else None
        request = urllib.request.Request(f"http://{service.address()}{route}", body, method=method)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        answer = json.loads(refused.value.read())
        assert (refused.value.code, answer["code"]) == (404, "not_served_by_role"), answer
        assert said in answer["message"], answer
    root, stores = await read_only(directory, parts)
    try:
        placed = await wait_placed(stores, set(first), 60, [service])
        assert placed == Counter(dict.fromkeys(first, 1))
    finally:
        for s in (*stores.values(), root):
            await s.close()
    assert service.stop() == 0, service.tail()
    stopped = [line for line in service.lines() if line.get("event") == "service_stopped"]
    assert stopped, service.tail()
    for shard in ("global", "cells-0", "cells-1"):
        assert list((directory / shard / "snapshots").iterdir()), f"{shard} snapshotted when stopped"
    # stopped: more inputs, then the process resumes from its snapshots
    second = [f"b{i}" for i in range(20)]
    await write_file(directory, parts, {**beats, None: [job(j, gpus=0, cpu=1000, mem=512) for j in second]})
    again = start(tmp_path, "all-again", "--config", str(path))
    again.wait_leading()
    root, stores = await read_only(directory, parts)
    try:
        placed = await wait_placed(stores, set(first + second), 60, [again])
        assert placed == Counter(dict.fromkeys(first + second, 1))
        assert set(await dispatches(stores)) == {(j, 1) for j in first + second}
    finally:
        for s in (*stores.values(), root):
            await s.close()
    assert again.stop() == 0
    resumed = [line for line in again.lines() if line.get("event") == "cell_shard_started"]
    assert len(resumed) == 2, resumed
    assert all(line["snapshot"] for line in resumed), resumed
    root, stores = file_stores(directory, parts)
    for s in (root, *stores.values()):
        await s.open()
    try:
        await verify_all(root, stores, CellMap(tuple(sorted(cells.items()))), 30_000)
    finally:
        for s in (*stores.values(), root):
            await s.close()


@pytest.mark.kafka
async def test_a_cell_shard_commits_what_it_only_folded_every_role_commit_every_ms(
    tmp_path: Path, kafka_config: KafkaConfig
) -> None:
    """Inputs a cell shard folds without publishing (steady heartbeats) are committed by a timer.
    Each such commit is a transaction that holds the shard's steps, and they met the probes of
    the roles' latency benchmark (benchmarks/README.md, "shards"): at most one per
    ``role_commit_every_ms`` after the last commit (a step that publishes commits with it), not
    one a second. A restart folds those inputs again; they are committed all the same."""
    path = config_file(tmp_path, kafka_place(kafka_config), {"c0": 0}, role_commit_every_ms=4000,
                       summary_every_ms=600_000)
    glob, stores = await open_stores(kafka_config, {0})
    store, beats = stores[0], [msg(node(f"n{i}", cell="c0")) for i in range(4)]
    try:
        cell = start(tmp_path, "cell", "--config", str(path), "--role", "cell")
        started(cell)
        await wait_owned([cell], {0})
        end = await store.log(INPUTS).append(beats) + len(beats)  # new nodes: a summary, published
        deadline = time.monotonic() + 60
        while (await store.committed_offset("fleetlog-scheduler") or 0) < end:
            assert time.monotonic() < deadline, cell.tail(20)
            await asyncio.sleep(0.1)
        committed, folded = await store.committed_offset("fleetlog-scheduler"), []
        for _ in range(10):  # 2.5 s of steady heartbeats: folded, nothing published
            await store.log(INPUTS).append(beats)
            await asyncio.sleep(0.25)
            folded.append(cell.health()["partitions"]["0"]["inputs_offset"])
            assert await store.committed_offset("fleetlog-scheduler") == committed
        assert folded[-1] > committed
        deadline = time.monotonic() + 10
        while (await store.committed_offset("fleetlog-scheduler") or 0) < folded[-1]:
            assert time.monotonic() < deadline, "the timer commits what was folded"
            await asyncio.sleep(0.1)
        assert cell.stop() == 0, cell.tail()
    finally:
        for s in (*stores.values(), glob):
            await s.close()
