"""The cell shard's pure core (fleetlog/core/cellshard.py, fold's ``on_dispatched`` and
``hand_back``; docs/scale-out.md): a dispatched job folded as a submission restricted to its
cell, handed back after ``hold_ms`` of log time, summaries built from the state — and the whole
round trip with the step-1 dispatcher, pure functions only, in one process and across hash seeds."""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
from pathlib import Path

import msgspec
import numpy as np
import pytest

from fleetlog.core import dispatch as d
from fleetlog.core.cellshard import (
    SummaryRule,
    cell_summary,
    cut_free,
    cut_usage,
    free_rows,
    returns,
    summary_due,
)
from fleetlog.core.digest import digest, restore, snapshot
from fleetlog.core.fold import fold
from fleetlog.core.fold_batch import fold_lists, fold_many
from fleetlog.core.invariants import check
from fleetlog.core.policy import Policy
from fleetlog.core.state import FULL_GPU, CoreConfig, JobState, NodeStatus, State
from fleetlog.events import CellSummary, FreeSlots, JobCancelled, JobDispatched, Resources, TenantUsage
from fleetlog.events.model import MAX_SUMMARY_ENTRIES, MAX_SUMMARY_TENANTS, Event
from tests.core.builders import Driver, job, node

ROOT = Path(__file__).resolve().parents[2]
HOLD = 30_000


def shard(cell: str, hold_ms: int = HOLD) -> Driver:
    """A cell shard of ``cell``: two racks of two 8-GPU A100 nodes."""
    drv = Driver(Policy(), CoreConfig(hold_ms=hold_ms, cells=(cell,)))
    drv.feed(*[node(f"{cell}-n{i}", cell=cell, rack=f"r{i // 2}") for i in range(4)])
    return drv


def dispatched(spec_id: str, cell: str, attempt: int = 1, seq: int = 1, **kw: object) -> JobDispatched:
    return JobDispatched(job=job(spec_id, **kw), cell=cell, attempt=attempt, seq=seq, as_of=0)  # type: ignore[arg-type]


def status(drv: Driver, job_id: str) -> JobState:
    return JobState(int(drv.state.jobs.cols["state"][drv.state.job_row(job_id)]))


# --- fold JobDispatched -------------------------------------------------------------------------


def test_a_dispatch_is_a_submission_restricted_to_its_cell_and_is_placed_there() -> None:
    drv = shard("a")
    drv.feed(node("b-n0", cell="b"))  # (a node of another cell the shard happens to see)
    drv.feed(dispatched("j1", "a", cells=("a", "b")))
    row = drv.state.job_row("j1")
    assert drv.state.job_cells[row] == (drv.state.names["cell"].get("a"),)
    assert drv.state.dispatches[row][1:3] == (1, 1)
    assert drv.state.dispatched_seq == {drv.state.names["cell"].get("a"): 1}
    placed = drv.placed(drv.decide())
    assert placed["j1"].cell == "a"


@pytest.mark.parametrize(
    ("second", "why"),
    [
        (dispatched("j1", "a", attempt=1, seq=2), "a resend (same attempt)"),
        (dispatched("j1", "a", attempt=2, seq=2), "a newer attempt while the shard still holds it"),
        (dispatched("j2", "b", attempt=1, seq=1), "a cell this shard does not hold"),
    ],
)
def test_dispatches_the_shard_must_not_take_are_ignored_and_counted(second: JobDispatched, why: str) -> None:
    drv = shard("a")
    drv.feed(dispatched("j1", "a"))
    before = (drv.state.pending_count, drv.state.jobs.size, drv.state.ignored)
    drv.feed(second)
    assert (drv.state.pending_count, drv.state.jobs.size) == before[:2], why
    assert drv.state.ignored == before[2] + 1, why


def test_a_job_submitted_here_directly_is_not_taken_over_by_a_dispatch() -> None:
    drv = shard("a")
    drv.feed(job("j1"), dispatched("j1", "a"))
    assert drv.state.ignored == 1
    assert not drv.state.dispatches


