"""Placement kernels: numba == plain-Python reference on random clusters, plus clear cases.

Run also with ``NUMBA_DISABLE_JIT=1`` (the numba kernels then run as Python).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetlog.core import kernels as nb
from fleetlog.core import kernels_ref as ref
from fleetlog.core.kernels import BEST_FIT, CPU_BOUND_MARK, FGD, FULL_GPU, MAX_GPUS
from fleetlog.core.kernels.floor import _fgd_floor, _floor_table
from tests.core.budget import examples

Array = npt.NDArray[Any]
POLICIES = (BEST_FIT, FGD)
PROPERTY = settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ---------------------------------------------------------------- builders


@dataclass
class Cluster:
    """The node arrays of the state, built node by node."""

    cpu_free: list[int] = field(default_factory=list)
    mem_free: list[int] = field(default_factory=list)
    gpus: list[list[int]] = field(default_factory=list)
    model: list[int] = field(default_factory=list)
    domain: list[int] = field(default_factory=list)

    def node(
        self,
        cpu: int = 64_000,
        mem: int = 256_000,
        gpus: tuple[int, ...] | int = (),
        model: int = 0,
        domain: int = 0,
    ) -> Cluster:
        """Add a node; ``gpus`` is the free milli per GPU, or a count of fully free GPUs."""
        free = [FULL_GPU] * gpus if isinstance(gpus, int) else list(gpus)
        self.cpu_free.append(cpu)
        self.mem_free.append(mem)
        self.gpus.append(free)
        self.model.append(model if free else -1)
        self.domain.append(domain)
        return self

    def arrays(self) -> tuple[Array, Array, Array, Array, Array]:
        """(cpu_free, mem_free, gpu_free, gpu_count, node_model)."""
        gpu_free = np.zeros((len(self.gpus), MAX_GPUS), dtype=np.int16)
        for n, free in enumerate(self.gpus):
            gpu_free[n, : len(free)] = free
        return (
            np.array(self.cpu_free, dtype=np.int64),
            np.array(self.mem_free, dtype=np.int64),
            gpu_free,
            np.array([len(g) for g in self.gpus], dtype=np.int32),
            np.array(self.model, dtype=np.int32),
        )

    def domains(self) -> Array:
        return np.array(self.domain, dtype=np.int32)

    def all(self) -> Array:
        return np.arange(len(self.gpus), dtype=np.int64)


@dataclass(frozen=True)
class Task:
    cpu: int = 1000
    mem: int = 1024
    gpus: int = 0
    milli: int = 0
    models: int = 0

    def args(self) -> tuple[int, int, int, int, np.uint64]:
        return self.cpu, self.mem, self.gpus, self.milli, np.uint64(self.models)


def gpu_task(gpus: int = 1, milli: int = FULL_GPU, cpu: int = 1000, mem: int = 1024, models: int = 0) -> Task:
    return Task(cpu, mem, gpus, milli, models)


def gang_arrays(tasks: list[Task]) -> tuple[Array, Array, Array, Array, Array]:
    def column(name: str, dtype: type) -> Array:
        return np.array([getattr(t, name) for t in tasks], dtype=dtype)

    return (
        column("cpu", np.int64),
        column("mem", np.int64),
        column("gpus", np.int32),
        column("milli", np.int32),
        column("models", np.uint64),
    )


def shape_matrix(rows: list[tuple[int, int, int, int]]) -> Array:
    return np.array(rows, dtype=np.int64).reshape(-1, 4)


NO_SHAPES = shape_matrix([])


def best(
    kernels: Any,
    cluster: Cluster,
    task: Task,
    policy: int = BEST_FIT,
    shapes: Array = NO_SHAPES,
    *,
    cands: Array | None = None,
) -> int:
    cands = cluster.all() if cands is None else cands
    return int(kernels.best_node(cands, *cluster.arrays(), *task.args(), policy, shapes))


Gang = tuple[tuple[int, int], list[int], list[int]]


def gang(
    kernels: Any,
    cluster: Cluster,
    tasks: list[Task],
    policy: int = BEST_FIT,
    *,
    shapes: Array = NO_SHAPES,
    domains: Array | None = None,
) -> Gang:
    """((domain, count), out_node, out_mask) of ``place_gang`` over every node of the cluster."""
    out_node = np.zeros(len(tasks), dtype=np.int32)
    out_mask = np.zeros(len(tasks), dtype=np.uint64)
    domains = cluster.domains() if domains is None else domains
    result = kernels.place_gang(
        cluster.all(), domains, *cluster.arrays(), *gang_arrays(tasks), policy, shapes, out_node, out_mask
    )
    return (int(result[0]), int(result[1])), out_node.tolist(), [int(m) for m in out_mask.tolist()]


def bits(*indices: int) -> int:
    return sum(1 << i for i in indices)


# ---------------------------------------------------------------- clear cases


@pytest.mark.parametrize("kernels", [nb, ref], ids=["numba", "ref"])
@pytest.mark.parametrize(
    ("free", "gpus", "milli", "expected"),
    [
        ([1000, 600, 300], 1, 250, bits(2)),  # fractional: the tightest GPU that still fits
        ([1000, 600, 300], 1, 400, bits(1)),
        ([1000, 600, 600], 1, 500, bits(1)),  # tie: lowest index
        ([1000, 600, 300], 1, 1000, bits(0)),
        ([200, 100], 1, 300, 0),  # no GPU has the share
        ([900, 1000, 0, 1000], 2, 1000, bits(1, 3)),  # whole GPUs: only fully free ones, lowest index first
        ([900, 1000, 0, 1000], 3, 1000, 0),
        ([1000, 1000, 1000], 2, 1000, bits(0, 1)),
        ([1000] * 64, 64, 1000, (1 << 64) - 1),
        ([1000, 1000], 0, 0, 0),  # CPU-only: no GPU taken
        ([], 1, 500, 0),
    ],
)
def test_pick_gpus(kernels: Any, free: list[int], gpus: int, milli: int, expected: int) -> None:
    row = np.zeros(MAX_GPUS, dtype=np.int16)
    row[: len(free)] = free
    assert int(kernels.pick_gpus(row, len(free), gpus, milli)) == expected


@pytest.mark.parametrize("kernels", [nb, ref], ids=["numba", "ref"])
def test_fractional_task_goes_to_the_tightest_gpu(kernels: Any) -> None:
    cluster = Cluster().node(gpus=(1000, 1000, 1000)).node(gpus=(1000, 600, 300, 0))
    assert gang(kernels, cluster, [gpu_task(milli=250)])[1:] == ([1], [bits(2)])  # least GPU left: node 1
    assert gang(kernels, cluster, [gpu_task(milli=400)])[1:] == ([1], [bits(1)])
    assert gang(kernels, cluster, [gpu_task(milli=700)])[1:] == ([1], [bits(0)])
    twins = Cluster().node(gpus=(1000, 600, 300)).node(gpus=(1000, 600, 300))
    assert best(kernels, twins, gpu_task(milli=250)) == 0  # equal scores: lowest index
    assert best(kernels, twins, gpu_task(milli=250), cands=np.array([1, 0], dtype=np.int64)) == 0


@pytest.mark.parametrize("kernels", [nb, ref], ids=["numba", "ref"])
def test_whole_gpu_task_takes_fully_free_gpus_only(kernels: Any) -> None:
    cluster = Cluster().node(gpus=(999, 999, 999, 999)).node(gpus=(1000, 1000, 0, 0, 0, 0, 0, 500))
    assert best(kernels, cluster, gpu_task(gpus=2)) == 1
    assert best(kernels, cluster, gpu_task(gpus=3)) == -1
    assert best(kernels, cluster, gpu_task(gpus=1, cpu=70_000)) == -1  # not enough cpu
    assert best(kernels, cluster, gpu_task(gpus=1, mem=300_000)) == -1  # not enough memory


@pytest.mark.parametrize("kernels", [nb, ref], ids=["numba", "ref"])
def test_model_restriction(kernels: Any) -> None:
    cluster = Cluster().node(gpus=1, model=1).node(gpus=2, model=2).node(gpus=4, model=-1).node(model=3)
    assert best(kernels, cluster, gpu_task(models=bits(2))) == 1
    assert best(kernels, cluster, gpu_task(models=bits(1, 2))) == 0  # tighter: 0 GPUs left on node 0
    assert best(kernels, cluster, gpu_task(models=bits(3))) == -1  # node 3 has no GPUs
    assert best(kernels, cluster, gpu_task(models=bits(63))) == -1
    assert best(kernels, cluster, gpu_task(gpus=4)) == 2  # any model, unknown included
    assert best(kernels, cluster, gpu_task(gpus=4, models=bits(0, 1, 2))) == -1
    arrays = cluster.arrays()
    assert kernels.fits(2, *arrays, *gpu_task(gpus=4).args())
    assert not kernels.fits(2, *arrays, *gpu_task(gpus=4, models=bits(0)).args())
    # every task's mask is checked (fold gives a task without GPUs 0; decide's node kinds rely on it)
    assert kernels.fits(0, *arrays, *Task(models=bits(1)).args())
    assert not kernels.fits(0, *arrays, *Task(models=bits(5)).args())
    assert not kernels.fits(3, *arrays, *Task(models=bits(5)).args())  # (no model: only mask 0)
    assert kernels.fits(3, *arrays, *Task().args())


@pytest.mark.parametrize("kernels", [nb, ref], ids=["numba", "ref"])
def test_cpu_only_task_prefers_nodes_without_free_gpus(kernels: Any) -> None:
    cluster = (
        Cluster()
        .node(cpu=2_000, gpus=8)
        .node(cpu=64_000)
        .node(cpu=32_000)
        .node(cpu=16_000, gpus=(0, 0))
        .node(cpu=1_000)
    )
    assert best(kernels, cluster, Task(cpu=2_000)) == 3  # not node 0 (exact fit, but free GPUs)
    assert best(kernels, cluster, Task(cpu=20_000)) == 2
    assert best(kernels, cluster, Task(cpu=16_000)) == 3  # fully used GPUs: no penalty, exact fit
    assert best(kernels, cluster, Task(cpu=40_000)) == 1
    gpu_only = Cluster().node(cpu=64_000, gpus=2).node(cpu=8_000, gpus=8)
    assert best(kernels, gpu_only, Task(cpu=4_000)) == 1  # then least cpu left


@pytest.mark.parametrize("kernels", [nb, ref], ids=["numba", "ref"])
def test_fgd_keeps_fully_free_gpus_whole(kernels: Any) -> None:
    # node 0: one fully free GPU; node 1: a partly used GPU and two free ones.
    cluster = Cluster().node(gpus=(1000,)).node(gpus=(400, 1000, 1000))
    small = gpu_task(milli=300)
    shapes = shape_matrix([(1, FULL_GPU, 1000, 10), (1, 300, 1000, 1)])
    assert best(kernels, cluster, small, BEST_FIT, shapes) == 0  # best fit: least GPU left, breaks a GPU
    assert best(kernels, cluster, small, FGD, shapes) == 1  # FGD: uses the partly used GPU
    assert int(kernels.pick_gpus(cluster.arrays()[2][1], 3, 1, 300)) == bits(0)
    cpu_free, _, gpu_free, gpu_count, _ = cluster.arrays()
    increase = [
        kernels.node_score(n, cpu_free, gpu_free, gpu_count, 1000, 1, 300, FGD, shapes)[0] for n in (0, 1)
    ]
    # node 0: F goes 0 -> 10 * 700 (+ 1 * 0): whole-GPU shapes no longer fit;
    # node 1: whole shapes' frag 400 -> 100 (x10), the 300-share shape's 0 -> 100 (x1)
    assert increase == [7000, -2900]
    assert best(kernels, cluster, small, FGD, NO_SHAPES) == 0  # no shapes: falls back to best fit
    zero = shape_matrix([(1, FULL_GPU, 1000, 0)])
    assert best(kernels, cluster, small, FGD, zero) == 0


@pytest.mark.parametrize("kernels", [nb, ref], ids=["numba", "ref"])
def test_fragmentation_report(kernels: Any) -> None:
    cluster = Cluster().node(cpu=8_000, gpus=(1000, 500, 0)).node(cpu=500, gpus=(1000,)).node()
    cpu_free, _, gpu_free, gpu_count, _ = cluster.arrays()
    shapes = shape_matrix([(1, FULL_GPU, 1000, 2), (1, 600, 0, 3), (0, 0, 1000, 1)])
    # GPU shapes: weight 5, mean cpu (2 * 1000 + 3 * 0) // 5 = 400, mean milli 3800 // 5 = 760;
    # the cpu-only shape counts for nothing.
    # node 0: whole 1-GPU fits, 500 stranded (x2); 600-share fits, 500 stranded (x3);
    #         cpu 8000 feeds 8000 * 760 // 400 = 15200 milli >= 1500 free: nothing starved
    # node 1: cpu 500 < 1000: the whole shape doesn't fit -> 1000 (x2); 600-share fits -> 0;
    #         cpu 500 feeds 950 of its 1000 free milli: 50 starved (x5)
    expected = 2 * 500 + 3 * 500 + 2 * 1000 + 5 * 50
    assert int(kernels.fragmentation(cluster.all(), cpu_free, gpu_free, gpu_count, shapes)) == expected


@pytest.mark.parametrize("kernels", [nb, ref], ids=["numba", "ref"])
def test_fgd_keeps_cpu_where_gpus_need_it(kernels: Any) -> None:
    # Two 8-GPU nodes, half used: node 0 has 24 cores left, node 1 has 80. The shape mix needs
    # ~10 cores per GPU, so node 0's cpu feeds only 2.4 of its 4 free GPUs.
    cluster = Cluster().node(cpu=24_000, gpus=(0,) * 4 + (1000,) * 4)
    cluster.node(cpu=80_000, gpus=(0,) * 4 + (1000,) * 4)
    shapes = shape_matrix([(1, FULL_GPU, 10_000, 4), (1, 500, 5_000, 4), (0, 0, 16_000, 8)])
    cpu_free, _, gpu_free, gpu_count, _ = cluster.arrays()
    cpu_only = Task(cpu=8_000)
    increase = [
        kernels.node_score(n, cpu_free, gpu_free, gpu_count, 8_000, 0, 0, FGD, shapes)[0] for n in (0, 1)
    ]
    # mean cpu 7500 per 750 milli: node 0 feeds 2400 milli before, 1600 after (x8 weight);
    # node 1 feeds 8000 then 7200: still all of its 4000 free milli
    assert increase == [8 * (2400 - 1600), 0]
    assert best(kernels, cluster, cpu_only, FGD, shapes) == 1  # the cpu-only task goes where cpu is spare
    assert best(kernels, cluster, cpu_only, BEST_FIT, shapes) == 0  # best fit: least cpu left


def racks(*full_nodes: int, per_rack: int = 8, cpu: int = 64_000) -> Cluster:
    """Racks of ``per_rack`` 8-GPU nodes, of which the first ``full_nodes[r]`` are fully free
    (the others have one GPU partly used)."""
    cluster = Cluster()
    for rack, full in enumerate(full_nodes):
        for i in range(per_rack):
            cluster.node(cpu=cpu, gpus=8 if i < full else (1000,) * 7 + (500,), domain=rack)
    return cluster


@pytest.mark.parametrize("kernels", [nb, ref], ids=["numba", "ref"])
def test_gang_of_eight_full_nodes_picks_the_rack_that_holds_it(kernels: Any) -> None:
    cluster = racks(7, 8, 6)
    (chosen, count), nodes, masks = gang(kernels, cluster, [gpu_task(gpus=8)] * 8)
    assert (chosen, count) == (1, 8)
    assert sorted(nodes) == list(range(8, 16))
    assert masks == [0xFF] * 8


@pytest.mark.parametrize("kernels", [nb, ref], ids=["numba", "ref"])
def test_gang_prefers_the_tighter_rack_then_the_lowest_id(kernels: Any) -> None:
    roomy = racks(8, 8, 8)
    for n in range(16, 24):
        roomy.cpu_free[n] = 10_000  # rack 2: least cpu left
    assert gang(kernels, roomy, [gpu_task(gpus=8)] * 8)[0] == (2, 8)
    assert gang(kernels, racks(8, 8), [gpu_task(gpus=8)] * 8)[0] == (0, 8)
    excluded = racks(8, 8)
    excluded.domain[:8] = [-1] * 8  # rack 0 is in no domain
    assert gang(kernels, excluded, [gpu_task(gpus=8)] * 8)[0] == (1, 8)


@pytest.mark.parametrize("kernels", [nb, ref], ids=["numba", "ref"])
def test_infeasible_gang_reports_the_best_partial_fit(kernels: Any) -> None:
    cluster = racks(3, 5, 2)
    (chosen, count), nodes, masks = gang(kernels, cluster, [gpu_task(gpus=8)] * 8)
    assert (chosen, count) == (-1, 5)
    assert nodes == [-1] * 8
    assert masks == [0] * 8
    flat = np.zeros(len(cluster.domain), dtype=np.int32)  # no topology: one domain, 10 full nodes
    assert gang(kernels, cluster, [gpu_task(gpus=8)] * 12, domains=flat)[0] == (-1, 10)
    assert gang(kernels, cluster, [gpu_task(gpus=8)] * 10, domains=flat)[0] == (0, 10)


@pytest.mark.parametrize("kernels", [nb, ref], ids=["numba", "ref"])
def test_gang_tasks_may_share_a_node(kernels: Any) -> None:
    cluster = Cluster().node(gpus=(1000, 1000, 1000, 1000)).node(gpus=(1000, 1000))
    tasks = [gpu_task(gpus=2), gpu_task(gpus=1), gpu_task(milli=500), gpu_task(milli=500)]
    (chosen, count), nodes, masks = gang(kernels, cluster, tasks)
    assert (chosen, count) == (0, 4)
    assert nodes == [1, 0, 0, 0]
    assert masks == [bits(0, 1), bits(0), bits(1), bits(1)]


# ---------------------------------------------------------------- random clusters

SHARES = st.sampled_from([0, 0, 100, 250, 300, 500, 700, 1000, 1000, 1000])
CPUS = st.sampled_from([0, 500, 1000, 2000, 4000, 8000, 16_000, 32_000, 64_000])
MEMS = st.sampled_from([0, 1024, 4096, 16_384, 65_536, 262_144])
MODEL_BITS = st.sampled_from([0, 0, bits(0), bits(1), bits(0, 2), bits(3), bits(63), bits(1, 2, 3)])


@st.composite
def clusters(draw: st.DrawFn) -> Cluster:
    cluster = Cluster()
    for _ in range(draw(st.integers(1, 30))):
        free = draw(st.lists(SHARES | st.integers(0, 1000), max_size=8))
        model = draw(st.integers(-1, 3)) if free else -1
        cluster.node(draw(CPUS), draw(MEMS), tuple(free), model, draw(st.integers(-1, 3)))
    if draw(st.booleans()):
        cluster.domain = [0] * len(cluster.domain)
    return cluster


@st.composite
def tasks(draw: st.DrawFn) -> Task:
    cpu, mem = draw(st.sampled_from([0, 500, 1000, 4000, 16_000])), draw(st.sampled_from([0, 1024, 16_384]))
    kind = draw(st.sampled_from(["cpu", "share", "whole"]))
    if kind == "cpu":
        return Task(cpu, mem)
    if kind == "share":
        return Task(
            cpu,
            mem,
            1,
            draw(st.sampled_from([100, 250, 300, 500, 700, 999]) | st.integers(1, 1000)),
            draw(MODEL_BITS),
        )
    return Task(cpu, mem, draw(st.integers(1, 8)), FULL_GPU, draw(MODEL_BITS))


CPU_BOUND = (CPU_BOUND_MARK, 0, 0, 0)  # a first row: the rows are scored as CPU-bound


def _mix(draw: st.DrawFn, shapes: st.SearchStrategy[Task], most_rows: int, most_weight: int) -> Array:
    """Up to ``most_rows`` rows of ``shapes``; one mix in three scored as CPU-bound."""
    rows = [CPU_BOUND] if draw(st.integers(0, 2)) == 0 else []
    for _ in range(draw(st.integers(0, most_rows))):
        task = draw(shapes)
        rows.append((task.gpus, task.milli, task.cpu, draw(st.integers(0, most_weight))))
    return shape_matrix(rows)


@st.composite
def shape_mixes(draw: st.DrawFn) -> Array:
    return _mix(draw, tasks(), 6, 5)


@st.composite
def gangs(draw: st.DrawFn) -> list[Task]:
    """Runs of equal tasks (as real gangs are), sometimes mixed."""
    out: list[Task] = []
    for _ in range(draw(st.integers(0, 3))):
        out += [draw(tasks())] * draw(st.integers(1, 4))
    return out


@st.composite
def candidates(draw: st.DrawFn, size: int) -> Array:
    """All nodes in some order, or a subset (with repeats)."""
    if draw(st.booleans()):
        return np.array(draw(st.permutations(range(size))), dtype=np.int64)
    return np.array(draw(st.lists(st.integers(0, size - 1), max_size=2 * size)), dtype=np.int64)


def snapshot(arrays: tuple[Array, ...]) -> list[Array]:
    return [a.copy() for a in arrays]


@PROPERTY
@given(row=st.lists(SHARES | st.integers(0, 1000), max_size=MAX_GPUS), task=tasks())
def test_pick_gpus_matches_reference(row: list[int], task: Task) -> None:
    free = np.zeros(MAX_GPUS, dtype=np.int16)
    free[: len(row)] = row
    got = int(nb.pick_gpus(free, len(row), task.gpus, task.milli))
    assert got == int(ref.pick_gpus(free, len(row), task.gpus, task.milli))
    assert bin(got).count("1") in (0, task.gpus)
    assert all(row[i] >= task.milli for i in range(len(row)) if got >> i & 1)


@PROPERTY
@given(cluster=clusters(), task=tasks(), shapes=shape_mixes(), data=st.data())
def test_best_node_matches_reference(
    cluster: Cluster, task: Task, shapes: Array, data: st.DataObject
) -> None:
    arrays = cluster.arrays()
    cands = data.draw(candidates(len(cluster.gpus)))
    for n in range(len(cluster.gpus)):
        feasible = nb.fits(n, *arrays, *task.args())
        assert feasible == ref.fits(n, *arrays, *task.args())
        for policy in POLICIES if feasible else ():
            score = (arrays[0], arrays[2], arrays[3], task.cpu, task.gpus, task.milli, policy, shapes)
            assert tuple(nb.node_score(n, *score)) == tuple(ref.node_score(n, *score))
    for policy in POLICIES:
        got = nb.best_node(cands, *arrays, *task.args(), policy, shapes)
        assert got == ref.best_node(cands, *arrays, *task.args(), policy, shapes)
        assert got == nb.best_node(cands[::-1].copy(), *arrays, *task.args(), policy, shapes)  # order-free
        assert got == -1 or (got in cands.tolist() and nb.fits(got, *arrays, *task.args()))


@PROPERTY
@given(cluster=clusters(), task=tasks(), data=st.data())
def test_best_node_summary_equals_best_fit(cluster: Cluster, task: Task, data: st.DataObject) -> None:
    arrays = cluster.arrays()
    cands = data.draw(candidates(len(cluster.gpus)))
    total = arrays[2].astype(np.int64).sum(axis=1)
    want = nb.best_node(cands, *arrays, *task.args(), nb.BEST_FIT, shape_matrix([]))
    assert nb.best_node_summary(cands, total, *arrays, *task.args()) == want
    assert ref.best_node_summary(cands, total, *arrays, *task.args()) == want


@PROPERTY
@given(
    cluster=clusters(),
    arrivals=st.lists(tasks(), min_size=1, max_size=12),
    shapes=shape_mixes(),
    policy=st.sampled_from(POLICIES),
)
def test_best_node_memo_equals_reference_as_tasks_land(
    cluster: Cluster, arrivals: list[Task], shapes: Array, policy: int
) -> None:
    """Tasks arrive one by one and land where chosen: the memoized kernel, reusing each task
    shape's evaluations of the nodes nothing landed on since, chooses what ``best_node`` does."""
    arrays = cluster.arrays()
    cpu_free, mem_free, gpu_free, gpu_count, _ = arrays
    cands = cluster.all()
    version = np.zeros(len(cluster.gpus), dtype=np.int64)
    memos: dict[tuple[object, ...], Array] = {}
    for task in arrivals:
        memo = memos.setdefault(task.args(), np.full((version.size, nb.MEMO_COLUMNS), -1, np.int64))
        got = nb.best_node_memo(cands, *arrays, *task.args(), policy, shapes, version, memo)
        assert got == ref.best_node(cands, *arrays, *task.args(), policy, shapes)
        assert got == ref.best_node_memo(cands, *arrays, *task.args(), policy, shapes, version, memo)
        if got >= 0:
            mask = nb.pick_gpus(gpu_free[got], int(gpu_count[got]), task.gpus, task.milli)
            nb.allocate(got, mask, task.cpu, task.mem, task.milli, cpu_free, mem_free, gpu_free, -1)
            version[got] += 1


