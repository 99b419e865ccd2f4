"""The fairness part of ``benchmarks/shards.py``: 4 equal-weight tenants of different shapes (1,
4 and 8 GPUs, and a CPU-heavy 1-GPU one) over 4 cells; each tenant's dominant share split over
the cells against one shard over all the nodes.

Issue 17's target is 2 points. At the benchmark's size (4 x 25 nodes, under a second) the
split gives the single shard's shares exactly since the dispatcher spreads each tenant's jobs
over the cells (``dispatch.Spread``); at 4 x 5 nodes one 8-GPU job is 5 points of the fleet,
and the split is one such job off. Without the spread: 6.5 and 7.5 points; with the first room
rule (a whole slot of every larger bucket per smaller task): far worse. A variant of three
tenants checks the summary rows' node bounds (``FreeSlots.node_cpu_milli``): 1 point with them,
3.6 without (docs/scale-out.md, "The dispatcher's decisions"). Asserted here so that the rules
cannot slide back."""

from __future__ import annotations

import functools

import pytest

from benchmarks import shards
from benchmarks.shards import fairness
from fleetlog.core import cellshard
from fleetlog.core import dispatch as d


def test_split_fairness_tracks_the_single_shard() -> None:
    result = fairness(25)
    assert result["drf_max_delta_points"] <= 2, result
    small = fairness(5)
    assert small["drf_max_delta_points"] <= 5, small  # one 8-GPU job of 20 nodes: 5 points
    shares = small["dominant_share_split"]
    assert min(shares.values()) >= 27.5  # each tenant within one job of its 30


def test_the_fairness_test_can_fail_without_the_spread(monkeypatch: pytest.MonkeyPatch) -> None:
    """The room left alone choosing the cell (the rule before the spread) misses it."""
    def room_left(self: d.Scores, cell: str, kind: d.Kind, tenant: int) -> tuple[int, int, str]:
        return 0, -d.room_for(self.room[cell], kind), cell

    monkeypatch.setattr(d.Scores, "key", room_left)
    monkeypatch.setattr(d, "Scores", functools.partial(d.Scores, remember=False))
    assert fairness(25)["drf_max_delta_points"] > 6


THREE = {"t0": (1, 4_000), "t2": (8, 24_000), "t3": (1, 48_000)}
"""A variant: three tenants (1 and 8 GPUs, and CPU-heavy 1-GPU); the split within 1 point."""


def test_three_tenants_with_the_node_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shards, "SHAPES", THREE)
    assert fairness(25)["drf_max_delta_points"] <= 1.5


def test_three_tenants_without_the_node_bounds_miss(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows bound by their totals alone (summaries before ``node_cpu_milli``): the dispatcher
    sends CPU-heavy tasks to free GPUs on nodes without the CPU, they wait there held, and the
    GPUs they hold in the summary are lost to the 1-GPU tenant (3.6 points)."""
    monkeypatch.setattr(shards, "SHAPES", THREE)
    rows = cellshard.free_rows
    totals = lambda state, up: [(*r[:5], *r[3:5]) for r in rows(state, up)]  # noqa: E731
    monkeypatch.setattr(cellshard, "free_rows", totals)
    assert fairness(25)["drf_max_delta_points"] > 3


def test_the_fairness_test_can_fail_with_the_first_room_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first room rule (a whole slot of every larger bucket per smaller task) misses it."""
    def whole_slots(room: d.Room, key: tuple[str, int], tasks: int, gpus: int, cpu: int, mem: int) -> None:
        for (m, bucket), row in room.items():
            if m != key[0]:
                continue
            if (m, bucket) == key:
                row[0] -= tasks
            elif bucket and gpus:
                row[0] = max(0, row[0] - (tasks if bucket > gpus else tasks * gpus // bucket))
            row[1] = max(0, row[1] - tasks * cpu)
            row[2] = max(0, row[2] - tasks * mem)

    monkeypatch.setattr(d, "_draw", whole_slots)
    assert fairness(5)["drf_max_delta_points"] > 10