def test_a_single_shard_ignores_nothing_of_its_own_and_its_digest_has_no_cell_fields() -> None:
    plain, cell = State(), State(CoreConfig(hold_ms=HOLD))
    for s in (plain, cell):
        fold(s, node("n0"), 1)
        fold(s, job("j1"), 2)
    assert digest(plain) == digest(cell)  # hold_ms at its default is not in the digest
    assert digest(State(CoreConfig(hold_ms=1))) != digest(State())


# --- hand-back ----------------------------------------------------------------------------------


def unplaceable(drv: Driver, attempt: int = 1) -> None:
    """A gang of 3 x 8 GPUs that must share a rack of 2 nodes: never placed in this cell."""
    drv.feed(dispatched("g", "a", attempt=attempt, seq=attempt, tasks=3, gpus=8, topology="rack"))


@pytest.mark.parametrize(("wait", "back"), [(HOLD - 1, False), (HOLD, True), (50 * HOLD, True)])
def test_a_held_job_is_handed_back_at_the_bound_not_before(wait: int, back: bool) -> None:
    drv = shard("a")
    unplaceable(drv)
    since, at = drv.state.offset, drv.now_ms
    reasons = drv.reasons(drv.decide())
    assert reasons == {"g": "never_fits"}
    drv.feed(node("a-n0"), step_ms=wait)  # (a heartbeat moves log time)
    drv.decide()
    got = returns(drv.state, since)
    if not back:
        assert got == []
        assert status(drv, "g") == JobState.PENDING
        return
    assert [(r.job_id, r.cell, r.attempt, r.reason) for r in got] == [("g", "a", 1, "never_fits")]
    assert got[0].as_of == drv.state.offset - 1
    assert str(drv.now_ms - at) in got[0].message
    assert status(drv, "g") == JobState.RETURNED
    assert drv.state.pending_count == 0
    assert returns(drv.state, drv.state.offset) == []  # written once: the next step has none
    check(drv.state)


def test_a_job_held_without_any_decide_is_returned_with_hold_expired() -> None:
    drv = shard("a")
    unplaceable(drv)
    drv.feed(node("a-n1"), step_ms=HOLD)
    assert [r.reason for r in returns(drv.state, 0)] == ["hold_expired"]


def test_a_job_placed_in_time_is_the_cells_even_when_requeued_later() -> None:
    drv = shard("a")
    drv.feed(dispatched("j1", "a", gpus=8))
    placed = drv.placed(drv.decide())["j1"]
    drv.feed(node(placed.tasks[0].node, cell="a", healthy=False))  # requeued: node unhealthy
    assert status(drv, "j1") == JobState.PENDING
    drv.feed(node("a-n3"), step_ms=3 * HOLD)
    assert returns(drv.state, 0) == []
    assert status(drv, "j1") == JobState.PENDING


def test_a_returned_job_ignores_its_late_observations_and_a_cancel_and_can_come_back() -> None:
    drv = shard("a")
    unplaceable(drv)
    drv.decide()
    drv.feed(node("a-n0"), step_ms=HOLD)
    assert status(drv, "g") == JobState.RETURNED
    ignored = drv.state.ignored
    drv.feed(JobCancelled(job_id="g"))
    drv.feed(dispatched("g", "a", attempt=1, seq=5))  # the old attempt again
    assert drv.state.ignored == ignored + 2
    drv.feed(dispatched("g", "a", attempt=2, seq=6, tasks=3, gpus=8, topology="rack"))
    assert status(drv, "g") == JobState.PENDING
    assert returns(drv.state, 0) == []
    assert drv.state.dispatched_seq[drv.state.names["cell"].get("a")] == 6
    drv.decide()
    drv.feed(node("a-n0"), step_ms=HOLD)
    assert [r.attempt for r in returns(drv.state, 0)] == [2]


