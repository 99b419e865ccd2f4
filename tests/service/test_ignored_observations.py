"""Task reports for a job, task or node that does not exist are counted, logged once per producer
and reason, and shown (issue 47): the live loop over a real log store, the metric the service
feeds from the state, and the job's status and detail."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from fleetlog.api.detail import job_detail
from fleetlog.cli import main
from fleetlog.core.policy import Policy
from fleetlog.core.views import job_status, named_by_reports
from fleetlog.events import Event, JobPlaced, TaskFinished, TaskStarted, encode, envelope
from fleetlog.events.codec import CONTENT_TYPE_HEADER, MSGPACK
from fleetlog.log.base import DECISIONS, INPUTS, Message
from fleetlog.log.consumer import decision_batches
from fleetlog.log.file import FileLogStore
from fleetlog.log.memory import MemoryLogStore
from fleetlog.replay.verify import verify
from fleetlog.service.loop import LoopConfig, SchedulerLoop
from fleetlog.service.metrics import Metrics
from tests.core.builders import job, node
from tests.service.test_cellshard import Clock, FileShards, cell_nodes, dispatched, feed, make_loop
from tests.service.test_metrics import eventually, parse, series
from tests.service.test_service import serving


def sent(producer: str, *events: Event) -> list[Message]:
    return [Message(encode(envelope(e, producer))) for e in events]


async def step(loop: SchedulerLoop, messages: list[Message]) -> list[dict[str, object]]:
    """Append ``messages``, step once; the ``ignored_observation`` lines it logged."""
    await loop.store.log(INPUTS).append(messages)
    with capture_logs() as logs:
        await loop.step(timeout_ms=1000)
        loop.observed.flush()  # (what the service does after each step)
    return [line for line in logs if line["event"] == "ignored_observation"]


async def test_ignored_reports_are_counted_logged_once_per_producer_and_reason_and_shown() -> None:
    store = MemoryLogStore()
    await store.open()
    loop, metrics = SchedulerLoop(store, Policy(), LoopConfig(check_invariants=True)), Metrics()
    assert await step(loop, sent("setup", node("n0"), job("one"), job("wait", gpus=16))) == []
    placed = [d for _, b in decision_batches(await store.log(DECISIONS).read(0)) for d in b.decisions
              if isinstance(d, JobPlaced)]
    assert [p.job_id for p in placed] == ["one"]
    lines = await step(loop, sent(
        "agent-a",
        TaskStarted(job_id="ghost", task_index=0, node="n0"),  # unknown_job
        TaskStarted(job_id="ghost", task_index=1, node="n0"),  # the same again: no second line
        TaskStarted(job_id="one", task_index=5, node="n0"),  # unknown_task
        TaskStarted(job_id="wait", task_index=0, node="n0"),  # not_placed
        TaskStarted(job_id="one", task_index=0, node="nowhere"),  # applied, but unknown_node
        TaskFinished(job_id="one", task_index=0),  # applied
        TaskFinished(job_id="one", task_index=0),  # already_finished
    ))
    assert [(x["producer"], x["reason"], x["job_id"]) for x in lines] == [
        ("agent-a", "unknown_job", "ghost"), ("agent-a", "unknown_task", "one"),
        ("agent-a", "not_placed", "wait"), ("agent-a", "unknown_node", "one"),
        ("agent-a", "already_finished", "one")]
    assert lines[0]["inputs_offset"] == 3
    again = await step(loop, sent("agent-a", TaskStarted(job_id="ghost", task_index=0, node="n0"))
                       + sent("agent-b", TaskStarted(job_id="ghost", task_index=0, node="n0")))
    assert [(x["producer"], x["reason"]) for x in again] == [("agent-b", "unknown_job")]

    metrics.count_ignored("single", loop.state.observations.counts)
    metrics.count_ignored("single", loop.state.observations.counts)  # (fed after every step: no double count)
    counted = series(parse(metrics.exposition().decode()), "fleetlog_ignored_observations_total")
    assert counted == {("unknown_job",): 4.0, ("unknown_task",): 1.0, ("not_placed",): 1.0,
                       ("unknown_node",): 1.0, ("already_finished",): 1.0}

    status = job_status(loop.state, "one")
    assert status is not None
    assert [(o["ignored"], o["reason"]) for o in status["ignored_observations"]] == [
        ("TaskStarted", "unknown_task"), ("TaskStarted", "unknown_node"),
        ("TaskFinished", "already_finished")]
    detail = job_detail(loop.state, "wait")
    assert detail is not None
    assert [o.reason for o in detail.ignored_observations] == ["not_placed"]
    assert "4 task report(s) named it" in named_by_reports(loop.state, "ghost")
    assert (await verify(store)).ok  # replay folds the same records to the same digests


async def _record(directory: Path) -> None:
    store = FileLogStore(directory, fsync="never")
    await store.open()
    loop = SchedulerLoop(store, Policy(), LoopConfig())
    try:
        await step(loop, sent("setup", node("n0"), job("one")))
        await step(loop, sent("agent-a", TaskStarted(job_id="one", task_index=5, node="n0"),
                              TaskStarted(job_id="ghost", task_index=0, node="n0")))
    finally:
        await store.close()


def test_fleetlog_status_and_the_nodes_list_show_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    """From the file log the loop wrote: ``fleetlog status`` of the job (text and JSON), of a job
    never submitted (the error names the reports), and ``GET /v1/nodes`` of the node named."""
    asyncio.run(_record(tmp_path))
    capsys.readouterr()
    assert main(["status", "one", "--log", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert re.search(r"^ignored TaskStarted\s+reason unknown_task, job id one, task index 5, node n0, inputs "
                     r"offset 2", text, re.M), text
    assert main(["status", "one", "--log", str(tmp_path), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["ignored_observations"]
    assert [(o["reason"], o["task_index"]) for o in shown] == [("unknown_task", 5)]
    assert main(["status", "ghost", "--log", str(tmp_path)]) == 2
    assert "1 task report(s) named it" in capsys.readouterr().err
    assert main(["nodes", "--log", str(tmp_path), "-o", "json"]) == 0
    items = json.loads(capsys.readouterr().out)["items"]
    assert [(o["job_id"], o["reason"]) for o in items[0]["ignored_observations"]] == [
        ("one", "unknown_task"), ("ghost", "unknown_job")]


async def test_a_cell_shard_notes_them_alike(tmp_path: Path) -> None:
    """A cell shard of the global layer folds its partition's inputs through the same loop: the
    same reasons, one line per producer and reason (named by the record's envelope), the metric
    fed from its state under its own key (what ``CellRunner`` does after each step)."""
    clock = Clock()
    shards = FileShards(tmp_path / "log", clock)
    _, c0, _ = await shards.open()
    try:
        loop, metrics = make_loop(c0), Metrics()
        await feed(loop, clock, 1_000, *cell_nodes("a"), dispatched("j", "a", 1))
        await loop.step(timeout_ms=1000)
        clock.ms = 2_000
        reports = [TaskStarted(job_id="ghost", task_index=0, node="a-n0"),
                   TaskStarted(job_id="j", task_index=3, node="a-n0")]
        headers = ((CONTENT_TYPE_HEADER, MSGPACK),)
        lines = await step(loop, [Message(encode(envelope(e, "agent-cell")), headers=headers)
                                  for e in [*reports, *reports]])
        assert [(x["producer"], x["reason"], x["loop"]) for x in lines] == [
            ("agent-cell", "unknown_job", loop.producer), ("agent-cell", "unknown_task", loop.producer)]
        metrics.count_ignored("cell-0", loop.state.observations.counts)
        metrics.count_ignored("single", {"unknown_job": 1})  # (another loop's counts add up, apart)
        counted = series(parse(metrics.exposition().decode()), "fleetlog_ignored_observations_total")
        assert counted == {("unknown_job",): 3.0, ("unknown_task",): 2.0}
    finally:
        await shards.close()


def _body(producer: str, *events: Event) -> bytes:
    return b"[" + b",".join(encode(envelope(e, producer), "json") for e in events) + b"]"


async def test_a_running_service_counts_logs_and_shows_them(tmp_path: Path) -> None:
    """``fleetlog run`` (embedded): reports posted to ``/v1/events`` raise
    ``fleetlog_ignored_observations_total`` on ``/metrics``, log one line per producer and reason,
    and show in ``GET /v1/jobs/JOB`` and ``GET /v1/nodes``."""
    with capture_logs() as logs:
        async with serving(tmp_path / "log") as running:
            assert (await running.request("/v1/events", _body("setup", node("n0"), job("one"))))[0] == 200
            ghost = TaskStarted(job_id="ghost", task_index=0, node="n0")
            bad = _body("agent-a", ghost, ghost, TaskStarted(job_id="one", task_index=5, node="n0"))
            assert (await running.request("/v1/events", bad))[0] == 200
            assert (await running.request("/v1/events", _body("agent-b", ghost)))[0] == 200

            def counted(s: Any) -> dict[tuple[str, ...], float]:
                found = series(s, "fleetlog_ignored_observations_total")
                assert found == {("unknown_job",): 3.0, ("unknown_task",): 1.0}
                return found

            await eventually(running, counted)
            status, detail = await running.request("/v1/jobs/one")
            assert status == 200
            shown = [(o["reason"], o["task_index"]) for o in detail["ignored_observations"]]
            assert shown == [("unknown_task", 5)]
            status, nodes = await running.request("/v1/nodes")
            assert [o["job_id"] for o in nodes["items"][0]["ignored_observations"]] == [
                "ghost", "ghost", "one", "ghost"]
    lines = [(x["producer"], x["reason"]) for x in logs if x["event"] == "ignored_observation"]
    assert lines == [("agent-a", "unknown_job"), ("agent-a", "unknown_task"), ("agent-b", "unknown_job")]
