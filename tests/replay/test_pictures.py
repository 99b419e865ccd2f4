"""``replay timeline`` and ``replay report`` on a real simulated log with preemptions, shared
(fractional) GPUs, CPU-only tasks and jobs never placed: no two slices on one track overlap
without nesting (Perfetto drops those), every preemption is an arrow bound to two real slices,
and the charts' series say what the log says. The facts come from ``fleetlog replay dump`` run
as a child process, not from the code under test."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from fleetlog.cli import main
from fleetlog.core.state import State
from fleetlog.events.model import QuotaSet, Resources
from fleetlog.replay.charts import (
    FLOOR_S,
    Ecdf,
    Quotas,
    TenantBar,
    draw_pending,
    draw_tenants,
    pending_ecdf,
    tenant_bars,
)
from fleetlog.replay.observe import Measures, Preemption, Slice, Slices
from fleetlog.replay.source import open_file_source
from fleetlog.replay.timeline import lanes, lay_out, record, trace_events

ROOT = Path(__file__).parents[2]
WORKLOAD = "synthetic?jobs=60&cpu=0.2&prod=0.3&load=3&gang=0.2"
"""Small and seeded, and it has everything the pictures must show (checked in ``facts``)."""
Event = dict[str, Any]


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("pictures") / "log"
    sim = ["simulate", "--log", str(where), "--seed", "3", "--json", "--cluster", "synthetic?nodes=4"]
    assert main([*sim, "--workload", WORKLOAD, "--mode", "replay?drain_h=0"]) == 0
    return where


def dump(log: Path, *args: str) -> list[Event]:
    """Every event of the log, through the CLI in a child process."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = [sys.executable, "-m", "fleetlog.cli", "replay", "dump", "--log", str(log), *args]
    out = subprocess.run(run, capture_output=True, text=True, check=True, env=env, timeout=300).stdout
    return [json.loads(line)["event"] for line in out.splitlines() if "event" in json.loads(line)]


@pytest.fixture(scope="module")
def facts(log: Path) -> dict[str, Any]:
    inputs = dump(log)
    decisions = [d for b in dump(log, "--from-log", "decisions") for d in b["decisions"]]
    submitted = {e["job_id"] for e in inputs if e["type"] == "JobSubmitted"}
    placed = {d["job_id"] for d in decisions if d["type"] == "JobPlaced"}
    preempted = Counter((d["job_id"], d["by_job_id"]) for d in decisions if d["type"] == "TaskPreempted")
    quotas = {
        (e["tenant"], e.get("cell", "")): e["nominal"].get("gpu_milli", 0)
        for e in inputs
        if e["type"] == "QuotaSet"
    }
    assert preempted
    assert submitted - placed
    assert quotas
    cells = {d["job_id"]: d["cell"] for d in decisions if d["type"] == "JobPlaced"}
    return {
        "submitted": submitted,
        "placed": placed,
        "preempted": preempted,
        "quotas": quotas,
        "cells": cells,
    }


@pytest.fixture(scope="module")
def trace(log: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Event]:
    out = tmp_path_factory.mktemp("trace") / "trace.json"
    assert main(["replay", "timeline", "--out", str(out), "--log", str(log), "--json"]) == 0
    document = json.loads(out.read_text(), parse_constant=_no_constants)  # strict JSON: no NaN
    assert set(document) == {"traceEvents", "displayTimeUnit"}
    events: list[Event] = document["traceEvents"]
    for e in events:
        _check_format(e)
    return events


def _no_constants(name: str) -> None:
    raise AssertionError(f"{name} is not JSON")