@pytest.mark.parametrize("submissions", [False, True])
def test_the_batch_twins_hand_back_at_the_same_input_however_chunked(submissions: bool) -> None:
    beats = [node(f"a-n{i}", cell="a", rack=f"r{i // 2}") for i in range(4)]
    inputs: list[tuple[Event, int]] = [(beats[i % 4], i) for i in range(74)]  # (steady once seen)
    inputs.append((dispatched("g", "a", tasks=3, gpus=8, topology="rack"), 100))
    # the hold ends some 300 steady heartbeats later: in a later chunk of 64 than the dispatch
    inputs += [(beats[i % 4], 101 + 100 * i) for i in range(400)]
    if submissions:  # a run of submissions across the end of the hold
        inputs[374:374] = [(job(f"s{k}", gpus=0), 30_050 + 10 * k) for k in range(10)]
    config = CoreConfig(hold_ms=HOLD, cells=("a",), node_timeout_ms=3_600_000)  # (no sweep near the hold)
    one = State(config)
    for e, at in inputs:
        fold(one, e, at)
    for chunk in (1, 7, 64, 100, len(inputs)):
        for fast in (fold_many, fold_lists):
            s = State(config)
            for i in range(0, len(inputs), chunk):
                part = inputs[i : i + chunk]
                if fast is fold_many:
                    fold_many(s, part)
                else:
                    fold_lists(s, [e for e, _ in part], [at for _, at in part])
            assert digest(s) == digest(one), (chunk, fast.__name__)
            assert returns(s, 0) == returns(one, 0)
            assert len(returns(one, 0)) == 1


def test_a_snapshot_keeps_dispatches_returns_and_holds() -> None:
    drv = shard("a")
    unplaceable(drv)
    drv.feed(dispatched("h", "a", seq=2, gpus=8))
    drv.feed(node("a-n0"), step_ms=HOLD - 5)
    back = restore(snapshot(drv.state))
    assert digest(back) == digest(drv.state)
    assert back.held == drv.state.held
    assert back.next_return_ms == drv.state.next_return_ms
    for s in (back, drv.state):
        fold(s, node("a-n1"), drv.now_ms + 10)
    assert returns(back, 0) == returns(drv.state, 0)
    assert len(returns(back, 0)) == 2
    assert digest(restore(snapshot(back))) == digest(back)


# --- summaries ----------------------------------------------------------------------------------


def plain_free(state: State, cell: str) -> list[tuple[str, int, int, int, int, int, int]]:
    """free_rows, node by node in plain Python (the spec the numpy version is checked against)."""
    nc, cid = state.nodes.cols, state.names["cell"].get(cell)
    acc: dict[tuple[str, int], list[int]] = {}
    for n in range(state.nodes.size):
        if int(nc["status"][n]) != NodeStatus.UP or int(nc["cell"][n]) != cid:
            continue
        gpus = int(nc["gpu_count"][n])
        model = state.names["model"].names[int(nc["model"][n])] if gpus else ""
        cpu, mem = max(0, int(nc["cpu_free"][n])), max(0, int(nc["mem_free"][n]))
        whole = sum(1 for g in range(gpus) if int(nc["gpu_free"][n][g]) == FULL_GPU)
        for b in (0, 1, 2, 4, 8, 16, 32, 64):
            slots = (cpu if cpu > 0 and mem > 0 else 0) if b == 0 else whole // b
            if slots:
                row = acc.setdefault((model, b), [0, 0, 0, 0, 0])
                row[0] += slots
                row[1] += cpu
                row[2] += mem
                row[3], row[4] = max(row[3], cpu), max(row[4], mem)
    return sorted((m, b, *row) for (m, b), row in acc.items())


def test_free_rows_match_the_plain_node_by_node_count() -> None:
    drv = Driver(Policy(), CoreConfig(cells=("a",)))
    shapes = [(8, "A100"), (4, "H100"), (0, ""), (2, "A100"), (16, "H100")]
    drv.feed(*[node(f"n{i}", gpus=g, model=m, cell="a") for i, (g, m) in enumerate(shapes * 20)])
    drv.feed(node("x0", cell="b"), node("n3", cell="a", healthy=False))
    drv.feed(*[job(f"j{i}", gpus=[1, 2, 1, 0][i % 4], milli=[1000, 1000, 300, 0][i % 4]) for i in range(60)])
    drv.decide()
    cid = drv.state.names["cell"].get("a")
    up = np.flatnonzero(
        (drv.state.nodes.view("status") == NodeStatus.UP) & (drv.state.nodes.view("cell") == cid)
    )
    assert free_rows(drv.state, up) == plain_free(drv.state, "a")
    assert not [r for r in free_rows(drv.state, up) if r[:2] == ("", 1)]  # no GPU rows for GPU-less nodes


