"""``fleetlog history`` on a log the real scheduling loop wrote under ``fleetlog simulate`` (nodes
that fail and come back, preemptions, gangs), checked against what the raw records say without
the fold, and against the fold's own counts of ended jobs."""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import msgspec
import pytest

from fleetlog.cli import main
from fleetlog.core.state import JobState
from fleetlog.events.model import JobPlaced, JobSubmitted, TaskFinished, TaskPreempted, TaskStarted
from fleetlog.log.base import INPUTS
from fleetlog.replay.history import ENDED, STATE_NAMES, account
from fleetlog.replay.source import InputReader, batches, end_offset, open_file_source
from fleetlog.replay.state_at import Point, state_at

CLUSTER = "synthetic?nodes=6&hosts_per_rack=2&mtbf_h=2&mttr_s=600"
WORKLOAD = "synthetic?jobs=150&load=1.5&max_h=1"


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("history-sim")
    argv = ["simulate", "--cluster", CLUSTER, "--workload", WORKLOAD, "--log", str(where / "log"),
            "--report", str(where / "report"), "--json"]
    assert main(argv) == 0
    return where / "log"


@pytest.fixture(scope="module")
def records(sim: Path) -> list[dict[str, Any]]:
    """The records, from a replay with the check mode on (the jobs held pending and running are
    the fold's after every part of the inputs and every batch)."""

    async def run() -> list[dict[str, Any]]:
        source = await open_file_source(sim)
        try:
            out: list[Any] = []
            await account(source, out.append, check=True)
            return [msgspec.to_builtins(r) for r in out]
        finally:
            await source.close()

    return asyncio.run(run())


@pytest.fixture(scope="module")
def raw(sim: Path) -> dict[str, Any]:
    """What the records say job by job, read without the fold: submissions, task starts and
    finishes (log times), placements, and the decision batches that preempted each job."""

    async def run() -> dict[str, Any]:
        source = await open_file_source(sim)
        out: dict[str, Any] = {"submitted": {}, "starts": defaultdict(dict), "finishes": defaultdict(dict),
                               "placements": Counter(), "preempted_in": defaultdict(set)}
        try:
            reader = InputReader(source.store)
            async for chunk in reader.until(await end_offset(source.store, INPUTS)):
                for _, e, t in chunk:
                    if isinstance(e, JobSubmitted):
                        out["submitted"].setdefault(e.job_id, e)
                    elif isinstance(e, TaskStarted):
                        out["starts"][e.job_id].setdefault(e.task_index, t)
                    elif isinstance(e, TaskFinished):
                        out["finishes"][e.job_id].setdefault(e.task_index, t)
            async for offset, _, batch in batches(source.store):
                for d in batch.decisions:
                    if isinstance(d, JobPlaced):
                        out["placements"][d.job_id] += 1
                    elif isinstance(d, TaskPreempted):
                        out["preempted_in"][d.job_id].add(offset)
        finally:
            await source.close()
        return out

    return asyncio.run(run())


def test_every_finished_job_once_as_the_fold_counts_them(sim: Path, records: list[dict[str, Any]]) -> None:
    """Per tenant and end state, the fold's count of ended jobs (retired ones' counters plus the
    ended rows still held) is the number of records; the ended jobs still held are listed."""

    async def fold_end() -> Any:
        source = await open_file_source(sim)
        try:
            return (await state_at(source, Point(offset=await end_offset(source.store, INPUTS)))).state
        finally:
            await source.close()

    state = asyncio.run(fold_end())
    names, tenants = state.names["job"].names, state.names["tenant"].names
    fold: Counter[tuple[str, str]] = Counter()
    for tenant, counts in state.retired_counts.items():
        for name, count in zip(ENDED, counts, strict=True):
            fold[tenants[tenant], name] += count
    held = {}
    for row, code in enumerate(state.jobs.view("state").tolist()):
        if code in STATE_NAMES:
            fold[tenants[int(state.jobs.cols["tenant"][row])], STATE_NAMES[JobState(code)]] += 1
            held[names[row]] = STATE_NAMES[JobState(code)]
    ids = [r["job_id"] for r in records]
    assert len(ids) == len(set(ids)) > 100
    assert Counter((r["tenant"], r["state"]) for r in records) == +fold
    by_id = {r["job_id"]: r["state"] for r in records}
    assert {j: by_id.get(j) for j in held} == held


def test_times_are_in_order(records: list[dict[str, Any]]) -> None:
    ended = [r["ended_at_ms"] for r in records]
    assert ended == sorted(ended)  # (listed in the order they ended)
    for r in records:
        assert r["wait_ms"] >= 0, r
        assert r["elapsed_ms"] >= 0, r
        assert r["submitted_at_ms"] <= r["placed_at_ms"] <= r["started_at_ms"] <= r["ended_at_ms"], r
        assert r["wait_ms"] + r["elapsed_ms"] == r["ended_at_ms"] - r["submitted_at_ms"]
        assert not r["partial"]


def test_preemptions_and_requeues_match_the_decisions(
    records: list[dict[str, Any]], raw: dict[str, Any]
) -> None:
    """A preemption is a decision batch that preempted the job; every requeue of a job that
    ended running was followed by a placement; some requeues were a failed node's."""
    for r in records:
        assert r["preemptions"] == len(raw["preempted_in"][r["job_id"]]), r
        assert raw["placements"][r["job_id"]] == r["requeues"] + 1, r
    assert sum(r["preemptions"] for r in records) > 0
    assert sum(r["requeues"] - r["preemptions"] for r in records) > 0


def test_gpu_hours_are_the_task_events(records: list[dict[str, Any]], raw: dict[str, Any]) -> None:
    """A job that ran once: the sum over its tasks of GPUs x (finish - start), from the raw task
    events; one that ran more: at most all its GPUs for its whole elapsed time."""
    once = 0
    for r in records:
        job = raw["submitted"][r["job_id"]]
        gpus = [g.gpu_count * g.gpu_milli for g in job.task_groups for _ in range(g.count)]
        starts, finishes = raw["starts"][r["job_id"]], raw["finishes"][r["job_id"]]
        if r["requeues"] == 0:
            milli_ms = sum(g * (finishes[i] - starts[i]) for i, g in enumerate(gpus))
            assert r["gpu_hours"] == round(milli_ms / 3_600_000_000, 6), r
            once += 1
        else:
            assert 0 <= r["gpu_hours"] <= round(sum(gpus) * r["elapsed_ms"] / 3_600_000_000, 6) + 1e-6, r
    assert once > 50