@PROPERTY
@given(
    cluster=clusters(),
    arrivals=st.lists(gangs().filter(bool), min_size=1, max_size=8),
    shapes=shape_mixes(),
    policy=st.sampled_from(POLICIES),
    data=st.data(),
)
def test_place_gang_memo_equals_reference_as_gangs_land(
    cluster: Cluster, arrivals: list[list[Task]], shapes: Array, policy: int, data: st.DataObject
) -> None:
    """Gangs arrive one by one and land where chosen, with single tasks in between: the gang
    kernel reading and refreshing the memo of its first task's shape (shared with
    ``best_node_memo``) places each gang as ``place_gang`` does."""
    if data.draw(st.booleans()):
        cluster.domain = data.draw(
            st.lists(st.integers(-1, 3), min_size=len(cluster.gpus), max_size=len(cluster.gpus))
        )
    arrays, domains, cands = cluster.arrays(), cluster.domains(), cluster.all()
    cpu_free, mem_free, gpu_free, _, _ = arrays
    version = np.zeros(len(cluster.gpus), dtype=np.int64)
    memos: dict[tuple[object, ...], Array] = {}

    def memo(task: Task) -> Array:
        return memos.setdefault(task.args(), np.full((version.size, nb.MEMO_COLUMNS), -1, np.int64))

    for tasks in arrivals:
        if data.draw(st.booleans()):  # a single task first, through the same memos
            single = tasks[-1]
            nb.best_node_memo(cands, *arrays, *single.args(), policy, shapes, version, memo(single))
        outs = [(np.zeros(len(tasks), np.int32), np.zeros(len(tasks), np.uint64)) for _ in range(2)]
        inputs = (cands, domains, *arrays, *gang_arrays(tasks), policy, shapes)
        got = nb.place_gang_memo(*inputs, *outs[0], version, memo(tasks[0]))
        want = ref.place_gang(*inputs, *outs[1])
        assert (int(got[0]), int(got[1])) == (int(want[0]), int(want[1]))
        assert outs[0][0].tolist() == outs[1][0].tolist()
        assert outs[0][1].tolist() == outs[1][1].tolist()
        if got[0] < 0:
            continue
        for n, mask, task in zip(outs[0][0].tolist(), outs[0][1].tolist(), tasks, strict=True):
            nb.allocate(n, np.uint64(mask), task.cpu, task.mem, task.milli, cpu_free, mem_free, gpu_free, -1)
            version[n] += 1


