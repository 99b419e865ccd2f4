"""Fragmentation (FGD): a node's fragmentation under a shape mix and a task's increase of it."""

from __future__ import annotations

import numpy as np

from fleetlog.core.kernels.base import (
    _ZERO,
    CPU_BOUND_MARK,
    CPU_FEED_CAP,
    FGD,
    FULL_GPU,
    I16,
    I32,
    I64,
    PUBLISHED_LOGITS,
    PUBLISHED_MARK,
    PUBLISHED_MAX_SCORE,
    SHAPE_CPU,
    SHAPE_GPUS,
    SHAPE_MILLI,
    SHAPE_WEIGHT,
    _hot,
    _jit,
)
from fleetlog.core.kernels.gpus import _bit, _has_bit, _take

# ---------------------------------------------------------------- fragmentation (FGD)


@_hot
def _gpu_stats(row: I16, count: int, mask: np.uint64, taken: int) -> tuple[int, int, int, int, int, int]:
    """(free total, fully free GPUs, partly used milli) before and after ``taken`` milli leave
    the GPUs in ``mask``."""
    total_b, full_b, partial_b, total_a, full_a, partial_a = 0, 0, 0, 0, 0, 0
    for i in range(count):
        free = int(row[i])
        after = free - taken if _has_bit(mask, i) else free
        total_b += free
        total_a += after
        full_b += free == FULL_GPU
        full_a += after == FULL_GPU
        partial_b += free if 0 < free < FULL_GPU else 0
        partial_a += after if 0 < after < FULL_GPU else 0
    return total_b, full_b, partial_b, total_a, full_a, partial_a


@_hot
def _fractional_pair(
    row: I16, count: int, mask: np.uint64, taken: int, milli: int
) -> tuple[int, int, int, int]:
    """(GPUs with >= milli free, free milli on the others) before and after, for a fractional shape."""
    usable_b, stranded_b, usable_a, stranded_a = 0, 0, 0, 0
    for i in range(count):
        free = int(row[i])
        after = free - taken if _has_bit(mask, i) else free
        usable_b += free >= milli
        usable_a += after >= milli
        stranded_b += 0 if free >= milli else free
        stranded_a += 0 if after >= milli else after
    return usable_b, stranded_b, usable_a, stranded_a


@_hot
def _plain_frag(total: int, full: int, partial: int, cpu_avail: int, gpus: int, cpu: int) -> int:
    """frag of a whole-GPU shape: all free milli when it does not fit, else what it can't use."""
    if cpu > cpu_avail or full < gpus:
        return total
    return partial


@_hot
def _starved(total: int, cpu_avail: int, mean_cpu: int, mean_milli: int) -> int:
    """Free GPU milli that the node's free cpu cannot feed at the shape mix's cpu per GPU milli."""
    if mean_cpu <= 0:
        return 0
    fed = min(cpu_avail, CPU_FEED_CAP) * mean_milli // mean_cpu
    return max(0, total - fed)


@_hot
def _is_cpu_bound(shapes: I64) -> bool:
    """The shape matrix is scored as CPU-bound (its first row is the marker)."""
    return shapes.shape[0] > 0 and int(shapes[0, SHAPE_GPUS]) == CPU_BOUND_MARK


