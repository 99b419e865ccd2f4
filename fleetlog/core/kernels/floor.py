"""A floor under the FGD increase (``floor_table``, ``_fgd_floor``) and ``allocate``."""

from __future__ import annotations

import numpy as np

from fleetlog.core.kernels.base import (
    _ONE,
    _ZERO,
    FULL_GPU,
    I16,
    I64,
    MAX_GPUS,
    PUBLISHED_MARK,
    SHAPE_CPU,
    SHAPE_GPUS,
    SHAPE_MILLI,
    SHAPE_WEIGHT,
    Task,
    _hot,
    _jit,
)
from fleetlog.core.kernels.frag import _is_cpu_bound, _starved
from fleetlog.core.kernels.gpus import _has_bit, _model_ok
from fleetlog.core.kernels.node import _best_fit

# ---------------------------------------------------------------- a floor under the FGD increase

# Why the floor holds (``_frag_pair``'s terms, a task taking D = gpus * milli milli-GPU and its
# cpu >= 0): taking resources never makes a shape fit that did not fit before, and a GPU share
# that drops by t moves a shape's fragment (stranded or partial milli) by at least -t, so every
# shape's term changes by at least -D (by exactly -D when it fits neither before nor after).
# A shape provably changes by >= 0 when it fits before and the task's GPU(s) had enough for it
# (the GPU goes from usable to stranded, or stays usable): one-GPU fractional shapes with
# milli <= the chosen GPU's free share (or whole GPUs taken), whole-GPU shapes when the task
# takes (from) fully free GPUs and the node has their GPUs, in both cases with their cpu free
# on the node. The floor is -D times the weight of every other shape, plus the starved term's
# change (exact). A CPU-bound matrix has no starved term at the mean; each fractional shape's
# own starved term changes by at least -D (the free milli drop by D, the milli the cpu feeds
# cannot grow) and by at least 0 when the task takes no GPU: -D times their weight more.

# layout of the per-call table built by _floor_table
FLOOR_SHARE_OVER = 0  # [0 .. 1000]: weight of 1-GPU fractional shapes with milli > f
FLOOR_WHOLE_OVER = FULL_GPU + 1  # [0 .. MAX_GPUS]: weight of whole-GPU shapes of more than g GPUs
FLOOR_OTHER = FLOOR_WHOLE_OVER + MAX_GPUS + 1  # weight of other GPU shapes (never provably >= 0)
FLOOR_WHOLE = FLOOR_OTHER + 1  # weight of all whole-GPU shapes
FLOOR_WEIGHTS = FLOOR_WHOLE + 1  # W, the weight of all GPU shapes
FLOOR_MEAN_CPU = FLOOR_WEIGHTS + 1
FLOOR_MEAN_MILLI = FLOOR_MEAN_CPU + 1
FLOOR_SOUND = FLOOR_MEAN_MILLI + 1  # 1 when no weight is negative (else no floor)
FLOOR_ROW_STARVED = FLOOR_SOUND + 1  # CPU-bound: weight of the fractional shapes (own starved terms)
FLOOR_CPU = FLOOR_ROW_STARVED + 1  # pairs (cpu, weight) of the GPU shapes, by descending cpu
NO_FLOOR_VALUE = -(1 << 62)


@_jit
def _floor_table(shapes: I64) -> I64:
    """What ``_fgd_floor`` needs of the shape mix, once per call (see the layout above)."""
    n_shapes = shapes.shape[0]
    table = np.zeros(FLOOR_CPU + 2 * n_shapes, dtype=np.int64)
    table[FLOOR_SOUND] = 1
    weights, cpu_sum, milli_sum, n_cpu = 0, 0, 0, 0
    bound = _is_cpu_bound(shapes)
    for k in range(n_shapes):
        gpus, milli = int(shapes[k, SHAPE_GPUS]), int(shapes[k, SHAPE_MILLI])
        cpu, weight = int(shapes[k, SHAPE_CPU]), int(shapes[k, SHAPE_WEIGHT])
        if gpus == PUBLISHED_MARK:  # the published rule's score: no floor known under it
            table[FLOOR_SOUND] = 0
        if weight == 0 or gpus <= 0:
            continue
        if weight < 0:
            table[FLOOR_SOUND] = 0
        if bound and milli != FULL_GPU:
            table[FLOOR_ROW_STARVED] += weight
        weights += weight
        cpu_sum += weight * cpu
        milli_sum += weight * gpus * milli
        if milli == FULL_GPU:
            table[FLOOR_WHOLE] += weight
            table[FLOOR_WHOLE_OVER + min(gpus, MAX_GPUS + 1) - 1] += weight
        elif gpus == 1 and 0 < milli < FULL_GPU:
            table[FLOOR_SHARE_OVER + milli - 1] += weight
        else:
            table[FLOOR_OTHER] += weight
        at = FLOOR_CPU + 2 * n_cpu  # insertion by descending cpu
        while at > FLOOR_CPU and table[at - 2] < cpu:
            table[at], table[at + 1] = table[at - 2], table[at - 1]
            at -= 2
        table[at], table[at + 1] = cpu, weight
        n_cpu += 1
    for f in range(FULL_GPU - 1, -1, -1):  # bucket m - 1 holds milli m: suffix sums give "> f"
        table[FLOOR_SHARE_OVER + f] += table[FLOOR_SHARE_OVER + f + 1]
    for g in range(MAX_GPUS - 1, -1, -1):
        table[FLOOR_WHOLE_OVER + g] += table[FLOOR_WHOLE_OVER + g + 1]
    table[FLOOR_WEIGHTS] = weights
    if weights > 0 and not bound:  # (mean cpu 0: no starved term at the mean)
        table[FLOOR_MEAN_CPU] = cpu_sum // weights
        table[FLOOR_MEAN_MILLI] = milli_sum // weights
    return table[: FLOOR_CPU + 2 * n_cpu]


