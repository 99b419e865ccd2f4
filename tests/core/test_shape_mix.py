"""The shape mix FGD scores against (issue 23): two views of the window, by (gpus, milli) at the
group's mean CPU (``state.shape_mix``, as before) and its GPU shapes by ``shape_key``, the CPU
rounded up to a power of two of cores (``state.shape_mix_cpu``); ``default`` scores against the
first at ``MEAN_VIEW_WEIGHT`` times the second (``scratch.shape_matrix``)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks import trap
from fleetlog.core import kernels, scratch
from fleetlog.core.digest import digest, restore, snapshot
from fleetlog.core.fold import CPU_BOUND_ROW, MAX_SHAPES, cpu_bound, fold, is_cpu_bound, take_shape_mix
from fleetlog.core.invariants import check
from fleetlog.core.policy import Policy
from fleetlog.core.scratch import MEAN_VIEW_WEIGHT, per_cpu_weights, shape_matrix
from fleetlog.core.state import CoreConfig, State, shape_key
from fleetlog.events import NodeRemoved
from fleetlog.events.model import Event
from tests.core.builders import Driver, fold_chunked, job, node


def folded(cpus: list[int], config: CoreConfig | None = None) -> State:
    """A state that folded one 1-GPU job of each CPU in ``cpus``, in order."""
    state = State(config or CoreConfig())
    for i, cpu in enumerate(cpus):
        fold(state, job(f"j{i}", cpu=cpu), i + 1)
    return state


@pytest.mark.parametrize(
    ("cpu", "bucket"),
    [
        (0, 1), (1, 1), (1_000, 1), (1_001, 2), (2_000, 2), (2_001, 4), (4_000, 4), (4_001, 8),
        (32_000, 32), (32_001, 64), (10**12, 1 << 30),
    ],
)
def test_the_key_rounds_cpu_up_to_a_power_of_two_of_cores(cpu: int, bucket: int) -> None:
    assert shape_key((2, 500, cpu)) == (2, 500, bucket)


def test_a_group_of_two_cpu_needs_is_one_mean_row_and_two_cpu_rows() -> None:
    state = folded([4_000] * 6 + [3_000] * 2 + [32_000] * 8)
    assert state.shape_mix == ((1, 1000, 17_875, 16),)  # (the view of every fleetlog before it)
    assert state.shape_mix_cpu == ((1, 1000, 3_750, 8), (1, 1000, 32_000, 8))  # (ties: the smaller key)
    w = MEAN_VIEW_WEIGHT * 16
    assert shape_matrix(state).tolist() == [[1, 1000, 17_875, w], [1, 1000, 3_750, 8], [1, 1000, 32_000, 8]]
    check(state)  # (raises on a broken invariant: the shape counts against the window)


def test_the_matrix_kept_for_decide_follows_every_refresh_of_the_mix() -> None:
    """``shape_matrix`` keeps its matrix in ``state.derived`` while both views stay the same
    objects: at each refresh (every doubling of the tasks seen here) it is made again, equal to
    one made from scratch, and between refreshes it is the same matrix."""
    state, seen = State(CoreConfig(shape_window=64, shape_mix_every=8)), []
    for i in range(40):
        fold(state, job(f"j{i}", cpu=[4_000, 32_000, 6_000][i % 3], gpus=1 + i % 2), i + 1)
        kept = shape_matrix(state)
        assert kept is shape_matrix(state)
        fresh = State()
        fresh.shape_mix, fresh.shape_mix_cpu = state.shape_mix, state.shape_mix_cpu
        assert kept.tolist() == shape_matrix(fresh).tolist()
        seen.append(kept.tolist())
    assert len({str(m) for m in seen}) >= 4  # (the mix did change along the way)


def test_a_group_of_one_cpu_need_is_one_row_of_both_weights() -> None:
    """Its row in the CPU view equals its mean row: the matrix adds the weights (the score is
    linear in them), and fragments are the same as over the two rows."""
    state = folded([6_000] * 8)
    assert state.shape_mix == state.shape_mix_cpu == ((1, 1000, 6_000, 8),)
    merged = shape_matrix(state)
    assert merged.tolist() == [[1, 1000, 6_000, (MEAN_VIEW_WEIGHT + 1) * 8]]
    both = np.array([[1, 1000, 6_000, MEAN_VIEW_WEIGHT * 8], [1, 1000, 6_000, 8]], dtype=np.int64)
    for free in (4_000, 6_000, 9_000, 20_000):
        assert _increase(merged, free, 2_000) == _increase(both, free, 2_000)


def test_each_view_keeps_its_most_common_rows() -> None:
    """More keys than rows, CPU-only ones the most common: the mean view keeps the 32 most
    common (gpus, milli), CPU-only ones among them; the CPU view the 12 most common GPU keys."""
    state = State(CoreConfig(shape_window=4096))
    at = 0
    for g in range(1, 41):  # 40 GPU keys of 40 (gpus, milli), key g submitted g times
        for _ in range(g):
            at += 1
            fold(state, job(f"g{at}", gpus=1, milli=25 * g, cpu=1_000 * g), at)
    for c in range(8):  # 8 CPU-only keys of one (0, 0): 8 x 40 + 28 tasks, the most common
        for _ in range(40 + c):
            at += 1
            fold(state, job(f"c{at}", gpus=0, cpu=1_000 << c), at)
    take_shape_mix(state)  # (fold takes it at 256, 512, ... tasks: take it at the end)
    assert len(state.shape_mix) == MAX_SHAPES
    assert state.shape_mix[0][:2] == (0, 0)
    assert state.shape_mix[0][3] == sum(range(40, 48))
    assert [row[3] for row in state.shape_mix[1:]] == list(range(40, 40 - MAX_SHAPES + 1, -1))
    assert len(state.shape_mix_cpu) == CoreConfig().shape_cpu_rows
    assert all(row[0] > 0 for row in state.shape_mix_cpu)
    assert [row[3] for row in state.shape_mix_cpu] == list(range(40, 40 - CoreConfig().shape_cpu_rows, -1))
    check(state)


@pytest.mark.parametrize("rows", [0, -1, -12])
def test_no_rows_or_fewer_is_no_cpu_view_and_the_matrix_as_before(rows: int) -> None:
    state = folded([4_000, 32_000] * 8, CoreConfig(shape_cpu_rows=rows))
    assert state.shape_mix_cpu == ()
    assert shape_matrix(state).tolist() == [[1, 1000, 18_000, 16]]


def test_a_snapshot_keeps_both_views() -> None:
    state = folded([4_000, 32_000] * 8)
    back = restore(snapshot(state))
    assert back.shape_mix == state.shape_mix
    assert back.shape_mix_cpu == state.shape_mix_cpu
    assert digest(back) == digest(state)


def idle_gpus_after_one_pass() -> int:
    driver = Driver()
    driver.feed(*(node(f"n{i:02d}") for i in range(25)), check_each=False)
    # (per round: eight 1-GPU 4-core tasks, a 4-GPU 16-core one, a 1-GPU 48-core one, and every
    # other round an 8-GPU 24-core one: about twice what 25 nodes of 8 GPUs and 96 cores hold)
    driver.feed(*trap.arrivals(25, 8, 48_000, 8, "bursts"), check_each=False)
    driver.decide()
    nodes = driver.state.nodes
    return int((nodes.cols["gpu_free"][: nodes.size] > 0).sum())


def test_cpu_hungry_bursts_leave_no_gpu_idle() -> None:
    """A 48-core 1-GPU task is half a 96-core node: two on one node leave its 6 other GPUs
    without CPU. The CPU view alone keeps a 48-core room on each node such a task took and
    sends the 4-core tasks to fresh nodes instead, until only those rooms are left and the
    48-core tasks pair up in them (18 of 200 GPUs idle; the published rule with typical pods by
    exact CPU, 24); with the mean view beside it, none (as before the CPU view)."""
    assert idle_gpus_after_one_pass() == 0


def test_cpu_hungry_bursts_strand_gpus_with_the_cpu_view_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scratch, "MEAN_VIEW_WEIGHT", 0)  # (mean rows of weight 0 count for nothing)
    assert idle_gpus_after_one_pass() >= 12


def test_the_cpu_view_moves_a_decision_the_mean_view_ties() -> None:
    """The window's 1-GPU tasks ask 4 or 32 cores (mean 18). Two nodes with a free GPU, 40 and
    34 cores: a task of 4 cores leaves both above the mean (a tie for the mean view; neither
    starves), but only the 40-core one still feeds a 32-core task after it."""
    state = folded([4_000, 32_000] * 8)
    both, mean = shape_matrix(state), shape_matrix(state)[:1]
    assert _increase(mean, 40_000, 4_000) == _increase(mean, 34_000, 4_000) == 0
    assert _increase(both, 40_000, 4_000) == 0
    assert _increase(both, 34_000, 4_000) == 8 * 1000  # (the 32-core row's 8 tasks lose the GPU)


def _increase(shapes: np.ndarray, cpu_free: int, cpu: int) -> int:
    """The FGD increase of a node with one free GPU when a task without GPUs takes ``cpu``."""
    gpu_free = np.zeros((1, kernels.MAX_GPUS), dtype=np.int16)
    gpu_free[0, 0] = 1000
    count, cands = np.array([1], dtype=np.int32), np.array([0], dtype=np.int64)

    def f(free: int) -> int:
        return int(kernels.fragmentation(cands, np.array([free], dtype=np.int64), gpu_free, count, shapes))

    return f(cpu_free - cpu) - f(cpu_free)


# ---------------------------------------------------------------- when CPU runs out first


def fleet(config: CoreConfig | None = None, *nodes: tuple[str, int, int]) -> State:
    """A state that folded heartbeats of ``nodes`` (name, cores, GPUs): by default four 96-core
    8-GPU nodes (12 cores a GPU)."""
    state = State(config or CoreConfig())
    for at, (name, cores, gpus) in enumerate(nodes or [(f"n{i}", 96, 8) for i in range(4)]):
        fold(state, node(name, gpus=gpus, cpu=cores * 1_000), at + 1)
    return state


def window(state: State, *groups: tuple[int, int, int]) -> State:
    """Fold ``count`` jobs of (count, GPUs, cpu) per group, then take the mix."""
    at = 100
    for count, gpus, cpu in groups:
        for _ in range(count):
            at += 1
            fold(state, job(f"j{at}", gpus=gpus, cpu=cpu), at)
    take_shape_mix(state)
    return state


@pytest.mark.parametrize(("cpu", "bound"), [(11_000, False), (12_000, False), (12_001, True), (40_000, True)])
def test_a_window_is_cpu_bound_when_it_asks_more_of_the_cpu_than_of_the_gpus(cpu: int, bound: bool) -> None:
    """The fleet has 12 cores a GPU: 1-GPU tasks of up to 12 cores run out of GPUs first."""
    state = window(fleet(), (16, 1, cpu))
    assert cpu_bound(state) is bound
    assert is_cpu_bound(state) is bound
    check(state)


def test_cpu_only_tasks_count_and_so_does_the_cpu_of_nodes_without_gpus() -> None:
    """8-core 1-GPU tasks and as many 8-core CPU-only ones ask 16 cores a GPU: bound on 12. A
    384-core node without GPUs makes the fleet 24 cores a GPU: not bound; removed, bound again."""
    state = window(fleet(), (16, 1, 8_000), (16, 0, 8_000))
    assert is_cpu_bound(state)
    fold(state, node("cpus", gpus=0, cpu=384_000), 1_000)
    assert not is_cpu_bound(window(state))
    fold(state, NodeRemoved(cell="c1", node="cpus"), 1_001)
    assert is_cpu_bound(window(state))


@pytest.mark.parametrize("config", [CoreConfig(cpu_bound_rule=False), CoreConfig(shape_cpu_rows=0)])
def test_off_or_without_the_cpu_view_no_window_is_cpu_bound(config: CoreConfig) -> None:
    state = window(fleet(config), (16, 1, 40_000))
    assert cpu_bound(state)  # (the window does ask more of the CPU)
    assert not is_cpu_bound(state)
    assert shape_matrix(state)[0, 0] != kernels.CPU_BOUND_MARK


def test_without_gpu_tasks_or_gpus_no_window_is_cpu_bound() -> None:
    assert not cpu_bound(window(fleet(), (16, 0, 40_000)))
    assert not cpu_bound(window(fleet(None, ("a", 96, 0)), (16, 1, 40_000)))
    assert not cpu_bound(window(State(), (16, 1, 40_000)))  # (no node at all)


def test_a_cpu_bound_matrix_is_the_view_by_cpu_by_what_a_cpu_buys_and_a_snapshot_keeps_it() -> None:
    """12 1-GPU 4-core tasks, 4 1-GPU 32-core ones, 16 CPU-only 16-core ones: the window's GPU
    tasks take 16,000 GPU milli for 176,000 CPU milli. A 4-core task's takes 1000 / 4000 of a
    milli a CPU milli, 2.75 times the window's: 12 * 2.75 = 33; a 32-core one's 0.34375 times
    it: 4 * 0.34375 = 1.375, 1. The mean view is left out (and CPU-only rows are never in the
    view by CPU)."""
    state = window(fleet(), (12, 1, 4_000), (4, 1, 32_000), (16, 0, 16_000))
    assert state.shape_mix_cpu == (CPU_BOUND_ROW, (1, 1000, 4_000, 12), (1, 1000, 32_000, 4))
    rows = [[1, 1000, 4_000, 33], [1, 1000, 32_000, 1]]
    assert shape_matrix(state).tolist() == [list(CPU_BOUND_ROW), *rows]
    assert shape_matrix(state) is shape_matrix(state)  # (kept while the views are)
    back = restore(snapshot(state))
    assert back.shape_mix_cpu == state.shape_mix_cpu
    assert back.config == state.config
    assert digest(back) == digest(state)
    assert shape_matrix(back).tolist() == shape_matrix(state).tolist()


def test_without_the_weights_a_cpu_bound_matrix_is_the_two_views_after_the_marker() -> None:
    config = CoreConfig(cpu_bound_weights=False)
    state = window(fleet(config), (12, 1, 4_000), (4, 1, 32_000), (16, 0, 16_000))
    assert state.shape_mix_cpu == (CPU_BOUND_ROW, (1, 1000, 4_000, 12), (1, 1000, 32_000, 4))
    w = MEAN_VIEW_WEIGHT * 16
    rows = [[0, 0, 16_000, w], [1, 1000, 11_000, w], [1, 1000, 4_000, 12], [1, 1000, 32_000, 4]]
    assert shape_matrix(state).tolist() == [list(CPU_BOUND_ROW), *rows]
    assert restore(snapshot(state)).config == config


@pytest.mark.parametrize(
    ("rows", "weights"),
    [
        ([(1, 1000, 4_000, 12), (1, 1000, 32_000, 4)], [33, 1]),  # (the hand-worked window above)
        ([(1, 1000, 8_000, 5), (2, 1000, 16_000, 3), (1, 500, 4_000, 7)], [5, 3, 7]),  # (alike: counts)
        ([(4, 1000, 8_000, 1), (1, 1000, 8_000, 1)], [2, 1]),  # (1.6 and 0.4: half up, at least 1)
        ([(1, 1000, 8_000, 3), (0, 0, 8_000, 9), (1, 250, 1_000, 0)], [3, 9, 0]),  # (no GPU, no count)
        ([(1, 1000, 0, 1), (1, 1000, 8_000, 1)], [16, 1]),  # (no cpu: 1 milli, 4001, capped at 8 * 2)
        ([(8, 1000, 0, 4096), (1, 1, 10**9, 4096)], [MEAN_VIEW_WEIGHT * 8192, 1]),  # (hostile: capped)
        ([], []),
    ],
)
def test_per_cpu_weights(rows: list[tuple[int, int, int, int]], weights: list[int]) -> None:
    assert per_cpu_weights(rows) == weights


def test_cpu_bound_a_fractional_shape_starves_at_its_own_cpu_and_a_whole_one_not_at_all() -> None:
    """A node with one free GPU and 20 cores; a CPU-only task takes 12. Rows: a whole GPU at 4
    cores, half a GPU at 16. Both ways the half-GPU row stops fitting (+1000 milli of fragment).
    CPU-bound, the half-GPU row's own starvation grows from 1000 - 20 * 500 / 16 = 375 to
    1000 - 8 * 500 / 16 = 750 (+375), the whole one has none: 1375. As two views' matrix, the
    rows' mean (10 cores a 750 milli) starves 0, then 1000 - 8 * 750 / 10 = 400, times their
    weight 2 (+800): 1800."""
    rows = [(1, 1000, 4_000, 1), (1, 500, 16_000, 1)]
    bound = np.array([CPU_BOUND_ROW, *rows], dtype=np.int64)
    plain = np.array(rows, dtype=np.int64)
    assert _increase(bound, 20_000, 12_000) == 1375
    assert _increase(plain, 20_000, 12_000) == 1800


def test_where_cpu_runs_out_first_the_rule_leaves_fewer_gpus_idle() -> None:
    """A cell of the trap grid's ``cpu-bound`` mix (25 nodes of 64 cores and 8 GPUs; per round
    8-core CPU-only tasks for 8 cores a GPU asked, a 1-GPU 4-core task, a 4-GPU 16-core one, a
    1-GPU 16-core one and every other round an 8-GPU one): 2.5% of the GPUs idle with the
    CPU-bound rule, 6% without it (benchmarks/README.md, "When CPU runs out first")."""
    events = [*trap.nodes(25, 64, 8), *trap.arrivals(25, 8, 16_000, 1, "cpu-bound", 64)]
    assert trap.idle_pct(Policy(), events, 8) == 2.5
    assert trap.idle_pct(Policy(), events, 8, CoreConfig(cpu_bound_weights=False)) == 2.5
    assert trap.idle_pct(Policy(), events, 8, CoreConfig(cpu_bound_rule=False)) == 6.0


def regime_log() -> list[tuple[Event, int]]:
    """Four 96-core 8-GPU nodes (12 cores a GPU); runs of 4-core 1-GPU jobs (GPU-bound), steady
    heartbeats, runs of 40-core ones (CPU-bound), a 2,048-core node without GPUs joining (76
    cores a GPU: not bound), 24-core half-GPU jobs, that node removed (bound again), CPU-only
    and 1-GPU 8-core jobs interleaved (16 cores a GPU: bound), 4-core 1-GPU jobs (not bound)."""
    beats = [node(f"n{i}") for i in range(4)]
    events: list[Event] = [*beats]
    events += [job(f"a{i}", cpu=4_000) for i in range(40)] + beats
    events += [job(f"b{i}", cpu=40_000) for i in range(60)] + beats
    events += [node("cpus", gpus=0, cpu=2_048_000)] + [job(f"c{i}", cpu=24_000, milli=500) for i in range(40)]
    events += [NodeRemoved(cell="c1", node="cpus"), *beats]
    events += [job(f"d{i}", gpus=i % 2, cpu=8_000) for i in range(60)] + beats
    events += [job(f"e{i}", cpu=4_000) for i in range(80)]
    return [(e, at + 1) for at, e in enumerate(events)]


def test_the_batch_folds_take_the_same_regime_as_folding_one_by_one_however_chunked() -> None:
    config, log = CoreConfig(shape_window=64, shape_mix_every=16), regime_log()
    plain, views = State(config), []
    for e, at in log:
        fold(plain, e, at)
        views.append(plain.shape_mix_cpu)
    regimes = [view[:1] == (CPU_BOUND_ROW,) for view in views]
    assert sum(a != b for a, b in itertools.pairwise(regimes)) >= 4  # (not, bound, not, bound, not)
    def same_view(state: State, last: int) -> None:
        assert state.shape_mix_cpu == views[last], last

    for chunk in (1, 7, 50, len(log)):
        for how in ("many", "lists"):
            state = fold_chunked(config, log, chunk, how, same_view)
            assert digest(state) == digest(plain), (chunk, how)


MILLI = st.sampled_from([1, 100, 250, 500, 999, 1000])
ROW = st.tuples(st.integers(0, 8), MILLI, st.integers(0, 200_000), st.integers(0, 5000))


@settings(max_examples=300, deadline=None)
@given(st.lists(ROW, max_size=14), st.integers(2, 9))
def test_per_cpu_weights_on_generated_views(rows: list[tuple[int, int, int, int]], k: int) -> None:
    """Every GPU row with a count weighs 1 to 8 times the view's GPU counts; rows without GPUs or
    count keep their counts; scaling every row's cpu by k (all at least 1) changes no weight; of
    two rows alike in count, the one whose tasks take more GPU per CPU weighs at least as much."""
    weights = per_cpu_weights(rows)
    counted = sum(n for g, _, _, n in rows if g > 0 and n > 0)
    for (g, _, _, n), w in zip(rows, weights, strict=True):
        assert 1 <= w <= MEAN_VIEW_WEIGHT * counted if g > 0 and n > 0 else w == n
    fed = [(g, m, max(cpu, 1) * k, n) for g, m, cpu, n in rows]
    assert per_cpu_weights(fed) == per_cpu_weights([(g, m, max(cpu, 1), n) for g, m, cpu, n in rows])
    pairs = zip(rows, weights, strict=True)
    gpu = [(g * m, max(cpu, 1), n, w) for (g, m, cpu, n), w in pairs if g > 0 and n > 0]
    for (ma, ca, na, wa), (mb, cb, nb, wb) in itertools.product(gpu, gpu):
        if na == nb and ma * cb >= mb * ca:
            assert wa >= wb