@_hot
def _frag_pair(
    row: I16, count: int, mask: np.uint64, taken: int, cpu_before: int, cpu_after: int, shapes: I64
) -> tuple[int, int]:
    """(F before, F after) of a node from which a task takes ``taken`` milli on the GPUs in
    ``mask`` and its cpu; F = sum_k weight_k * frag_k + W * starved over the GPU shapes k
    (W their total weight). CPU-only shapes count for nothing: every free GPU share is a
    fragment to them whatever happens, so they add the same to every node's increase. A
    CPU-bound matrix (``CPU_BOUND_MARK``) has no term at the mean: each fractional shape k adds
    weight_k * starved at its own cpu per GPU milli instead."""
    total_b, full_b, partial_b, total_a, full_a, partial_a = _gpu_stats(row, count, mask, taken)
    before, after = 0, 0
    weights, cpu_sum, milli_sum = 0, 0, 0
    bound = _is_cpu_bound(shapes)
    for k in range(shapes.shape[0]):
        gpus, milli = int(shapes[k, SHAPE_GPUS]), int(shapes[k, SHAPE_MILLI])
        cpu, weight = int(shapes[k, SHAPE_CPU]), int(shapes[k, SHAPE_WEIGHT])
        if weight == 0 or gpus <= 0:
            continue
        if not bound:
            weights += weight
            cpu_sum += weight * cpu
            milli_sum += weight * gpus * milli
        elif milli != FULL_GPU:
            before += weight * _starved(total_b, cpu_before, cpu, gpus * milli)
            after += weight * _starved(total_a, cpu_after, cpu, gpus * milli)
        if milli != FULL_GPU:
            usable_b, stranded_b, usable_a, stranded_a = _fractional_pair(row, count, mask, taken, milli)
            before += weight * (stranded_b if cpu <= cpu_before and usable_b >= gpus else total_b)
            after += weight * (stranded_a if cpu <= cpu_after and usable_a >= gpus else total_a)
        else:
            before += weight * _plain_frag(total_b, full_b, partial_b, cpu_before, gpus, cpu)
            after += weight * _plain_frag(total_a, full_a, partial_a, cpu_after, gpus, cpu)
    if weights > 0:
        mean_cpu, mean_milli = cpu_sum // weights, milli_sum // weights
        before += weights * _starved(total_b, cpu_before, mean_cpu, mean_milli)
        after += weights * _starved(total_a, cpu_after, mean_cpu, mean_milli)
    return before, after


@_hot
def _stranded(row: I16, count: int, mask: np.uint64, taken: int, milli: int, after: bool) -> int:
    """Free milli on the GPUs with less than ``milli`` free, before or after the task."""
    out = 0
    for i in range(count):
        free = int(row[i])
        if after and _has_bit(mask, i):
            free -= taken
        out += free if free < milli else 0
    return out


@_hot
def _share_frag_change(
    row: I16,
    count: int,
    mask: np.uint64,
    taken: int,
    milli: int,
    fit_b: bool,
    fit_a: bool,
    totals: tuple[int, int],
    changed: tuple[int, int],
) -> int:
    """frag after - frag before of a fractional shape (``milli`` in 1..999). When it fits both
    before and after, only the changed GPUs' stranded milli moves; ``changed`` = (the GPUs
    the task changes, the free share of the last of them): one GPU, or whole GPUs (which are
    never stranded, before or after). Otherwise the side(s) that fit are summed up."""
    total_b, total_a = totals
    n_changed, free = changed
    if fit_b and fit_a:
        if n_changed != 1:
            return 0
        left = free - taken
        return (left if left < milli else 0) - (free if free < milli else 0)
    frag_b = _stranded(row, count, mask, taken, milli, False) if fit_b else total_b
    frag_a = _stranded(row, count, mask, taken, milli, True) if fit_a else total_a
    return frag_a - frag_b