def _check_format(e: Event) -> None:
    """Trace Event Format: the fields each phase we write needs, of the right types."""
    assert e["ph"] in {"M", "X", "C", "s", "f"}
    assert isinstance(e["pid"], int)
    assert isinstance(e["tid"], int)
    assert isinstance(e["name"], str)
    if e["ph"] == "M":
        assert e["name"] in {"process_name", "thread_name", "process_sort_index", "thread_sort_index"}
        assert set(e["args"]) <= {"name", "sort_index"}
        assert e["args"]
        return
    assert isinstance(e["ts"], int)  # whole microseconds: every reader gets the same nanoseconds
    assert e["ts"] >= 0
    if e["ph"] == "X":
        assert isinstance(e["dur"], int)
        assert e["dur"] >= 0
    elif e["ph"] == "C":
        assert all(isinstance(v, int | float) for v in e["args"].values())
    else:
        assert isinstance(e["id"], int)
        assert e["cat"] == "preemption"
        assert e["ph"] == "s" or e["bp"] == "e"


def tracks(events: list[Event]) -> dict[tuple[int, int], list[Event]]:
    out: dict[tuple[int, int], list[Event]] = {}
    for e in events:
        if e["ph"] == "X":
            out.setdefault((e["pid"], e["tid"]), []).append(e)
    return out


def badly_overlapping(track: list[Event]) -> list[Event]:
    """Slices that overlap an earlier one without nesting in it (what Perfetto drops)."""
    bad: list[Event] = []
    open_ends: list[int] = []
    for e in sorted(track, key=lambda e: (e["ts"], -e["dur"])):
        while open_ends and open_ends[-1] <= e["ts"]:
            open_ends.pop()
        if open_ends and e["ts"] + e["dur"] > open_ends[-1]:
            bad.append(e)
        else:
            open_ends.append(e["ts"] + e["dur"])
    return bad


def test_no_two_slices_on_a_track_overlap_without_nesting(trace: list[Event], facts: dict[str, Any]) -> None:
    by_track = tracks(trace)
    assert sum(len(badly_overlapping(t)) for t in by_track.values()) == 0
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace if e["name"] == "thread_name"}
    assert set(by_track) <= set(names)
    nodes = {e["pid"]: e["args"]["name"] for e in trace if e["name"] == "process_name" and e["pid"]}
    for (pid, _), track in by_track.items():
        assert {nodes[pid]} == {f"node {e['args']['node']} (cell {facts['cells'][e['name']]})" for e in track}
    shared = [n for n in names.values() if n.startswith("gpu") and "·" in n]
    cpu = [n for n in names.values() if n.startswith("cpu")]
    assert shared
    assert len(cpu) > 1
    for (pid, tid), track in by_track.items():
        for e in track:  # each slice is on the track of a GPU it holds, or on a CPU lane
            gpus = e["args"]["gpus"]
            assert names[(pid, tid)].split(" · ")[0] in ([f"gpu {g}" for g in gpus] or [names[(pid, tid)]])
            assert gpus or names[(pid, tid)].startswith("cpu")


def test_every_preemption_is_an_arrow_between_two_real_slices(
    trace: list[Event], facts: dict[str, Any]
) -> None:
    by_track = tracks(trace)
    ends: dict[int, dict[str, Event]] = {}
    for e in trace:
        if e["ph"] in "sf":
            assert e["ph"] not in ends.setdefault(e["id"], {})
            ends[e["id"]][e["ph"]] = e
    arrows: Counter[tuple[str, str]] = Counter()
    for pair in ends.values():
        leave, arrive = pair["s"], pair["f"]
        assert leave["ts"] < arrive["ts"]  # a flow never runs back in time
        victim, preemptor = _enclosing(by_track, leave), _enclosing(by_track, arrive)
        assert victim["args"]["end"] == f"preempted by {preemptor['name']}"
        assert victim["ts"] + victim["dur"] <= arrive["ts"]
        assert leave["ts"] < preemptor["ts"] + 1
        arrows[(victim["name"], preemptor["name"])] += 1
        here = [e for t, track in by_track.items() if t[0] == victim["pid"] for e in track]
        if any(e["name"] == preemptor["name"] and e["ts"] == preemptor["ts"] for e in here):
            assert arrive["pid"] == victim["pid"]  # on the victim's node when placed there
    assert arrows == facts["preempted"]