@PROPERTY
@given(cluster=clusters(), shapes=shape_mixes(), data=st.data())
def test_fragmentation_matches_reference(cluster: Cluster, shapes: Array, data: st.DataObject) -> None:
    cpu_free, _, gpu_free, gpu_count, _ = cluster.arrays()
    cands = data.draw(candidates(len(cluster.gpus)))
    got = nb.fragmentation(cands, cpu_free, gpu_free, gpu_count, shapes)
    assert got == ref.fragmentation(cands, cpu_free, gpu_free, gpu_count, shapes)
    assert got >= 0


@PROPERTY
@given(
    cluster=clusters(),
    gang_tasks=gangs(),
    shapes=shape_mixes(),
    policy=st.sampled_from(POLICIES),
    data=st.data(),
)
def test_place_gang_matches_reference(
    cluster: Cluster, gang_tasks: list[Task], shapes: Array, policy: int, data: st.DataObject
) -> None:
    cands, domains, arrays = data.draw(candidates(len(cluster.gpus))), cluster.domains(), cluster.arrays()
    inputs = (cands, domains, *arrays, *gang_arrays(gang_tasks), shapes)
    before = snapshot(inputs)
    results = []
    for kernels in (nb, ref):
        out_node = np.full(len(gang_tasks), 7, dtype=np.int32)
        out_mask = np.full(len(gang_tasks), 7, dtype=np.uint64)
        chosen = kernels.place_gang(*inputs[:12], policy, shapes, out_node, out_mask)
        results.append(((int(chosen[0]), int(chosen[1])), out_node.tolist(), out_mask.tolist()))
        assert all(np.array_equal(a, b) for a, b in zip(before, inputs, strict=True))  # inputs untouched
    assert results[0] == results[1]
    (chosen, count), nodes, masks = results[0]
    if chosen < 0:
        assert count < len(gang_tasks) or not gang_tasks
        assert nodes == [-1] * len(nodes)
        assert masks == [0] * len(masks)
        return
    assert count == len(gang_tasks)
    assert all(n in cands.tolist() and domains[n] == chosen for n in nodes)  # all in one domain
    cpu_free, mem_free, gpu_free, gpu_count, _ = snapshot(arrays)
    for n, mask, task in zip(nodes, masks, gang_tasks, strict=True):
        assert nb.fits(n, cpu_free, mem_free, gpu_free, gpu_count, arrays[4], *task.args())
        assert mask == int(nb.pick_gpus(gpu_free[n], int(gpu_count[n]), task.gpus, task.milli))
        nb.allocate(n, np.uint64(mask), task.cpu, task.mem, task.milli, cpu_free, mem_free, gpu_free, -1)
    assert (cpu_free >= 0).all()  # no over-commit
    assert (mem_free >= 0).all()
    assert (gpu_free >= 0).all()


