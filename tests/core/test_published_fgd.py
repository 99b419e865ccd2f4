"""The published FGD rule (policy ``fgd``; Weng et al., ATC'23, as the authors' simulator scores):
the kernels against their plain twins on generated inputs and at the limits, the integer score
against the plugin's float formula, the GPU a share takes, and the typical pods of a workload."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetlog.core import kernels as nb
from fleetlog.core import kernels_ref as ref
from fleetlog.core.kernels import FGD, FULL_GPU, PUBLISHED_MARK
from fleetlog.core.kernels.frag import _published_score, _tie_key
from fleetlog.core.typical import typical_pods
from tests.core.test_kernels import PROPERTY, Cluster, Task, clusters, gpu_task, place_run, tasks

Array = npt.NDArray[Any]
TIE_LIMIT = 1 << 40


def published(rows: list[tuple[int, int, int, int]], tie_seed: int = 0) -> Array:
    """The shape matrix of the published rule: the marker (its cpu column: the tie seed), then
    the typical pods."""
    return np.array([(PUBLISHED_MARK, 0, tie_seed, 0), *rows], dtype=np.int64).reshape(-1, 4)


NOWHERE = [(8, FULL_GPU, 10**9, 3), (64, FULL_GPU, 0, 2), (1, 999, 200_000, 1)]  # fit no node drawn


@st.composite
def typical_mixes(draw: st.DrawFn) -> Array:
    """0..6 typical pods (CPU-only ones with milli 0, as the simulator keys them), sometimes one
    that fits nowhere; weights 0..50."""
    rows = []
    for _ in range(draw(st.integers(0, 6))):
        task = draw(tasks())
        milli = task.milli if task.gpus > 0 else 0
        rows.append((task.gpus, milli, task.cpu, draw(st.integers(0, 50))))
    if draw(st.booleans()):
        rows.append(draw(st.sampled_from(NOWHERE)))
    return published(rows, draw(st.sampled_from([0, 1, 7, (1 << 62) - 1]) | st.integers(0, 1 << 40)))


def scores(kernels: Any, cluster: Cluster, task: Task, shapes: Array) -> list[tuple[int, int, int] | None]:
    """Per node: (primary, secondary, GPU mask) when the task fits, else None."""
    arrays = cluster.arrays()
    out: list[tuple[int, int, int] | None] = []
    for n in range(len(cluster.gpus)):
        if not kernels.fits(n, *arrays, *task.args()):
            out.append(None)
            continue
        task_args = (task.cpu, task.gpus, task.milli, FGD, shapes)
        p, s = kernels.node_score(n, arrays[0], arrays[2], arrays[3], *task_args)
        free = (arrays[2][n], int(arrays[3][n]), task.gpus, task.milli, int(arrays[0][n]), task.cpu)
        out.append((int(p), int(s), int(kernels.pick_gpus_scored(*free, FGD, shapes))))
    return out


@PROPERTY
@given(cluster=clusters(), task=tasks(), shapes=typical_mixes())
def test_scores_and_gpus_match_reference(cluster: Cluster, task: Task, shapes: Array) -> None:
    got = scores(nb, cluster, task, shapes)
    assert got == scores(ref, cluster, task, shapes)
    arrays = cluster.arrays()
    weight = int(shapes[:, 3].sum())
    for n, score in enumerate(got):
        if score is None or weight <= 0:
            continue
        assert 0 < score[0] <= 100  # 100 - a score in 0..99
        assert 0 <= score[1] < TIE_LIMIT  # the tie key, no best-fit tie-break
        mask = score[2]
        assert bin(mask).count("1") == task.gpus
        assert all(int(arrays[2][n, i]) >= task.milli for i in range(64) if mask >> i & 1)
    best = nb.best_node(cluster.all(), *arrays, *task.args(), FGD, shapes)
    assert best == ref.best_node(cluster.all(), *arrays, *task.args(), FGD, shapes)


@PROPERTY
@given(
    cluster=clusters(),
    kinds=st.lists(tasks(), min_size=1, max_size=3),
    shapes=typical_mixes(),
    data=st.data(),
)
def test_place_run_matches_reference(
    cluster: Cluster, kinds: list[Task], shapes: Array, data: st.DataObject
) -> None:
    """Runs of a few task shapes, each job on the best node's best GPU, the memo kept as in decide."""
    run = data.draw(st.lists(st.sampled_from(kinds), max_size=30))
    assert place_run(nb, cluster, run, None, FGD, shapes) == place_run(ref, cluster, run, None, FGD, shapes)