floor_table = _floor_table  # (what ``place_run`` takes as its ``table``)


@_hot
def _gpu_summary(row: I16, count: int, milli: int) -> tuple[int, int, int, int]:
    """(free total, fully free GPUs, GPUs the task's ``milli`` may use (as ``_gpu_fit``), the
    least free share >= milli or -1)."""
    whole = milli == FULL_GPU
    total, full, usable, tight = 0, 0, 0, -1
    for i in range(count):
        free = int(row[i])
        total += free
        full += free == FULL_GPU
        usable += (free >= milli) & ((not whole) | (free == FULL_GPU))
        if free >= milli and (tight < 0 or free < tight):
            tight = free
    return total, full, usable, tight


@_hot
def _cpu_short(table: I64, cpu_avail: int) -> int:
    """Weight of the GPU shapes asking for more cpu than ``cpu_avail``."""
    out = 0
    for at in range(FLOOR_CPU, table.shape[0], 2):
        if table[at] <= cpu_avail:
            break
        out += table[at + 1]
    return out


@_hot
def _fgd_floor(
    cpu_avail: int, mem_avail: int, row: I16, count: int, model: int, task: Task, table: I64
) -> tuple[bool, int, int]:
    """(fits, a floor under the FGD increase, the secondary score): ``fits`` and the secondary
    are exactly ``_eval``'s; the increase is at least the floor (see above)."""
    cpu, mem, gpus, milli, models = task
    if cpu_avail < cpu or mem_avail < mem or not _model_ok(models, model):
        return False, 0, 0
    total, full, usable, tight = _gpu_summary(row, count, milli)
    if not (gpus <= 0 or usable >= gpus):
        return False, 0, 0
    secondary = _best_fit(count, total, cpu_avail - cpu, gpus, milli)
    if table[FLOOR_SOUND] == 0 or cpu < 0 or (gpus > 0 and not 0 < milli <= FULL_GPU):
        return True, NO_FLOOR_VALUE, secondary
    taken = gpus * milli if gpus > 0 else 0
    weights = int(table[FLOOR_WEIGHTS])
    floor = 0
    if weights > 0:
        mean_cpu, mean_milli = int(table[FLOOR_MEAN_CPU]), int(table[FLOOR_MEAN_MILLI])
        before = _starved(total, cpu_avail, mean_cpu, mean_milli)
        floor = weights * (_starved(total - taken, cpu_avail - cpu, mean_cpu, mean_milli) - before)
    if taken == 0:
        return True, floor, secondary
    if milli == FULL_GPU:  # whole GPUs: 1-GPU shares fit them before
        unsure = int(table[FLOOR_OTHER]) + int(table[FLOOR_WHOLE_OVER + min(full, MAX_GPUS)])
    elif gpus == 1:  # one share, from the GPU with ``tight`` free
        unsure = int(table[FLOOR_OTHER]) + int(table[FLOOR_SHARE_OVER + tight])
        whole = table[FLOOR_WHOLE_OVER + min(full, MAX_GPUS)] if tight == FULL_GPU else table[FLOOR_WHOLE]
        unsure += int(whole)
    else:
        unsure = weights
    unsure += _cpu_short(table, cpu_avail) + int(table[FLOOR_ROW_STARVED])
    return True, floor - taken * unsure, secondary


@_jit
def allocate(
    n: int,
    mask: np.uint64,
    cpu: int,
    mem: int,
    milli: int,
    cpu_free: I64,
    mem_free: I64,
    gpu_free: I16,
    sign: int,
) -> None:
    """Take (sign = -1) or give back (sign = +1) a task's resources on node ``n``, in place."""
    _allocate(n, np.uint64(mask), int(cpu), int(mem), int(milli), cpu_free, mem_free, gpu_free, int(sign))


@_hot
def _allocate(
    n: int,
    mask: np.uint64,
    cpu: int,
    mem: int,
    milli: int,
    cpu_free: I64,
    mem_free: I64,
    gpu_free: I16,
    sign: int,
) -> None:
    cpu_free[n] += sign * cpu
    mem_free[n] += sign * mem
    rest = mask
    for i in range(MAX_GPUS):
        if rest == _ZERO:
            break
        if _has_bit(rest, 0):
            gpu_free[n, i] += sign * milli
        rest >>= _ONE