@PROPERTY
@given(cluster=clusters(), task=tasks(), size=st.integers(1, 12), shapes=shape_mixes(), data=st.data())
def test_equal_task_gang_matches_reference(
    cluster: Cluster, task: Task, size: int, shapes: Array, data: st.DataObject
) -> None:
    """Gangs of equal tasks over several domains (where place_gang prunes domains)."""
    cluster.domain = data.draw(
        st.lists(st.integers(-1, 5), min_size=len(cluster.gpus), max_size=len(cluster.gpus))
    )
    policy = data.draw(st.sampled_from(POLICIES))
    results = [gang(kernels, cluster, [task] * size, policy, shapes=shapes) for kernels in (nb, ref)]
    assert results[0] == results[1]


@pytest.mark.parametrize("kernels", [nb, ref], ids=["numba", "ref"])
def test_gang_of_empty_tasks(kernels: Any) -> None:
    cluster = (
        Cluster().node(cpu=0, mem=0, domain=1).node(gpus=2, domain=0).node(cpu=0, domain=2).node(domain=0)
    )
    assert gang(kernels, cluster, [Task(0, 0)] * 5) == ((1, 5), [0] * 5, [0] * 5)
    assert gang(kernels, cluster, []) == ((0, 0), [], [])
    assert gang(kernels, Cluster().node(domain=-1), []) == ((-1, 0), [], [])


@PROPERTY
@given(cluster=clusters(), task=tasks(), data=st.data())
def test_allocate_takes_and_gives_back(cluster: Cluster, task: Task, data: st.DataObject) -> None:
    arrays = cluster.arrays()
    n = data.draw(st.integers(0, len(cluster.gpus) - 1))
    count = int(arrays[3][n])
    mask = nb.pick_gpus(arrays[2][n], count, task.gpus, task.milli)
    states = {}
    for name, kernels in (("numba", nb), ("ref", ref)):
        cpu_free, mem_free, gpu_free = arrays[0].copy(), arrays[1].copy(), arrays[2].copy()
        kernels.allocate(n, mask, task.cpu, task.mem, task.milli, cpu_free, mem_free, gpu_free, -1)
        states[name] = snapshot((cpu_free, mem_free, gpu_free))
        assert int(gpu_free[n].sum()) == int(arrays[2][n].sum()) - bin(int(mask)).count("1") * task.milli
        kernels.allocate(n, mask, task.cpu, task.mem, task.milli, cpu_free, mem_free, gpu_free, 1)
        assert all(np.array_equal(a, b) for a, b in zip((cpu_free, mem_free, gpu_free), arrays, strict=False))
    assert all(np.array_equal(a, b) for a, b in zip(states["numba"], states["ref"], strict=True))


