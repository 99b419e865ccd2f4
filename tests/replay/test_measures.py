"""One set of numbers (issue 15): ``fleetlog simulate`` and ``fleetlog replay report`` show the
same measures, computed by one function over the run's log, in one unit (percent, seconds), with
one percentile (nearest rank) — and each measure holds at its limits."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fleetlog.backends.simulated.clock import VirtualClock
from fleetlog.cli import main
from fleetlog.core.policy import policy_named
from fleetlog.events import Event, TaskFinished, TaskPreempted, TaskStarted, encode, envelope
from fleetlog.log.base import DECISIONS, INPUTS, Message
from fleetlog.log.consumer import decision_batches
from fleetlog.log.memory import MemoryLogStore
from fleetlog.measures import KEYS, ROWS, percentile, wait_percentiles_s
from fleetlog.replay import source
from fleetlog.replay.source import Source
from fleetlog.replay.summary import measure, measure_store
from fleetlog.service.loop import SchedulerLoop
from fleetlog.simulation import (
    RunConfig,
    Simulation,
    arrivals,
    load_cluster,
    load_workload,
    parse_mode,
)
from fleetlog.simulation.driver import open_store
from tests.core.builders import job, node

BUSY_CLUSTER = "synthetic?nodes=6&hosts_per_rack=2&mtbf_h=2&mttr_s=600"
BUSY_WORKLOAD = "synthetic?jobs=80&load=1.5&max_h=1"


async def measured(steps: Sequence[tuple[int, Sequence[Event]]]) -> tuple[dict[str, Any], list[Any]]:
    """Append each step's events at its log time, let the real loop decide after each; the
    shared measures of the resulting logs, and every decision."""
    clock = VirtualClock()
    async with MemoryLogStore(clock=clock) as store:
        loop = SchedulerLoop(store, policy_named("default"))
        for at_ms, events in steps:
            clock.advance(at_ms)
            await store.log(INPUTS).append([Message(encode(envelope(e, "test"))) for e in events])
            while loop.offset < await store.log(INPUTS).end_offset():
                await loop.step(0)
        records = await store.log(DECISIONS).read(0, 10_000)
        made = [d for _, batch in decision_batches(records) for d in batch.decisions]
        return await measure_store(store), made


# --- the percentile ----------------------------------------------------------------------


def test_the_percentile_is_the_nearest_rank() -> None:
    ten = list(range(1, 11))
    assert [percentile(ten, q) for q in (0, 10, 50, 90, 91, 99, 100)] == [1, 1, 5, 9, 10, 10, 10]
    assert [percentile([7], q) for q in (0, 50, 99, 100)] == [7, 7, 7, 7]
    rng = random.Random(15)
    for n in (1, 2, 3, 7, 10, 99, 100, 101, 1000):
        values = sorted(rng.randrange(0, 10_000) for _ in range(n))
        for q in (1, 25, 50, 90, 99, 100):
            assert percentile(values, q) == np.percentile(values, q, method="inverted_cdf")
    thousand = list(range(1, 1001))
    assert percentile(thousand, 99.9) == 999  # exact: numpy's float rank says 1000
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)
    with pytest.raises(ValueError, match="not within"):
        percentile([1], 101)


def test_waits_are_seconds_and_none_without_a_placed_job() -> None:
    assert wait_percentiles_s([]) == {"p50": None, "p90": None, "p99": None, "max": None}
    assert wait_percentiles_s([1500]) == {"p50": 1.5, "p90": 1.5, "p99": 1.5, "max": 1.5}
    waits = list(range(0, 100_000, 1000))  # 0 s .. 99 s
    assert wait_percentiles_s(waits) == {"p50": 49.0, "p90": 89.0, "p99": 98.0, "max": 99.0}


# --- the measures at their limits -------------------------------------------------------


async def test_a_log_with_no_job_has_no_allocation_to_show() -> None:
    summary, _ = await measured([(0, [node("n1")]), (10_000, [node("n1")])])
    assert summary["gpu_allocation_pct"] is None  # no job: no window to measure
    assert (summary["jobs_submitted"], summary["jobs_placed"], summary["placements"]) == (0, 0, 0)
    assert summary["wait_s"] == {"p50": None, "p90": None, "p99": None, "max": None}
    assert summary["tenant_share_pct"] == {}


async def test_a_log_where_no_job_was_ever_placed() -> None:
    steps = [(0, [node("n1")]), (1_000, [job("huge", gpus=16)]), (11_000, [node("n1")])]
    summary, made = await measured(steps)
    assert not any(type(d).__name__ == "JobPlaced" for d in made)
    assert summary["gpu_allocation_pct"] == 0.0
    assert (summary["jobs_submitted"], summary["jobs_placed"], summary["jobs_never_placed"]) == (1, 0, 1)
    assert (summary["placements"], summary["preemptions"]) == (0, 0)
    assert summary["wait_s"] == {"p50": None, "p90": None, "p99": None, "max": None}
    assert summary["tenant_share_pct"] == {}


async def test_a_single_job_that_never_finished() -> None:
    """Submitted at 1 s with no node; placed when the node comes at 4 s; still running when the
    log ends at 14 s: it waited 3 s, and it held 4 of 8 GPUs of the available GPU-time."""
    steps = [(1_000, [job("one", gpus=4)]), (4_000, [node("n1")]), (14_000, [node("n1")])]
    summary, _ = await measured(steps)
    assert summary["wait_s"] == {"p50": 3.0, "p90": 3.0, "p99": 3.0, "max": 3.0}
    assert summary["gpu_allocation_pct"] == 50.0  # the 3 s without a node offered no GPU-time
    assert (summary["jobs_placed"], summary["jobs_never_placed"], summary["placements"]) == (1, 0, 1)
    assert summary["tenant_share_pct"] == {"t1": 100.0}


async def test_a_finish_frees_its_gpus_when_it_happens_not_at_the_next_decision() -> None:
    """The whole node for 5 s of a 10 s log: 50%, though no decision follows the finish."""
    summary, made = await measured(
        [
            (0, [node("n1"), job("a", gpus=8)]),
            (100, [TaskStarted(job_id="a", task_index=0, node="n1")]),
            (5_000, [TaskFinished(job_id="a", task_index=0)]),
            (10_000, [node("n1")]),
        ]
    )
    assert len(made) == 1  # the placement: the finish made no decision batch
    assert summary["gpu_allocation_pct"] == 50.0


async def test_a_preempted_gang_is_one_preemption() -> None:
    summary, made = await measured(
        [
            (0, [node("n1"), job("gang", tasks=2, gpus=4)]),
            (1_000, [job("urgent", gpus=8, priority=10)]),
            (2_000, [node("n1")]),
        ]
    )
    assert sum(isinstance(d, TaskPreempted) for d in made) == 2  # a task each
    assert summary["preemptions"] == 1  # one job preempted once
    assert summary["placements"] == 2


# --- simulate and replay report agree ----------------------------------------------------


def shown(out: str) -> dict[str, str]:
    """The value each shared row shows in a printed table (label -> text)."""
    cells = {}
    for line in out.splitlines():
        parts = [p.strip() for p in line.split("│")]
        if len(parts) >= 3:
            cells[parts[1]] = parts[2]
    return {label: cells[label] for label, _, _ in ROWS}


def test_simulate_and_replay_report_show_the_same_numbers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "240")  # rich tables: no wrapped cells to compare
    log, report = str(tmp_path / "log"), str(tmp_path / "report")
    run = ["simulate", "--cluster", BUSY_CLUSTER, "--workload", BUSY_WORKLOAD, "--seed", "3"]
    assert main([*run, "--log", log, "--report", str(tmp_path / "sim"), "--json"]) == 0
    simulated = json.loads(capsys.readouterr().out)
    assert main(["replay", "report", "--log", log, "--out", report, "--json"]) == 0
    reported = json.loads(capsys.readouterr().out)["summary"]
    assert {k: simulated[k] for k in KEYS} == {k: reported[k] for k in KEYS}
    assert simulated["preemptions"] > 0  # a run that exercises every measure
    assert simulated["jobs_placed"] > 0
    assert simulated["wait_s"]["p99"] > 0
    assert len(simulated["tenant_share_pct"]) > 1
    assert 0 < simulated["gpu_allocation_pct"] <= 100

    assert main([*run, "--log", log, "--report", str(tmp_path / "sim"), "--force"]) == 0  # the same run again
    simulated_table = shown(capsys.readouterr().out)
    assert main(["replay", "report", "--log", log, "--out", report]) == 0
    assert shown(capsys.readouterr().out) == simulated_table
    assert simulated_table["GPU allocation, time-weighted (%)"] == f"{simulated['gpu_allocation_pct']:.2f}%"


def test_docs_define_every_shared_measure_under_its_key_and_row() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "replay.md").read_text()
    section = page.split("## The measures", 1)[1].split("\n## ", 1)[0]
    documented = [
        tuple(cell.strip().strip("`") for cell in line.split("|")[1:3])
        for line in section.splitlines()
        if line.startswith("| `")
    ]
    assert documented == [(key, label) for label, key, _ in ROWS]


async def test_the_measures_do_not_depend_on_how_the_log_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reads of 1, 7, 333 and 10,000 records cut the log's times differently: the same samples
    and the same summary (node failures, gangs, preemptions and steady heartbeats included)."""
    cluster = load_cluster(BUSY_CLUSTER)
    config = RunConfig(cluster, load_workload(BUSY_WORKLOAD, cluster, 3), parse_mode("replay"), 3, "default")
    clock = VirtualClock()
    seen = []
    async with open_store(None, clock) as store:
        sim = Simulation(cluster, arrivals(config.mode, config.workload, cluster, 3), config.mode,
                         store=store, clock=clock, seed=3)
        await sim.run(SchedulerLoop(store, policy_named("default")))
        assert sim.recorder.node_failures > 0
        for chunk in (1, 7, 333, 10_000):
            monkeypatch.setattr(source, "READ_CHUNK", chunk)
            measures = await measure(Source(store, None, "memory"))
            seen.append((measures.samples, measures.summary()))
    assert all(s == seen[0] for s in seen[1:])
    assert seen[0][1]["preemptions"] > 0