def _enclosing(by_track: dict[tuple[int, int], list[Event]], point: Event) -> Event:
    """The one slice of the point's track that holds it strictly inside (how Perfetto binds it)."""
    inside = [e for e in by_track[(point["pid"], point["tid"])] if e["ts"] < point["ts"] < e["ts"] + e["dur"]]
    assert len(inside) == 1, point
    return inside[0]


@pytest.fixture(scope="module")
def recorded(log: Path) -> tuple[Measures, Quotas]:
    async def run() -> tuple[Measures, Quotas]:
        source, quotas = await open_file_source(log), Quotas()
        try:
            _, measures = await record(source, extra=(quotas,))
        finally:
            await source.close()
        return measures, quotas

    return asyncio.run(run())


def test_the_pending_ecdf_counts_every_submitted_job(
    recorded: tuple[Measures, Quotas], facts: dict[str, Any]
) -> None:
    ecdf = pending_ecdf(recorded[0])
    submitted, placed = len(facts["submitted"]), len(facts["placed"] & facts["submitted"])
    assert (ecdf.submitted, ecdf.placed, ecdf.never_placed) == (submitted, placed, submitted - placed)
    assert ecdf.never_placed > 0
    assert ecdf.seconds[0] == FLOOR_S
    assert list(ecdf.seconds) == sorted(set(ecdf.seconds))
    assert list(ecdf.share) == sorted(ecdf.share)
    assert ecdf.share[0] > 0
    assert ecdf.share[-1] == pytest.approx(placed / submitted)


def test_the_tenants_series_puts_each_quota_share_next_to_its_usage(
    recorded: tuple[Measures, Quotas], facts: dict[str, Any]
) -> None:
    bars = {b.tenant: b for b in tenant_bars(*recorded)}
    total = sum(facts["quotas"].values())
    for (tenant, _), milli in facts["quotas"].items():
        assert bars[tenant].quota_share == pytest.approx(milli / total)
    assert sum(b.usage_share for b in bars.values()) == pytest.approx(1)
    assert sum(b.quota_share or 0 for b in bars.values()) == pytest.approx(1)


def test_quota_shares_take_the_latest_quota_per_cell_and_name_tenants_without_one() -> None:
    quotas, state = Quotas(), State()
    gpus = [("a", "", 4000), ("b", "", 4000), ("a", "", 1000), ("b", "c2", 3000), ("c", "", 0)]
    quotas.inputs(
        state, [(i, QuotaSet(t, Resources(gpu_milli=m), cell=c), i) for i, (t, c, m) in enumerate(gpus)]
    )
    assert quotas.shares() == {"a": 1 / 8, "b": 7 / 8, "c": 0.0}  # a's second quota replaced its first
    measures = Measures(tenant_gpu_ms={"d": 5.0, "a": 15.0})
    bars = [(b.tenant, b.usage_share, b.quota_share) for b in tenant_bars(measures, quotas)]
    assert bars == [("a", 0.75, 1 / 8), ("b", 0.0, 7 / 8), ("c", 0.0, 0.0), ("d", 0.25, None)]
    assert tenant_bars(Measures(), Quotas()) == []


def test_an_ecdf_of_no_jobs_and_of_jobs_none_placed() -> None:
    empty = pending_ecdf(Measures())
    assert (empty.seconds, empty.share, empty.never_placed) == ((FLOOR_S,), (0.0,), 0)
    waiting = pending_ecdf(Measures(submitted_at={"x": 0, "y": 5}))
    assert (waiting.share[-1], waiting.never_placed) == (0.0, 2)
    ties = pending_ecdf(Measures(submitted_at=dict.fromkeys("abcd", 0), waits_ms={"a": 0, "b": 0, "c": 7000}))
    assert (ties.seconds, ties.share) == ((FLOOR_S, 7.0), (0.5, 0.75))


def _slice(job: str, start: int, end: int) -> Slice:
    return Slice(job, 0, "n", "c", start, end, "finished")