@_hot
def _frag_increase(
    row: I16, count: int, mask: np.uint64, taken: int, cpu_before: int, cpu_after: int, shapes: I64
) -> int:
    """F after - F before of ``_frag_pair``, exactly, in one pass over the GPUs and O(1) per
    shape: a task changes one GPU's share, or takes whole GPUs, or no GPU (any other mask
    goes to ``_frag_pair``), so a one-GPU fractional shape fits iff some GPU has ``milli``
    free (the largest share says) and its stranded milli moves only on the changed GPUs."""
    total_b, full_b, partial_b, top_b, total_a, full_a, partial_a, top_a = 0, 0, 0, -1, 0, 0, 0, -1
    n_changed, changed_free, odd = 0, 0, 0
    for i in range(count):
        free = int(row[i])
        after = free
        if _has_bit(mask, i):
            after = free - taken
            n_changed += 1
            changed_free = free
            odd += free != FULL_GPU or taken != FULL_GPU
        total_b += free
        total_a += after
        full_b += free == FULL_GPU
        full_a += after == FULL_GPU
        partial_b += free if 0 < free < FULL_GPU else 0
        partial_a += after if 0 < after < FULL_GPU else 0
        top_b = max(top_b, free)
        top_a = max(top_a, after)
    if n_changed > 1 and odd > 0:
        before, after_f = _frag_pair(row, count, mask, taken, cpu_before, cpu_after, shapes)
        return after_f - before
    increase = 0
    weights, cpu_sum, milli_sum = 0, 0, 0
    bound = _is_cpu_bound(shapes)
    for k in range(shapes.shape[0]):
        gpus, milli = int(shapes[k, SHAPE_GPUS]), int(shapes[k, SHAPE_MILLI])
        cpu, weight = int(shapes[k, SHAPE_CPU]), int(shapes[k, SHAPE_WEIGHT])
        if weight == 0 or gpus <= 0:
            continue
        if not bound:
            weights += weight
            cpu_sum += weight * cpu
            milli_sum += weight * gpus * milli
        elif milli != FULL_GPU:
            starved_b = _starved(total_b, cpu_before, cpu, gpus * milli)
            increase += weight * (_starved(total_a, cpu_after, cpu, gpus * milli) - starved_b)
        if milli == FULL_GPU:
            before = _plain_frag(total_b, full_b, partial_b, cpu_before, gpus, cpu)
            increase += weight * (_plain_frag(total_a, full_a, partial_a, cpu_after, gpus, cpu) - before)
        elif gpus == 1 and 0 < milli < FULL_GPU:
            fit_b = cpu <= cpu_before and top_b >= milli
            fit_a = cpu <= cpu_after and top_a >= milli
            totals, changed = (total_b, total_a), (n_changed, changed_free)
            increase += weight * _share_frag_change(
                row, count, mask, taken, milli, fit_b, fit_a, totals, changed
            )
        else:
            usable_b, stranded_b, usable_a, stranded_a = _fractional_pair(row, count, mask, taken, milli)
            before = stranded_b if cpu <= cpu_before and usable_b >= gpus else total_b
            increase += weight * ((stranded_a if cpu <= cpu_after and usable_a >= gpus else total_a) - before)
    if weights > 0:
        mean_cpu, mean_milli = cpu_sum // weights, milli_sum // weights
        before = _starved(total_b, cpu_before, mean_cpu, mean_milli)
        increase += weights * (_starved(total_a, cpu_after, mean_cpu, mean_milli) - before)
    return increase


# ---------------------------------------------------------------- the published FGD rule (ATC'23)


@_hot
def _is_published(shapes: I64) -> bool:
    """The shape matrix selects the published rule (its first row is the marker)."""
    return shapes.shape[0] > 0 and int(shapes[0, SHAPE_GPUS]) == PUBLISHED_MARK


@_hot
def _published_frag(
    row: I16, count: int, mask: np.uint64, taken: int, cpu_avail: int, gpus: int, milli: int, cpu: int
) -> int:
    """One typical pod's fragment of the node once ``taken`` milli leave the GPUs in ``mask``:
    the free milli of the GPUs with less than ``milli`` free when the pod fits (its cpu free, and
    ``gpus`` GPUs with ``milli`` free), else every free milli (a CPU-only pod: always)."""
    total, usable, stranded = 0, 0, 0
    for i in range(count):
        free = int(row[i])
        if _has_bit(mask, i):
            free -= taken
        total += free
        if free >= milli:
            usable += 1
        else:
            stranded += free
    if milli <= 0 or gpus <= 0 or cpu > cpu_avail or usable < gpus:
        return total
    return stranded


