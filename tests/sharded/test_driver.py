"""The in-process sharded driver (fleetlog/sharded, docs/scale-out.md): the dispatcher and the
cell shards joined in memory, the cross-shard invariants checked after every step."""

from __future__ import annotations

import dataclasses
import functools
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from fleetlog.core import dispatch as d
from fleetlog.core.state import JobState
from fleetlog.events import JobCancelled, JobDispatched, JobReturned, NodeHeartbeat
from fleetlog.sharded import FleetConfig, ShardedFleet, ShardInvariantError, check_fleet
from fleetlog.sharded.driver import FleetStep, returned_in
from fleetlog.sharded.procs import close_all, split_groups
from tests.core.builders import job, node

ROOT = Path(__file__).resolve().parents[2]
HOLD = 30_000


class World:
    """A fleet of cells (each: ``racks`` racks of ``per_rack`` 8-GPU nodes) whose nodes
    heartbeat whenever time moves; :meth:`step` checks every invariant after the step."""

    def __init__(self, cells: dict[str, tuple[int, int]], partitions: dict[str, int] | None = None,
                 hold_ms: int = HOLD) -> None:
        where = partitions or {c: i for i, c in enumerate(sorted(cells))}
        cell_map = d.CellMap(tuple(sorted(where.items())))
        self.fleet = ShardedFleet(FleetConfig(cell_map, hold_ms=hold_ms, check=True))
        self.beats: dict[str, list[NodeHeartbeat]] = {
            c: [node(f"{c}-n{i}", cell=c, rack=f"r{i // per}") for i in range(racks * per)]
            for c, (racks, per) in sorted(cells.items())
        }
        self.heartbeat()
        self.step()
        self.step()

    def heartbeat(self) -> None:
        for cell, beats in self.beats.items():
            self.fleet.to_cell(cell, *beats)

    def step(self, advance_ms: int = 0) -> FleetStep:
        if advance_ms:
            self.fleet.advance(advance_ms)
            self.heartbeat()
        out = self.fleet.step()
        check_fleet(self.fleet)
        return out

    def state_in(self, cell: str, job_id: str) -> JobState | None:
        partition = self.fleet.config.cells.partition_of(cell)
        assert partition is not None
        state = self.fleet.local_shards()[partition].state
        row = state.job_row(job_id)
        return None if row < 0 else JobState(int(state.jobs.cols["state"][row]))


def test_jobs_flow_end_to_end_each_placed_in_one_cell() -> None:
    w = World({"a": (2, 2), "b": (2, 2), "c": (1, 4)})
    w.fleet.submit(*[job(f"j{i}", tenant=f"t{i % 3}", gpus=(1, 2, 4)[i % 3]) for i in range(30)])
    steps = [w.step() for _ in range(4)]  # (the summaries' room is conservative: some wait a step)
    assert sum(s.placed for s in steps) == 30
    where = {e.job.job_id: e.cell for s in steps for e in s.dispatched}
    assert len(where) == 30
    assert sorted(set(where.values())) == ["a", "b", "c"]  # spread: the emptiest cell first
    for job_id, cell in where.items():
        assert w.state_in(cell, job_id) == JobState.RUNNING
        assert [c for c in "abc" if c != cell and w.state_in(c, job_id) is not None] == []
    assert w.fleet.refused == []


def test_a_job_the_first_cell_cannot_place_is_handed_back_and_placed_in_the_other() -> None:
    """Cell a (racks of 2 nodes) is chosen first (a tie goes to the smaller id) for a gang of
    3 x 8 GPUs in one rack; only b (one rack of 4) can place it."""
    w = World({"a": (2, 2), "b": (1, 4)})
    w.fleet.submit(job("g", tasks=3, gpus=8, topology="rack", cells=("a", "b")))
    first = w.step()
    assert [(e.cell, e.attempt) for e in first.dispatched] == [("a", 1)]
    assert w.state_in("a", "g") == JobState.PENDING
    assert returned_in(w.step(advance_ms=HOLD - 1).outs) == []  # a millisecond before the bound
    back = returned_in(w.step(advance_ms=1).outs)
    assert [(r.job_id, r.cell, r.attempt) for r in back] == [("g", "a", 1)]
    again = w.step()
    assert [(e.cell, e.attempt) for e in again.dispatched] == [("b", 2)]
    assert again.placed == 1
    assert w.state_in("b", "g") == JobState.RUNNING
    assert w.state_in("a", "g") == JobState.RETURNED
    for _ in range(3):
        w.step(advance_ms=HOLD)  # long past every hold: nothing moves back
    assert w.state_in("b", "g") == JobState.RUNNING