# ---------------------------------------------------------------- the FGD floor (best_node_memo's pruning)


@st.composite
def any_tasks(draw: st.DrawFn) -> Task:
    """``tasks()`` plus the unusual shapes: several GPUs, each a share below a whole GPU."""
    if draw(st.integers(0, 4)) > 0:
        return draw(tasks())
    cpu = draw(st.sampled_from([0, 500, 4000, 16_000]))
    return Task(cpu, 0, draw(st.integers(2, 4)), draw(st.sampled_from([100, 300, 500, 999])))


@st.composite
def wide_shape_mixes(draw: st.DrawFn) -> Array:
    """Shape mixes of up to 12 rows, unusual shapes included, weights up to 40."""
    return _mix(draw, any_tasks(), 12, 40)


@st.composite
def alike_clusters(draw: st.DrawFn) -> Cluster:
    """Nodes of a few types, many of them alike (as real clusters are), some partly used."""
    kinds = st.tuples(CPUS, MEMS, st.integers(0, 8), st.integers(0, 2))
    types = draw(st.lists(kinds, min_size=1, max_size=3))
    cluster = Cluster()
    for _ in range(draw(st.integers(1, 40))):
        cpu, mem, count, model = draw(st.sampled_from(types))
        free = [FULL_GPU] * count
        if count and draw(st.integers(0, 3)) == 0:
            free[draw(st.integers(0, count - 1))] = draw(SHARES)
        cluster.node(cpu, mem, tuple(free), model)
    return cluster


@PROPERTY
@given(cluster=clusters(), task=any_tasks(), shapes=wide_shape_mixes())
def test_fgd_floor_is_below_the_increase(cluster: Cluster, task: Task, shapes: Array) -> None:
    """``_fgd_floor`` agrees with a full evaluation on fit and secondary score, and its floor is
    never above the FGD increase: the pruning in ``best_node_memo`` is sound."""
    cpu_free, mem_free, gpu_free, gpu_count, model = cluster.arrays()
    table = _floor_table(shapes)
    args = (task.cpu, task.mem, task.gpus, task.milli, np.uint64(task.models))
    for n in range(len(cluster.gpus)):
        node = (int(cpu_free[n]), int(mem_free[n]), gpu_free[n], int(gpu_count[n]), int(model[n]))
        ok, floor, secondary = _fgd_floor(*node, args, table)
        assert bool(ok) == nb.fits(n, cpu_free, mem_free, gpu_free, gpu_count, model, *task.args())
        if ok:
            primary, want = nb.node_score(
                n, cpu_free, gpu_free, gpu_count, task.cpu, task.gpus, task.milli, FGD, shapes
            )
            assert int(secondary) == int(want)
            assert int(floor) <= int(primary)


def test_the_cpu_bound_floor_is_below_a_fall_of_the_rows_own_starvation() -> None:
    """A CPU-starved node (8 free GPUs, 4 cores) under a CPU-bound mix of one fractional row
    (half a GPU at 16 cores, 5 tasks): a whole-GPU task lowers the row's fragment by 5 x 1000
    and its own starvation by 5 x 968 (fed 125 -> 93 of 8000 -> 7000 free milli), -9840 in
    all; the floor must cover both falls (-10000), not the fragment's alone."""
    cluster = Cluster()
    cluster.node(4_000, 65_536, (FULL_GPU,) * 8, 0, 0)
    shapes = shape_matrix([CPU_BOUND, (1, 500, 16_000, 5)])
    cpu_free, mem_free, gpu_free, gpu_count, model = cluster.arrays()
    task = Task(1_000, 1024, 1, FULL_GPU)
    node = (int(cpu_free[0]), int(mem_free[0]), gpu_free[0], int(gpu_count[0]), int(model[0]))
    ok, floor, _ = _fgd_floor(*node, task.args(), _floor_table(shapes))
    primary, _ = nb.node_score(0, cpu_free, gpu_free, gpu_count, task.cpu, task.gpus, task.milli, FGD, shapes)
    assert ok
    assert int(primary) == -9840
    assert int(floor) == -10_000


@PROPERTY
@given(
    cluster=alike_clusters(),
    arrivals=st.lists(any_tasks(), min_size=1, max_size=24),
    shapes=wide_shape_mixes(),
)
def test_best_node_memo_equals_reference_on_alike_nodes(
    cluster: Cluster, arrivals: list[Task], shapes: Array
) -> None:
    """Many alike nodes and long runs of arrivals (where the floor prunes most): the memoized
    FGD kernel chooses what the reference ``best_node`` does, and every row it wrote for the
    current node state is that node's full evaluation, or for a pruned node a floor under its
    score with the exact secondary."""
    arrays = cluster.arrays()
    cpu_free, mem_free, gpu_free, gpu_count, _ = arrays
    cands = cluster.all()
    version = np.zeros(len(cluster.gpus), dtype=np.int64)
    memos: dict[tuple[object, ...], Array] = {}
    for task in arrivals:
        memo = memos.setdefault(task.args(), np.full((version.size, nb.MEMO_COLUMNS), -1, np.int64))
        got = nb.best_node_memo(cands, *arrays, *task.args(), FGD, shapes, version, memo)
        assert got == ref.best_node(cands, *arrays, *task.args(), FGD, shapes)
        for n in np.flatnonzero(memo[:, nb.MEMO_VERSION] == version).tolist():
            fits = ref.fits(n, *arrays, *task.args())
            floor_only = memo[n, nb.MEMO_FITS] == nb.MEMO_FLOOR
            assert (1 if floor_only else memo[n, nb.MEMO_FITS]) == int(fits)
            if fits:
                want = (cpu_free, gpu_free, gpu_count, task.cpu, task.gpus, task.milli, FGD, shapes)
                primary, secondary = ref.node_score(n, *want)
                assert memo[n, nb.MEMO_SECONDARY] == secondary
                if floor_only:
                    assert memo[n, nb.MEMO_PRIMARY] <= primary
                else:
                    assert memo[n, nb.MEMO_PRIMARY] == primary
        if got >= 0:
            mask = nb.pick_gpus(gpu_free[got], int(gpu_count[got]), task.gpus, task.milli)
            nb.allocate(got, mask, task.cpu, task.mem, task.milli, cpu_free, mem_free, gpu_free, -1)
            version[got] += 1


@PROPERTY
@given(cluster=clusters(), data=st.data())
def test_most_free_is_the_column_maxima(cluster: Cluster, data: st.DataObject) -> None:
    """The capacity-failure summary: most whole free GPUs on a node, most free share on a GPU,
    most free CPU and memory, over the nodes given."""
    cpu_free, mem_free, gpu_free, _, _ = cluster.arrays()
    nodes = np.unique(data.draw(candidates(len(cluster.gpus))))
    if nodes.size == 0:
        return
    want = (
        int((gpu_free[nodes] == 1000).sum(axis=1).max()),
        int(gpu_free[nodes].max()),
        int(cpu_free[nodes].max()),
        int(mem_free[nodes].max()),
    )
    assert tuple(int(x) for x in nb.most_free(nodes, cpu_free, mem_free, gpu_free)) == want


@PROPERTY
@given(
    cluster=alike_clusters(),
    arrivals=st.lists(st.tuples(any_tasks(), st.integers(1, 4)), min_size=1, max_size=16),
    shapes=wide_shape_mixes(),
)
def test_gangs_read_pruned_rows_of_single_tasks_of_their_shape(
    cluster: Cluster, arrivals: list[tuple[Task, int]], shapes: Array
) -> None:
    """Single tasks (whose FGD kernel leaves pruned nodes a floor-only row) and gangs of the
    same shape share one memo, as in decide: each still lands where the reference puts it."""
    arrays = cluster.arrays()
    cpu_free, mem_free, gpu_free, _, _ = arrays
    cands, domains = cluster.all(), np.zeros(len(cluster.gpus), dtype=np.int32)
    version = np.zeros(len(cluster.gpus), dtype=np.int64)
    memos: dict[tuple[object, ...], Array] = {}
    for task, size in arrivals:
        memo = memos.setdefault(task.args(), np.full((version.size, nb.MEMO_COLUMNS), -1, np.int64))
        got = nb.best_node_memo(cands, *arrays, *task.args(), FGD, shapes, version, memo)
        assert got == ref.best_node(cands, *arrays, *task.args(), FGD, shapes)
        tasks = [task] * size
        outs = [(np.zeros(size, np.int32), np.zeros(size, np.uint64)) for _ in range(2)]
        inputs = (cands, domains, *arrays, *gang_arrays(tasks), FGD, shapes)
        chosen = nb.place_gang_memo(*inputs, *outs[0], version, memo)
        want = ref.place_gang(*inputs, *outs[1])
        assert (int(chosen[0]), int(chosen[1])) == (int(want[0]), int(want[1]))
        assert outs[0][0].tolist() == outs[1][0].tolist()
        if chosen[0] < 0:
            continue
        for n, mask in zip(outs[0][0].tolist(), outs[0][1].tolist(), strict=True):
            nb.allocate(n, np.uint64(mask), task.cpu, task.mem, task.milli, cpu_free, mem_free, gpu_free, -1)
            version[n] += 1


