"""decide's shortcuts give exactly the decisions of its general path.

Three states are fed the same seeded inputs and asked to decide at the same points:
- the normal one, which keeps node-score memos from one call to the next (``decide_memo``)
  and places one-task jobs with ``kernels.place_run`` (``place_singles``);
- one whose memos are dropped before every call;
- one with ``place_singles`` turned off, whose every job goes through ``schedule_job``.

Their decisions must be equal at every step, and so must their digests. The scenarios mix
one-task jobs of many shapes with gangs, topology, allowed cells, preemption, nodes that go
down, come back or change shape, and tasks that finish — the things that end a fast run.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Iterator
from contextlib import contextmanager

import msgspec
import numpy as np
import pytest

from fleetlog.core import decide as decide_module
from fleetlog.core import kernels
from fleetlog.core.decide import decide
from fleetlog.core.digest import digest
from fleetlog.core.fold import fold
from fleetlog.core.invariants import check
from fleetlog.core.memo import Memos
from fleetlog.core.policy import Policy, policy_named, with_typical_pods
from fleetlog.core.state import CoreConfig, State
from fleetlog.events import DecisionBatch, Event, TaskFinished
from fleetlog.events.model import (
    JobPlaced,
    JobSubmitted,
    NodeHeartbeat,
    NodeLabel,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    PreferredTerm,
    Taint,
    Toleration,
)
from tests.core.budget import seeds
from tests.core.builders import job, node

CONFIG = CoreConfig(node_timeout_ms=60_000, shape_window=64, shape_mix_every=16)


@contextmanager
def general_path_only() -> Iterator[None]:
    """No batch twin: every job through ``schedule_job``, the turns one tenant at a time."""
    original = decide_module.place_singles
    decide_module.place_singles = lambda sc, run, at, stop=False: at  # type: ignore[assignment]
    decide_module.MERGED_RUNS = False
    try:
        yield
    finally:
        decide_module.place_singles = original
        decide_module.MERGED_RUNS = True


def inputs(
    rng: random.Random, step: int, placed: list[str], cells: int, tenants: int = 1, constraints: bool = False
) -> list[Event]:
    """Some arrivals, finishes and node changes, seeded; with ``constraints``, nodes with
    labels and taints (some cordoned or tainted ``NoExecute`` later) and jobs with selectors,
    affinity, tolerations and soft affinity (gangs of two classes among them, gangs spread one
    task a host)."""
    events: list[Event] = []
    if step == 0:
        for i in range(12):
            hb = node(f"n{i}", gpus=(2, 4, 8)[i % 3], cpu=(16_000, 64_000)[i % 2], cell=f"c{i % cells}")
            events.append(node_attrs(rng, hb) if constraints else hb)
    for k in range(rng.randint(1, 12)):
        name = f"s{step}-{k}"
        kind = rng.random()
        tenant = f"t{rng.randrange(tenants) + 1}"
        if kind < 0.75:  # one task, many shapes (some fractional)
            gpus = rng.choice([0, 1, 1, 1, 2, 4])
            milli = rng.choice([250, 500, 700, 1000]) if gpus == 1 else 1000
            events.append(
                job(
                    name,
                    tenant=tenant,
                    gpus=gpus,
                    milli=milli,
                    cpu=rng.choice([1_000, 4_000, 12_000]),
                    priority=rng.choice([0, 0, 1]),
                )
            )
        elif kind < 0.85:
            tasks = rng.randint(2, 3)
            events.append(job(name, tenant=tenant, tasks=tasks, gpus=rng.choice([1, 2]), cpu=2_000))
        elif kind < 0.92:
            events.append(job(name, tenant=tenant, tasks=2, gpus=1, topology="rack"))
        else:
            allowed = rng.choice([("c0",), ("c0",), ("c9",), ("c0", "c9")])  # (c9: a cell of no node)
            events.append(job(name, gpus=1, milli=500, cells=allowed))
        if constraints and rng.random() < 0.6:
            events[-1] = constrain(rng, events[-1])  # type: ignore[arg-type]
    for _ in range(rng.randint(0, 6)):
        if placed:
            events.append(TaskFinished(job_id=placed.pop(rng.randrange(len(placed))), task_index=0))
    if rng.random() < 0.2:  # a node goes down, comes back, or changes shape
        i = rng.randrange(12)
        hb = node(
            f"n{i}", gpus=rng.choice([2, 4, 8]), cpu=64_000, healthy=rng.random() < 0.6, cell=f"c{i % cells}"
        )
        events.append(node_attrs(rng, hb) if constraints else hb)
    if constraints and rng.random() < 0.3:  # new labels, taints or a cordon, same shape
        i = rng.randrange(12)
        shape = {"gpus": (2, 4, 8)[i % 3], "cpu": (16_000, 64_000)[i % 2], "cell": f"c{i % cells}"}
        events.append(node_attrs(rng, node(f"n{i}", **shape)))  # type: ignore[arg-type]
    return events


ZONES = ("a", "b", "c")


def node_attrs(rng: random.Random, hb: NodeHeartbeat) -> NodeHeartbeat:
    """``hb`` with random labels, taints and maybe a cordon."""
    taints = []
    if rng.random() < 0.4:
        taints.append(Taint(key="gpu", value="present", effect="NoSchedule"))
    if rng.random() < 0.1:
        taints.append(Taint(key="maint", effect="NoExecute"))
    return msgspec.structs.replace(
        hb,
        labels={"zone": rng.choice(ZONES), **({"fast": "yes"} if rng.random() < 0.5 else {})},
        taints=tuple(taints),
        unschedulable=rng.random() < 0.08,
    )


def constrain(rng: random.Random, j: JobSubmitted) -> JobSubmitted:
    """``j`` with random constraints on each group (a gang may get a second class)."""
    groups = list(j.task_groups)
    if groups[0].count > 1 and rng.random() < 0.5:  # split the gang: two groups, two classes
        g = groups[0]
        groups = [msgspec.structs.replace(g, count=1), msgspec.structs.replace(g, count=g.count - 1)]
    out = []
    for g in groups:
        fields: dict[str, object] = {}
        if rng.random() < 0.6:
            fields["tolerations"] = (Toleration(key="gpu", operator="Exists"),) + (
                (Toleration(key="maint", operator="Exists"),) if rng.random() < 0.3 else ()
            )
        if rng.random() < 0.3:
            fields["node_selector"] = (NodeLabel("zone", rng.choice(ZONES)),)
        if rng.random() < 0.3:
            op = rng.choice(["In", "NotIn", "Exists", "DoesNotExist"])
            values = (rng.choice(ZONES),) if op in ("In", "NotIn") else ()
            key = "zone" if values else "fast"
            fields["node_affinity"] = (NodeSelectorTerm((NodeSelectorRequirement(key, op, values),)),)  # type: ignore[arg-type]
        if rng.random() < 0.3:  # soft affinity: a zone, maybe also the fast nodes, weighed
            zone = NodeSelectorTerm((NodeSelectorRequirement("zone", "In", (rng.choice(ZONES),)),))
            fast = NodeSelectorTerm((NodeSelectorRequirement("fast", "Exists"),))
            fields["preferred_affinity"] = (PreferredTerm(rng.choice([1, 10, 100]), zone),) + (
                (PreferredTerm(rng.choice([1, 10]), fast),) if rng.random() < 0.5 else ()
            )
        out.append(msgspec.structs.replace(g, **fields))
    spread = "host" if sum(g.count for g in out) > 1 and rng.random() < 0.3 else None
    return msgspec.structs.replace(j, task_groups=tuple(out), spread=spread)


def run_three(
    policy: Policy, seed: int, cells: int = 1, steps: int = 40, tenants: int = 1, constraints: bool = False
) -> int:
    """Feed three states alike; compare their decisions at every step; how many placements."""
    rng = random.Random(seed)
    normal, forgetful, general = State(CONFIG), State(CONFIG), State(CONFIG)
    placed: list[str] = []
    now, total = 1_000, 0
    for step in range(steps):
        for event in inputs(rng, step, placed, cells, tenants, constraints):
            now += 1
            for state in (normal, forgetful, general):
                fold(state, event, now)
        forgetful.derived.decide_memo = None
        with general_path_only():
            expected = decide(general, policy)
        got = decide(normal, policy)
        assert got == expected, f"seed {seed} step {step}: the fast path decided otherwise"
        assert decide(forgetful, policy) == expected, (
            f"seed {seed} step {step}: remembered scores changed a decision"
        )
        batch = DecisionBatch(as_of=normal.offset, digest=digest(normal), decisions=tuple(got))
        for state in (normal, forgetful, general):
            fold(state, batch, now)
        check(normal)
        assert digest(normal) == digest(forgetful) == digest(general)
        newly = [d.job_id for d in got if isinstance(d, JobPlaced) and len(d.tasks) == 1]
        placed.extend(newly)
        total += len(newly)
    return total


POLICIES = {
    "default": Policy(),
    "default-fail-unplaced": Policy(fail_unplaced=True),
    "best-fit": Policy(name="best-fit", scoring="best-fit"),
    "no-preemption": Policy(preemption=False, reclaim=False, reserve=False),
    "fgd": policy_named("fgd"),  # the published rule, on the window's mix cut at 95%
    "fgd-typical": with_typical_pods(  # the published rule on typical pods given for the run
        policy_named("fgd", fail_unplaced=True), ((1, 1000, 2000, 5), (1, 500, 1000, 3), (0, 0, 1000, 2))
    ),
}


@pytest.mark.parametrize("name", sorted(POLICIES))
@pytest.mark.parametrize("seed", seeds([1, 2, 3]))
def test_fast_paths_decide_as_the_general_path(name: str, seed: int) -> None:
    assert run_three(POLICIES[name], seed) > 20  # (the scenario does place: the test is not vacuous)


@pytest.mark.parametrize("name", sorted(POLICIES))
@pytest.mark.parametrize("seed", seeds([1, 2, 3]))
def test_merged_runs_of_several_tenants_decide_as_the_turns_one_tenant_at_a_time(
    name: str, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three tenants: the turns foreseen and placed as merged runs (``decide.merged``) against
    the turns taken one at a time by the general path; merged runs did run, and ended both
    ways (every job placed, and one not placed)."""
    ends: list[bool] = []
    original = decide_module.merged

    def counted(sc: object, run: np.ndarray) -> tuple[int, bool]:
        used, placed = original(sc, run)  # type: ignore[arg-type]
        ends.append(used == run.size and placed)
        return used, placed

    monkeypatch.setattr(decide_module, "merged", counted)
    assert run_three(POLICIES[name], seed, tenants=3, steps=60) > 20
    assert True in ends  # a run placed whole
    assert False in ends  # a run that ended at a job not placed


