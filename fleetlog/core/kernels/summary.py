"""Best-fit with a node summary: ``best_node_summary`` and ``most_free``."""

from __future__ import annotations

import numpy as np

from fleetlog.core.kernels.base import _NO_SHAPES, FULL_GPU, I16, I32, I64, NO_NODE, NodeArrays, Task, _jit
from fleetlog.core.kernels.node import _best_fit, _eval_node, _task

# ---------------------------------------------------------------- best-fit with a node summary


@_jit
def best_node_summary(
    cands: I64,
    gpu_total: I64,
    cpu_free: I64,
    mem_free: I64,
    gpu_free: I16,
    gpu_count: I32,
    node_model: I32,
    cpu: int,
    mem: int,
    gpus: int,
    milli: int,
    models: np.uint64,
) -> int:
    """``best_node`` under BEST_FIT, pruned by ``gpu_total`` (each node's free GPU milli total).

    A node's best-fit score is a function of its free total and free CPU alone, so a node
    whose score cannot beat the best feasible node found so far is skipped before its GPUs
    are looked at. Same result as ``best_node(..., BEST_FIT, ...)`` whenever ``gpu_total[n]``
    equals the sum of node ``n``'s free shares.
    """
    task = _task(cpu, mem, gpus, milli, models)
    return _best_summary(cands, gpu_total, (cpu_free, mem_free, gpu_free, gpu_count, node_model), task)


@_jit
def _best_summary(cands: I64, gpu_total: I64, nodes: NodeArrays, task: Task) -> int:
    """``best_node_summary`` of one task."""
    cpu_free, mem_free, gpu_free, gpu_count, node_model = nodes
    cpu, _, gpus, milli, _ = task
    best, best_s = NO_NODE, 0
    for j in range(cands.shape[0]):
        n = int(cands[j])
        count = int(gpu_count[n])
        total = int(gpu_total[n])
        if gpus > 0 and total < gpus * milli:
            continue
        cpu_left = int(cpu_free[n]) - cpu
        if cpu_left < 0:
            continue
        score = _best_fit(count, total, cpu_left, gpus, milli)
        if best >= 0 and (score > best_s or (score == best_s and n > best)):
            continue
        ok, _, secondary = _eval_node(
            n, cpu_free, mem_free, gpu_free, gpu_count, node_model, task, False, _NO_SHAPES
        )
        if ok:
            best, best_s = n, secondary
    return best


@_jit
def most_free(nodes: I64, cpu_free: I64, mem_free: I64, gpu_free: I16) -> tuple[int, int, int, int]:
    """Over ``nodes``: the most whole free GPUs on one node, the most free share on one GPU, the
    most free CPU and the most free memory (for the "insufficient capacity" explanation)."""
    whole_max, share_max, cpu_max, mem_max = 0, 0, 0, 0
    for j in range(nodes.shape[0]):
        n = nodes[j]
        whole = 0
        for i in range(gpu_free.shape[1]):
            free = int(gpu_free[n, i])
            whole += free == FULL_GPU
            share_max = max(share_max, free)
        whole_max = max(whole_max, whole)
        cpu_max = max(cpu_max, int(cpu_free[n]))
        mem_max = max(mem_max, int(mem_free[n]))
    return whole_max, share_max, cpu_max, mem_max