@pytest.mark.parametrize("seed", range(6))
def test_free_rows_match_the_plain_count_at_the_limits(seed: int) -> None:
    """Generated cells: none or one node, nodes of 64 GPUs (the widest) among smaller ones,
    one model or several, nodes without GPUs, CPU or memory used up, shares of GPUs taken."""
    rng = random.Random(seed)
    drv = Driver(Policy(), CoreConfig(cells=("a",)))
    count = (0, 1, 3, 40, 40, 120)[seed]
    nodes = []
    for i in range(count):
        gpus = rng.choice((0, 1, 2, 8, 8, 64))
        model = "A100" if seed == 4 else rng.choice(("A100", "H100", "T4"))  # (seed 4: one model)
        nodes.append(node(f"n{i}", cell="a", gpus=gpus, model=model,
                          cpu=rng.choice((4_000, 64_000)), mem=rng.choice((16_384, 524_288))))
    drv.feed(*nodes)
    jobs = []
    for i in range(3 * count):
        gpus = rng.choice((0, 1, 2, 4, 8))
        milli = rng.choice((300, 1000)) if gpus == 1 else 1000 if gpus else 0  # (a share: one GPU's)
        jobs.append(job(f"j{i}", tenant="t", gpus=gpus, milli=milli,
                        cpu=rng.choice((1_000, 4_000, 32_000)), mem=rng.choice((1_024, 16_384))))
    drv.feed(*jobs)
    drv.decide()
    cid = drv.state.names["cell"].get("a")
    cells = drv.state.nodes.view("cell")
    up = np.flatnonzero((drv.state.nodes.view("status") == NodeStatus.UP) & (cells == cid))
    assert free_rows(drv.state, up) == plain_free(drv.state, "a")


def test_a_summary_counts_placements_and_takes_off_held_jobs() -> None:
    drv = shard("a")
    empty = cell_summary(drv.state, "a", 3, 1)
    assert (empty.total.gpu_milli, empty.total.cpu_milli, empty.pending) == (32_000, 4 * 96_000, 0)
    assert {(f.gpu_model, f.gpus): f.slots for f in empty.free}[("A100", 8)] == 4
    drv.feed(dispatched("p", "a", gpus=8, tenant="t1"))
    drv.decide()
    drv.feed(dispatched("h", "a", seq=2, gpus=8, tenant="t2"))  # held, not placed yet
    s = cell_summary(drv.state, "a", 3, 2)
    assert (s.partition, s.seq, s.as_of, s.at_ms) == (3, 2, drv.state.offset, drv.state.now_ms)
    assert s.dispatched_seq == 2
    assert s.pending == 1
    slots = {(f.gpu_model, f.gpus): f.slots for f in s.free}
    assert slots[("A100", 8)] == 2
    assert slots[("A100", 1)] == 16
    assert [(u.tenant, u.gpu_milli) for u in s.usage] == [("t1", 8000), ("t2", 8000)]
    assert msgspec.json.decode(msgspec.json.encode(s), type=CellSummary) == s  # valid as an event
    drv.feed(node("a-n0"), step_ms=HOLD)  # h is handed back: its room is free again
    after = cell_summary(drv.state, "a", 3, 3)
    assert {(f.gpu_model, f.gpus): f.slots for f in after.free}[("A100", 8)] == 3
    assert [u.tenant for u in after.usage] == ["t1"]
    assert after.pending == 0


