"""``fleetlog replay serve``: the read API of recorded logs answers what the live service
answered at the same inputs offset, for every list; ``?at=`` names the point."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest

from fleetlog.api.resources import ApiError
from fleetlog.api.routes import LISTS
from fleetlog.events import TaskStarted
from fleetlog.log.base import Shard
from fleetlog.replay.shards import open_shard
from fleetlog.replay_serve import LogApi
from fleetlog.service.http import HttpServer
from tests.core.builders import job, node
from tests.service.process import REPO
from tests.service.test_service import Running, events_body, serving


async def answers(url: str, session: aiohttp.ClientSession, at: int | None = None) -> dict[str, Any]:
    out = {}
    for path in [*LISTS, "/v1/jobs/j0", "/v1/jobs/j1", "/v1/jobs/j4", "/v1/jobs?label=team=vision",
                 "/v1/nodes/a1"]:
        params = {"at": str(at)} if at is not None else {}
        async with session.get(url + path, params=params) as r:
            assert r.status == 200, (path, await r.text())
            out[path] = await r.json()
    return out


async def settle(running: Running, inputs: int) -> None:
    loop = running.service.loop
    assert loop is not None
    await running.until(lambda: loop.offset == inputs and loop.committed == inputs)


async def test_the_logs_answer_what_the_service_answered(tmp_path: Path) -> None:
    log = tmp_path / "log"
    first = [node("a1", gpus=8, cell="c1"), node("b1", gpus=4, model="H100", cell="c2"),
             *(msgspec.structs.replace(job(f"j{i}", tenant=f"t{i % 2}", gpus=4), labels={"team": f"t{i % 3}"})
               for i in range(4)),
             msgspec.structs.replace(job("j4", tenant="t0", gpus=4), labels={"team": "vision", "run": "4"},
                                     annotations={"owner": "Ada <ada@example.org>"})]
    later = [TaskStarted(job_id="j0", task_index=0, node="a1"), job("k1", gpus=1),
             msgspec.structs.replace(node("b1", gpus=4, model="H100", cell="c2"), healthy=False)]
    async with serving(log) as running, aiohttp.ClientSession() as session:
        assert (await running.request("/v1/events", events_body(*first)))[0] == 200
        await settle(running, len(first))
        at_first = await answers(running.url, session)
        assert (await running.request("/v1/events", events_body(*later)))[0] == 200
        await settle(running, len(first) + len(later))
        at_end = await answers(running.url, session)
    assert at_first != at_end
    j4 = at_end["/v1/jobs/j4"]  # (waits: the detail, its story, position and labels, both ways alike)
    assert (j4["queue_position"], j4["story"][-1]["what"]) == (2, "waiting")  # (after t0's j2)
    assert j4["labels"] == {"team": "vision", "run": "4"}
    assert [j["job_id"] for j in at_end["/v1/jobs?label=team=vision"]["items"]] == ["j4"]
    assert at_first["/v1/jobs/j0"]["story"] != at_end["/v1/jobs/j0"]["story"]  # (j0's task started)
    source = await open_shard(log, Shard.SINGLE, None, True)
    server = HttpServer(LogApi(source).handle)
    await server.start()
    url = f"http://127.0.0.1:{server.port}"
    try:
        async with aiohttp.ClientSession() as session:
            assert await answers(url, session, at=len(first)) == at_first
            assert await answers(url, session) == at_end  # default: the end of the logs
            async with session.get(url + "/v1/jobs", params={"at": str(len(first)), "limit": "2"}) as r:
                assert r.headers["Fleetlog-Offset"] == str(len(first))
                assert (await r.json())["next_page_token"] == "2"
            for params, field in (({"at": "soon"}, "at"), ({"at": "999"}, "at"), ({"state": "x"}, "state")):
                async with session.get(url + "/v1/jobs", params=params) as r:
                    answer = await r.json()
                    assert (r.status, answer["field"]) == (400, field), answer
            async with session.post(url + "/v1/events", data=b"[]") as r:
                assert (r.status, (await r.json())["code"]) == (404, "not_served")
            async with session.get(url + "/v1/nope") as r:
                assert (r.status, (await r.json())["code"]) == (404, "no_route")
    finally:
        await server.stop()
        await source.close()


async def test_the_command_serves_until_ctrl_c(tmp_path: Path) -> None:
    log = tmp_path / "log"
    async with serving(log) as running:
        assert (await running.request("/v1/events", events_body(node("n1"), job("j1", gpus=1))))[0] == 200
        await settle(running, 2)
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fleetlog.cli", "replay", "serve", "--log", str(log), "--json",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:
        assert child.stdout is not None
        line = await asyncio.wait_for(child.stdout.readline(), 120)
        where = json.loads(line)["serving"]
        async with aiohttp.ClientSession() as session, session.get(where + "/v1/jobs") as r:
            assert [j["job_id"] for j in (await r.json())["items"]] == ["j1"]
        child.send_signal(signal.SIGINT)
        await asyncio.wait_for(child.wait(), 60)
        assert child.returncode == 0
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()


async def test_at_a_time(tmp_path: Path) -> None:
    log = tmp_path / "log"
    async with serving(log) as running:
        assert (await running.request("/v1/events", events_body(node("n1"))))[0] == 200
        await settle(running, 1)
    source = await open_shard(log, Shard.SINGLE, None, True)
    try:
        api = LogApi(source)
        offset, state = await api.state(["2100-01-01T00:00:00Z"])  # after the last input: the end
        assert (offset, state.nodes.size) == (1, 1)
        for before in ("1700000000000ms", "2026-01-01T00:00:00Z"):
            with pytest.raises(ApiError) as refused:
                await api.state([before])
            assert (refused.value.status, refused.value.field) == (400, "at")
            assert "before the first input" in refused.value.message
    finally:
        await source.close()