@PROPERTY
@given(cluster=clusters(), arrivals=st.lists(tasks(), min_size=1, max_size=12), shapes=typical_mixes())
def test_best_node_memo_matches_reference_as_tasks_land(
    cluster: Cluster, arrivals: list[Task], shapes: Array
) -> None:
    arrays = cluster.arrays()
    cpu_free, mem_free, gpu_free, gpu_count, _ = arrays
    version = np.zeros(len(cluster.gpus), dtype=np.int64)
    memos: dict[tuple[object, ...], Array] = {}
    for task in arrivals:
        memo = memos.setdefault(task.args(), np.full((version.size, nb.MEMO_COLUMNS), -1, np.int64))
        got = nb.best_node_memo(cluster.all(), *arrays, *task.args(), FGD, shapes, version, memo)
        assert got == ref.best_node(cluster.all(), *arrays, *task.args(), FGD, shapes)
        if got >= 0:
            take = (gpu_free[got], int(gpu_count[got]), task.gpus, task.milli, int(cpu_free[got]), task.cpu)
            mask = nb.pick_gpus_scored(*take, FGD, shapes)
            nb.allocate(got, mask, task.cpu, task.mem, task.milli, cpu_free, mem_free, gpu_free, -1)
            version[got] += 1


LIMITS = {
    "empty-mix": [],
    "one-shape": [(1, 500, 1000, 7)],
    "fits-nowhere": NOWHERE,
    "cpu-only-pods": [(0, 0, 4000, 5), (0, 0, 64_000, 1)],
    "zero-weights": [(1, 500, 1000, 0), (1, FULL_GPU, 0, 0)],
}
EDGE_NODES = (
    Cluster()
    .node(cpu=0, gpus=(1000, 500))  # no CPU
    .node(gpus=(0, 0, 0, 0))  # fully used GPUs
    .node(gpus=())  # no GPU
    .node(gpus=(1000, 300, 0))
    .node(cpu=4000, gpus=(1000, 1000))
)


@pytest.mark.parametrize("rows", list(LIMITS.values()), ids=list(LIMITS))
@pytest.mark.parametrize(
    "task", [Task(0, 0), Task(2000, 0), gpu_task(1, 300, 0), gpu_task(1, 500), gpu_task(2), gpu_task(8)]
)
def test_limits_match_reference(rows: list[tuple[int, int, int, int]], task: Task) -> None:
    shapes = published(rows)
    assert scores(nb, EDGE_NODES, task, shapes) == scores(ref, EDGE_NODES, task, shapes)
    arrays = EDGE_NODES.arrays()
    want = ref.best_node(EDGE_NODES.all(), *arrays, *task.args(), FGD, shapes)
    assert nb.best_node(EDGE_NODES.all(), *arrays, *task.args(), FGD, shapes) == want
    runs = [task] * 4
    want_run = place_run(ref, EDGE_NODES, runs, None, FGD, shapes)
    assert place_run(nb, EDGE_NODES, runs, None, FGD, shapes) == want_run


def test_an_empty_mix_scores_as_best_fit() -> None:
    """No typical pod (or none of positive weight): no FGD at all, as for the window's mix."""
    arrays = EDGE_NODES.arrays()
    task = gpu_task(1, 300, 0)
    for rows in ([], LIMITS["zero-weights"]):
        got = nb.best_node(EDGE_NODES.all(), *arrays, *task.args(), FGD, published(rows))
        assert got == nb.best_node(EDGE_NODES.all(), *arrays, *task.args(), nb.BEST_FIT, published([]))


def plugin_score(increase: int, weights: int) -> float:
    """The plugin's float before truncation: 100 * sigmoid((F before - F after) / 1000)."""
    return 100.0 / (1.0 + math.exp(increase / (1000.0 * weights)))


@pytest.mark.parametrize("weights", [1, 3, 7, 100, 8152])
def test_the_integer_score_is_the_plugins_truncated_sigmoid(weights: int) -> None:
    """Away from a boundary (where float rounding may differ) the score is int(plugin's float);
    no change is 50; a fragmentation added lowers it, one removed raises it; 0..99."""
    assert _published_score(0, weights) == 50 == ref._sigmoid_score(0, weights)
    for increase in range(-12_000 * weights, 12_000 * weights + 1, 37 * weights):
        got = _published_score(increase, weights)
        assert got == ref._sigmoid_score(increase, weights)
        want = plugin_score(increase, weights)
        if abs(want - round(want)) > 1e-9:
            assert got == int(want), (increase, weights)
        assert 0 <= got <= 99


