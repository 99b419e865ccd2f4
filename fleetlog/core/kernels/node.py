"""One node, one task: feasibility, scores and the best node of a candidate list."""

from __future__ import annotations

import numpy as np

from fleetlog.core.kernels.base import (
    _NO_SHAPES,
    _ZERO,
    CPU_TIEBREAK_CAP,
    FULL_GPU,
    GPU_LEFT_UNIT,
    GPU_NODE_PENALTY,
    I16,
    I32,
    I64,
    NO_NODE,
    Eval,
    NodeArrays,
    Task,
    _hot,
    _jit,
)
from fleetlog.core.kernels.frag import _frag_increase, _is_published, _published_pick, _tie_key, _uses_fgd
from fleetlog.core.kernels.gpus import _model_ok, _take

# ---------------------------------------------------------------- one node, one task


@_hot
def _gpu_fit(row: I16, count: int, gpus: int, milli: int) -> tuple[bool, int]:
    """(the task's GPUs fit, the node's free milli total): what ``_take`` decides, without the mask."""
    whole = milli == FULL_GPU
    total = 0
    usable = 0
    for i in range(count):
        free = int(row[i])
        total += free
        usable += (free >= milli) & ((not whole) | (free == FULL_GPU))
    return gpus <= 0 or usable >= gpus, total


@_hot
def _best_fit(count: int, total: int, cpu_left: int, gpus: int, milli: int) -> int:
    cpu_term = min(cpu_left, CPU_TIEBREAK_CAP)
    if gpus > 0:
        return (total - gpus * milli) * GPU_LEFT_UNIT + cpu_term
    if count > 0 and total > 0:
        return GPU_NODE_PENALTY + cpu_term
    return cpu_term


@_jit
def _fgd_increase(row: I16, count: int, cpu_avail: int, task: Task, shapes: I64) -> int:
    """F(after) - F(before) of placing the (fitting) task on the node (under the published
    rule: 100 - its score, ``_published_pick``)."""
    cpu, _, gpus, milli, _ = task
    if _is_published(shapes):
        return _published_pick(row, count, cpu_avail, cpu, gpus, milli, shapes)[0]
    mask = _take(row, count, gpus, milli)
    return _frag_increase(row, count, mask, milli, cpu_avail, cpu_avail - cpu, shapes)


@_hot
def _eval(
    cpu_avail: int,
    mem_avail: int,
    row: I16,
    count: int,
    model: int,
    task: Task,
    use_fgd: bool,
    shapes: I64,
    node: int,
) -> Eval:
    """(fits, primary, secondary) of one task on one node state (``node``: the node's index,
    which only the published rule's tie key reads)."""
    cpu, mem, gpus, milli, models = task
    if cpu_avail < cpu or mem_avail < mem or not _model_ok(models, model):
        return False, 0, 0
    fit, total = _gpu_fit(row, count, gpus, milli)
    if not fit:
        return False, 0, 0
    secondary = _best_fit(count, total, cpu_avail - cpu, gpus, milli)
    if not use_fgd:
        return True, 0, secondary
    if _is_published(shapes):  # (equal scores: the node's tie key, no best-fit tie-break)
        return True, _fgd_increase(row, count, cpu_avail, task, shapes), _tie_key(node, shapes)
    return True, _fgd_increase(row, count, cpu_avail, task, shapes), secondary


@_hot
def _eval_node(
    n: int,
    cpu_free: I64,
    mem_free: I64,
    gpu_free: I16,
    gpu_count: I32,
    node_model: I32,
    task: Task,
    use_fgd: bool,
    shapes: I64,
) -> Eval:
    # (arrays one by one: unpacking a tuple of arrays in a per-node loop costs refcount traffic)
    return _eval(
        int(cpu_free[n]),
        int(mem_free[n]),
        gpu_free[n],
        int(gpu_count[n]),
        int(node_model[n]),
        task,
        use_fgd,
        shapes,
        n,
    )


@_hot
def _task(cpu: int, mem: int, gpus: int, milli: int, models: np.uint64) -> Task:
    return int(cpu), int(mem), int(gpus), int(milli), np.uint64(models)


@_jit
def fits(
    n: int,
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
) -> bool:
    """Whether the task fits node ``n`` (cpu, memory, GPUs and GPU model)."""
    task = _task(cpu, mem, gpus, milli, models)
    return _eval_node(n, cpu_free, mem_free, gpu_free, gpu_count, node_model, task, False, _NO_SHAPES)[0]


