"""``POST /v1/dry-run`` and ``fleetlog submit --dry-run``/``--wait`` (docs/api.md, docs/cli.md):
where a job would go now, or why it would wait, without appending anything or changing the
live state; the same answer from the live service, from ``replay serve`` at the same offset and
from the CLI with or without a service; ``--wait`` follows a job to ``running`` or times out."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import jsonschema
import msgspec
import pytest

from fleetlog.api.routes import openapi
from fleetlog.cli import main
from fleetlog.core.digest import digest
from fleetlog.events import TaskFailed, TaskStarted
from fleetlog.events.model import Taint, Toleration
from fleetlog.log.base import Shard
from fleetlog.replay.shards import open_shard
from fleetlog.replay_serve import LogApi
from fleetlog.service.http import HttpServer
from tests.core.builders import job, node
from tests.service.test_service import Running, events_body, serving

TAINT = Taint(key="dedicated", value="infer", effect="NoSchedule")


def fleet() -> list[Any]:
    """a1: 8 A100s, 4 of them taken by j1; b1: 8 H100s behind a taint nobody tolerates yet."""
    tainted = msgspec.structs.replace(node("b1", gpus=8, model="H100"), taints=(TAINT,))
    return [node("a1", gpus=8), tainted, job("j1", gpus=4)]


def tolerating(job_id: str, gpus: int) -> Any:
    base = job(job_id, gpus=gpus)
    tolerates = (Toleration(key="dedicated", value="infer"),)
    group = msgspec.structs.replace(base.task_groups[0], tolerations=tolerates)
    return msgspec.structs.replace(base, task_groups=(group,))


def schema_of(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}", "components": openapi()["components"]}


async def settled(running: Running, body: list[Any]) -> None:
    """Send ``body`` and wait until the service folded (and decided) it."""
    end = await running.inputs_end() + len(body)
    assert (await running.request("/v1/events", events_body(*body)))[0] == 200
    loop = running.service.loop
    assert loop is not None
    await running.until(lambda: loop.offset == end and loop.committed == end)


async def test_the_service_says_where_or_why_and_changes_nothing(tmp_path: Path) -> None:
    async with serving(tmp_path / "log") as running:
        await settled(running, fleet())
        loop = running.service.loop
        assert loop is not None
        before = (await running.inputs_end(), digest(loop.state), await running.request("/v1/jobs"))
        asked = [job("d1", gpus=4), job("d2", gpus=8), job("j1", gpus=4), job("j1", gpus=2),
                 job("d3", gpus=16), tolerating("d4", 8), job("h1", gpus=1, models=("H100",))]
        status, answer = await running.request("/v1/dry-run", events_body(*asked))
        assert status == 200, answer
        jsonschema.validate(answer, schema_of("DryRun"))
        assert (await running.inputs_end(), digest(loop.state), await running.request("/v1/jobs")) == before
        d1, d2, same, other, never, d4, h1 = answer["items"]
        assert (d1["outcome"], d1["cell"], [t["node"] for t in d1["tasks"]]) == ("placed", "c1", ["a1"])
        assert len(d1["tasks"][0]["gpu_indices"]) == 4
        assert "on a1 (GPUs " in d1["message"]
        assert (d2["outcome"], d2["reason"]) == ("waits", "insufficient_capacity")  # a1 is full after d1
        assert (h1["outcome"], h1["reason"]) == ("waits", "no_eligible_nodes"), h1  # b1's taint
        assert "dedicated" in h1["message"], h1
        assert (same["outcome"], same["reason"]) == ("duplicate", "already_submitted")
        assert (other["outcome"], other["reason"]) == ("refused", "already_exists")
        assert (never["outcome"], never["reason"]) == ("refused", "never_fits")
        assert (d4["outcome"], [t["node"] for t in d4["tasks"]]) == ("placed", ["b1"])  # it tolerates it
        alone, bare = await running.request("/v1/dry-run", json.dumps(  # a bare JobSubmitted, no type
            {"job_id": "d5", "tenant": "t", "task_groups": [{"count": 1, "cpu_milli": 1, "mem_mib": 1,
                                                             "gpu_count": 8, "gpu_milli": 1000}]}).encode())
        assert (alone, bare["items"][0]["outcome"]) == (200, "waits"), bare
        for wrong, code in ((b"", "undecodable"), (b"[]", "undecodable"), (b'{"job_id": 1}', "invalid_event"),
                            (events_body(node("x")), "invalid_event")):
            status, refused = await running.request("/v1/dry-run", wrong)
            assert (status, refused["code"]) == (400, code), (wrong, refused)
            jsonschema.validate(refused, schema_of("Error"))
        many = events_body(*(job(f"m{i}") for i in range(1001)))
        status, refused = await running.request("/v1/dry-run", many)
        assert (status, refused["code"]) == (413, "too_many_events")
        assert await running.inputs_end() == before[0]


async def test_the_real_submission_goes_where_the_dry_run_said(tmp_path: Path) -> None:
    async with serving(tmp_path / "log") as running:
        await settled(running, fleet())
        asked = [job("r1", gpus=2, tasks=2), tolerating("r2", 3), job("r3", gpus=8)]
        said = (await running.request("/v1/dry-run", events_body(*asked)))[1]["items"]
        assert [item["outcome"] for item in said] == ["placed", "placed", "waits"]
        await settled(running, asked)
        state = running.service.loop.state if running.service.loop else None
        assert state is not None
        for item in said[:2]:
            row = state.job_row(item["job_id"])
            got = []
            for t in state.job_tasks(row):
                mask = int(state.tasks.cols["gpu_mask"][t])
                node = state.node_name(int(state.tasks.cols["node"][t]))
                got.append([node, [i for i in range(64) if mask >> i & 1]])
            assert got == [[t["node"], t["gpu_indices"]] for t in item["tasks"]], (item, got)
        status, r3 = await running.request("/v1/jobs/r3")
        assert status == 200
        assert (r3["state"], r3["pending_reason"], r3["pending_message"]) == (
            "pending", said[2]["reason"], said[2]["message"])


async def test_replay_serve_answers_what_the_service_answered(tmp_path: Path) -> None:
    log = tmp_path / "log"
    asked = events_body(job("d1", gpus=4), job("d2", gpus=8), tolerating("d4", 8))
    async with serving(log) as running:
        await settled(running, fleet())
        live = (await running.request("/v1/dry-run", asked))[1]
        offset = await running.inputs_end()
        await settled(running, [job("j2", gpus=4)])  # later: a1 is full
        later = (await running.request("/v1/dry-run", asked))[1]
    assert live["items"] != later["items"]
    source = await open_shard(log, Shard.SINGLE, None, True)
    server = HttpServer(LogApi(source).handle)
    await server.start()
    try:
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{server.port}/v1/dry-run"
            async with session.post(url, data=asked, params={"at": str(offset)}) as r:
                assert (r.status, r.headers["Fleetlog-Offset"]) == (200, str(offset))
                assert await r.json() == live
            async with session.post(url, data=asked) as r:
                assert await r.json() == later
            async with session.get(url) as r:
                assert r.status == 405
    finally:
        await server.stop()
        await source.close()


async def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], str]:
    """``fleetlog ARGV`` beside the in-process service: (exit code, stdout lines, stderr)."""
    capsys.readouterr()
    code = await asyncio.to_thread(main, list(argv))
    out, err = capsys.readouterr()
    return code, [line for line in out.splitlines() if not line.startswith('{"event": "')], err


async def test_the_cli_with_and_without_the_service(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "log"
    fits = ("submit", "d1", "--tenant", "t1", "--gpus", "4", "--log", str(log), "--dry-run")
    waits = ("submit", "d2", "--tenant", "t1", "--gpus", "8", "--log", str(log), "--dry-run")
    async with serving(log) as running:
        await settled(running, fleet())
        end = await running.inputs_end()
        code, lines, _ = await cli(capsys, *fits)  # the service the file log announces answers
        assert code == 0
        assert lines[-1].startswith("job d1 would be placed in cell c1 on a1 (GPUs "), lines
        code, lines, _ = await cli(capsys, *waits, "--json")
        live = json.loads(lines[-1])
        assert (code, live["job_id"], live["outcome"]) == (1, "d2", "waits")
        code, lines, _ = await cli(capsys, *waits, "--url", running.url)
        assert code == 1
        assert lines[-1].startswith(f"job d2 would wait: {live['reason']}: "), lines
        assert await running.inputs_end() == end
    assert not (log / "service.json").exists()
    code, lines, _ = await cli(capsys, *waits, "--json")  # no service: the logs folded to their end
    assert (code, json.loads(lines[-1])) == (1, live)
    code, lines, _ = await cli(capsys, *fits)
    assert code == 0
    assert "on a1 (GPUs " in lines[-1]
    code, lines, _ = await cli(capsys, "submit", "j1", "--tenant", "t1", "--gpus", "4", "--log", str(log),
                               "--dry-run")
    assert code == 1
    assert lines[-1].startswith("job j1 would not be submitted again (already_submitted)")
    async with serving(log) as running:
        assert await running.inputs_end() == end  # nothing was appended, with or without the service


async def test_wait_follows_the_job_to_running(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "log"
    async with serving(log) as running:
        await settled(running, fleet())
        waiting = asyncio.create_task(cli(capsys, "submit", "w1", "--tenant", "t1", "--gpus", "2", "--log",
                                          str(log), "--wait", "--timeout", "60", "--json"))
        loop = running.service.loop
        assert loop is not None
        await running.until(lambda: (loop.state.job_row("w1") >= 0
                                     and int(loop.state.jobs.cols["state"][loop.state.job_row("w1")]) == 1))
        status, _ = await running.request("/v1/events", events_body(TaskStarted(job_id="w1", task_index=0,
                                                                                node="a1")))
        assert status == 200
        code, lines, _ = await asyncio.wait_for(waiting, 60)
    assert code == 0
    changes = [json.loads(line) for line in lines if line.startswith('{"at"')]
    assert (changes[-1]["state"], changes[-1]["tasks_started"]) == ("running", 1)
    assert "placed" in [c["state"] for c in changes]
    assert all(c["job_id"] == "w1" and c["at"].endswith("Z") for c in changes)


async def test_wait_for_ended_exits_1_when_the_job_failed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "log"
    async with serving(log) as running:
        await settled(running, fleet())
        waiting = asyncio.create_task(cli(capsys, "submit", "w3", "--tenant", "t1", "--gpus", "1", "--log",
                                          str(log), "--wait", "--wait-for", "ended", "--timeout", "60"))
        loop = running.service.loop
        assert loop is not None
        await running.until(lambda: (loop.state.job_row("w3") >= 0
                                     and int(loop.state.jobs.cols["state"][loop.state.job_row("w3")]) == 1))
        status, _ = await running.request("/v1/events", events_body(
            TaskStarted(job_id="w3", task_index=0, node="a1"),
            TaskFailed(job_id="w3", task_index=0, reason="oom")))
        assert status == 200
        code, lines, _ = await asyncio.wait_for(waiting, 60)
    assert code == 1
    assert [line.split()[3] for line in lines if " job w3 " in line][-1] == "failed", lines


async def test_wait_times_out_with_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "log"
    async with serving(log) as running:
        await settled(running, fleet())
        code, lines, err = await cli(capsys, "submit", "w2", "--tenant", "t1", "--gpus", "8", "--log",
                                     str(log), "--wait", "--wait-for", "placed", "--timeout", "1")
    assert code == 1
    assert any(" job w2 pending (" in line for line in lines), lines
    assert err.strip().startswith("fleetlog submit: timed out after 1 s waiting for placed: w2 pending")
    assert len(err.strip().splitlines()) == 1


async def test_usage_errors_exit_2_and_append_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "log"
    async with serving(log) as running:
        await settled(running, fleet())
        end = await running.inputs_end()
    base = ("submit", "u1", "--tenant", "t1", "--log", str(log))
    for extra, says in ((("--wait",), "--wait follows the job through the running service"),
                        (("--dry-run", "--wait"), "not both"), (("--timeout", "5"), "goes with --wait"),
                        (("--wait-for", "ended"), "goes with --wait"),
                        (("--wait", "--timeout", "0"), "positive"),
                        (("--url", "http://127.0.0.1:9"), "--url goes with"),
                        (("--dry-run", "--url", "http://127.0.0.1:9"), "cannot reach")):
        try:
            code = main([*base, *extra])
        except SystemExit as exc:
            code = int(exc.code or 0)
        err = capsys.readouterr().err
        assert code == 2, (extra, err)
        assert says in err, (extra, err)
        assert len(err.strip().splitlines()) == 1, (extra, err)
    async with serving(log) as running:
        assert await running.inputs_end() == end
    code = await asyncio.to_thread(main, ["replay", "serve", "--log", str(log), "--policy", "nope"])
    err = capsys.readouterr().err
    assert code == 2
    assert "--policy" in err, err
    assert len(err.strip().splitlines()) == 1, err