@pytest.mark.parametrize("placed", [False, True])
def test_cancellation_reaches_the_holding_cell(placed: bool) -> None:
    w = World({"a": (1, 2), "b": (2, 1)})  # b: two racks of one node
    gang = {} if placed else {"tasks": 2, "topology": "rack"}  # 2 x 8 in one rack: never fits b
    w.fleet.submit(job("j", gpus=8, cells=("b",), **gang))  # type: ignore[arg-type]
    w.step()
    assert w.state_in("b", "j") == (JobState.RUNNING if placed else JobState.PENDING)
    w.fleet.submit(JobCancelled(job_id="j"))
    step = w.step()
    assert [(cell, c.job_id) for cell, c in step.cancels] == [("b", "j")]
    assert w.state_in("b", "j") == JobState.CANCELLED
    assert w.state_in("a", "j") is None
    w.step(advance_ms=2 * HOLD)
    assert returned_in(w.step().outs) == []  # a cancelled job is not handed back
    assert w.fleet.dispatcher.jobs["j"].status == d.CANCELLED


def test_no_cell_with_room_the_jobs_wait_with_the_reason_and_go_when_room_comes() -> None:
    w = World({"a": (1, 1), "b": (1, 1)})
    w.fleet.submit(*[job(f"f{i}", gpus=8) for i in range(2)])
    assert w.step().placed == 2  # both cells full now
    w.fleet.submit(job("late", gpus=8))
    waiting = w.step().waiting
    assert [(j, code) for j, code, _ in waiting] == [("late", d.NO_ROOM)]
    assert w.step(advance_ms=HOLD).dispatched == ()


def test_a_job_allowed_in_no_mapped_cell_waits_and_is_never_dispatched() -> None:
    w = World({"a": (1, 2)})
    w.fleet.submit(job("x", cells=("gone", "z")))
    step = w.step()
    assert step.dispatched == ()
    assert [(j, code) for j, code, _ in step.waiting] == [("x", d.NO_KNOWN_CELL)]
    assert "gone" in step.waiting[0][2]


def test_a_gang_larger_than_any_cell_is_never_dispatched_nor_split() -> None:
    """Two cells of 2 nodes: 4 x 8 GPUs fit the fleet, never one cell."""
    w = World({"a": (1, 2), "b": (1, 2)})
    w.fleet.submit(job("big", tasks=4, gpus=8))
    for k in range(4):
        step = w.step(advance_ms=HOLD if k else 0)
        assert step.dispatched == ()
    assert w.fleet.dispatcher.jobs["big"].reason.startswith(d.NO_ROOM)
    assert w.state_in("a", "big") is None
    assert w.state_in("b", "big") is None


def test_bad_input_is_refused_with_a_reason_and_nothing_else_changes() -> None:
    w = World({"a": (1, 2)})
    with pytest.raises(TypeError, match="NodeHeartbeat does not go to the global partition"):
        w.fleet.submit(node("a-n0", cell="a"))
    with pytest.raises(ValueError, match="cell 'nowhere' is not in the cell map"):
        w.fleet.to_cell("nowhere", node("x"))
    w.fleet.global_in.append((JobReturned(job_id="ghost", cell="a", attempt=1, reason="x", as_of=0), 0))
    w.fleet.submit(job("ok"))
    assert w.step().placed == 1
    assert [why.split(":")[0] for _, why in w.fleet.refused] == [d.UNKNOWN_JOB]


def test_the_invariant_check_can_fail() -> None:
    """A job dispatched by hand into a second cell is live in two: the check says so."""
    w = World({"a": (1, 2), "b": (1, 2)})
    w.fleet.submit(job("j", cells=("a",)))
    w.step()
    forged = JobDispatched(job=job("j"), cell="b", attempt=1, seq=1, as_of=0)
    w.fleet.to_cell("b", forged)
    with pytest.raises(ShardInvariantError, match="'j' is live in 2 cells"):
        w.step()