@_jit
def node_score(
    n: int,
    cpu_free: I64,
    gpu_free: I16,
    gpu_count: I32,
    cpu: int,
    gpus: int,
    milli: int,
    policy: int,
    shapes: I64,
) -> tuple[int, int]:
    """(primary, secondary) score of placing the task on node ``n``, which must be feasible."""
    row = gpu_free[n]
    count = int(gpu_count[n])
    cpu_avail = int(cpu_free[n])
    task = _task(cpu, 0, gpus, milli, _ZERO)
    total = _gpu_fit(row, count, task[2], task[3])[1]
    secondary = _best_fit(count, total, cpu_avail - task[0], task[2], task[3])
    if not _uses_fgd(policy, shapes):
        return 0, secondary
    if _is_published(shapes):
        return _fgd_increase(row, count, cpu_avail, task, shapes), _tie_key(int(n), shapes)
    return _fgd_increase(row, count, cpu_avail, task, shapes), secondary


@_hot
def _better(primary: int, secondary: int, node: int, best_p: int, best_s: int, best_node: int) -> bool:
    """(primary, secondary, node) lexicographically below the best so far (-1 = none yet)."""
    if best_node < 0 or primary != best_p:
        return best_node < 0 or primary < best_p
    if secondary != best_s:
        return secondary < best_s
    return node < best_node


@_jit
def best_node(
    cands: I64,
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
    policy: int,
    shapes: I64,
) -> int:
    """Node index (not a position in ``cands``) of the best feasible candidate, or -1."""
    nodes = (cpu_free, mem_free, gpu_free, gpu_count, node_model)
    task = _task(cpu, mem, gpus, milli, models)
    if _uses_fgd(policy, shapes):
        return _best_of(cands, nodes, task, True, shapes)
    return _best_of(cands, nodes, task, False, shapes)


@_hot
def _best_of(cands: I64, nodes: NodeArrays, task: Task, use_fgd: bool, shapes: I64) -> int:
    cpu_free, mem_free, gpu_free, gpu_count, node_model = nodes
    best = NO_NODE
    best_p = 0
    best_s = 0
    for j in range(cands.shape[0]):
        n = int(cands[j])
        ok, primary, secondary = _eval_node(
            n, cpu_free, mem_free, gpu_free, gpu_count, node_model, task, use_fgd, shapes
        )
        if ok and _better(primary, secondary, n, best_p, best_s, best):
            best, best_p, best_s = n, primary, secondary
    return best


@_jit
def preferred_node(
    cands: I64,
    weights: I64,
    node: int,
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
    policy: int,
    shapes: I64,
) -> int:
    """Soft affinity for one task: of the feasible candidates that score exactly as ``node``
    does (the best node, as ``best_node`` finds it), the one with the highest ``weights[n]``,
    then the lowest index — ``node`` itself when none weighs more (or -1 when ``node`` is).
    Only the candidates that could win (a higher weight, or as high and a lower index) are
    scored."""
    if node < 0:
        return node
    task = _task(cpu, mem, gpus, milli, models)
    use_fgd = _uses_fgd(policy, shapes)
    _, want_p, want_s = _eval_node(
        node, cpu_free, mem_free, gpu_free, gpu_count, node_model, task, use_fgd, shapes
    )
    best, best_w = node, weights[node]
    for j in range(cands.shape[0]):
        n = int(cands[j])
        w = weights[n]
        if w < best_w or (w == best_w and n >= best):
            continue
        ok, p, s = _eval_node(n, cpu_free, mem_free, gpu_free, gpu_count, node_model, task, use_fgd, shapes)
        if ok and p == want_p and s == want_s:
            best, best_w = n, w
    return best


@_hot
def _take_scored(
    row: I16, count: int, gpus: int, milli: int, cpu_avail: int, cpu: int, use_fgd: bool, shapes: I64
) -> np.uint64:
    """``_take``'s GPUs, except under the published FGD rule (``use_fgd`` and its shape matrix),
    where a GPU share goes to the GPU of the highest score, the first such (``_published_pick``)."""
    if use_fgd and _is_published(shapes) and gpus == 1 and 0 < milli < FULL_GPU:
        return _published_pick(row, count, cpu_avail, cpu, gpus, milli, shapes)[1]
    return _take(row, count, gpus, milli)


@_jit
def pick_gpus_scored(
    gpu_free_row: I16, count: int, gpus: int, milli: int, cpu_avail: int, cpu: int, policy: int, shapes: I64
) -> np.uint64:
    """The GPUs a task takes on a node (0: it does not fit) as the policy scores them:
    ``pick_gpus``'s, except under the published FGD rule (``_take_scored``)."""
    use_fgd = _uses_fgd(policy, shapes)
    row, count, gpus, milli = gpu_free_row, int(count), int(gpus), int(milli)
    return _take_scored(row, count, gpus, milli, int(cpu_avail), int(cpu), use_fgd, shapes)