@pytest.mark.parametrize(
    "intervals",
    [
        [(0, 10), (0, 10), (0, 10)],  # identical
        [(0, 10), (10, 20), (20, 20), (20, 30)],  # touching, and a zero-length one between
        [(5, 5), (5, 5), (5, 6)],  # zero-length at one instant
        [(0, 100), (1, 2), (2, 3), (50, 150), (99, 100)],  # nested in time, not on a track
    ],
)
def test_lanes_never_overlap(intervals: list[tuple[int, int]]) -> None:
    pieces = [(a * 1000, max(1, (b - a) * 1000), _slice(f"j{i}", a, b)) for i, (a, b) in enumerate(intervals)]
    laid = lanes(pieces)
    assert sorted(p[2].job_id for lane in laid for p in lane) == sorted(p[2].job_id for p in pieces)
    for lane in laid:
        assert all(x[0] + x[1] <= y[0] for x, y in itertools.pairwise(lane))
    most_at_once = max(sum(1 for p in pieces if p[0] <= q[0] < p[0] + p[1]) for q in pieces)
    assert len(laid) == most_at_once  # first fit on sorted starts uses no more lanes than needed


def test_the_page_shows_the_run_these_tests_draw() -> None:
    text = " ".join((ROOT / "docs" / "replay.md").read_text().split())
    assert f"--seed 3 --cluster 'synthetic?nodes=4' --mode 'replay?drain_h=0' --workload '{WORKLOAD}'" in text


def test_a_slice_placed_and_ended_in_one_millisecond_is_drawn_3_us_long() -> None:
    drawn = lay_out([_slice("quick", 5, 5), _slice("next", 5, 9)]).drawn
    assert {(d.slice.job_id, d.ts, d.dur) for d in drawn} == {("quick", 5000, 3), ("next", 5000, 4000)}
    assert len({d.tid for d in drawn}) == 2  # they overlap for 3 us, so they are on two CPU lanes


def test_the_charts_mark_never_placed_jobs_and_tenants_without_quota() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (pending, tenants) = plt.subplots(1, 2)
    try:
        draw_pending(pending, Ecdf((FLOOR_S, 3.0), (0.5, 0.6), 6, 10))
        assert pending.get_xscale() == "log"
        assert [t.get_text() for t in pending.texts] == ["4 of 10 never placed"]
        assert [line.get_ydata()[0] for line in pending.get_lines()][1] == 0.6  # the dotted level
        draw_tenants(tenants, [TenantBar("a", 0.75, 0.25), TenantBar("d", 0.25, None)])
        assert [t.get_text() for t in tenants.get_xticklabels()] == ["a", "d\n(no quota)"]
        assert [b.get_height() for b in tenants.patches] == [0.75, 0.25, 0.25, 0.0]
    finally:
        plt.close(fig)


@pytest.mark.parametrize(
    ("victim_ms", "preemptor_ms"), [((5, 5), (5, 9)), ((5, 5), (5, 5)), ((1, 5), (5, 5))]
)
def test_an_arrow_binds_even_to_slices_that_lasted_no_time(
    victim_ms: tuple[int, int], preemptor_ms: tuple[int, int]
) -> None:
    victim = Slice("v", 0, "n", "c", *victim_ms, "preempted by p", (0,))
    preemptor = Slice("p", 0, "n", "c", *preemptor_ms, "finished", (0,))
    events = trace_events(
        Slices(done=[victim, preemptor], preemptions=[Preemption("v", 0, "p", 5)]), Measures()
    )
    for e in events:
        _check_format(e)
    by_track = tracks(events)
    assert sum(len(badly_overlapping(t)) for t in by_track.values()) == 0
    leave, arrive = (next(e for e in events if e["ph"] == ph) for ph in "sf")
    assert leave["ts"] < arrive["ts"]
    assert (_enclosing(by_track, leave)["name"], _enclosing(by_track, arrive)["name"]) == ("v", "p")