def test_a_summary_row_says_the_most_cpu_and_memory_one_node_has() -> None:
    """Two 1-GPU tasks of 48 cores (FGD puts them on two nodes) and two 8-GPU ones of 90 cores
    on the other two: the 1-GPU row has 14 slots and 96 cores in total, but no node more than
    48 (a task of 64 cores fits none, which the totals cannot say); with every job held, the
    held ones are taken off the totals and the bound never says more than the totals."""
    drv = shard("a")
    drv.feed(*[dispatched(f"big{i}", "a", seq=i + 1, cpu=48_000) for i in range(2)])
    drv.decide()
    row = {(f.gpu_model, f.gpus): f for f in cell_summary(drv.state, "a", 0, 1).free}[("A100", 1)]
    got = (row.slots, row.cpu_milli, row.node_cpu_milli, row.node_mem_mib)
    assert got == (30, 3 * 96_000, 96_000, 786_432)
    drv.feed(*[dispatched(f"full{i}", "a", seq=3 + i, gpus=8, cpu=90_000) for i in range(2)])
    drv.decide()
    row = {(f.gpu_model, f.gpus): f for f in cell_summary(drv.state, "a", 0, 2).free}[("A100", 1)]
    assert (row.slots, row.cpu_milli, row.node_cpu_milli) == (14, 96_000, 48_000)
    drv = shard("a")
    drv.feed(*[dispatched(f"h{i}", "a", seq=i + 1, cpu=90_000, mem=786_000) for i in range(4)])  # held
    row = {(f.gpu_model, f.gpus): f for f in cell_summary(drv.state, "a", 0, 1).free}[("A100", 1)]
    assert (row.slots, row.cpu_milli, row.node_cpu_milli, row.mem_mib, row.node_mem_mib) == (
        28, 24_000, 24_000, 4 * 432, 4 * 432)


def test_a_summary_of_a_cell_the_shard_never_saw_is_empty() -> None:
    s = cell_summary(State(), "nowhere", 0, 1)
    assert (s.total, s.free, s.usage, s.pending, s.dispatched_seq) == (s.total.__class__(), (), (), 0, 0)


def test_when_a_summary_is_due() -> None:
    rule = SummaryRule(every_ms=5_000, material_milli=125)
    first = cell_summary(shard("a").state, "a", 0, 1)

    def later(ms: int, **rows: int) -> CellSummary:
        free = [msgspec.structs.replace(f, slots=rows.get(f"b{f.gpus}", f.slots)) for f in first.free]
        return msgspec.structs.replace(first, at_ms=first.at_ms + ms, free=tuple(f for f in free if f.slots))

    assert summary_due(None, first, rule)
    assert not summary_due(first, later(4_999), rule)
    assert summary_due(first, later(5_000), rule)  # at least every every_ms
    assert not summary_due(first, later(1, b1=29), rule)  # 32 -> 29: under 1/8
    assert summary_due(first, later(1, b1=28), rule)  # 32 -> 28: 1/8
    assert summary_due(first, later(1, b8=3), rule)
    assert summary_due(first, later(1, b8=0), rule)  # a row gone
    grown = msgspec.structs.replace(first, total=Resources(cpu_milli=1))
    assert summary_due(first, grown, rule)  # a node up, down or reshaped


def test_the_cuts_at_and_past_the_bounds() -> None:
    free = [FreeSlots(f"m{i:04d}", 1, i + 1, 0, 0) for i in range(MAX_SUMMARY_ENTRIES)]
    assert cut_free(free) == free
    more = [*free, FreeSlots("m9999", 1, 0, 0, 0), FreeSlots("z", 2, 10**6, 0, 0)]
    cut = cut_free(sorted(more, key=lambda f: (f.gpu_model, f.gpus)))
    assert len(cut) == MAX_SUMMARY_ENTRIES
    assert cut[-1].gpu_model == "z"
    assert {f.gpu_model for f in cut} == {f.gpu_model for f in free[1:]} | {"z"}  # fewest slots cut
    usage = [TenantUsage(f"t{i:05d}", i, 0, 0) for i in range(MAX_SUMMARY_TENANTS)]
    assert cut_usage(usage) == usage
    big = [*usage, TenantUsage("zz", 0, 0, 1000)]
    got = cut_usage(big)
    assert len(got) == MAX_SUMMARY_TENANTS
    assert got[-1].tenant == "zz"
    assert got[0].tenant == "t00001"
    at_bound = CellSummary(cell="a", partition=0, seq=1, as_of=0, at_ms=0, total=Resources(),
                           free=tuple(cut), usage=tuple(got))  # fmt: skip
    assert msgspec.json.decode(msgspec.json.encode(at_bound), type=CellSummary) == at_bound