def scenario(
    seed: int, two_processes: bool = False, pipeline: bool = False, share: float | None = None
) -> str:
    """A seeded run: cells of random shapes (two share a partition), jobs of random shapes,
    tenants and allowed cells, time moving past holds, a few cancellations; its digest."""
    rng = random.Random(seed)
    cells = {c: (rng.randint(1, 3), rng.randint(1, 3)) for c in "abcde"}
    where = {"a": 0, "b": 1, "c": 2, "d": 2, "e": 3}
    config = FleetConfig(d.CellMap(tuple(sorted(where.items()))), hold_ms=HOLD, keep_decisions=False,
                         pipeline=pipeline)
    groups = split_groups(config, 1, share) if two_processes else None
    fleet = ShardedFleet(config, groups)
    beats = {
        c: [node(f"{c}-n{i}", cell=c, rack=f"r{i // p}") for i in range(r * p)] for c, (r, p) in cells.items()
    }
    try:
        for k in range(12):
            fleet.advance(rng.choice((0, 5, HOLD // 2)))
            for c in sorted(beats):
                fleet.to_cell(c, *beats[c])
            allowed = [(), ("a", "b"), ("c",), ("d", "e", "zz")]
            fleet.submit(*[
                job(f"s{k}-{i}", tenant=f"t{rng.randint(0, 3)}", tasks=rng.randint(1, 3),
                    gpus=rng.choice((1, 2, 4, 8)), topology=rng.choice((None, "rack")),
                    cells=rng.choice(allowed))
                for i in range(rng.randint(0, 8))
            ])
            if k % 4 == 3:
                fleet.submit(JobCancelled(job_id=f"s{k - 2}-0"))
            fleet.step()
            if groups is None:
                check_fleet(fleet)
        fleet.run_until_idle()
        return fleet.digest()
    finally:
        close_all(groups or [])


def test_the_same_seed_gives_the_same_digest_here_in_two_processes_and_under_other_hash_seeds() -> None:
    here = scenario(7)
    assert here == scenario(7)
    assert here != scenario(8)
    assert scenario(7, two_processes=True) == here
    code = "from tests.sharded.test_driver import scenario; print(scenario(7))"
    env = {**os.environ, "PYTHONHASHSEED": "4242", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                         check=True, timeout=300)
    assert out.stdout.split() == [here]


def test_pipelined_the_same_seed_gives_the_same_digest_in_one_and_two_processes() -> None:
    """The dispatcher's step k+1 overlapping the cells' step k: another run than lock step (its
    summaries are one step staler), the same however the shards are split over processes."""
    here = scenario(7, pipeline=True)
    assert here != scenario(7)
    assert scenario(7, two_processes=True, pipeline=True) == here
    assert scenario(7, two_processes=True, pipeline=True, share=0.25) == here  # (one partition here)
    code = "from tests.sharded.test_driver import scenario; print(scenario(7, pipeline=True))"
    env = {**os.environ, "PYTHONHASHSEED": "77", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                         check=True, timeout=300)
    assert out.stdout.split() == [here]


def test_a_pipelined_fleet_checks_its_invariants_at_every_step() -> None:
    w = World({"a": (2, 2), "b": (1, 4)})
    w.fleet = ShardedFleet(dataclasses.replace(w.fleet.config, pipeline=True))
    w.heartbeat()
    for _ in range(3):
        w.step()
    w.fleet.submit(*[job(f"j{i}", tenant=f"t{i % 3}", gpus=(1, 2, 4, 8)[i % 4]) for i in range(12)])
    placed = sum(w.step(advance_ms=1_000).placed for _ in range(6))
    assert placed == 12  # (45 of the 64 GPUs)
    assert w.fleet.refused == []


def test_a_child_runs_its_warm_up_before_its_first_batch(tmp_path: Path) -> None:
    """``split_groups(..., warm=)``: each child process runs it first (the scale benchmark's child
    loads its kernels there, before the timed steps, as a role warms up before it leads)."""
    marker = tmp_path / "warm"
    config = FleetConfig(d.CellMap((("a", 0), ("b", 1))), keep_decisions=False)
    groups = split_groups(config, 1, 0.5, functools.partial(Path.touch, marker))
    try:
        fleet = ShardedFleet(config, groups)
        fleet.to_cell("b", node("b-n0", cell="b"))
        fleet.step()  # the child answered its first batch: its warm-up ran before it
        assert marker.exists()
    finally:
        close_all(groups)
