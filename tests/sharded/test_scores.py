"""The dispatcher's fast choice of cell (``fleetlog.core.dispatch.Scores``: a heap per job shape
and tenant) against its plain twin (every candidate cell, a ``take`` on a copy), on generated
rooms with several models, gangs, jobs without GPUs, ties, cells that fill up and tenants with
shares of the cells (``Spread``); and the room rule
(``_draw``: a smaller task costs ``gpus / bucket`` of a larger bucket's slot, carried)."""

from __future__ import annotations

import functools
import random

import pytest

from fleetlog.core import dispatch as d
from tests.core.builders import job
from tests.sharded.test_driver import World, scenario

MODELS = ("A100", "H100", "T4")


def spread() -> list[str]:
    """Ten one-GPU jobs in one step over two equal cells: where each went."""
    w = World({"a": (1, 2), "b": (1, 2)})
    w.fleet.submit(*[job(f"j{i}") for i in range(10)])
    return [e.cell for e in w.step().dispatched]


def random_room(rng: random.Random, cpus: random.Random | None = None) -> d.Room:
    """A cell's room as a summary would give it: nodes of a few models, some GPUs taken, some
    CPU (drawn from ``cpus``, else ``rng``)."""
    cpus = rng if cpus is None else cpus
    room: d.Room = {}
    for model in rng.sample(MODELS, rng.randint(0, 3)):
        # whole free GPUs and free CPU per node (a node may lack the CPU a task needs)
        nodes = [(rng.randint(0, 8), cpus.choice((8_000, 32_000, 96_000))) for _ in range(rng.randint(0, 6))]
        for b in (1, 2, 4, 8):
            slots = sum(n // b for n, _ in nodes)
            free = [c for n, c in nodes if n >= b]
            if slots:
                room[(model, b)] = [slots, sum(free), 786_432 * len(free), 0, max(free), 786_432]
        cpu = sum(c for _, c in nodes)
        room[(model, 0)] = [cpu, cpu, 786_432 * len(nodes), 0, max((c for _, c in nodes), default=0), 786_432]
    if rng.random() < 0.5:
        room[("", 0)] = [rng.randint(0, 200_000), 200_000, 1_000_000, 0, 100_000, 500_000]
    return {k: v for k, v in room.items() if v[0] > 0}


def random_spread(rng: random.Random, cells: list[str]) -> d.Spread:
    """Tenants 0..2 with some usage in some cells (a cell's total may be 0 in a resource: not
    counted then)."""
    totals = {c: (rng.choice((0, 96_000)) * n, 786_432 * n, rng.choice((0, 8_000)) * n)
              for c in cells for n in [rng.randint(1, 6)]}
    used = {(c, t): [rng.randrange(0, 96_000), 0, rng.randrange(0, 16_000)]
            for c in cells for t in range(3) if rng.random() < 0.4}
    return d.Spread(totals, used)


def random_spec(rng: random.Random, i: int) -> d.JobSubmitted:
    gpus = rng.choice((0, 1, 1, 2, 3, 4, 8))
    models = tuple(sorted(rng.sample(MODELS, rng.randint(1, 2)))) if rng.random() < 0.3 else ()
    return job(f"x{i}", gpus=gpus, milli=1000 if gpus else 0, tasks=rng.choice((1, 1, 1, 2, 5)),
               cpu=rng.choice((1_000, 16_000, 48_000)), models=models)


@pytest.mark.parametrize("seed", range(12))
def test_the_heap_chooses_as_the_plain_loop_over_every_cell(seed: int) -> None:
    """The same cell for every job (or none), and the same rooms after, over a step of jobs of
    a few shapes dispatched until the cells are full; at the limits: no cell, one cell, many."""
    rng = random.Random(seed)
    n = (0, 1, 2, 7, 64)[seed % 5]
    cpus = random.Random(-seed)  # the nodes' CPU: the same rooms otherwise as before it was drawn
    rooms = {f"c{i:03}": random_room(rng, cpus) for i in range(n)}
    if seed % 3 == 0:  # ties everywhere
        rooms = {c: {k: list(v) for k, v in rooms["c000"].items()} for c in rooms} if rooms else {}
    plain = {c: {k: list(v) for k, v in r.items()} for c, r in rooms.items()}
    who = random.Random(-seed)  # the tenants' draws: the rooms and shapes as without them
    spread = random_spread(who, sorted(rooms))
    twins = d.Spread(dict(spread.totals), {k: list(v) for k, v in spread.used.items()})
    fast, twin = d.Scores(rooms, spread=spread), d.Scores(plain, remember=False, spread=twins)
    shapes = [random_spec(rng, i) for i in range(6)]
    chosen = []
    for i in range(600):
        spec, tenant = rng.choice(shapes), who.randrange(-1, 3)
        cell = fast.best(spec, tenant=tenant)
        assert cell == twin.best(spec, tenant=tenant), (i, spec, tenant)
        if cell:
            demand = (spec.task_groups[0].cpu_milli, 0, 1000 * spec.task_groups[0].gpu_count)
            fast.take(cell, spec, tenant, demand)
            twin.take(cell, spec, tenant, demand)
        chosen.append(cell)
        assert rooms == plain
        assert spread.used == twins.used
    if n:
        assert any(chosen)
        assert seed % 3 == 0 or n < 2 or len(set(chosen)) > 2


def test_a_run_with_the_heap_dispatches_as_the_plain_one(monkeypatch: pytest.MonkeyPatch) -> None:
    fast = scenario(11), spread()
    assert fast[1] == ["a", "b"] * 5
    monkeypatch.setattr(d, "Scores", functools.partial(d.Scores, remember=False))
    assert (scenario(11), spread()) == fast


def test_the_twin_test_can_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    """A heap that misses a cell's change (its room taken, its entry not recomputed) keeps
    choosing that cell (on the per-job path: ``spread``'s equal jobs would take the fast one)."""
    class Stale(d.Scores):
        def take(self, cell: str, spec: d.JobSubmitted, tenant: int = -1,
                 demand: tuple[int, int, int] = (0, 0, 0)) -> None:
            d.take(self.room[cell], spec, commit=True)

    monkeypatch.setattr(d, "Scores", Stale)
    monkeypatch.setattr(d, "run_least", lambda cells: 10**9)
    assert spread() == ["a"] * 10


def test_a_smaller_task_costs_a_share_of_a_larger_slot() -> None:
    """Eight 1-GPU tasks take one 8-GPU slot and two 4-GPU slots (not eight of each); a 4-GPU
    task takes half an 8-GPU slot; the fraction is carried until it makes a whole slot."""
    room: d.Room = {("A100", b): [16 // b, 64_000, 500_000, 0, 32_000, 250_000] for b in (1, 2, 4, 8)}
    for _ in range(7):
        assert d.take(room, job("x", gpus=1), commit=True)
    assert {b: room[("A100", b)][0] for b in (1, 2, 4, 8)} == {1: 9, 2: 5, 4: 3, 8: 2}
    assert d.take(room, job("y", gpus=1), commit=True)
    assert {b: room[("A100", b)][0] for b in (1, 2, 4, 8)} == {1: 8, 2: 4, 4: 2, 8: 1}
    assert d.take(room, job("z", gpus=4), commit=True)
    assert {b: (room[("A100", b)][0], room[("A100", b)][3]) for b in (1, 2, 4, 8)} == {
        1: (4, 0), 2: (2, 0), 4: (1, 0), 8: (1, 4)}  # half of the last 8-GPU slot owed
    assert not d.take(room, job("g", gpus=4, tasks=2), commit=False)  # a gang: both or none
    assert d.take(room, job("w", gpus=4), commit=False)


def test_the_score_is_the_largest_row_the_jobs_largest_task_may_draw_on() -> None:
    """The most free slots in one row of the task's bucket and models (not the rows' sum): a
    1-GPU job goes where one model's row is largest, a job limited to A100 by A100 rows only,
    a gang by its largest task's bucket, a job without GPUs by the bucket-0 rows."""
    big = [10**6, 10**7, 0, 10**5, 10**6]
    a = {("A100", 1): [4, *big], ("T4", 1): [7, *big], ("V100", 1): [7, *big], ("T4", 0): [5_000, *big],
         ("A100", 8): [2, *big]}
    b = {("A100", 1): [8, *big], ("A100", 0): [9_000, *big], ("A100", 8): [1, *big]}
    scores = d.Scores({"a": a, "b": b})
    assert d.room_for(a, d.kind_of(job("any", gpus=1))) == 7  # (not 4 + 7 + 7)
    assert scores.best(job("any", gpus=1)) == "b"  # 8 in one row against 7
    assert scores.best(job("t4", gpus=1, models=("T4", "V100"))) == "a"
    assert scores.best(job("big", gpus=8)) == "a"  # two 8-GPU slots against one
    assert scores.best(job("cpu", gpus=0, milli=0)) == "b"  # 9,000 against 5,000
    assert d.kind_of(job("mixed", gpus=1)) == (1, None)


def test_a_run_of_equal_jobs_drawn_at_once_leaves_the_room_drawing_each_leaves() -> None:
    """``_take_all`` (how a summary's room is less what is in flight): runs of equal one-group
    jobs drawn as one, against ``take`` job by job, on rooms that run out of slots, CPU or
    memory on the way (and past: jobs that no longer fit, gangs half drawn), with carried
    shares of larger slots, other shapes and multi-group jobs between the runs."""
    ran_out = 0
    for seed in range(40):
        rng = random.Random(seed)
        room = random_room(rng)
        if seed % 4 == 0:  # CPU or memory, not slots, is what runs out
            room = {k: [v[0], v[1] // 9, v[2] // 40, v[3], v[4] // 9, v[5] // 40] for k, v in room.items()}
        shapes = [random_spec(rng, i) for i in range(3)]
        two = d.JobSubmitted(job_id="two", tenant="t", task_groups=(shapes[0].task_groups[0], d.TaskGroup(
            count=2, cpu_milli=2_000, mem_mib=1_024, gpu_count=1, gpu_milli=1000)))
        specs: list[d.JobSubmitted] = []
        while len(specs) < 300:
            specs += [rng.choice([*shapes, two])] * rng.choice((1, 1, 2, 5, 40))
        twin = {k: list(v) for k, v in room.items()}
        d._take_all(room, specs)
        for spec in specs:
            d.take(twin, spec, commit=True)
        assert room == twin, seed
        ran_out += any(v[0] == 0 or v[1] < 16_000 for k, v in room.items() if k[1])
    assert ran_out >= 20  # most rooms ran out of GPU slots or CPU on the way


def test_asking_whether_one_group_fits_answers_as_drawing_it_on_a_copy() -> None:
    """``take(commit=False)`` of one task group draws nothing (``_fits``); its twin is the draw
    itself on a copy of the room."""
    rng = random.Random(5)
    answers = set()
    for i in range(3_000):
        room, spec = random_room(rng), random_spec(rng, i)
        copy = {k: list(v) for k, v in room.items()}
        answers.add(d.take(room, spec, commit=False))
        assert d.take(room, spec, commit=False) == d.take(copy, spec, commit=True), (room, spec)
    assert answers == {True, False}