def test_a_summary_with_many_tenants_is_cut_to_the_bound() -> None:
    drv = Driver(Policy(), CoreConfig(cells=("a",)))
    drv.feed(node("n0", gpus=0, cpu=10**9, mem=10**9, cell="a"))
    n = MAX_SUMMARY_TENANTS + 3
    drv.feed(*[job(f"j{i}", tenant=f"t{i:05d}", gpus=0, cpu=1 + i) for i in range(n)], check_each=False)
    drv.decide()
    s = cell_summary(drv.state, "a", 0, 1)
    assert len(s.usage) == MAX_SUMMARY_TENANTS
    assert s.usage[0].tenant == "t00003"


# --- the round trip with the dispatcher -----------------------------------------------------------


class Fleet:
    """The dispatcher and two cell shards (a: racks of 2 nodes; b: one rack of 4), joined by
    pure functions only: what the loops will carry between partitions, carried by hand."""

    def __init__(self) -> None:
        self.dispatcher = d.DispatchState(d.CellMap((("a", 0), ("b", 1))))
        self.cells = {"a": shard("a"), "b": Driver(Policy(), CoreConfig(hold_ms=HOLD, cells=("b",)))}
        self.cells["b"].feed(*[node(f"b-n{i}", cell="b", rack="r0") for i in range(4)])
        self.seq = {"a": 0, "b": 0}
        self.since = {"a": 0, "b": 0}
        self.log: list[str] = []

    def to_dispatcher(self, event: object) -> None:
        assert d.fold(self.dispatcher, event, self.dispatcher.now_ms + 1) == ""

    def summarise(self) -> None:
        for cell, drv in sorted(self.cells.items()):
            self.seq[cell] += 1
            s = cell_summary(drv.state, cell, {"a": 0, "b": 1}[cell], self.seq[cell])
            self.to_dispatcher(s)
            self.log.append(msgspec.json.encode(s).decode())

    def step(self, advance_ms: int = 0) -> None:
        """One dispatcher step, the dispatches folded in their cells, a decide in every cell,
        its returns folded by the dispatcher, then fresh summaries."""
        step = d.dispatch(self.dispatcher)
        for e in step.dispatched:
            self.cells[e.cell].feed(e, step_ms=0)  # (written together: one log time)
            self.log.append(f"dispatch {e.job.job_id} {e.cell} {e.attempt}")
        for cell, drv in sorted(self.cells.items()):
            if advance_ms:
                drv.feed(node(f"{cell}-n0", cell=cell, rack="r0"), step_ms=advance_ms)
            for dec in drv.decide():
                self.log.append(msgspec.json.encode(dec).decode())
            for r in returns(drv.state, self.since[cell]):
                self.to_dispatcher(r)
                self.log.append(msgspec.json.encode(r).decode())
            self.since[cell] = drv.state.offset
            self.log.append(f"{cell} {digest(drv.state)}")
        self.summarise()

    def holders(self, job_id: str) -> list[str]:
        """The cells where ``job_id`` is pending or running."""
        live = (JobState.PENDING, JobState.RUNNING)
        out = []
        for cell, drv in sorted(self.cells.items()):
            row = drv.state.job_row(job_id)
            if row >= 0 and JobState(int(drv.state.jobs.cols["state"][row])) in live:
                out.append(cell)
        return out