INT16 = st.integers(np.iinfo(np.int16).min, np.iinfo(np.int16).max)


@pytest.mark.parametrize(
    "rows",
    [
        np.zeros((0, MAX_GPUS), dtype=np.int16),  # no node
        np.zeros((0, 1), dtype=np.int16),
        np.array([[FULL_GPU] * MAX_GPUS], dtype=np.int16),  # one node, every GPU free
        np.array([[1000, 250, 0]], dtype=np.int16),
        np.full((3, MAX_GPUS), np.iinfo(np.int16).max, dtype=np.int16),  # past int16 once summed
    ],
    ids=["empty", "empty-narrow", "one-row-full", "one-row", "large-values"],
)
def test_row_totals_edges_match_reference(rows: Array) -> None:
    got = nb.row_totals(rows)
    assert got.dtype == np.int64
    assert got.tolist() == ref.row_totals(rows).tolist() == [sum(int(x) for x in r) for r in rows]


@PROPERTY
@given(
    shape=st.tuples(st.integers(0, 40), st.integers(1, MAX_GPUS)),
    data=st.data(),
)
def test_row_totals_matches_reference(shape: tuple[int, int], data: st.DataObject) -> None:
    """``decide``'s per-node free-GPU totals: the numba kernel equals its plain twin (which
    ``benchmarks.core`` swaps in for its reference run)."""
    values = data.draw(st.lists(SHARES | INT16, min_size=shape[0] * shape[1], max_size=shape[0] * shape[1]))
    rows = np.array(values, dtype=np.int16).reshape(shape)
    assert nb.row_totals(rows).tolist() == ref.row_totals(rows).tolist()


@PROPERTY
@given(cluster=clusters(), data=st.data())
def test_versions_after_matches_reference(cluster: Cluster, data: st.DataObject) -> None:
    """A node's version moves exactly when its free capacity, GPU count or model changed."""
    was = cluster.arrays()
    now = [a.copy() for a in was]
    n = len(cluster.gpus)
    for node in data.draw(st.lists(st.integers(0, n - 1), max_size=n)):
        column = data.draw(st.integers(0, 4))
        if column == 2:
            now[2][node, data.draw(st.integers(0, MAX_GPUS - 1))] += 1
        else:
            now[column][node] += 1
    version = np.array(data.draw(st.lists(st.integers(0, 1 << 40), min_size=n, max_size=n)), dtype=np.int64)
    args = [x for pair in zip(was, now, strict=True) for x in pair]
    got = nb.versions_after(version, *args)
    assert got.tolist() == ref.versions_after(version, *args).tolist()
    changed = [any(not np.array_equal(w[i], c[i]) for w, c in zip(was, now, strict=True)) for i in range(n)]
    assert (got - version).tolist() == [int(c) for c in changed]


# ---------------------------------------------------------------- every kernel has a plain twin


def public_kernels() -> list[str]:
    return sorted(n for n in nb.__all__ if n[0].islower() and callable(getattr(nb, n)))


def test_every_kernel_has_a_plain_twin_with_its_parameters() -> None:
    names = public_kernels()
    assert {"place_run", "most_free", "floor_table"} <= set(names)
    for name in names:
        assert name in ref.__all__, name
        fast = getattr(nb, name)
        fast = getattr(fast, "py_func", fast)  # (a plain function under NUMBA_DISABLE_JIT)
        plain = inspect.signature(getattr(ref, name)).parameters
        assert list(plain) == list(inspect.signature(fast).parameters), name


# ---------------------------------------------------------------- most_free


@pytest.mark.parametrize(
    ("cluster", "nodes", "want"),
    [
        (Cluster().node(gpus=2), [], (0, 0, 0, 0)),  # no node: nothing free
        (Cluster().node(cpu=5, mem=7, gpus=(1000, 250)), [0], (1, 1000, 5, 7)),  # one node
        (Cluster().node(gpus=MAX_GPUS), [0, 0], (MAX_GPUS, 1000, 64_000, 256_000)),  # every GPU free
        (Cluster().node(cpu=0, mem=0, gpus=(0, 0)), [0], (0, 0, 0, 0)),  # full
        (Cluster().node(cpu=-5, mem=-1, gpus=(999,)).node(cpu=3, gpus=(1,)), [1, 0], (0, 999, 3, 256_000)),
    ],
    ids=["empty", "one-node", "all-free", "full", "overcommitted"],
)
@pytest.mark.parametrize("kernels", [nb, ref], ids=["numba", "ref"])
def test_most_free_at_the_limits(
    kernels: Any, cluster: Cluster, nodes: list[int], want: tuple[int, int, int, int]
) -> None:
    cpu_free, mem_free, gpu_free, _, _ = cluster.arrays()
    got = kernels.most_free(np.array(nodes, dtype=np.int64), cpu_free, mem_free, gpu_free)
    assert tuple(int(x) for x in got) == want


@PROPERTY
@given(cluster=clusters(), data=st.data())
def test_most_free_matches_reference(cluster: Cluster, data: st.DataObject) -> None:
    cpu_free, mem_free, gpu_free, _, _ = cluster.arrays()
    nodes = data.draw(candidates(len(cluster.gpus)))
    got = nb.most_free(nodes, cpu_free, mem_free, gpu_free)
    assert tuple(int(x) for x in got) == ref.most_free(nodes, cpu_free, mem_free, gpu_free)


# ---------------------------------------------------------------- floor_table

BOUNDARY_SHAPES = [
    (1, 1, 0, 1),  # the smallest share
    (1, FULL_GPU - 1, 500, 2),  # the largest share
    (1, FULL_GPU, 1000, 1),  # one whole GPU
    (MAX_GPUS, FULL_GPU, 8000, 1),  # every GPU of a node
    (MAX_GPUS + 1, FULL_GPU, 8000, 3),  # past any node
    (2, 500, 100, 1),  # neither a share nor whole GPUs ("other")
    (0, 0, 4000, 9),  # CPU only: not a GPU shape
    (1, 300, 100, 0),  # weight 0: left out
    (1, 300, 100, -2),  # a negative weight: no sound floor
]


@pytest.mark.parametrize(
    "rows",
    [
        [],
        BOUNDARY_SHAPES[:1],
        BOUNDARY_SHAPES,
        BOUNDARY_SHAPES[:-1],
        [(1, 250, 100, 1)] * 3,
        [CPU_BOUND],
        [CPU_BOUND, *BOUNDARY_SHAPES],
        [CPU_BOUND, *BOUNDARY_SHAPES[:-1]],
    ],
    ids=["empty", "one", "every-bound", "sound", "ties", "cpu-bound-empty", "cpu-bound", "cpu-bound-sound"],
)
def test_floor_table_at_the_limits(rows: list[tuple[int, int, int, int]]) -> None:
    shapes = shape_matrix(rows)
    got = nb.floor_table(shapes)
    assert got.tolist() == ref.floor_table(shapes).tolist()
    assert got[nb.FLOOR_SOUND] == int(all(w >= 0 for g, _, _, w in rows if g > 0 and w != 0))
    bound = rows[:1] == [CPU_BOUND]
    fractional = sum(w for g, m, _, w in rows if g > 0 and w != 0 and m != FULL_GPU)
    assert got[nb.FLOOR_ROW_STARVED] == (fractional if bound else 0)
    assert (got[nb.FLOOR_MEAN_CPU] == 0) or not bound  # (no starved term at the mean)


