"""``fleetlog jobs | nodes | queues | tenants | cells``: the same answer from the running
service's API and from the logs once it stopped; ``-o json`` valid against the OpenAPI schema;
tables for people; a bad address or filter is one line and exit code 2."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import jsonschema
import msgspec
import pytest

from fleetlog.api.routes import openapi
from fleetlog.cli import main
from fleetlog.events.model import Taint
from fleetlog.reads_cli import LISTINGS, collect, node_text, sorted_items
from fleetlog.reads_watch import changed
from tests.core.builders import job, node
from tests.service.test_service import events_body, serving

SCHEMAS = {"jobs": "JobPage", "nodes": "NodePage", "queues": "QueueList", "tenants": "TenantList",
           "cells": "CellList"}


def schema_of(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}", "components": openapi()["components"]}


def events() -> list[Any]:
    fleet: list[Any] = [node("a1", gpus=8, cell="c1"), node("a2", gpus=8, cell="c2")]
    work = [job(f"j{i}", tenant=f"t{i % 3}", gpus=4) for i in range(9)]
    return [*fleet, *work, msgspec.structs.replace(job("q", gpus=1), queue="batch")]


async def listed_live(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    """As :func:`listed`, beside the in-process service (whose loop must go on answering)."""
    capsys.readouterr()
    assert await asyncio.to_thread(main, list(argv)) == 0
    (line,) = [out for out in capsys.readouterr().out.splitlines() if out.startswith(('{"items"', '{"node"'))]
    return json.loads(line)  # (the service beside it logs to stdout too)


async def test_the_service_and_the_logs_answer_alike(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "log"
    live: dict[str, Any] = {}
    async with serving(log) as running:
        body = events()
        assert (await running.request("/v1/events", events_body(*body)))[0] == 200
        loop = running.service.loop
        assert loop is not None
        await running.until(lambda: loop.offset == len(body) and loop.committed == len(body))
        for name in LISTINGS:  # through the API the file log announces (service.json)
            live[name] = await listed_live(capsys, name, "--log", str(log), "-o", "json")
            jsonschema.validate(live[name], schema_of(SCHEMAS[name]))
        via_url = await listed_live(
            capsys, "jobs", "--url", running.url, "--json", "--tenant", "t1", "--limit", "2")
    assert not (log / "service.json").exists()
    for name in LISTINGS:  # the service stopped: the same, folded from the logs
        assert await listed_live(capsys, name, "--log", str(log), "-o", "json") == live[name], name
    jobs = live["jobs"]
    assert jobs["total"] == 10
    assert sum(j["state"] == "placed" for j in jobs["items"]) == 4  # two four-GPU jobs a node; q waits
    assert [j["job_id"] for j in via_url["items"]] == ["j1", "j4"]
    assert (via_url["total"], via_url["next_page_token"] is not None) == (4, True)  # j1, j4, j7, q
    from_logs = await listed_live(
        capsys, "jobs", "--log", str(log), "--json", "--tenant", "t1", "--limit", "2")
    assert from_logs == via_url


async def test_tables_and_yaml_for_people(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "log"
    async with serving(log) as running:
        body = events()
        assert (await running.request("/v1/events", events_body(*body)))[0] == 200
        loop = running.service.loop
        assert loop is not None
        await running.until(lambda: loop.offset == len(body) and loop.committed == len(body))
    capsys.readouterr()
    assert await asyncio.to_thread(main, ["jobs", "--log", str(log), "--state", "pending"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["JOB_ID", "STATE", "TENANT", "QUEUE", "PRIORITY", "TASKS", "GPUS", "NODE",
                                "CELL", "REASON", "POS", "AGE"]  # (gpu_milli shown in GPUs)
    assert {line.split()[6] for line in lines[1:]} == {"1", "4"}  # four-GPU jobs (4000 milli in the API), q
    assert len(lines) == 1 + 6  # five four-GPU jobs and q wait
    assert all(" pending " in line for line in lines[1:])
    positions = {line.split()[0]: int(line.split()[-2]) for line in lines[1:]}
    assert positions["q"] == 1  # alone in queue batch; the others in decide's turns (t0..t2 alike)
    assert sorted(p for j, p in positions.items() if j != "q") == [1, 2, 3, 4, 5]
    assert await asyncio.to_thread(main, ["nodes", "--log", str(log), "-o", "wide"]) == 0
    wide = capsys.readouterr().out.splitlines()
    assert "LAST_HEARTBEAT" in wide[0].split()
    assert len(wide) == 3
    assert await asyncio.to_thread(main, ["tenants", "--log", str(log), "-o", "yaml"]) == 0
    import yaml

    tenants = yaml.safe_load(capsys.readouterr().out)
    assert [t["tenant"] for t in tenants["items"]] == ["t0", "t1", "t2"]


def test_an_unreachable_url_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["jobs", "--url", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fleetlog jobs: ")
    assert "cannot read http://127.0.0.1:9/v1/jobs" in err
    assert len(err.strip().splitlines()) == 1


def test_collect_pages_until_the_limit_and_keeps_the_token() -> None:
    rows = [{"n": i} for i in range(23)]
    asked: list[dict[str, list[str]]] = []

    def fetch(query: dict[str, list[str]]) -> dict[str, Any]:
        asked.append(query)
        start, limit = int(query.get("page_token", ["0"])[0]), min(5, int(query.get("limit", ["5"])[0]))
        end = min(start + limit, len(rows))
        token = str(end) if end < len(rows) else None
        return {"items": rows[start:end], "total": len(rows), "next_page_token": token}

    assert collect(fetch, {}) == {"items": rows, "total": 23, "next_page_token": None}
    assert len(asked) == 5
    cut = collect(fetch, {"state": ["pending"]}, limit=7)
    assert (cut["items"], cut["next_page_token"]) == (rows[:7], "7")
    assert asked[-1] == {"state": ["pending"], "page_token": ["5"], "limit": ["2"]}
    assert collect(lambda q: {"items": [1, 2]}, {}) == {"items": [1, 2]}  # an unpaged list


async def test_watch_prints_each_job_that_changes_until_ctrl_c(tmp_path: Path) -> None:
    import os
    import signal
    import sys

    from tests.service.process import REPO

    async with serving(tmp_path / "log") as running:
        assert (await running.request("/v1/events", events_body(job("old", gpus=1))))[0] == 200
        loop = running.service.loop
        assert loop is not None
        await running.until(lambda: loop.offset == 1 and loop.committed == 1)
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "fleetlog.cli", "jobs", "--url", running.url, "--watch", "-o", "json",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env=dict(os.environ, PYTHONPATH=str(REPO)))
        assert child.stdout is not None
        assert child.stderr is not None

        async def next_item() -> dict[str, Any]:
            item: dict[str, Any] = json.loads(await asyncio.wait_for(child.stdout.readline(), 60))
            return item

        try:
            assert (await next_item())["job_id"] == "old"  # the list first
            await asyncio.sleep(2)  # the watches are on
            assert (await running.request("/v1/events", events_body(job("new", gpus=1))))[0] == 200
            assert ((await next_item())["job_id"], "pending") == ("new", "pending")
            assert (await running.request("/v1/events", events_body(node("n1", gpus=8))))[0] == 200
            placed = {(await next_item())["job_id"] for _ in range(2)}  # both get placed: both change
            assert placed == {"old", "new"}
            child.send_signal(signal.SIGINT)
            await asyncio.wait_for(child.wait(), 60)
            assert child.returncode == 130
            assert (await child.stderr.read()).decode() == "fleetlog jobs: interrupted\n"
        finally:
            if child.returncode is None:
                child.kill()
                await child.wait()


def test_watch_needs_the_running_service(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["jobs", "--watch", "--log", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--watch follows the running service" in err
    assert len(err.strip().splitlines()) == 1


def described(out: str) -> dict[str, str]:
    """``fleetlog nodes NAME``'s lines (``label  value``) by label (a job's line: ``job ID``)."""
    return {k: v.strip() for k, _, v in (line.partition("  ") for line in out.splitlines())}


async def test_jobs_show_their_node_and_age_filter_by_node_and_sort(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "log"
    labelled = msgspec.structs.replace(node("a1", gpus=8, cell="c1", rack="r4"), labels={"zone": "west"},
                                       taints=(Taint(key="gpu", value="h100", effect="PreferNoSchedule"),))
    async with serving(log) as running:
        body = [labelled, node("a2", gpus=8, cell="c2"),
                *(job(f"j{i}", tenant=f"t{i % 3}", gpus=2 + 2 * (i % 2), priority=i % 4) for i in range(6))]
        assert (await running.request("/v1/events", events_body(*body)))[0] == 200
        loop = running.service.loop
        assert loop is not None
        await running.until(lambda: loop.offset == len(body) and loop.committed == len(body))
        live = await listed_live(capsys, "nodes", "a1", "--url", running.url, "-o", "json")
    every = await listed_live(capsys, "jobs", "--log", str(log), "-o", "json")
    on_a1 = [j["job_id"] for j in every["items"] if j.get("nodes") == ["a1"]]
    assert on_a1
    assert [j["job_id"] for j in (await listed_live(capsys, "jobs", "--log", str(log), "--node", "a1",
                                                     "-o", "json"))["items"]] == on_a1
    for key, field in (("tenant", "tenant"), ("gpus", "gpu_milli"), ("-priority", "priority")):
        ordered = await listed_live(capsys, "jobs", "--log", str(log), f"--sort-by={key}", "-o", "json")
        values = [j[field] for j in ordered["items"]]
        assert values == sorted(values, reverse=key.startswith("-")), key
        assert sorted(j["job_id"] for j in ordered["items"]) == sorted(j["job_id"] for j in every["items"])
    top = await listed_live(capsys, "jobs", "--log", str(log), "--sort-by=-priority", "--limit=2", "--json")
    assert ([j["job_id"] for j in top["items"]], top["total"]) == (["j3", "j2"], 6)  # sorted all, then cut
    by_age = await listed_live(capsys, "jobs", "--log", str(log), "--sort-by=-age", "-o", "json")
    ages = [j["age_ms"] for j in by_age["items"]]
    assert ages == sorted((j["age_ms"] for j in every["items"]), reverse=True)
    with pytest.raises(SystemExit) as usage:  # (argparse's usage error)
        await asyncio.to_thread(main, ["jobs", "--log", str(log), "--sort-by", "colour"])
    assert usage.value.code == 2
    err = capsys.readouterr().err
    assert "'colour': sort by one of age, priority, gpus" in err
    assert await asyncio.to_thread(main, ["jobs", "--log", str(log), "--node", "a1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[7] == "NODE"
    assert lines[0].split()[-1] == "AGE"
    assert {line.split()[7] for line in lines[1:]} == {"a1"}
    assert await asyncio.to_thread(main, ["nodes", "--log", str(log), "-o", "wide"]) == 0
    wide = capsys.readouterr().out.splitlines()
    assert {"LABELS", "TAINTS", "TOPOLOGY"} <= set(wide[0].split())
    assert "zone=west" in wide[1]
    assert "gpu=h100:PreferNoSchedule" in wide[1]
    assert "b1/r4/a1" in wide[1]
    assert await listed_live(capsys, "nodes", "a1", "--log", str(log), "-o", "json") == live  # logs = API
    assert [j["job_id"] for j in live["jobs"]] == on_a1
    assert await asyncio.to_thread(main, ["nodes", "a1", "--log", str(log)]) == 0
    facts = described(capsys.readouterr().out)
    assert (facts["node"], facts["labels"], facts["taints"], facts["topology"]) == (
        "a1", "zone=west", "gpu=h100:PreferNoSchedule", "b1/r4/a1")
    assert facts["jobs"] == str(len(on_a1))
    assert facts[f"job {on_a1[0]}"].startswith("tenant ")
    assert await asyncio.to_thread(main, ["nodes", "nope", "--log", str(log)]) == 2
    assert "no node 'nope'" in capsys.readouterr().err
    for name in ("tenants", "queues"):  # (nothing started: every job holding a node is placed, none running)
        assert await asyncio.to_thread(main, [name, "--log", str(log), "-o", "json"]) == 0
        items = json.loads(capsys.readouterr().out)["items"]
        assert sum(i["placed"] for i in items) == sum(j["state"] == "placed" for j in every["items"]) > 0
        assert sum(i["running"] for i in items) == 0
        assert await asyncio.to_thread(main, [name, "--log", str(log)]) == 0
        assert {"RUNNING", "PLACED", "PLACED_LONGEST"} <= set(capsys.readouterr().out.splitlines()[0].split())


def test_a_gangs_node_cell_names_its_first_node_and_how_many_more() -> None:
    assert (node_text([]), node_text(["n1"]), node_text(["n1", "n2", "n3", "n4"])) == ("", "n1", "n1 +3")


def test_sort_by_keeps_ties_in_submission_order_puts_the_fieldless_last_and_cuts_after() -> None:
    jobs = [{"job_id": "a", "gpu_milli": 2000, "nodes": ["n2"]}, {"job_id": "b", "gpu_milli": 1000},
            {"job_id": "c", "gpu_milli": 2000, "nodes": ["n1", "n3"]}, {"job_id": "d", "gpu_milli": 500}]
    found = {"items": jobs, "total": 9, "next_page_token": "4"}
    ids = [j["job_id"] for j in sorted_items(found, "gpus", None)["items"]]
    assert ids == ["d", "b", "a", "c"]  # (a before c: equal, in submission order)
    assert [j["job_id"] for j in sorted_items(found, "-gpus", None)["items"]] == ["a", "c", "b", "d"]
    by_node = sorted_items(found, "node", None)["items"]
    assert [j["job_id"] for j in by_node] == ["c", "a", "b", "d"]  # ("n1 +1" < "n2"; no node: last)
    assert [j["job_id"] for j in sorted_items(found, "-node", None)["items"]] == ["a", "c", "b", "d"]
    cut = sorted_items(found, "-gpus", 2)
    assert ([j["job_id"] for j in cut["items"]], cut["total"]) == (["a", "c"], 9)


def test_sort_by_and_a_node_name_refuse_watch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["jobs", "--sort-by", "age", "--watch", "--log", str(tmp_path)]) == 2
    assert "--sort-by sorts one listing" in capsys.readouterr().err
    assert main(["nodes", "n1", "--watch", "--log", str(tmp_path)]) == 2
    assert "not with a NODE name" in capsys.readouterr().err


def test_watch_does_not_reprint_an_item_only_older_by_log_time() -> None:
    seen: dict[str, Any] = {}
    first = [{"job_id": "j1", "state": "placed", "age_ms": 1000}, {"tenant": "t1", "placed": 1,
                                                                   "placed_longest_ms": 500}]
    assert changed(seen, first) == first
    older = [{"job_id": "j1", "state": "placed", "age_ms": 6000}, {"tenant": "t1", "placed": 1,
                                                                   "placed_longest_ms": 5500}]
    assert changed(seen, older) == []
    started = [{"job_id": "j1", "state": "running", "age_ms": 7000}]
    assert changed(seen, started) == started
