"""The client and ``fleetlog submit``/``cancel`` with a ``[cells]`` map: each event in its
partition's inputs log, on a real file log (and Kafka); an unknown cell writes nothing."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from pathlib import Path

import pytest
from aiohttp import web

from fleetlog.cli import main
from fleetlog.client import Client, ClientError
from fleetlog.events import decode
from fleetlog.events.codec import CONTENT_TYPE_HEADER
from fleetlog.events.model import (
    InputEvent,
    JobCancelled,
    JobSubmitted,
    NodeHeartbeat,
    NodeRemoved,
    TaskFinished,
    TaskGroup,
    TaskStarted,
)
from fleetlog.log.base import INPUTS, LogStore, Shard
from fleetlog.log.discovery import announce
from fleetlog.log.file import FileLogStore
from fleetlog.log.kafka import KafkaConfig, KafkaLogStore
from fleetlog.log.location import LogConfig
from fleetlog.log.routing import CELL_HEADER
from fleetlog.log.settings import Location

MAP = (("a100-east", 0), ("a100-west", 1), ("t4-lab", 1))
GLOBAL, CELL0, CELL1 = Shard.GLOBAL, Shard.cell(0), Shard.cell(1)


def job(job_id: str) -> JobSubmitted:
    return JobSubmitted(job_id=job_id, tenant="t", task_groups=(TaskGroup(count=1, cpu_milli=1, mem_mib=1),))


def beat(cell: str, node: str) -> NodeHeartbeat:
    return NodeHeartbeat(cell=cell, node=node, cpu_milli=1000, mem_mib=1024)


async def read(store: LogStore) -> list[InputEvent]:
    async with store:
        end = await store.log(INPUTS).end_offset()
        records = await store.log(INPUTS).read(0, end + 1, timeout_ms=5000 if end else 0)
    return [decode(r.value, r.header(CONTENT_TYPE_HEADER)).event for r in records]  # type: ignore[misc]


async def on_disk(base: Path) -> dict[str, list[InputEvent]]:
    """Every shard directory's inputs (the single log's as ``single``)."""
    found: dict[str, list[InputEvent]] = {}
    for shard in (Shard.SINGLE, GLOBAL, CELL0, CELL1, Shard.cell(2)):
        if (base / shard.dirname / INPUTS).is_dir():
            found[str(shard)] = await read(FileLogStore(base, shard=shard, read_only=True))
    return found


def located(base: Path, cells: tuple[tuple[str, int], ...] = MAP) -> Location:
    return Location(log=LogConfig(dir=str(base)), cells=cells)


async def test_each_event_lands_in_its_partition(tmp_path: Path) -> None:
    base = tmp_path / "log"
    async with await Client.connect(located(base), cell="t4-lab") as client:
        assert await client.submit(job("j1")) == 0
        assert await client.heartbeat(beat("a100-east", "e1")) == 0
        assert await client.heartbeat(beat("a100-west", "w1")) == 0
        assert await client.heartbeat(beat("t4-lab", "t1")) == 1  # shares partition 1 with a100-west
        assert await client.send([TaskStarted(job_id="j1", task_index=0, node="t1")]) == 2  # its cell's
        assert await client.cancel("j1") == 1
    assert await on_disk(base) == {
        "global": [job("j1"), JobCancelled(job_id="j1")],
        "cells-0": [beat("a100-east", "e1")],
        "cells-1": [beat("a100-west", "w1"), beat("t4-lab", "t1"),
                    TaskStarted(job_id="j1", task_index=0, node="t1")],
    }


async def test_a_mixed_batch_is_split_and_each_part_appended(tmp_path: Path) -> None:
    base = tmp_path / "log"
    started = TaskStarted(job_id="j1", task_index=0, node="e1")
    batch: list[InputEvent] = [beat("t4-lab", "t1"), job("j1"), started, beat("a100-east", "e1"), job("j2"),
                               NodeRemoved(cell="a100-west", node="w9")]
    async with await Client.connect(located(base), cell="a100-east") as client:
        await client.heartbeat(beat("a100-east", "e0"))
        sent = await client.deliver(batch)
    assert sent.shards == ("cells-1", "global", "cells-0", "cells-0", "global", "cells-1")
    assert sent.offsets == (0, 0, 1, 2, 1, 1)
    assert (sent.first_offset, sent.appended, sent.duplicates) == (0, 6, ())
    assert await on_disk(base) == {
        "global": [job("j1"), job("j2")],
        "cells-0": [beat("a100-east", "e0"), batch[2], batch[3]],
        "cells-1": [batch[0], batch[5]],
    }


async def test_an_unknown_cell_or_a_task_event_without_a_cell_writes_nothing(tmp_path: Path) -> None:
    base = tmp_path / "log"
    async with await Client.connect(located(base)) as client:
        await client.submit(job("before"))
        with pytest.raises(ClientError) as caught:  # good events first: none of them is written
            await client.send([job("j1"), beat("a100-east", "e1"), beat("h100-north", "h1")])
        assert caught.value.reason == "unknown_cell"
        assert str(caught.value) == (
            "event 2: NodeHeartbeat of node 'h1': cell 'h100-north' is not in the [cells] map (it names "
            "a100-east, a100-west, t4-lab): add it to the map, or fix the cell; nothing was sent")
        with pytest.raises(ClientError, match="event 0: TaskFinished of job 'j1' carries no cell") as caught:
            await client.send([TaskFinished(job_id="j1", task_index=0), job("j2")])
        assert caught.value.reason == "cell_needed"
    with pytest.raises(ClientError, match="the producer's cell 'nowhere' is not in the") as caught:
        await Client.connect(located(base), cell="nowhere")
    assert caught.value.reason == "unknown_cell"
    assert await on_disk(base) == {"global": [job("before")]}  # no cell directory was even made


async def test_without_a_map_everything_goes_to_the_single_log_as_today(tmp_path: Path) -> None:
    base = tmp_path / "log"
    async with await Client.connect(located(base, ()), cell="not-in-any-map") as client:
        finished = TaskFinished(job_id="j1", task_index=0)
        sent = await client.deliver([job("j1"), beat("h100-north", "h1"), finished])
    assert (sent.first_offset, sent.appended, sent.shards, sent.offsets) == (0, 3, (), ())
    assert await on_disk(base) == {"single": [job("j1"), beat("h100-north", "h1"),
                                              TaskFinished(job_id="j1", task_index=0)]}


async def test_limits_a_map_of_ten_thousand_cells_a_name_at_253_and_a_batch_at_the_request_bound(
    tmp_path: Path,
) -> None:
    long = "c" * 253
    cells = tuple(sorted([(f"cell-{i:05d}", i % 3) for i in range(9_999)] + [(long, 2)]))
    base = tmp_path / "log"
    batch: list[InputEvent] = [beat(f"cell-{i:05d}", f"n{i}") for i in range(9_998)]
    batch += [beat(long, "n" * 253), TaskStarted(job_id="j" * 253, task_index=0, node="n")]
    assert len(batch) == 10_000  # the service's max_request_events
    async with await Client.connect(located(base, cells), cell=long) as client:
        sent = await client.deliver(batch)
        with pytest.raises(ClientError, match=r"cell-00018, … \(10000 cells in all\)\): add it") as caught:
            await client.send([beat("c" * 252, "n")])
        assert caught.value.reason == "unknown_cell"
        with pytest.raises(ClientError, match=r"length <= 253 - at `\$.event.cell`"):
            await client.send([beat("c" * 254, "n")])  # past the bound: the codec refuses it first
    assert sent.appended == 10_000
    found = await on_disk(base)
    assert sorted(found) == ["cells-0", "cells-1", "cells-2"]
    assert [len(found[f"cells-{p}"]) for p in range(3)] == [3333, 3333, 3334]
    assert found["cells-2"][-2:] == batch[-2:]
    assert [e.node for e in found["cells-0"][:2]] == ["n0", "n3"]  # type: ignore[union-attr]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_submit_and_cancel_go_to_the_global_partition(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = tmp_path / "fleetlog.toml"
    config.write_text('[cells]\na100-east = 0\n"t4-lab" = 1\n')
    base = tmp_path / "log"
    where = ("--config", str(config), "--log", str(base))
    code, out, err = run(capsys, "submit", "j1", "--tenant", "t", "--cell", "t4-lab", *where)
    assert code == 2
    assert err == (f"fleetlog submit: error: no file log at {base} (expected inputs/ and decisions/ "
                   "directories in global/ or cells-<p>/ (a [cells] map); --create starts a new one)\n")
    code, out, err = run(capsys, "submit", "j1", "--tenant", "t", "--cell", "t4-lab", *where, "--create")
    assert (code, err) == (0, "")
    assert out == ("JobSubmitted j1 (key submit/j1) appended at the global inputs offset 0 "
                   f"(the file log at {base})\n")
    code, out, _ = run(capsys, "cancel", "j1", *where, "--json")
    assert code == 0
    assert json.loads(out) == {"event": "JobCancelled", "job_id": "j1", "key": "cancel/j1", "offset": 1,
                               "duplicate": False, "log": f"the file log at {base}", "shard": "global"}
    code, out, _ = run(capsys, "cancel", "j1", *where)  # screened against the global log: a repeat
    assert (code, out) == (0, f"JobCancelled j1 (key cancel/j1) cancelled already: nothing appended "
                              f"(the file log at {base})\n")
    code, _, err = run(capsys, "cancel", "never", *where)
    assert (code, err) == (1, "fleetlog cancel: error: cannot cancel job 'never': no such job\n")
    submitted = JobSubmitted(job_id="j1", tenant="t", allowed_cells=("t4-lab",),
                             task_groups=(TaskGroup(count=1, cpu_milli=1000, mem_mib=1024),))
    assert asyncio.run(on_disk(base)) == {"global": [submitted, JobCancelled(job_id="j1")]}


@pytest.mark.kafka
async def test_on_kafka_each_event_lands_in_its_topic_partition(kafka_bootstrap: str) -> None:
    prefix = f"rt-{uuid.uuid4().hex[:10]}"
    kafka = KafkaConfig(bootstrap_servers=kafka_bootstrap, topic_prefix=prefix, shards=2)
    config = Location(kafka=kafka, cells=MAP)
    async with await Client.connect(config, cell="a100-east") as client:
        sent = await client.deliver([job("k1"), beat("t4-lab", "t1"), TaskStarted(job_id="k1", task_index=0,
                                                                                  node="e1"),
                                     beat("a100-west", "w1")])
        with pytest.raises(ClientError, match="cell 'gone' is not in the"):
            await client.send([job("k2"), beat("gone", "g")])
    assert sent.shards == ("global", "cells-1", "cells-0", "cells-1")
    assert await read(KafkaLogStore(kafka, GLOBAL)) == [job("k1")]
    assert await read(KafkaLogStore(kafka, CELL0)) == [TaskStarted(job_id="k1", task_index=0, node="e1")]
    assert await read(KafkaLogStore(kafka, CELL1)) == [beat("t4-lab", "t1"), beat("a100-west", "w1")]


async def test_to_a_running_service_the_batch_goes_whole_with_the_producers_cell(tmp_path: Path) -> None:
    """The service that holds the file log routes by the same rule (its ingest); the client checks
    the batch first and names its cell in the ``fleetlog-cell`` header."""
    seen: list[tuple[str | None, int]] = []

    async def ingest(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append((request.headers.get(CELL_HEADER), len(body)))
        return web.json_response({"appended": len(body), "first_offset": 7})

    app = web.Application()
    app.router.add_post("/v1/events", ingest)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    base = tmp_path / "log"
    base.mkdir()
    announce(base, os.getpid(), f"127.0.0.1:{port}")
    try:
        async with await Client.connect(located(base), cell="t4-lab") as client:
            sent = await client.deliver([job("j1"), TaskStarted(job_id="j1", task_index=0, node="t1")])
            with pytest.raises(ClientError, match="cell 'gone' is not in the"):
                await client.send([job("j2"), beat("gone", "g")])
        async with await Client.connect(located(base)) as client:
            await client.submit(job("j3"))
    finally:
        await runner.cleanup()
    assert (sent.first_offset, sent.appended) == (7, 2)
    assert seen == [("t4-lab", 2), (None, 1)]  # the refused batch never left the client
    assert await on_disk(base) == {}


def test_send_routes_heartbeats_and_task_events_with_cell(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = tmp_path / "fleetlog.toml"
    config.write_text('[cells]\na100-east = 0\nt4-lab = 1\n')
    base = tmp_path / "log"
    events = tmp_path / "events.jsonl"
    events.write_text(
        '{"type": "NodeHeartbeat", "cell": "t4-lab", "node": "t1", "cpu_milli": 1000, "mem_mib": 1024}\n'
        '{"type": "TaskStarted", "job_id": "j1", "task_index": 0, "node": "e1"}\n'
        '{"type": "NodeRemoved", "cell": "a100-east", "node": "e9"}\n')
    where = ("--config", str(config), "--log", str(base), "--create")
    code, _, err = run(capsys, "send", "--file", str(events), *where)  # a task event: which cell?
    assert code == 2
    assert err == ("fleetlog send: error: event 1: TaskStarted of job 'j1' carries no cell: with a [cells] "
                   "map its producer must say its cell (--cell NAME, Client(cell=...)); nothing was sent\n")
    code, _, err = run(capsys, "send", "--file", str(events), "--cell", "h100", *where)
    assert code == 2
    assert "the producer's cell 'h100' is not in the [cells] map (it names a100-east, t4-lab)" in err
    assert not base.exists()  # nothing written anywhere, not even a directory
    code, out, err = run(capsys, "send", "--file", str(events), "--cell", "a100-east", *where)
    assert (code, err) == (0, "")
    assert out.splitlines()[1].startswith("TaskStarted j1 (key started/j1/0/")
    assert out.splitlines()[1].endswith(f"appended at the cells-0 inputs offset 0 (the file log at {base})")
    assert asyncio.run(on_disk(base)) == {
        "cells-0": [TaskStarted(job_id="j1", task_index=0, node="e1"),
                    NodeRemoved(cell="a100-east", node="e9")],
        "cells-1": [beat("t4-lab", "t1")],
    }
    without = ("--log", str(tmp_path / "plain"), "--create")  # no map: --cell changes nothing
    assert run(capsys, "send", "--file", str(events), "--cell", "any", *without)[0] == 0
    assert sorted(asyncio.run(on_disk(tmp_path / "plain"))) == ["single"]