@PROPERTY
@given(
    rows=st.lists(
        st.tuples(
            st.integers(0, MAX_GPUS + 2),
            st.sampled_from([0, 1, 250, 500, 999, FULL_GPU]) | st.integers(0, FULL_GPU),
            st.integers(0, 1 << 20),
            st.integers(-3, 1 << 16),
        ),
        max_size=12,
    ),
    bound=st.booleans(),
)
def test_floor_table_matches_reference(rows: list[tuple[int, int, int, int]], bound: bool) -> None:
    shapes = shape_matrix([CPU_BOUND, *rows] if bound else rows)
    assert nb.floor_table(shapes).tolist() == ref.floor_table(shapes).tolist()


# ---------------------------------------------------------------- place_run


def run_rows(tasks: list[Task], skip_at: int | None) -> tuple[Array, int]:
    """``place_run``'s task rows (one memo slot per distinct task shape) and the slot count."""
    slots: dict[Task, int] = {}
    rows = [
        [t.cpu, t.mem, t.gpus, t.milli, 0, slots.setdefault(t, len(slots)), int(j == skip_at)]
        for j, t in enumerate(tasks)
    ]
    out = np.array(rows, dtype=np.int64).reshape(-1, nb.RUN_COLUMNS)
    out[:, 4] = np.array([t.models for t in tasks], dtype=np.uint64)  # as decide: the bits, wrapped
    return out, max(1, len(slots))


Run = tuple[int, list[list[int]], list[Any]]


def place_run(
    kernels: Any, cluster: Cluster, tasks: list[Task], skip_at: int | None, policy: int, shapes: Array
) -> Run:
    """``place_run`` over every node of the cluster: (placed, out rows, arrays it changed)."""
    cpu_free, mem_free, gpu_free, gpu_count, node_model = cluster.arrays()
    gpu_total = nb.row_totals(gpu_free)
    version = np.zeros(len(cluster.gpus), dtype=np.int64)
    rows, n_slots = run_rows(tasks, skip_at)
    memos = np.full((n_slots, len(cluster.gpus), nb.MEMO_COLUMNS), -1, dtype=np.int64)
    out = np.full((len(tasks), 2), -1, dtype=np.int64)
    stale = np.empty((len(cluster.gpus), 3), dtype=np.int64)
    placed = kernels.place_run(
        cluster.all(), cpu_free, mem_free, gpu_free, gpu_total, gpu_count, node_model, policy, shapes,
        nb.floor_table(shapes), version, memos, rows, out, stale,
    )
    assert gpu_total.tolist() == nb.row_totals(gpu_free).tolist()  # kept in step
    changed = [a.tolist() for a in (cpu_free, mem_free, gpu_free, gpu_total, version)]
    return int(placed), out[: int(placed)].tolist(), changed


@pytest.mark.parametrize(
    ("cluster", "tasks", "skip_at", "want"),
    [
        (Cluster().node(gpus=2), [], None, 0),  # no job
        (Cluster().node(gpus=1), [gpu_task()], None, 1),  # one node, one job
        (Cluster().node(gpus=1), [gpu_task(), gpu_task()], None, 1),  # then full: stops
        (Cluster().node(gpus=2), [gpu_task(), gpu_task(), Task()], None, 3),  # to the last resource
        (Cluster().node(gpus=(0, 0), cpu=0), [Task(cpu=1)], None, 0),  # full from the start
        (Cluster().node(gpus=2), [gpu_task(), gpu_task()], 0, 0),  # skip at the first job
        (Cluster().node(gpus=2), [gpu_task(), gpu_task()], 1, 1),  # skip at the last job
        (Cluster().node(gpus=MAX_GPUS), [gpu_task(MAX_GPUS)], None, 1),  # every GPU of a node
        (Cluster().node(gpus=1, model=63), [gpu_task(models=bits(63))], None, 1),  # the top model bit
        (Cluster().node(gpus=1, model=62), [gpu_task(models=bits(63))], None, 0),
    ],
    ids=[
        "no-job", "one", "then-full", "exactly-full", "full", "skip-first", "skip-last", "all-gpus",
        "model-63", "not-model-63",
    ],
)
@pytest.mark.parametrize("policy", POLICIES, ids=["best-fit", "fgd"])
def test_place_run_at_the_limits(
    cluster: Cluster, tasks: list[Task], skip_at: int | None, want: int, policy: int
) -> None:
    shapes = shape_matrix([(1, FULL_GPU, 1000, 3), (1, 500, 1000, 1)])
    got = place_run(nb, cluster, tasks, skip_at, policy, shapes)
    assert got == place_run(ref, cluster, tasks, skip_at, policy, shapes)
    assert got[0] == want


@PROPERTY
@given(
    cluster=clusters(),
    kinds=st.lists(tasks(), min_size=1, max_size=3),
    data=st.data(),
    policy=st.sampled_from(POLICIES),
    shapes=shape_mixes(),
)
def test_place_run_matches_reference(
    cluster: Cluster, kinds: list[Task], data: st.DataObject, policy: int, shapes: Array
) -> None:
    """Runs of a few task shapes (memo slots shared as in decide) until one fits nowhere."""
    run = data.draw(st.lists(st.sampled_from(kinds), max_size=40))
    skip_at = data.draw(st.none() | st.integers(0, max(0, len(run) - 1)))
    want = place_run(ref, cluster, run, skip_at, policy, shapes)
    assert place_run(nb, cluster, run, skip_at, policy, shapes) == want


@PROPERTY
@given(
    cluster=clusters(),
    alike=st.integers(0, 40),
    kinds=st.lists(tasks(), min_size=1, max_size=2),
    data=st.data(),
    policy=st.sampled_from(POLICIES),
    shapes=shape_mixes(),
)
def test_place_run_in_calls_over_kept_memos_matches_reference(
    cluster: Cluster, alike: int, kinds: list[Task], data: st.DataObject, policy: int, shapes: Array
) -> None:
    """decide's way: several calls on one working copy, one memo per task shape kept across them
    (floors and scores of earlier calls), over a subset of the nodes in any order, nodes changed
    between calls (their versions bumped), runs of one shape long enough for the run kernel's
    tree (``memo._tree_best``), and up to 40 equal nodes (ties: the lowest node)."""
    for _ in range(alike):
        cluster.node(16_000, 65_536, 4, 0)
    n = len(cluster.gpus)
    cands = np.array(data.draw(st.permutations(range(n)))[: data.draw(st.integers(1, n))], dtype=np.int64)
    fast, plain = list(cluster.arrays()), list(cluster.arrays())
    for arrays in (fast, plain):
        arrays.insert(3, nb.row_totals(arrays[2]))  # gpu_total
    versions = [np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)]
    slots = {t: i for i, t in enumerate(dict.fromkeys(kinds))}
    memos = np.full((len(slots), n, nb.MEMO_COLUMNS), -1, dtype=np.int64)
    table = nb.floor_table(shapes)
    for _ in range(3):
        run: list[Task] = []
        for kind, times in data.draw(
            st.lists(st.tuples(st.sampled_from(kinds), st.integers(1, 12)), max_size=4)
        ):
            run += [kind] * times
        rows = np.array([[t.cpu, t.mem, t.gpus, t.milli, 0, slots[t], 0] for t in run], np.int64)
        rows = rows.reshape(-1, nb.RUN_COLUMNS)
        rows[:, 4] = np.array([t.models for t in run], dtype=np.uint64)
        outs = []
        for kernels, arrays, version in ((nb, fast, versions[0]), (ref, plain, versions[1])):
            out = np.full((len(run), 2), -1, dtype=np.int64)
            placed = kernels.place_run(
                cands, *arrays, policy, shapes, table, version, memos, rows, out, np.empty((n, 3), np.int64)
            )
            outs.append(out[:placed].tolist())
        assert outs[0] == outs[1]
        assert all(np.array_equal(a, b) for a, b in zip(fast, plain, strict=True))
        for node in data.draw(st.lists(st.integers(0, n - 1), max_size=3)):  # changed outside the run
            for arrays, version in ((fast, versions[0]), (plain, versions[1])):
                arrays[0][node] = max(0, int(arrays[0][node]) - 1000)
                version[node] += 1


# ---------------------------------------------------------------- place_spread