def test_a_share_takes_the_gpu_of_the_best_score_not_the_tightest() -> None:
    """One typical pod of 300 milli. GPUs with 400 and 600 free: the tightest (400) leaves 100
    the pod cannot use (score int(100 * sigmoid(-0.1)) = 47); the other leaves 400 and 300,
    both usable (score 50). The published plugin takes GPU 1; fleetlog's own FGD, the tightest."""
    cluster = Cluster().node(gpus=(400, 600))
    task = gpu_task(1, 300, 0)
    shapes = published([(1, 300, 0, 1)])
    for kernels in (nb, ref):
        assert scores(kernels, cluster, task, shapes) == [(100 - 50, ref._tie_key(0, 0), 0b10)]
    assert nb.pick_gpus(cluster.arrays()[2][0], 2, 1, 300) == 0b01


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_equal_scores_go_to_the_node_of_the_least_tie_key(seed: int) -> None:
    """Twenty alike nodes: the framework picks one at random; fleetlog the one whose key, drawn
    from its index and the policy's tie seed, is least — another node for another seed."""
    cluster = Cluster()
    for _ in range(20):
        cluster.node(gpus=(1000, 1000))
    shapes = published([(1, FULL_GPU, 1000, 2), (1, 500, 1000, 1)], seed)
    want = min(range(20), key=lambda n: ref._tie_key(n, seed))
    for kernels in (nb, ref):
        cands = cluster.all()[::-1].copy()
        assert kernels.best_node(cands, *cluster.arrays(), *gpu_task().args(), FGD, shapes) == want


def test_the_tie_keys_differ_by_seed_and_match_reference() -> None:
    winners = {min(range(1213), key=lambda n: ref._tie_key(n, seed)) for seed in range(1, 11)}
    assert len(winners) >= 8  # ten seeds, (nearly) ten different first nodes
    for seed in (0, 1, 5, (1 << 62) - 1):
        keys = [_tie_key(n, published([], seed)) for n in range(300)]
        assert keys == [ref._tie_key(n, seed) for n in range(300)]
        assert len(set(keys)) == 300
        assert all(0 <= k < TIE_LIMIT for k in keys)


def test_cpu_only_typical_pods_count_every_free_share() -> None:
    """A CPU-only typical pod counts all free GPU milli as a fragment (the simulator's XL and
    XR): a whole-GPU task lowers F by its 1000 milli times the pod's weight, whatever the cpu."""
    cluster = Cluster().node(cpu=1000, gpus=(1000, 1000))
    task = gpu_task(1, FULL_GPU, 0)
    shapes = published([(0, 0, 64_000, 1)])  # the node lacks its CPU: XR, still all of it
    want = (100 - int(plugin_score(-1000, 1)), ref._tie_key(0, 0), 0b01)
    assert scores(ref, cluster, task, shapes) == [want]


# ---------------------------------------------------------------- typical pods of a workload


def test_typical_pods_keep_the_most_popular_until_95_percent() -> None:
    rows = [(1, 1000, 8000, 50), (1, 500, 4000, 30), (0, 0, 2000, 15), (2, 1000, 16_000, 4), (1, 250, 0, 1)]
    assert typical_pods(rows) == ((1, 1000, 8000, 50), (1, 500, 4000, 30), (0, 0, 2000, 15))
    assert typical_pods(rows, 96) == (*typical_pods(rows), (2, 1000, 16_000, 4))
    assert typical_pods(rows, 100) == tuple(rows)


def test_typical_pods_add_up_repeated_shapes_and_rank_ties_as_the_simulator() -> None:
    """Counts of a shape add up; a CPU-only task's milli is no request; equal counts: larger
    CPU, then milli, then GPU count first (the simulator's reversed order)."""
    rows = [(1, 500, 1000, 2), (0, 1000, 3000, 1), (0, 0, 3000, 1), (1, 700, 1000, 2), (2, 1000, 1000, 2)]
    assert typical_pods(rows, 100) == (
        (0, 0, 3000, 2), (2, 1000, 1000, 2), (1, 700, 1000, 2), (1, 500, 1000, 2),
    )


def test_typical_pods_of_nothing() -> None:
    assert typical_pods([]) == ()
    assert typical_pods([(1, 1000, 0, 0)]) == ()
