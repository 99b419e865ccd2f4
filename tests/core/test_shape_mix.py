"""The shape mix FGD scores against (issue 23): keyed by GPUs, milli and the CPU rounded up to a
power of two of cores, the 12 most common GPU keys then 4 CPU-only ones, each row at its
bucket's mean CPU."""

from __future__ import annotations

import numpy as np
import pytest

from fleetlog.core import kernels
from fleetlog.core.fold import MAX_CPU_SHAPES, MAX_GPU_SHAPES, fold, take_shape_mix
from fleetlog.core.invariants import check
from fleetlog.core.scratch import shape_matrix
from fleetlog.core.state import CoreConfig, State, shape_key
from tests.core.builders import job


@pytest.mark.parametrize(
    ("cpu", "bucket"),
    [
        (0, 1), (1, 1), (1_000, 1), (1_001, 2), (2_000, 2), (2_001, 4), (4_000, 4), (4_001, 8),
        (32_000, 32), (32_001, 64), (10**12, 1 << 30),
    ],
)
def test_the_key_rounds_cpu_up_to_a_power_of_two_of_cores(cpu: int, bucket: int) -> None:
    assert shape_key((2, 500, cpu)) == (2, 500, bucket)


def test_one_gpu_group_of_two_cpu_needs_is_two_rows_at_their_own_mean() -> None:
    state = State()
    for i, cpu in enumerate([4_000] * 6 + [3_000] * 2 + [32_000] * 8):
        fold(state, job(f"j{i}", cpu=cpu), i + 1)
    assert state.shape_mix == ((1, 1000, 3_750, 8), (1, 1000, 32_000, 8))  # (ties: the smaller key)
    check(state)  # (raises on a broken invariant: the shape counts against the window)


def test_the_mix_keeps_the_most_common_gpu_rows_then_cpu_only_ones() -> None:
    """More keys than rows, CPU-only ones the most common: the 12 GPU keys of the most tasks
    (ties: the smaller key) come first, then the 4 most common CPU-only keys."""
    state = State(CoreConfig(shape_window=4096))
    at = 0
    for g in range(1, 21):  # 20 GPU keys, key g submitted g times
        for _ in range(g):
            at += 1
            fold(state, job(f"g{at}", gpus=1 + g % 8, milli=1000, cpu=1_000 * g), at)
    for c in range(8):  # 8 CPU-only keys, each more common than any GPU key
        for _ in range(40 + c):
            at += 1
            fold(state, job(f"c{at}", gpus=0, cpu=1_000 << c), at)
    take_shape_mix(state)  # (fold takes it at 256, 512, ... tasks: take it at the end)
    state_rows = shape_matrix(state)
    gpu_rows, cpu_rows = state_rows[:MAX_GPU_SHAPES], state_rows[MAX_GPU_SHAPES:]
    assert len(gpu_rows) == MAX_GPU_SHAPES
    assert len(cpu_rows) == MAX_CPU_SHAPES
    assert (gpu_rows[:, 0] > 0).all()
    assert (cpu_rows[:, 0] == 0).all()
    assert gpu_rows[:, 3].tolist() == list(range(20, 20 - MAX_GPU_SHAPES, -1))  # the most tasks first
    assert cpu_rows[:, 3].tolist() == [47, 46, 45, 44]
    check(state)  # (raises on a broken invariant: the shape counts against the window)


def _increase(shapes: np.ndarray, cpu_free: int, cpu: int) -> int:
    """The FGD increase of a node with 2 free GPUs when a CPU-only task takes ``cpu``."""
    gpu_free = np.zeros((1, kernels.MAX_GPUS), dtype=np.int16)
    gpu_free[0, :2] = 1000
    count, cands = np.array([2], dtype=np.int32), np.array([0], dtype=np.int64)

    def f(free: int) -> int:
        return int(kernels.fragmentation(cands, np.array([free], dtype=np.int64), gpu_free, count, shapes))

    return f(cpu_free - cpu) - f(cpu_free)


def test_a_node_keeps_the_cpu_its_hungry_shapes_need() -> None:
    """Half the GPU tasks ask 4 cores, half 32: a 4-core task should go to the node with 20
    cores free (it still feeds the 4-core tasks) and spare the one with 34 (the only kind that
    feeds a 32-core task). The mean (18 cores) sees it the other way round: 34 -> 30 stays above
    it, 20 -> 16 falls below."""
    state = State()
    for i, cpu in enumerate([4_000, 32_000] * 8):
        fold(state, job(f"j{i}", cpu=cpu), i + 1)
    shapes = shape_matrix(state)
    assert _increase(shapes, 20_000, 4_000) < _increase(shapes, 34_000, 4_000)
    by_mean = np.array([[1, 1000, 18_000, 16]], dtype=np.int64)
    assert _increase(by_mean, 20_000, 4_000) > _increase(by_mean, 34_000, 4_000)