@pytest.mark.parametrize("name", sorted(POLICIES))
@pytest.mark.parametrize("seed", seeds([1, 2]))
def test_fast_paths_decide_as_the_general_path_with_constraints(name: str, seed: int) -> None:
    """Selectors, affinity, taints, tolerations, cordons and NoExecute evictions on the way:
    one-task jobs of one class run through place_singles, gangs of two classes through node kinds."""
    assert run_three(POLICIES[name], seed, constraints=True, steps=60) > 10


@pytest.mark.parametrize("seed", seeds([6, 7]))
def test_two_cells_with_constraints_decide_as_the_general_path(seed: int) -> None:
    assert run_three(Policy(), seed, cells=2, constraints=True) > 10


@pytest.mark.parametrize("seed", seeds([4, 5]))
def test_fast_paths_with_two_cells_decide_as_the_general_path(seed: int) -> None:
    """Two cells: no fast path, but remembered scores still must not change a decision."""
    assert run_three(Policy(), seed, cells=2) > 20


def test_memos_keep_at_most_their_limit_of_shapes_and_reuse_slots() -> None:
    memos = Memos(nodes=3, limit=2)
    a, b, c = (1, 0, 0, 0, 0), (2, 0, 0, 0, 0), (3, 0, 0, 0, 0)
    assert (memos.slot(a), memos.slot(b)) == (0, 1)
    memos.store[0] = 7
    assert memos.slot(a) == 0  # a is now the most recently used: b goes first
    assert memos.slot(c) == 1
    assert list(memos.slots) == [a, c]
    assert (memos.store[1] == -1).all()  # b's rows reset for c
    assert (memos.store[0] == 7).all()  # a's rows kept