@_hot
def _published_increase(
    row: I16, count: int, mask: np.uint64, taken: int, cpu_before: int, cpu_after: int, shapes: I64
) -> int:
    """sum_k weight_k * (frag_k after - frag_k before) over the typical pods (every row but the
    marker): F after - F before, F in weight-milli (the published F times the total weight)."""
    out = 0
    for k in range(1, shapes.shape[0]):
        gpus, milli = int(shapes[k, SHAPE_GPUS]), int(shapes[k, SHAPE_MILLI])
        cpu, weight = int(shapes[k, SHAPE_CPU]), int(shapes[k, SHAPE_WEIGHT])
        if weight == 0:
            continue
        after = _published_frag(row, count, mask, taken, cpu_after, gpus, milli, cpu)
        out += weight * (after - _published_frag(row, count, _ZERO, 0, cpu_before, gpus, milli, cpu))
    return out


TIE_BITS = 40  # a tie key is below 2**40: a gang's sum of 2**16 of them stays far within int64


@_hot
def _tie_key(node: int, shapes: I64) -> int:
    """The published rule's secondary: a pseudo-random key of the node (splitmix64 of its index
    and the marker row's seed, ``shapes[0, SHAPE_CPU]``), so equal scores go to a node drawn
    as if at random, the same one on every replay (the framework draws at random)."""
    x = np.uint64(node + 1) * np.uint64(0x9E3779B97F4A7C15)
    x += np.uint64(shapes[0, SHAPE_CPU]) * np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return int(x >> np.uint64(64 - TIE_BITS))


@_hot
def _mix_weight(shapes: I64) -> int:
    weight = 0
    for k in range(shapes.shape[0]):
        weight += int(shapes[k, SHAPE_WEIGHT])
    return weight


@_hot
def _published_score(increase: int, weights: int) -> int:
    """int(100 * sigmoid(-increase / (1000 * weights))) without exp: the most s in 1..99 whose
    bound ``1000 * weights * ln((100 - s) / s)`` is at least the increase (0 when none)."""
    scale = 1000.0 * weights
    lo, hi = 0, PUBLISHED_MAX_SCORE - 1  # the answer is in lo..hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if float(increase) <= scale * PUBLISHED_LOGITS[mid - 1]:
            lo = mid
        else:
            hi = mid - 1
    return lo


@_hot
def _published_pick(
    row: I16, count: int, cpu_avail: int, cpu: int, gpus: int, milli: int, shapes: I64
) -> tuple[int, np.uint64]:
    """(100 - the published score, the GPUs taken) of a task that fits the node: a GPU share
    goes to the GPU of the highest score (the first such), other tasks take ``_take``'s GPUs."""
    weights = _mix_weight(shapes)
    if gpus == 1 and 0 < milli < FULL_GPU:
        best, best_mask = -1, _ZERO
        for i in range(count):
            if int(row[i]) >= milli:
                mask = _bit(i)
                increase = _published_increase(row, count, mask, milli, cpu_avail, cpu_avail - cpu, shapes)
                score = _published_score(increase, weights)
                if score > best:
                    best, best_mask = score, mask
        return PUBLISHED_MAX_SCORE - best, best_mask
    mask = _take(row, count, gpus, milli)
    increase = _published_increase(row, count, mask, milli, cpu_avail, cpu_avail - cpu, shapes)
    return PUBLISHED_MAX_SCORE - _published_score(increase, weights), mask


@_jit
def _uses_fgd(policy: int, shapes: I64) -> bool:
    """FGD only with a non-empty shape mix of positive total weight (else BEST_FIT)."""
    if policy != FGD:
        return False
    weight = 0
    for k in range(shapes.shape[0]):
        weight += int(shapes[k, SHAPE_WEIGHT])
    return weight > 0


@_jit
def fragmentation(cands: I64, cpu_free: I64, gpu_free: I16, gpu_count: I32, shapes: I64) -> int:
    """Sum of F(node) over ``cands`` (fit checks use cpu and GPUs only: no memory, no model)."""
    out = 0
    for j in range(cands.shape[0]):
        n = cands[j]
        cpu = int(cpu_free[n])
        out += _frag_pair(gpu_free[n], int(gpu_count[n]), _ZERO, 0, cpu, cpu, shapes)[0]
    return out
