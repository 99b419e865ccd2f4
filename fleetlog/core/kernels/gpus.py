"""GPUs of one node: which GPUs a task takes (``pick_gpus``) and the bit helpers."""

from __future__ import annotations

import numpy as np

from fleetlog.core.kernels.base import _ONE, _ZERO, FULL_GPU, I16, MAX_MODELS, _hot, _jit

# ---------------------------------------------------------------- GPUs of one node


@_hot
def _bit(i: int) -> np.uint64:
    return _ONE << np.uint64(i)


@_hot
def _has_bit(mask: np.uint64, i: int) -> bool:
    return bool(((mask >> np.uint64(i)) & _ONE) != _ZERO)


@_hot
def _model_ok(models: np.uint64, model: int) -> bool:
    """A task may use a node of ``model`` (``models == 0`` allows any, even unknown). Checked
    for every task: fold gives a task without GPUs 0, and decide may pass node *kinds* for
    models (a gang whose tasks differ in constraints: ``fleetlog.core.fitting.node_kinds``)."""
    allowed = np.uint64(models)
    if allowed == _ZERO:
        return True
    return 0 <= model < MAX_MODELS and _has_bit(allowed, model)


@_hot
def _take_whole(row: I16, count: int, gpus: int) -> np.uint64:
    """Mask of the ``gpus`` lowest-indexed fully free GPUs, or 0."""
    mask = _ZERO
    taken = 0
    for i in range(count):
        if taken < gpus and int(row[i]) == FULL_GPU:
            mask |= _bit(i)
            taken += 1
    return mask if taken == gpus else _ZERO


@_hot
def _tightest(row: I16, count: int, milli: int, skip: np.uint64) -> int:
    """The GPU (not in ``skip``) with the least free share still >= milli; -1 if none."""
    best = -1
    best_free = 0
    for i in range(count):
        free = int(row[i])
        if free >= milli and (best < 0 or free < best_free) and not _has_bit(skip, i):
            best = i
            best_free = free
    return best


@_hot
def _take_tightest(row: I16, count: int, gpus: int, milli: int) -> np.uint64:
    """Mask of the ``gpus`` tightest GPUs with free >= milli (ties: lowest index), or 0."""
    mask = _ZERO
    for _ in range(gpus):
        i = _tightest(row, count, milli, mask)
        if i < 0:
            return _ZERO
        mask |= _bit(i)
    return mask


@_hot
def _take(row: I16, count: int, gpus: int, milli: int) -> np.uint64:
    """The GPU mask a task takes on the node; 0 when it does not fit (or takes no GPU)."""
    if gpus <= 0 or gpus > count:
        return _ZERO
    if milli == FULL_GPU:
        return _take_whole(row, count, gpus)
    return _take_tightest(row, count, gpus, milli)


@_jit
def pick_gpus(gpu_free_row: I16, count: int, gpus: int, milli: int) -> np.uint64:
    """Bitmask of the GPUs a task takes on a node, 0 if it does not fit (and for gpus == 0).

    Whole GPUs (milli == 1000): the ``gpus`` lowest-indexed fully free GPUs. A fractional
    share: the GPU with the least free share that is still >= milli (tie: lowest index).
    """
    return _take(gpu_free_row, int(count), int(gpus), int(milli))