def test_place_run_places_as_best_node_memo_then_pick_gpus() -> None:
    """The run kernel = best_node_memo, pick_gpus and taking the resources, job after job."""
    rng = np.random.default_rng(7)
    n = 40
    cpu = rng.integers(4_000, 64_000, n).astype(np.int64)
    mem = np.full(n, 1 << 20, np.int64)
    count = rng.choice([2, 4, 8], n).astype(np.int32)
    gpu_free = np.where(np.arange(8) < count[:, None], rng.choice([0, 300, 700, 1000], (n, 8)), 0).astype(
        np.int16
    )
    model = np.zeros(n, np.int32)
    shapes = np.array(
        [[1, 1000, 8_000, 9], [1, 500, 4_000, 5], [2, 1000, 16_000, 2], [1, 250, 2_000, 4]], np.int64
    )
    cands = np.arange(n, dtype=np.int64)
    tasks_list = [
        (int(rng.choice([2_000, 8_000])), 1024, 1, int(rng.choice([250, 500, 1000])), 0) for _ in range(60)
    ]
    for policy in (kernels.FGD, kernels.BEST_FIT):
        ref = [cpu.copy(), mem.copy(), gpu_free.copy(), count, model]
        ref_version, ref_memos = np.zeros(n, np.int64), Memos(n, 8)
        expect: list[tuple[int, int]] = []
        for t in tasks_list:
            memo = ref_memos.rows(t)
            got = kernels.best_node_memo(
                cands, *ref, *t[:4], np.uint64(t[4]), policy, shapes, ref_version, memo
            )
            if got < 0:
                break
            mask = int(kernels.pick_gpus(ref[2][got], int(count[got]), t[2], t[3]))
            ref[0][got] -= t[0]
            ref[1][got] -= t[1]
            for g in range(8):
                if mask >> g & 1:
                    ref[2][got, g] -= t[3]
            ref_version[got] += 1
            expect.append((int(got), mask))
        free = [cpu.copy(), mem.copy(), gpu_free.copy()]
        total = free[2].sum(axis=1, dtype=np.int64)
        version, memos = np.zeros(n, np.int64), Memos(n, 8)
        rows = np.array([(*t, memos.slot(t), 0) for t in tasks_list], np.int64)
        out = np.zeros((len(tasks_list), 2), np.int64)
        table = kernels.floor_table(shapes)
        run = functools.partial(
            kernels.place_run, cands, *free, total, count, model, policy, shapes, table, version, memos.store
        )
        buffer = np.empty((n, 3), np.int64)
        placed = run(rows, out, buffer)
        assert placed == len(expect) > 10
        assert [(int(a), int(b)) for a, b in out[:placed]] == expect
        assert (free[2] == ref[2]).all()
        assert (free[0] == ref[0]).all()
        assert (total == free[2].sum(axis=1)).all()
        rows[3, kernels.RUN_SKIP] = 1  # a job marked to skip stops the run there
        assert run(rows, out, buffer) <= 3


def test_shape_mix_is_taken_at_doublings_then_at_intervals() -> None:
    """The mix FGD scores against moves at 1, 2, 4, ... tasks until the window is full, then
    every ``shape_mix_every`` tasks — not at every submission."""
    state = State(CoreConfig(shape_window=8, shape_mix_every=4))
    taken: list[int] = []
    for i in range(20):
        before = state.shape_mix
        fold(state, job(f"j{i}", gpus=1, milli=(250, 500)[i % 2], cpu=1_000 * (i + 1)), i + 1)
        if state.shape_mix != before or i == 0:
            taken.append(state.shapes_seen)
    assert taken == [1, 2, 4, 8, 12, 16, 20]
    gpus_milli = {(g, m) for g, m, _, _ in state.shape_mix}
    assert gpus_milli == {(1, 250), (1, 500)}
    assert sum(n for *_, n in state.shape_mix) == 8  # the window's count