def spread(
    kernels: Any,
    cands: Array,
    starts: Array,
    arrays: tuple[Array, ...],
    tasks: list[Task],
    classes: list[int],
    allowed: npt.NDArray[np.bool_],
    weight: Array,
    policy: int = BEST_FIT,
    shapes: Array = NO_SHAPES,
) -> tuple[tuple[int, int], list[int]]:
    out = np.full(len(tasks), 7, dtype=np.int64)
    t_class = np.array(classes, dtype=np.int64)
    got = kernels.place_spread(
        cands, starts, *arrays, *gang_arrays(tasks), t_class, allowed, weight, policy, shapes, out
    )
    return (int(got[0]), int(got[1])), out.tolist()


@pytest.mark.parametrize("kernels", [nb, ref], ids=["numba", "ref"])
def test_spread_takes_a_node_a_task_and_the_domain_that_scores_best(kernels: Any) -> None:
    """Domain 0 has two roomy nodes, domain 1 three nodes of which two are half full (a
    better best fit): three tasks need domain 1; two tasks go there too (it scores better)."""
    half = (0,) * 4 + (1000,) * 4
    cluster = Cluster().node(gpus=8).node(gpus=8).node(gpus=8).node(gpus=half).node(gpus=half)
    cands, starts = np.arange(5, dtype=np.int64), np.array([0, 2, 5], dtype=np.int64)
    yes, none = np.ones((1, 5), dtype=np.bool_), np.zeros((1, 5), dtype=np.int64)
    three = [gpu_task()] * 3
    fleet = (cands, starts, cluster.arrays())
    assert spread(kernels, *fleet, three, [0] * 3, yes, none) == ((1, 3), [3, 4, 2])
    assert spread(kernels, *fleet, three[:2], [0] * 2, yes, none) == ((1, 2), [3, 4])
    assert spread(kernels, *fleet, [gpu_task()] * 4, [0] * 4, yes, none) == ((-1, 3), [-1] * 4)
    prefer_2 = np.array([[0, 0, 5, 0, 0]], dtype=np.int64)  # (n2 ties nobody: no change)
    assert spread(kernels, *fleet, three[:1], [0], yes, prefer_2)[1] == [3]
    prefer_4 = np.array([[0, 0, 0, 0, 5]], dtype=np.int64)  # (n3 and n4 tie: the weight decides)
    assert spread(kernels, *fleet, three[:1], [0], yes, prefer_4)[1] == [4]
    not_3 = np.array([[True, True, True, False, True]])
    assert spread(kernels, *fleet, three, [0] * 3, not_3, none) == ((-1, 2), [-1] * 3)


@st.composite
def spread_inputs(draw: st.DrawFn, size: int) -> tuple[Array, Array]:
    """Candidates grouped in runs (a node may repeat), and the runs' starts."""
    runs = draw(st.lists(st.lists(st.integers(0, size - 1), max_size=6), max_size=4))
    cands = np.array([n for run in runs for n in run], dtype=np.int64)
    starts = np.array([0, *np.cumsum([len(r) for r in runs]).tolist()], dtype=np.int64)
    return cands, starts


@PROPERTY
@given(
    cluster=clusters(),
    gang_tasks=gangs(),
    shapes=shape_mixes(),
    policy=st.sampled_from(POLICIES),
    data=st.data(),
)
def test_place_spread_matches_reference(
    cluster: Cluster, gang_tasks: list[Task], shapes: Array, policy: int, data: st.DataObject
) -> None:
    """Random fleets, gangs, runs (repeated nodes among them), classes, allowed candidates and
    weights (ties broken by them); inputs untouched; no node takes two tasks."""
    cands, starts = data.draw(spread_inputs(len(cluster.gpus)))
    n_classes = data.draw(st.integers(1, 3))
    classes = [data.draw(st.integers(0, n_classes - 1)) for _ in gang_tasks]
    allowed = np.array(
        data.draw(st.lists(st.booleans(), min_size=n_classes * cands.size, max_size=n_classes * cands.size)),
        dtype=np.bool_,
    ).reshape(n_classes, cands.size)
    weight = np.array(
        data.draw(st.lists(st.sampled_from([0, 0, 1, 5, 100]), min_size=allowed.size, max_size=allowed.size)),
        dtype=np.int64,
    ).reshape(n_classes, cands.size)
    arrays = cluster.arrays()
    inputs = (cands, starts, *arrays, allowed, weight)
    before = snapshot(inputs)
    args = (cands, starts, arrays, gang_tasks, classes, allowed, weight, policy, shapes)
    got = [spread(k, *args) for k in (nb, ref)]
    assert got[0] == got[1]
    assert all(np.array_equal(a, b) for a, b in zip(before, inputs, strict=True))
    (run, most), pos = got[0]
    if run < 0:
        assert pos == [-1] * len(gang_tasks)
        return
    assert most == len(gang_tasks)
    nodes = [int(cands[p]) for p in pos]
    assert len(set(nodes)) == len(nodes)
    assert all(starts[run] <= p < starts[run + 1] for p in pos)
    assert all(allowed[c, p] for p, c in zip(pos, classes, strict=True))


# ---------------------------------------------------------------- preferred_node


@PROPERTY
@given(cluster=clusters(), task=tasks(), shapes=shape_mixes(), data=st.data())
def test_preferred_node_matches_reference(
    cluster: Cluster, task: Task, shapes: Array, data: st.DataObject
) -> None:
    """Random weights (many alike: ties among tied nodes), the best node of random candidates
    (repeats, any order): the twins agree, the order of the candidates does not count, and
    the answer scores as the best node does and weighs at least as much."""
    arrays = cluster.arrays()
    cands = data.draw(candidates(len(cluster.gpus)))
    size = len(cluster.gpus)
    drawn = data.draw(st.lists(st.sampled_from([0, 0, 1, 7]), min_size=size, max_size=size))
    weights = np.array(drawn, dtype=np.int64)
    for policy in POLICIES:
        node = int(nb.best_node(cands, *arrays, *task.args(), policy, shapes))
        args = (*arrays, *task.args(), policy, shapes)
        got = int(nb.preferred_node(cands, weights, node, *args))
        assert got == int(ref.preferred_node(cands, weights, node, *args))
        assert got == int(nb.preferred_node(cands[::-1].copy(), weights, node, *args))
        if node < 0:
            assert got == -1
            continue
        score = (arrays[0], arrays[2], arrays[3], task.cpu, task.gpus, task.milli, policy, shapes)
        assert tuple(nb.node_score(got, *score)) == tuple(nb.node_score(node, *score))
        assert weights[got] >= weights[node]


@pytest.mark.parametrize("kernels", [nb, ref], ids=["numba", "ref"])
def test_preferred_node_takes_the_heaviest_tied_node(kernels: Any) -> None:
    """Four empty alike nodes and a fuller one (best fit: the fuller wins on score alone)."""
    cluster = Cluster().node(gpus=8).node(gpus=8).node(gpus=8).node(gpus=8)
    arrays, task = cluster.arrays(), gpu_task()
    cands = cluster.all()
    node = int(kernels.best_node(cands, *arrays, *task.args(), BEST_FIT, NO_SHAPES))
    assert node == 0

    def pick(weights: list[int], at: int = node) -> int:
        w = np.array(weights, dtype=np.int64)
        return int(kernels.preferred_node(cands, w, at, *arrays, *task.args(), BEST_FIT, NO_SHAPES))

    assert pick([0, 0, 0, 0]) == 0
    assert pick([0, 0, 3, 5]) == 3
    assert pick([0, 5, 3, 5]) == 1  # (two as heavy: the lower index)
    assert pick([9, 5, 3, 5]) == 0
    assert pick([0, 0, 0, 0], -1) == -1
    fuller = Cluster().node(gpus=8).node(gpus=(0, 1000)).node(gpus=8)
    f_arrays, f_cands = fuller.arrays(), fuller.all()
    best = int(kernels.best_node(f_cands, *f_arrays, *task.args(), BEST_FIT, NO_SHAPES))
    heavy = np.array([9, 0, 9], dtype=np.int64)
    assert best == 1
    got = kernels.preferred_node(f_cands, heavy, best, *f_arrays, *task.args(), BEST_FIT, NO_SHAPES)
    assert int(got) == 1  # (a preference never beats a better score)