def round_trip() -> Fleet:
    """A gang allowed in both cells that cell a (racks of 2) cannot place: dispatched to a (the
    tie goes to the smaller id), handed back after the hold, re-dispatched to b, placed there;
    and a one-GPU job that stays in its cell."""
    fleet = Fleet()
    fleet.summarise()
    fleet.to_dispatcher(job("g", tasks=3, gpus=8, topology="rack", cells=("a", "b")))
    fleet.to_dispatcher(job("small", gpus=1, cells=("a",)))
    fleet.step()
    assert fleet.holders("g") == ["a"]
    assert fleet.holders("small") == ["a"]
    fleet.step(advance_ms=HOLD - 1)  # not yet
    assert fleet.holders("g") == ["a"]
    fleet.step(advance_ms=1)  # at the bound: handed back, dispatched to b next step
    assert fleet.holders("g") == []
    fleet.step()
    assert fleet.holders("g") == ["b"]
    return fleet


def test_a_job_cell_a_cannot_place_is_handed_back_and_placed_in_cell_b() -> None:
    fleet = round_trip()
    a, b = fleet.cells["a"].state, fleet.cells["b"].state
    assert JobState(int(b.jobs.cols["state"][b.job_row("g")])) == JobState.RUNNING
    assert JobState(int(a.jobs.cols["state"][a.job_row("g")])) == JobState.RETURNED
    assert fleet.dispatcher.jobs["g"].attempt == 2
    assert fleet.dispatcher.jobs["g"].cell == "b"
    returned = [line for line in fleet.log if '"JobReturned"' in line]
    assert len(returned) == 1
    assert '"never_fits"' in returned[0]
    summary_b = fleet.dispatcher.summaries["b"]
    assert {(f.gpu_model, f.gpus): f.slots for f in summary_b.free}.get(("A100", 8), 0) == 1
    assert summary_b.dispatched_seq == 1
    assert [u.tenant for u in summary_b.usage] == ["t1"]
    summary_a = fleet.dispatcher.summaries["a"]
    assert {(f.gpu_model, f.gpus): f.slots for f in summary_a.free}[("A100", 8)] == 3  # small: 1 GPU
    for drv in fleet.cells.values():
        check(drv.state)


def test_a_summary_counts_a_held_job_until_it_is_handed_back() -> None:
    fleet = Fleet()
    fleet.summarise()
    fleet.to_dispatcher(job("g", tasks=3, gpus=8, topology="rack", cells=("a", "b")))
    fleet.step()
    held = fleet.dispatcher.summaries["a"]
    assert {(f.gpu_model, f.gpus): f.slots for f in held.free}[("A100", 8)] == 1  # 4 less 3 held
    assert held.pending == 1
    assert held.usage[0].gpu_milli == 24_000


def test_a_job_is_never_held_by_two_cells_over_a_long_run() -> None:
    fleet = Fleet()
    fleet.summarise()
    for i in range(12):
        fleet.to_dispatcher(job(f"g{i}", tasks=3, gpus=8, topology="rack", cells=("a", "b")))
        fleet.to_dispatcher(job(f"s{i}", gpus=2, cells=("a", "b")))
    for k in range(30):
        fleet.step(advance_ms=HOLD // 3 if k % 2 else 7)
        for name in [f"{p}{i}" for p in "gs" for i in range(12)]:
            assert len(fleet.holders(name)) <= 1, name
            held = fleet.dispatcher.jobs[name]
            if fleet.holders(name):
                assert (held.status, held.cell) == (d.HELD, fleet.holders(name)[0]), name
    assert any("JobReturned" in line for line in fleet.log)


def transcript() -> str:
    """The digest of everything the round trip wrote (decisions, returns, summaries, digests)."""
    return hashlib.sha256("\n".join(round_trip().log).encode()).hexdigest()


def test_the_same_inputs_give_the_same_returns_summaries_and_digests_under_another_hash_seed() -> None:
    here = transcript()
    assert here == transcript()
    code = "from tests.core.test_cellshard import transcript; print(transcript())"
    for hash_seed in ("1", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(ROOT)}
        out = subprocess.run(
            [sys.executable, "-c", code],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
        )
        assert out.stdout.split() == [here]
