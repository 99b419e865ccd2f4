"""``fleetlog quota set|get`` and ``fleetlog node add|drain|undrain|remove`` (docs/cli.md):
through the running service the file log announces, and on the logs alone; a drain holds against
the backend's heartbeats; an unknown node or tenant is one line and exit code 2."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from fleetlog.cli import main
from fleetlog.events import NodeDrained, NodeRemoved, QuotaSet, Resources
from fleetlog.events.codec import decode
from fleetlog.log.base import INPUTS
from fleetlog.log.file import FileLogStore
from tests.core.builders import job, node
from tests.service.test_reads_cli import listed_live
from tests.service.test_service import events_body, serving


def _main(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # (argparse's own errors: one line too)
        return int(str(exc.code))


async def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = await asyncio.to_thread(_main, list(argv))
    found = capsys.readouterr()
    return code, found.out, found.err


async def _inputs(log: Path) -> list[Any]:
    async with FileLogStore(log) as store:
        return [decode(record.value).event for record in await store.log(INPUTS).read(0, 1000)]


async def test_node_add_drain_undrain_remove_through_the_service(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "log"
    async with serving(log) as running:
        loop = running.service.loop
        assert loop is not None
        code, out, err = await _run(capsys, "node", "add", "n1", "--cell", "c1", "--cpu-milli", "64000",
                                    "--mem-mib", "262144", "--gpus", "8", "--gpu-model", "A100",
                                    "--label", "zone=a", "--taint", "maint=soon:PreferNoSchedule",
                                    "--log", str(log))
        assert code == 0, err
        assert "NodeHeartbeat n1" in out
        await running.until(lambda: loop.offset == 1)
        code, out, err = await _run(capsys, "node", "drain", "n1", "--reason", "disk swap", "--log", str(log))
        assert code == 0, err
        assert "NodeDrained n1" in out
        assert (await running.request("/v1/events", events_body(node("n1", gpus=8, cell="c1"),
                                                                 job("j", gpus=1))))[0] == 200
        await running.until(lambda: loop.offset == 4 and loop.committed == 4)
        nodes = await listed_live(capsys, "nodes", "--log", str(log), "-o", "json")
        (n1,) = nodes["items"]
        assert (n1["cell"], n1["cordoned"], n1["drained"]) == ("c1", True, "disk swap")
        jobs = await listed_live(capsys, "jobs", "--log", str(log), "-o", "json")
        assert [(j["state"], j["reason"]) for j in jobs["items"]] == [("pending", "no_eligible_nodes")]
        code, out, err = await _run(capsys, "node", "undrain", "n1", "--log", str(log))
        assert code == 0, err
        assert "undrain n1: NodeDrained drained=false" in out  # not "NodeDrained n1": that read as a drain
        await running.until(lambda: loop.offset == 5)
        await running.until(lambda: loop.state.jobs.cols["placed_at_ms"][loop.state.job_row("j")] >= 0)
        code, _, err = await _run(capsys, "node", "remove", "n1", "--cell", "c1", "--log", str(log))
        assert code == 0, err
        await running.until(lambda: loop.offset == 6)
        nodes = await listed_live(capsys, "nodes", "--log", str(log), "-o", "json")
        assert [(n["status"], n["drained"]) for n in nodes["items"]] == [("removed", None)]
    events = await _inputs(log)
    assert [type(e).__name__ for e in events] == ["NodeHeartbeat", "NodeDrained", "NodeHeartbeat",
                                                  "JobSubmitted", "NodeDrained", "NodeRemoved"]
    assert events[1] == NodeDrained(cell="c1", node="n1", drained=True, reason="disk swap")
    assert events[4] == NodeDrained(cell="c1", node="n1", drained=False)
    assert events[5] == NodeRemoved(cell="c1", node="n1")
    assert dict(events[0].labels) == {"zone": "a"}
    assert events[0].taints[0].effect == "PreferNoSchedule"


async def test_node_commands_name_what_is_wrong(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "log"
    async with serving(log) as running:
        body = [node("n1", cell="c1"), node("n1", cell="c2"), node("n2", cell="c1")]
        assert (await running.request("/v1/events", events_body(*body)))[0] == 200
        loop = running.service.loop
        assert loop is not None
        await running.until(lambda: loop.offset == 3)
        for argv, message in (
            (["node", "drain", "ghost"], "no node 'ghost' (fleetlog nodes lists them)"),
            (["node", "drain", "n2", "--cell", "c2"], "no node 'n2' in cell 'c2'"),
            (["node", "remove", "n1"], "node 'n1' is in cells c1, c2: give --cell"),
            (["node", "add", "n9", "--cell", "c1", "--cpu-milli", "1", "--mem-mib", "1", "--gpus", "2"],
             "a node with GPUs must name its gpu_model"),
            (["node", "add", "n9", "--cell", "c1", "--cpu-milli", "1", "--mem-mib", "1", "--taint", "k=v"],
             "--taint 'k=v': KEY[=VALUE]:EFFECT"),
        ):
            code, _, err = await _run(capsys, *argv, "--log", str(log))
            assert code == 2, argv
            assert len(err.strip().splitlines()) == 1, (argv, err)
            assert message in err, (argv, err)
        assert loop.offset == 3  # (nothing appended)
        code, _, err = await _run(capsys, "node", "drain", "n1", "--cell", "c2", "--log", str(log))
        assert code == 0, err
        await running.until(lambda: loop.offset == 4)
        assert sorted(loop.state.drained.values()) == [("", False)]
        assert loop.state.node_row("c2", "n1") in loop.state.drained


async def test_quota_set_and_get_through_the_service_and_from_the_logs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "log"
    async with serving(log) as running:
        loop = running.service.loop
        assert loop is not None
        code, out, err = await _run(capsys, "quota", "set", "team-a", "--gpu-milli", "16000", "--cpu-milli",
                                    "64000", "--mem-mib", "1024", "--borrow-gpu-milli", "8000",
                                    "--cohort", "research", "--weight-milli", "2000", "--log", str(log))
        assert code == 0, err
        assert "QuotaSet team-a" in out
        await running.until(lambda: loop.offset == 1)
        live = await listed_live(capsys, "quota", "get", "team-a", "--log", str(log), "-o", "json")
        code, out, err = await _run(capsys, "quota", "get", "--log", str(log))
        assert code == 0, err
        assert "team-a" in out
        assert "research" in out
        code, out, err = await _run(capsys, "quota", "get", "team-z", "--log", str(log))
        assert code == 2
        assert err.strip() == "fleetlog quota: error: no tenant 'team-z' (no quota and no job)"
    (item,) = live["items"]
    assert item["nominal"] == {"cpu_milli": 64000, "mem_mib": 1024, "gpu_milli": 16000}
    assert item["borrowing_limit"] == {"cpu_milli": 0, "mem_mib": 0, "gpu_milli": 8000}
    assert (item["cohort"], item["weight_milli"]) == ("research", 2000)
    assert await listed_live(capsys, "quota", "get", "team-a", "--log", str(log), "-o", "json") == live
    (event,) = await _inputs(log)
    assert event == QuotaSet(tenant="team-a", nominal=Resources(64000, 1024, 16000), cohort="research",
                             borrowing_limit=Resources(0, 0, 8000), weight_milli=2000)
    code, _, err = await _run(capsys, "quota", "set", "team-a", "--gpu-milli", "-1", "--log", str(log))
    assert code == 2
    assert "not a non-negative integer" in err
    code, _, err = await _run(capsys, "quota", "set", "team-b", "--gpus", "2", "--log", str(log))
    assert code == 2
    assert "unrecognized arguments: --gpus" in err


def test_quota_get_without_a_log_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["quota", "get", "--log", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
