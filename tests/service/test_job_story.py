"""``GET /v1/jobs/{job_id}`` of a running service: the fields ``fleetlog status`` reads, the job's
story (submitted, placed where, preempted by whom, its tasks, how it ended, or why it waits — the
constraint exclusions included), its queue position, labels and annotations; ``GET /v1/jobs``
filtered by label (and ``fleetlog jobs --label``), a malformed label a 400 naming the field; every
answer valid against the route's OpenAPI schema."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

import jsonschema
import msgspec
import pytest

from fleetlog.api.routes import openapi
from fleetlog.cli import main
from fleetlog.events import JobCancelled, TaskFinished, TaskStarted
from fleetlog.events.model import Taint
from tests.core.builders import job, node
from tests.service.test_service import Running, events_body, serving


def schema_of(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}", "components": openapi()["components"]}


async def send(running: Running, *events: Any) -> None:
    """Append ``events`` and wait until they and the decisions on them are folded."""
    loop = running.service.loop
    assert loop is not None
    want = loop.offset + len(events)
    assert (await running.request("/v1/events", events_body(*events)))[0] == 200
    await running.until(lambda: loop.offset == want and loop.committed == want)


async def detail(running: Running, job_id: str) -> dict[str, Any]:
    status, found = await running.request(f"/v1/jobs/{quote(job_id)}")
    assert status == 200, found
    jsonschema.validate(found, schema_of("JobDetail"))
    return found


def whats(found: dict[str, Any]) -> list[str]:
    return [step["what"] for step in found["story"]]


async def test_a_jobs_story_from_submission_through_preemption_to_its_end(tmp_path: Path) -> None:
    async with serving(tmp_path / "log") as running:
        await send(running, node("n1", gpus=8), job("low", gpus=8))
        await send(running, job("high", gpus=8, priority=5))  # preempts low
        low, high = await detail(running, "low"), await detail(running, "high")
        assert whats(low) == ["submitted", "placed", "preempted", "waiting"]
        said = "tenant t1, queue default, priority 0: 1 task(s), 8000 GPU milli in all"
        assert low["story"][0] == {"what": "submitted", "at_ms": low["submitted_at_ms"], "inputs_offset": 1,
                                   "detail": said}
        assert "preempted by job high (priority)" in low["story"][2]["detail"]
        assert low["story"][2]["at_ms"] == low["requeued"]["requeued_at_ms"]
        assert low["story"][-1]["detail"] == f"{low['pending_reason']}: {low['pending_message']}"
        assert (low["queue_position"], "placed_at_ms" in low) == (1, False)  # (status's fields, as before)
        assert whats(high) == ["submitted", "placed", "tasks"]
        assert high["story"][1]["detail"] == "cell c1: 0->n1"
        assert high["story"][1]["at_ms"] == high["placed_at_ms"]
        assert high["story"][2]["detail"] == "0 of 1 started, 0 finished"
        assert "queue_position" not in high
        await send(running, TaskStarted(job_id="high", task_index=0, node="n1"))
        assert (await detail(running, "high"))["story"][-1]["detail"] == "1 of 1 started, 0 finished"
        await send(running, TaskFinished(job_id="high", task_index=0, exit_code=0))
        low, high = await detail(running, "low"), await detail(running, "high")
        assert whats(high) == ["submitted", "placed", "succeeded"]
        assert high["story"][-1]["detail"] == "all 1 task(s) exited 0"
        assert high["story"][-1]["at_ms"] >= high["placed_at_ms"]
        assert whats(low) == ["submitted", "preempted", "placed", "tasks"]  # placed again, once high ended
        assert low["story"][1]["detail"].startswith("priority: ")
        await send(running, TaskFinished(job_id="low", task_index=0, exit_code=3))
        assert whats(await detail(running, "low"))[-1] == "failed"


async def test_a_waiting_jobs_story_says_which_constraints_exclude_the_nodes(tmp_path: Path) -> None:
    tainted = [msgspec.structs.replace(node(f"n{i}", gpus=8), taints=(Taint("gpu", "NoSchedule", "maint"),))
               for i in range(3)]
    async with serving(tmp_path / "log") as running:
        await send(running, *tainted, job("w", gpus=1))
        found = await detail(running, "w")
        assert found["pending_reason"] == "no_eligible_nodes"
        assert whats(found) == ["submitted", "waiting"]
        said = found["story"][-1]["detail"]
        assert said.startswith("no_eligible_nodes: 0/3 up nodes")
        assert "3 " in said, said
        assert "taint" in said, said


async def test_a_job_requeued_by_its_node_and_one_cancelled(tmp_path: Path) -> None:
    async with serving(tmp_path / "log") as running:
        await send(running, node("n1", gpus=8), job("r", gpus=8), job("x", gpus=8))
        await send(running, msgspec.structs.replace(node("n1", gpus=8), healthy=False))
        found = await detail(running, "r")
        assert whats(found) == ["submitted", "placed", "requeued", "waiting"]
        requeued = found["story"][2]
        assert requeued["detail"].startswith("node_unhealthy: ")
        assert (requeued["at_ms"], requeued["inputs_offset"]) == (
            found["requeued"]["requeued_at_ms"], found["requeued"]["inputs_offset"])
        assert found["story"][1]["detail"] == ""  # (the nodes it had are history once requeued)
        await send(running, JobCancelled(job_id="x"))
        cancelled = await detail(running, "x")
        assert whats(cancelled) == ["submitted", "cancelled"]
        assert cancelled["story"][-1]["at_ms"] >= cancelled["submitted_at_ms"]


async def test_labels_and_annotations_shown_and_filtered(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    labelled = [
        msgspec.structs.replace(job("a", gpus=0), labels={"team": "vision", "app": "x"},
                                annotations={"owner": "Ada <ada@example.org>"}),
        msgspec.structs.replace(job("b", gpus=0), labels={"team": "vision"}),
        msgspec.structs.replace(job("c", gpus=0), annotations={"note": "two\nlines"}),
        job("d", gpus=0),
    ]
    async with serving(tmp_path / "log") as running:
        await send(running, node("n1"), *labelled)
        status, page = await running.request("/v1/jobs")
        assert status == 200
        jsonschema.validate(page, schema_of("JobPage"))
        items = {i["job_id"]: i for i in page["items"]}
        assert items["a"]["labels"] == {"team": "vision", "app": "x"}
        assert items["c"]["annotations"] == {"note": "two\nlines"}
        assert "labels" not in items["d"]  # (none: left out)
        assert "annotations" not in items["d"]
        assert (await detail(running, "d"))["labels"] == {}
        assert (await detail(running, "a"))["annotations"] == {"owner": "Ada <ada@example.org>"}
        for query, want in (("label=team=vision", ["a", "b"]), ("label=team=vision&label=app=x", ["a"]),
                            ("label=team=", []), ("label=nobody=here", [])):
            status, page = await running.request(f"/v1/jobs?{query}")
            assert (status, [i["job_id"] for i in page["items"]]) == (200, want), query
        for bad in ("team", "=vision"):
            status, answer = await running.request(f"/v1/jobs?label={quote(bad)}")
            assert (status, answer["code"], answer["field"]) == (400, "invalid_value", "label")
        capsys.readouterr()
        argv = ["jobs", "--url", running.url, "--label", "team=vision", "--label", "app=x", "-o", "json"]
        assert await asyncio.to_thread(main, argv) == 0
        (line,) = [out for out in capsys.readouterr().out.splitlines() if out.startswith('{"items"')]
        assert [i["job_id"] for i in json.loads(line)["items"]] == ["a"]
        assert await asyncio.to_thread(main, ["jobs", "--url", running.url, "--label", "team"]) == 2
        err = capsys.readouterr().err
        assert "label" in err
        assert len(err.strip().splitlines()) == 1
    async with serving(tmp_path / "log") as running:  # restarted: from its snapshot and the tail
        assert (await detail(running, "a"))["labels"] == {"team": "vision", "app": "x"}
        status, page = await running.request("/v1/jobs?label=team=vision")
        assert [i["job_id"] for i in page["items"]] == ["a", "b"]
