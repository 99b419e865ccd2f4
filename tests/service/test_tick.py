"""Log time moves while the service leads (issue 47): with no input but the heartbeats that
stopped, the leader appends ticks, so silent nodes go down within the node timeout and a few tick
periods — not at the next input, all at once — and replay, reading the same ticks, verifies.  The
single shard and every cell shard of ``--role all`` with a ``[cells]`` map alike; a producer may
not send a tick; ``fleetlog nodes`` shows how long ago each node was heard from."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from fleetlog.cli import main
from fleetlog.core.state import NodeStatus, State
from fleetlog.events import Tick, encode, envelope
from fleetlog.events.codec import CONTENT_TYPE_HEADER, decode
from fleetlog.events.model import JobPending, JobPlaced
from fleetlog.log.base import DECISIONS, INPUTS, LogStore, Shard
from fleetlog.log.consumer import decision_batches
from fleetlog.log.file import FileLogStore
from fleetlog.log.kafka import KafkaConfig, KafkaLogStore
from fleetlog.reads_watch import changed
from fleetlog.replay.verify import verify
from fleetlog.service.config import Config, LogConfig, ServiceSettings
from fleetlog.service.roles import RoleService
from tests.core.builders import job, node
from tests.faults.checker import read_all
from tests.service.test_roles import write_file
from tests.service.test_service import events_body, serving, start

NODE_TIMEOUT_MS = 600
TICK_MS = 100
WITHIN_S = 30.0
"""A generous bound on the wall clock (a loaded machine): log time is what the fold reads."""


def downs(state: State) -> int:
    n = state.nodes.size
    return int((state.nodes.view("status")[:n] == int(NodeStatus.DOWN)).sum())


async def inputs_after(store: LogStore, first: int) -> list[tuple[str, str]]:
    """(type, producer) of each input from offset ``first`` on."""
    out = []
    for record in await read_all(store, INPUTS):
        if record.offset >= first:
            env = decode(record.value, record.header(CONTENT_TYPE_HEADER))
            out.append((type(env.event).__name__, env.producer_id))
    return out


async def until(predicate: Any, what: str) -> None:
    for _ in range(int(WITHIN_S / 0.05)):
        if predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{what} not within {WITHIN_S} s")


async def test_silent_nodes_go_down_on_ticks_alone_and_replay_verifies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "log"
    async with serving(log, node_timeout_ms=NODE_TIMEOUT_MS, tick_every_ms=TICK_MS) as running:
        sent = events_body(node("n1"), node("n2"), job("j1", gpus=4))
        assert (await running.request("/v1/events", sent))[0] == 200
        loop = running.service.loop
        assert loop is not None
        # the heartbeats stop here, and nothing else is sent
        await until(lambda: downs(loop.state) == 2, "both silent nodes down")
        status, found = await running.request("/v1/jobs/j1")
        assert (status, found["state"]) == (200, "pending"), found  # requeued off the lost node
        status, listed = await running.request("/v1/nodes")
        assert {n["status"] for n in listed["items"]} == {"down"}
        assert all(n["heard_ago_ms"] > NODE_TIMEOUT_MS for n in listed["items"]), listed
        assert running.service.store is not None
        every = await inputs_after(running.service.store, 0)
    last_sent = max(i for i, (_, producer) in enumerate(every) if producer == "test")
    after = every[last_sent + 1 :]
    assert after
    assert set(after) == {("Tick", "fleetlog-scheduler")}
    store = FileLogStore(log, read_only=True)
    await store.open()
    try:
        batches = [b for _, b in decision_batches(await read_all(store, DECISIONS))]
        report = await verify(store, core=ServiceSettings(node_timeout_ms=NODE_TIMEOUT_MS).core())
    finally:
        await store.close()
    assert report.ok, report.divergence
    kinds = [{type(d) for d in b.decisions} for b in batches]
    assert kinds[0] == {JobPlaced}, kinds
    assert JobPending in kinds[-1], kinds  # pending once requeued off the lost node
    assert len(batches) < len(after)
    assert all(b.decisions for b in batches)
    capsys.readouterr()
    timeout_s = str(NODE_TIMEOUT_MS / 1000)
    verify_argv = ["replay", "verify", "--log", str(log), "--node-timeout", timeout_s]
    assert await asyncio.to_thread(main, verify_argv) == 0
    capsys.readouterr()
    assert await asyncio.to_thread(main, ["nodes", "--log", str(log)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[-1] == "HEARD_AGO", table
    assert all(float(row.split()[-1].removesuffix("s")) > NODE_TIMEOUT_MS / 1000 for row in table[1:]), table
    assert await asyncio.to_thread(main, ["nodes", "--log", str(log), "-o", "json"]) == 0
    items = json.loads(capsys.readouterr().out)["items"]
    assert all(i["heard_ago_ms"] > NODE_TIMEOUT_MS for i in items), items
    await shown_only_where_asked(capsys, str(log), len(after))


async def shown_only_where_asked(capsys: pytest.CaptureFixture[str], log: str, ticks: int) -> None:
    """``replay dump`` shows the ticks; ``history --audit`` (even ``--all``) skips them unless
    ``--type Tick`` asks; ``history`` lists jobs only."""

    async def out(*argv: str) -> str:
        assert await asyncio.to_thread(main, [*argv, "--log", log]) == 0
        return capsys.readouterr().out

    capsys.readouterr()
    dumped = [json.loads(line) for line in (await out("replay", "dump", "--from-log", "inputs")).splitlines()]
    assert sum(d["event"]["type"] == "Tick" for d in dumped) >= ticks
    audited = json.loads(await out("history", "--audit", "--all", "--json"))["items"]
    assert {e["type"] for e in audited} == {"NodeHeartbeat", "JobSubmitted"}, audited
    asked = json.loads(await out("history", "--audit", "--type", "Tick", "--json"))["items"]
    assert len(asked) >= ticks
    assert {e["type"] for e in asked} == {"Tick"}
    assert json.loads(await out("history", "--json"))["items"] == []  # (no job ended: ticks are none)


async def test_a_producer_may_not_send_a_tick(tmp_path: Path) -> None:
    async with serving(tmp_path / "log", tick_every_ms=0) as running:
        body = b"[" + b",".join(encode(envelope(e, "test"), "json") for e in (node("n1"), Tick())) + b"]"
        status, answer = await running.request("/v1/events", body)
        assert (status, answer["code"], answer["field"]) == (400, "not_an_input", "event.type"), answer
        assert "event 1: a Tick is the scheduler's own" in answer["message"]
        assert await running.inputs_end() == 0  # nothing of the request appended


async def test_a_cell_shard_of_role_all_moves_its_log_time_too(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    await write_file(directory, [0], {0: [node("a-n1", cell="a"), node("a-n2", cell="a")], None: []})
    settings = ServiceSettings(
        http_port=0, idle_wait_ms=20, node_timeout_ms=NODE_TIMEOUT_MS, tick_every_ms=TICK_MS, role="all"
    )
    service = RoleService(
        Config(log=LogConfig(dir=str(directory), fsync="never"), service=settings, cells=(("a", 0),))
    )
    task = asyncio.create_task(service.run())
    try:

        def down() -> bool:
            runner = service.cells.runners.get(0) if service.cells is not None else None
            return runner is not None and runner.loop is not None and downs(runner.loop.state) == 2

        await until(down, "the cell shard's silent nodes down")
    finally:
        service.stopping.set()
        await asyncio.wait_for(task, 30)
    store = FileLogStore(directory, shard=Shard.cell(0), read_only=True)
    await store.open()
    try:
        after = await inputs_after(store, 2)
        report = await verify(store, core=settings.core(hold_ms=settings.cell_hold_ms, cells=("a",)))
    finally:
        await store.close()
    assert after
    assert set(after) == {("Tick", "fleetlog-scheduler-cell-0")}
    assert report.ok, report.divergence


@pytest.mark.kafka
async def test_on_kafka_the_leader_ticks_too_and_replay_verifies(
    tmp_path: Path, kafka_bootstrap: str
) -> None:
    kafka = KafkaConfig(bootstrap_servers=kafka_bootstrap, topic_prefix=f"tick{uuid.uuid4().hex[:8]}")
    settings = ServiceSettings(
        http_port=0,
        idle_wait_ms=20,
        node_timeout_ms=NODE_TIMEOUT_MS,
        tick_every_ms=TICK_MS,
        leader_session_timeout_ms=3000,
    )
    running = await start(Config(kafka=kafka, service=settings))
    try:
        sent = events_body(node("n1"), node("n2"), job("j1", gpus=4))
        assert (await running.request("/v1/events", sent))[0] == 200
        loop = running.service.loop
        assert loop is not None
        await until(lambda: downs(loop.state) == 2, "both silent nodes down")
        status, found = await running.request("/v1/jobs/j1")
        assert (status, found["state"]) == (200, "pending"), found
    finally:
        await running.stop()
    store = KafkaLogStore(kafka)
    await store.open()
    try:
        every = await inputs_after(store, 0)
        report = await verify(store, core=settings.core())
    finally:
        await store.close()
    last_sent = max(i for i, (_, producer) in enumerate(every) if producer == "test")
    assert every[last_sent + 1 :]
    assert set(every[last_sent + 1 :]) == {("Tick", "fleetlog-scheduler")}
    assert report.ok, report.divergence


def test_nodes_watch_does_not_reprint_a_node_only_older_by_log_time() -> None:
    """Each input (a tick too) ages every node's ``heard_ago_ms``: ``nodes -w`` prints a node
    again when it changed, not each time log time moved."""
    seen: dict[str, Any] = {}
    first = {"node": "n1", "status": "up", "last_heartbeat_ms": 1000, "heard_ago_ms": 0}
    assert changed(seen, [first]) == [first]
    assert changed(seen, [{**first, "heard_ago_ms": 5000}]) == []
    down = {**first, "status": "down", "heard_ago_ms": 61_000}
    assert changed(seen, [down]) == [down]


async def test_an_idle_service_counts_its_ticks_and_snapshots_as_one_fed_heartbeats(tmp_path: Path) -> None:
    log = tmp_path / "log"
    async with serving(log, tick_every_ms=TICK_MS, snapshot_every_s=0.5) as running:
        snapshots = log / "snapshots"
        await until(lambda: snapshots.is_dir() and any(snapshots.iterdir()), "a snapshot of the idle service")
        status, metrics = await running.request("/metrics")
        assert status == 200
        (line,) = [x for x in metrics.decode().splitlines() if x.startswith("fleetlog_input_events_total ")]
        assert float(line.split()[1]) >= 1
        assert running.service.store is not None
        every = await inputs_after(running.service.store, 0)
    assert every
    assert set(every) == {("Tick", "fleetlog-scheduler")}
