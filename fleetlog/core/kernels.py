"""Placement kernels: which node (and which GPUs on it) a task or a gang goes to.

Everything here is ``numba.njit`` over the state's struct of arrays, integer arithmetic only,
no fastmath, no parallel reductions; equal scores always go to the lowest node index.
``fleetlog.core.kernels_ref`` holds the same functions in plain, readable Python; the two must
agree exactly (``tests/core/test_kernels.py`` checks it with hypothesis).

Node arrays (N nodes): ``cpu_free`` int64 (milli-CPU), ``mem_free`` int64 (MiB), ``gpu_free``
int16[N, 64] (free milli-share per GPU, 1000 = fully free; the first ``gpu_count[n]`` are
meaningful), ``gpu_count`` int32, ``node_model`` int32 (GPU model id 0..63, -1 for none).

A task is (cpu, mem, gpus, milli, models): ``milli`` is the per-GPU share (1000 = whole GPUs;
below 1000 only with ``gpus == 1``); ``models`` is a uint64 bitmask of allowed GPU models, 0 = any.
``shapes`` is int64[K, 4] of rows (gpus, milli, cpu, weight): the recent task-shape mix used by FGD.

Scores are pairs ``(primary, secondary)`` of int64, lower is better, compared lexicographically
(then by node index). BEST_FIT: primary 0, secondary the best-fit score below. FGD: primary the
fragmentation increase ``F(after) - F(before)``, secondary the best-fit score. A gang's score is
the component-wise sum of its tasks' scores. Magnitudes: a secondary is below 2**47, so a sum of
up to 2**16 tasks cannot overflow; a primary is at most ``sum(weights) * 64000`` in absolute value,
so keep ``sum(weights)`` below 2**24 (normalise shape counts) for gangs of up to 2**16 tasks.

Preconditions (the state's invariants; results are unspecified otherwise): 0 <= gpu_free <= 1000,
0 <= gpu_count <= 64, node ids in ``cands`` are valid rows. ``pick_gpus`` also defines the
unusual shapes: ``gpus > 1`` with ``milli < 1000`` takes the ``gpus`` tightest GPUs with enough
free share.

place_gang is the plain procedure of its docstring (``kernels_ref.place_gang`` spells it out);
for speed it (1) ranks a domain's nodes once per run of equal tasks, scoring again only the
node just placed on (a node's score depends on its own state alone); (2) skips a domain when a
sound upper bound on the tasks it could host (free totals, or for equal tasks the sum of
per-node copy counts) can't beat the best result so far; (3) under BEST_FIT, for equal tasks,
skips a domain when T times a floor under any task's score there (a node's best-fit score only
falls as copies land on it) can't beat the best domain found. None of these changes a result.

best_node_memo is best_node for a caller that places many tasks in a row on one working copy
(decide): it keeps each node's evaluation of one task shape, stamped with the node's version,
and evaluates a node again only when the caller has bumped that version (the node's free
resources changed). Under FGD it first gives each stale node a cheap, sound floor under its
fragmentation increase (one pass over its GPUs, O(1) per call-wide table lookup) and scores in
full only the nodes whose floor could still beat the best so far, lowest floor first. The exact
increase itself takes one pass over the GPUs and O(1) per shape (``_frag_increase``). The
reference is plain best_node.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, TypeVar, cast

import numba
import numpy as np
import numpy.typing as npt

I16 = npt.NDArray[np.int16]
I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
# (cpu_free, mem_free, gpu_free, gpu_count, node_model)
NodeArrays = tuple[I64, I64, I16, I32, I32]
# (t_cpu, t_mem, t_gpus, t_milli, t_models)
TaskArrays = tuple[I64, I64, I32, I32, U64]
# (cpu, mem, gpus, milli, models) of one task
Task = tuple[int, int, int, int, np.uint64]
# (feasible, primary score, secondary score)
Eval = tuple[bool, int, int]

BEST_FIT = 0
FGD = 1

MAX_GPUS = 64  # GPUs per node (gpu_free row length)
MAX_MODELS = 64  # GPU model ids 0..63 (bits of a task's models mask)
FULL_GPU = 1000
NO_NODE = -1
NO_DOMAIN = -1

# best-fit score: gpu milli left * GPU_LEFT_UNIT + min(cpu left, CPU_TIEBREAK_CAP), so the cpu
# tie-break never outweighs one milli-GPU; CPU-only tasks pay GPU_NODE_PENALTY on GPU nodes
# that still have a free GPU share.
GPU_LEFT_UNIT = 1 << 30
CPU_TIEBREAK_CAP = GPU_LEFT_UNIT - 1
GPU_NODE_PENALTY = 1 << 46

# columns of the shapes matrix
SHAPE_GPUS = 0
SHAPE_MILLI = 1
SHAPE_CPU = 2
SHAPE_WEIGHT = 3

# columns of a gang's demand prefix sums (place_gang pruning)
DEMAND_CPU = 0
DEMAND_MEM = 1
DEMAND_MILLI = 2
DEMAND_WHOLE_GPUS = 3
DEMAND_WHOLE_TASKS = 4
DEMAND_COLUMNS = 5

# "no limit" for copy counts and score floors (place_gang pruning), far above any real value
UNBOUNDED = 1 << 62
NO_FLOOR = 1 << 62

# domain ids are bucketed directly (counting sort) when they are below this bound
DENSE_DOMAIN_FACTOR = 4
DENSE_DOMAIN_SLACK = 1024

_ZERO = np.uint64(0)
_ONE = np.uint64(1)
_NO_SHAPES = np.zeros((0, 4), dtype=np.int64)
# cpu above this much milli-CPU feeds any node's GPUs (keeps cpu * mean milli within int64)
CPU_FEED_CAP = 1 << 40

_F = TypeVar("_F", bound=Callable[..., Any])


def _jit(fn: _F) -> _F:
    """``numba.njit(cache=True)`` keeping the Python signature for the type checker."""
    return cast(_F, numba.njit(cache=True)(fn))


def _hot(fn: _F) -> _F:
    """Like ``_jit``, inlined into its callers (numba IR): per-node helpers, so that constant
    arguments (the policy) fold away and no call is paid per node."""
    return cast(_F, numba.njit(cache=True, inline="always")(fn))


# ---------------------------------------------------------------- GPUs of one node


@_hot
def _bit(i: int) -> np.uint64:
    return _ONE << np.uint64(i)


@_hot
def _has_bit(mask: np.uint64, i: int) -> bool:
    return bool(((mask >> np.uint64(i)) & _ONE) != _ZERO)


@_hot
def _model_ok(models: np.uint64, model: int) -> bool:
    """A GPU task may use a node of ``model`` (``models == 0`` allows any, even unknown)."""
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
def _frag_pair(
    row: I16, count: int, mask: np.uint64, taken: int, cpu_before: int, cpu_after: int, shapes: I64
) -> tuple[int, int]:
    """(F before, F after) of a node from which a task takes ``taken`` milli on the GPUs in
    ``mask`` and its cpu; F = sum_k weight_k * frag_k + W * starved over the GPU shapes k
    (W their total weight). CPU-only shapes count for nothing: every free GPU share is a
    fragment to them whatever happens, so they add the same to every node's increase."""
    total_b, full_b, partial_b, total_a, full_a, partial_a = _gpu_stats(row, count, mask, taken)
    before, after = 0, 0
    weights, cpu_sum, milli_sum = 0, 0, 0
    for k in range(shapes.shape[0]):
        gpus, milli = int(shapes[k, SHAPE_GPUS]), int(shapes[k, SHAPE_MILLI])
        cpu, weight = int(shapes[k, SHAPE_CPU]), int(shapes[k, SHAPE_WEIGHT])
        if weight == 0 or gpus <= 0:
            continue
        weights += weight
        cpu_sum += weight * cpu
        milli_sum += weight * gpus * milli
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
    for k in range(shapes.shape[0]):
        gpus, milli = int(shapes[k, SHAPE_GPUS]), int(shapes[k, SHAPE_MILLI])
        cpu, weight = int(shapes[k, SHAPE_CPU]), int(shapes[k, SHAPE_WEIGHT])
        if weight == 0 or gpus <= 0:
            continue
        weights += weight
        cpu_sum += weight * cpu
        milli_sum += weight * gpus * milli
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
    """F(after) - F(before) of placing the (fitting) task on the node."""
    cpu, _, gpus, milli, _ = task
    mask = _take(row, count, gpus, milli)
    return _frag_increase(row, count, mask, milli, cpu_avail, cpu_avail - cpu, shapes)


@_hot
def _eval(
    cpu_avail: int, mem_avail: int, row: I16, count: int, model: int, task: Task, use_fgd: bool, shapes: I64
) -> Eval:
    """(fits, primary, secondary) of one task on one node state."""
    cpu, mem, gpus, milli, models = task
    if cpu_avail < cpu or mem_avail < mem or (gpus > 0 and not _model_ok(models, model)):
        return False, 0, 0
    fit, total = _gpu_fit(row, count, gpus, milli)
    if not fit:
        return False, 0, 0
    secondary = _best_fit(count, total, cpu_avail - cpu, gpus, milli)
    if not use_fgd:
        return True, 0, secondary
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


# columns of a best_node_memo row
MEMO_VERSION = 0  # the node's version the row was computed at (-1: never)
MEMO_FITS = 1  # 0: does not fit; 1: fits, PRIMARY is its score; MEMO_FLOOR: fits, PRIMARY a floor
MEMO_PRIMARY = 2
MEMO_SECONDARY = 3
MEMO_COLUMNS = 4
MEMO_FLOOR = 2  # a row of FGD's floor only (the node was pruned): readers needing the score redo it


@_jit
def best_node_memo(
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
    node_version: I64,
    memo: I64,
) -> int:
    """``best_node``, remembering each node's evaluation of this one task in ``memo`` (int64[N,
    MEMO_COLUMNS], rows of -1 at first): a node is evaluated again only when its entry in
    ``node_version`` differs from the row's. The caller keeps one memo per task and shape mix
    and bumps a node's version whenever its free resources change.

    Under FGD a stale node is first given a cheap floor under its fragmentation increase
    (``_fgd_floor``); it is scored in full only if the floor could still beat the best node
    found, starting from the node of the lowest floor. A node skipped that way keeps its floor
    in its row (``MEMO_FLOOR``), so later calls on the same node state do not recompute it;
    readers that need the score (the gang kernel) score such a row in full."""
    task = _task(cpu, mem, gpus, milli, models)
    nodes = (cpu_free, mem_free, gpu_free, gpu_count, node_model)
    if _uses_fgd(policy, shapes):
        return _best_memo_fgd(cands, nodes, task, shapes, node_version, memo)
    return _best_memo_plain(cands, nodes, task, shapes, node_version, memo)


@_hot
def _memo_eval(
    n: int,
    cpu_free: I64,
    mem_free: I64,
    gpu_free: I16,
    gpu_count: I32,
    node_model: I32,
    task: Task,
    use_fgd: bool,
    shapes: I64,
    node_version: I64,
    memo: I64,
) -> tuple[bool, int, int]:
    """Evaluate node ``n`` in full and write its memo row."""
    ok, primary, secondary = _eval_node(
        n, cpu_free, mem_free, gpu_free, gpu_count, node_model, task, use_fgd, shapes
    )
    memo[n, MEMO_VERSION] = node_version[n]
    memo[n, MEMO_FITS] = 1 if ok else 0
    memo[n, MEMO_PRIMARY] = primary
    memo[n, MEMO_SECONDARY] = secondary
    return ok, primary, secondary


@_jit
def row_totals(gpu_free: I16) -> I64:
    """Each node's free GPU milli in all (numpy's row sum of short int16 rows is ~10x slower)."""
    out = np.zeros(gpu_free.shape[0], dtype=np.int64)
    for n in range(gpu_free.shape[0]):
        total = 0
        for i in range(gpu_free.shape[1]):
            total += int(gpu_free[n, i])
        out[n] = total
    return out


@_jit
def versions_after(
    version: I64,
    cpu_was: I64,
    cpu: I64,
    mem_was: I64,
    mem: I64,
    gpu_was: I16,
    gpu: I16,
    count_was: I32,
    count: I32,
    model_was: I32,
    model: I32,
) -> I64:
    """``version`` plus one for each node whose free capacity, GPU count or model differs from
    what it was (the arrays of equal shapes): what a node-score memo needs to know."""
    out = version.copy()
    for n in range(version.shape[0]):
        changed = (
            cpu_was[n] != cpu[n]
            or mem_was[n] != mem[n]
            or count_was[n] != count[n]
            or model_was[n] != model[n]
        )
        for i in range(gpu.shape[1]):
            changed = changed or gpu_was[n, i] != gpu[n, i]
        if changed:
            out[n] += 1
    return out


RUN_SLOT = 5  # a place_run task row's memo slot
RUN_SKIP = 6  # a place_run task row's skip flag (its key already failed in this call)
RUN_COLUMNS = 7




@_jit
def place_run(
    cands: I64,
    cpu_free: I64,
    mem_free: I64,
    gpu_free: I16,
    gpu_total: I64,
    gpu_count: I32,
    node_model: I32,
    policy: int,
    shapes: I64,
    table: I64,
    node_version: I64,
    memos: I64,
    tasks: I64,
    out: I64,
    stale: I64,
) -> int:
    """Place one-task jobs in order, each on ``best_node_memo``'s node with
    ``pick_gpus``'s GPUs, taking their resources in the working copy as it goes (and bumping
    the node's version); stop at the first job that does not fit or is marked to skip.

    Under best fit (or no shape mix) each job goes where ``best_node_summary`` says, and
    ``memos`` and the slots are not read.

    ``tasks``: int64[k, 7] rows (cpu, mem, gpus, milli, models as int64, memo slot, skip);
    ``memos``: int64[slots, N, MEMO_COLUMNS], one ``best_node_memo`` memo per slot;
    ``table``: ``floor_table(shapes)``; ``stale``: a work buffer, int64[>= len(cands), 3].
    Writes (node, GPU mask as int64) to ``out[j]`` for each job placed; returns how many
    were placed (the index of the job it stopped at)."""
    nodes = (cpu_free, mem_free, gpu_free, gpu_count, node_model)
    use_fgd = _uses_fgd(policy, shapes)
    for j in range(tasks.shape[0]):
        if tasks[j, RUN_SKIP] != 0:
            return j
        cpu, mem, gpus, milli = int(tasks[j, 0]), int(tasks[j, 1]), int(tasks[j, 2]), int(tasks[j, 3])
        task = _task(cpu, mem, gpus, milli, np.uint64(tasks[j, 4]))
        if use_fgd:
            memo = memos[tasks[j, RUN_SLOT]]
            n = _best_memo_floors(cands, nodes, task, shapes, table, stale, node_version, memo)
        else:  # best fit: pruned by the free totals, as best_node_summary (no memo needed)
            n = _best_summary(cands, gpu_total, nodes, task)
        if n < 0:
            return j
        mask = _take(gpu_free[n], int(gpu_count[n]), gpus, milli)
        cpu_free[n] -= cpu
        mem_free[n] -= mem
        for i in range(int(gpu_count[n])):
            if _has_bit(mask, i):
                gpu_free[n, i] -= milli
                gpu_total[n] -= milli
        node_version[n] += 1
        out[j, 0], out[j, 1] = n, np.int64(mask)
    return int(tasks.shape[0])


@_jit
def _best_memo_plain(
    cands: I64, nodes: NodeArrays, task: Task, shapes: I64, node_version: I64, memo: I64
) -> int:
    """``best_node_memo`` without FGD."""
    cpu_free, mem_free, gpu_free, gpu_count, node_model = nodes
    best, best_p, best_s = NO_NODE, 0, 0
    for j in range(cands.shape[0]):
        n = int(cands[j])
        if memo[n, MEMO_VERSION] != node_version[n] or memo[n, MEMO_FITS] == MEMO_FLOOR:
            _memo_eval(
                n,
                cpu_free,
                mem_free,
                gpu_free,
                gpu_count,
                node_model,
                task,
                False,
                shapes,
                node_version,
                memo,
            )
        if memo[n, MEMO_FITS] == 1:
            primary, secondary = int(memo[n, MEMO_PRIMARY]), int(memo[n, MEMO_SECONDARY])
            if _better(primary, secondary, n, best_p, best_s, best):
                best, best_p, best_s = n, primary, secondary
    return best


@_jit
def _best_memo_fgd(
    cands: I64, nodes: NodeArrays, task: Task, shapes: I64, node_version: I64, memo: I64
) -> int:
    """``best_node_memo`` under FGD: remembered scores first, then the nodes that fit and have
    only a floor (remembered, or computed now and remembered), lowest floor first."""
    stale = np.empty((cands.shape[0], 3), dtype=np.int64)
    return _best_memo_floors(cands, nodes, task, shapes, _floor_table(shapes), stale, node_version, memo)


@_jit
def _best_memo_floors(
    cands: I64,
    nodes: NodeArrays,
    task: Task,
    shapes: I64,
    table: I64,
    stale: I64,
    node_version: I64,
    memo: I64,
) -> int:
    """``_best_memo_fgd`` given the floor table of ``shapes`` and a work buffer ``stale``
    (int64[>= len(cands), 3]: (node, floor, secondary) of the nodes to score in full)."""
    cpu_free, mem_free, gpu_free, gpu_count, node_model = nodes
    n_stale, first = 0, -1
    best, best_p, best_s = NO_NODE, 0, 0
    for j in range(cands.shape[0]):
        n = int(cands[j])
        if memo[n, MEMO_VERSION] == node_version[n]:
            fits = memo[n, MEMO_FITS]
            if fits == 1:
                primary, secondary = int(memo[n, MEMO_PRIMARY]), int(memo[n, MEMO_SECONDARY])
                if _better(primary, secondary, n, best_p, best_s, best):
                    best, best_p, best_s = n, primary, secondary
            if fits != MEMO_FLOOR:
                continue
            floor, secondary = int(memo[n, MEMO_PRIMARY]), int(memo[n, MEMO_SECONDARY])
        else:
            cpu_n, mem_n, count_n, model_n = (
                int(cpu_free[n]),
                int(mem_free[n]),
                int(gpu_count[n]),
                int(node_model[n]),
            )
            ok, floor, secondary = _fgd_floor(cpu_n, mem_n, gpu_free[n], count_n, model_n, task, table)
            memo[n, MEMO_VERSION] = node_version[n]
            if not ok:  # exactly what a full evaluation says: it does not fit
                memo[n, MEMO_FITS] = 0
                memo[n, MEMO_PRIMARY] = 0
                memo[n, MEMO_SECONDARY] = 0
                continue
            memo[n, MEMO_FITS] = MEMO_FLOOR  # until scored in full below
            memo[n, MEMO_PRIMARY] = floor
            memo[n, MEMO_SECONDARY] = secondary
        stale[n_stale, 0], stale[n_stale, 1], stale[n_stale, 2] = n, floor, secondary
        if first < 0 or _better(floor, secondary, n, stale[first, 1], stale[first, 2], stale[first, 0]):
            first = n_stale
        n_stale += 1
    for k in range(-1, n_stale):
        i = first if k < 0 else k
        if i < 0 or (k >= 0 and k == first):
            continue
        n = int(stale[i, 0])
        if best >= 0 and not _better(stale[i, 1], stale[i, 2], n, best_p, best_s, best):
            continue  # its score is at least (floor, secondary): it cannot beat the best
        ok, primary, secondary = _memo_eval(
            n, cpu_free, mem_free, gpu_free, gpu_count, node_model, task, True, shapes, node_version, memo
        )
        if ok and _better(primary, secondary, n, best_p, best_s, best):
            best, best_p, best_s = n, primary, secondary
    return best


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
# change (exact).

# layout of the per-call table built by _floor_table
FLOOR_SHARE_OVER = 0  # [0 .. 1000]: weight of 1-GPU fractional shapes with milli > f
FLOOR_WHOLE_OVER = FULL_GPU + 1  # [0 .. MAX_GPUS]: weight of whole-GPU shapes of more than g GPUs
FLOOR_OTHER = FLOOR_WHOLE_OVER + MAX_GPUS + 1  # weight of other GPU shapes (never provably >= 0)
FLOOR_WHOLE = FLOOR_OTHER + 1  # weight of all whole-GPU shapes
FLOOR_WEIGHTS = FLOOR_WHOLE + 1  # W, the weight of all GPU shapes
FLOOR_MEAN_CPU = FLOOR_WEIGHTS + 1
FLOOR_MEAN_MILLI = FLOOR_MEAN_CPU + 1
FLOOR_SOUND = FLOOR_MEAN_MILLI + 1  # 1 when no weight is negative (else no floor)
FLOOR_CPU = FLOOR_SOUND + 1  # pairs (cpu, weight) of the GPU shapes, by descending cpu
NO_FLOOR_VALUE = -(1 << 62)


@_jit
def _floor_table(shapes: I64) -> I64:
    """What ``_fgd_floor`` needs of the shape mix, once per call (see the layout above)."""
    n_shapes = shapes.shape[0]
    table = np.zeros(FLOOR_CPU + 2 * n_shapes, dtype=np.int64)
    table[FLOOR_SOUND] = 1
    weights, cpu_sum, milli_sum, n_cpu = 0, 0, 0, 0
    for k in range(n_shapes):
        gpus, milli = int(shapes[k, SHAPE_GPUS]), int(shapes[k, SHAPE_MILLI])
        cpu, weight = int(shapes[k, SHAPE_CPU]), int(shapes[k, SHAPE_WEIGHT])
        if weight == 0 or gpus <= 0:
            continue
        if weight < 0:
            table[FLOOR_SOUND] = 0
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
    if weights > 0:
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
    if cpu_avail < cpu or mem_avail < mem or (gpus > 0 and not _model_ok(models, model)):
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
    unsure += _cpu_short(table, cpu_avail)
    return True, floor - taken * unsure, secondary


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


# ---------------------------------------------------------------- gangs: domains

# work arrays of one place_gang call (see _workspace), by position in the Work tuple
Work = tuple[I64, I64, I64, I64, I16, I64, I64, I64, U64, I64]
W_SLOT_OF: Final = 0  # int64[largest domain]: local copy (slot) of the domain's j-th node, -1 = none
W_SLOT_NODE: Final = 1  # int64[T]: which j each slot copies
W_SLOT_CPU: Final = 2  # int64[T]
W_SLOT_MEM: Final = 3  # int64[T]
W_SLOT_GPU: Final = 4  # int16[T, 64]
W_TOP: Final = 5  # int64[T, RANK_COLUMNS]: best untouched nodes of the current run of equal tasks
W_DIRTY: Final = 6  # int64[T, RANK_COLUMNS]: nodes placed on in the current run, scored again
W_RUN_NODE: Final = 7  # int64[T]: the domain's placement so far
W_RUN_MASK: Final = 8  # uint64[T]
W_META: Final = 9  # int64[1]: number of slots in use
# (slot_of, slot_cpu, slot_mem, slot_gpu) taken out of the Work once, outside per-node loops
Slots = tuple[I64, I64, I64, I16]

# columns of the ranked lists
RANK_LOCAL = 0  # j, the node's position in its domain group
RANK_PRIMARY = 1
RANK_SECONDARY = 2
RANK_FLAG = 3  # top: already taken; dirty: still feasible
RANK_COLUMNS = 4
# where a chosen candidate comes from
FROM_NONE = -1
FROM_TOP = 0
FROM_DIRTY = 1


@_jit
def _distinct_in_domains(cands: I64, domain: I32, n_nodes: int) -> I64:
    """Candidates in some domain (id >= 0), first occurrence only, in the order given."""
    seen = np.zeros(n_nodes, dtype=np.uint8)
    out = np.empty(cands.shape[0], dtype=np.int64)
    size = 0
    for j in range(cands.shape[0]):
        n = cands[j]
        if seen[n] == 0 and domain[n] >= 0:
            seen[n] = 1
            out[size] = n
            size += 1
    return out[:size]


@_jit
def _stable_order(keys: I64) -> I64:
    """Positions of ``keys`` sorted ascending, stable (a counting sort when ids are dense)."""
    size = keys.shape[0]
    top = keys.max() if size > 0 else 0
    if top >= DENSE_DOMAIN_FACTOR * size + DENSE_DOMAIN_SLACK:
        return np.argsort(keys, kind="mergesort").astype(np.int64)
    start = np.zeros(top + 2, dtype=np.int64)
    for j in range(size):
        start[keys[j] + 1] += 1
    for k in range(top + 1):
        start[k + 1] += start[k]
    order = np.empty(size, dtype=np.int64)
    for j in range(size):
        order[start[keys[j]]] = j
        start[keys[j]] += 1
    return order


@_jit
def _group_by_domain(members: I64, domain: I32) -> tuple[I64, I64]:
    """(members regrouped by ascending domain id, start of each group plus the end)."""
    size = members.shape[0]
    keys = np.empty(size, dtype=np.int64)
    ascending = True
    for j in range(size):
        keys[j] = domain[members[j]]
        ascending = ascending and (j == 0 or keys[j] >= keys[j - 1])
    if not ascending:
        order = _stable_order(keys)
        members = members[order]
        keys = keys[order]
    starts = np.empty(size + 1, dtype=np.int64)
    n_groups = 0
    for j in range(size):
        if j == 0 or keys[j] != keys[j - 1]:
            starts[n_groups] = j
            n_groups += 1
    starts[n_groups] = size
    return members, starts[: n_groups + 1]


@_jit
def _demand(tasks: TaskArrays) -> I64:
    """Prefix sums (T + 1 rows) of what the first t tasks need at the very least."""
    t_cpu, t_mem, t_gpus, t_milli, _ = tasks
    out = np.zeros((t_cpu.shape[0] + 1, DEMAND_COLUMNS), dtype=np.int64)
    for t in range(t_cpu.shape[0]):
        gpus = int(t_gpus[t])
        whole = gpus > 0 and int(t_milli[t]) == FULL_GPU
        out[t + 1] = out[t]
        out[t + 1, DEMAND_CPU] += max(int(t_cpu[t]), 0)
        out[t + 1, DEMAND_MEM] += max(int(t_mem[t]), 0)
        out[t + 1, DEMAND_MILLI] += max(gpus, 0) * max(int(t_milli[t]), 0)
        out[t + 1, DEMAND_WHOLE_GPUS] += gpus if whole else 0
        out[t + 1, DEMAND_WHOLE_TASKS] += 1 if whole else 0
    return out


@_jit
def _whole_min(tasks: TaskArrays) -> int:
    """Fewest GPUs any whole-GPU task of the gang asks for (0 when there is none)."""
    _, _, t_gpus, t_milli, _ = tasks
    least = 0
    for t in range(t_gpus.shape[0]):
        gpus = int(t_gpus[t])
        if gpus > 0 and int(t_milli[t]) == FULL_GPU and (least == 0 or gpus < least):
            least = gpus
    return least


@_jit
def _domain_bound(group: I64, nodes: NodeArrays, demand: I64, whole_min: int) -> int:
    """How many leading tasks the domain's free totals could host at most (a sound bound)."""
    cpu_free, mem_free, gpu_free, gpu_count, _ = nodes
    cpu, mem, milli, whole_gpus, whole_tasks = 0, 0, 0, 0, 0
    for n in group:
        cpu += max(int(cpu_free[n]), 0)
        mem += max(int(mem_free[n]), 0)
        full = 0
        for i in range(int(gpu_count[n])):
            free = int(gpu_free[n, i])
            milli += max(free, 0)
            full += free == FULL_GPU
        whole_gpus += full
        whole_tasks += full // whole_min if whole_min > 0 else 0
    bound = 0
    while bound + 1 < demand.shape[0]:
        need = demand[bound + 1]
        if (
            need[DEMAND_CPU] > cpu
            or need[DEMAND_MEM] > mem
            or need[DEMAND_MILLI] > milli
            or need[DEMAND_WHOLE_GPUS] > whole_gpus
            or need[DEMAND_WHOLE_TASKS] > whole_tasks
        ):
            break
        bound += 1
    return bound


@_hot
def _copies(cpu_avail: int, mem_avail: int, row: I16, count: int, model: int, task: Task) -> tuple[int, int]:
    """(an upper bound on how many copies of the task fit on the node at once, its free GPU milli)."""
    cpu, mem, gpus, milli, models = task
    total = 0
    units = 0
    for i in range(count):
        free = int(row[i])
        total += free
        if milli == FULL_GPU:
            units += free == FULL_GPU
        elif milli > 0:
            units += max(free, 0) // milli
    if cpu_avail < cpu or mem_avail < mem or (gpus > 0 and not _model_ok(models, model)):
        return 0, total
    most = UNBOUNDED
    most = min(most, cpu_avail // cpu) if cpu > 0 else most
    most = min(most, mem_avail // mem) if mem > 0 else most
    most = min(most, units // gpus) if gpus > 0 and milli > 0 else most
    return most, total


@_jit
def _run_bound(group: I64, nodes: NodeArrays, task: Task) -> tuple[int, int]:
    """For a gang of equal tasks under BEST_FIT: (how many could fit in the domain at most, a
    floor under any one task's score there). A node's score only falls as copies land on it,
    so its floor is the score of the last copy that could fit."""
    cpu_free, mem_free, gpu_free, gpu_count, node_model = nodes
    task_cpu, _, gpus, milli, _ = task
    fit, floor = 0, NO_FLOOR
    for n in group:
        count = int(gpu_count[n])
        cpu = int(cpu_free[n])
        most, total = _copies(cpu, int(mem_free[n]), gpu_free[n], count, int(node_model[n]), task)
        if most <= 0:
            continue
        fit = fit + most if most < UNBOUNDED - fit else UNBOUNDED
        cpu_left = cpu - (most * task_cpu if task_cpu > 0 else 0)
        floor = min(floor, _best_fit(count, total, cpu_left, most * gpus, milli))
    return fit, floor


# ---------------------------------------------------------------- gangs: one domain


@_jit
def _workspace(starts: I64, n_tasks: int) -> Work:
    largest = 0
    for d in range(starts.shape[0] - 1):
        largest = max(largest, starts[d + 1] - starts[d])
    return (
        np.full(largest, -1, dtype=np.int64),
        np.empty(n_tasks, dtype=np.int64),
        np.empty(n_tasks, dtype=np.int64),
        np.empty(n_tasks, dtype=np.int64),
        np.empty((n_tasks, MAX_GPUS), dtype=np.int16),
        np.empty((n_tasks, RANK_COLUMNS), dtype=np.int64),
        np.empty((n_tasks, RANK_COLUMNS), dtype=np.int64),
        np.full(n_tasks, NO_NODE, dtype=np.int64),
        np.zeros(n_tasks, dtype=np.uint64),
        np.zeros(1, dtype=np.int64),
    )


@_jit
def _slots(work: Work) -> Slots:
    return work[W_SLOT_OF], work[W_SLOT_CPU], work[W_SLOT_MEM], work[W_SLOT_GPU]


@_jit
def _eval_local(
    j: int, group: I64, nodes: NodeArrays, slots: Slots, task: Task, use_fgd: bool, shapes: I64
) -> Eval:
    """Evaluate the domain's ``j``-th node on its local copy when it was touched, else in place."""
    cpu_free, mem_free, gpu_free, gpu_count, node_model = nodes
    slot_of, slot_cpu, slot_mem, slot_gpu = slots
    n = int(group[j])
    slot = slot_of[j]
    if slot < 0:
        return _eval_node(n, cpu_free, mem_free, gpu_free, gpu_count, node_model, task, use_fgd, shapes)
    return _eval(
        int(slot_cpu[slot]),
        int(slot_mem[slot]),
        slot_gpu[slot],
        int(gpu_count[n]),
        int(node_model[n]),
        task,
        use_fgd,
        shapes,
    )


@_jit
def _touch(j: int, group: I64, nodes: NodeArrays, work: Work) -> int:
    """The local copy (slot) of the domain's ``j``-th node, made on first touch."""
    slot_of = work[W_SLOT_OF]
    if slot_of[j] >= 0:
        return int(slot_of[j])
    cpu_free, mem_free, gpu_free, gpu_count, _ = nodes
    meta = work[W_META]
    slot = int(meta[0])
    meta[0] = slot + 1
    n = group[j]
    slot_of[j] = slot
    work[W_SLOT_NODE][slot] = j
    work[W_SLOT_CPU][slot] = cpu_free[n]
    work[W_SLOT_MEM][slot] = mem_free[n]
    for i in range(int(gpu_count[n])):
        work[W_SLOT_GPU][slot, i] = gpu_free[n, i]
    return slot


@_jit
def _forget_touched(work: Work) -> None:
    slot_of, slot_node, meta = work[W_SLOT_OF], work[W_SLOT_NODE], work[W_META]
    for slot in range(int(meta[0])):
        slot_of[slot_node[slot]] = -1
    meta[0] = 0


@_jit
def _rank_insert(ranked: I64, size: int, cap: int, j: int, primary: int, secondary: int, node_of: I64) -> int:
    """Insert node ``j`` into the list sorted by (primary, secondary, node), keeping ``cap``; new size."""
    node = node_of[j]
    pos = size
    while pos > 0 and _better(
        primary,
        secondary,
        node,
        ranked[pos - 1, RANK_PRIMARY],
        ranked[pos - 1, RANK_SECONDARY],
        node_of[ranked[pos - 1, RANK_LOCAL]],
    ):
        pos -= 1
    if pos >= cap:
        return size
    for k in range(min(size, cap - 1), pos, -1):
        ranked[k] = ranked[k - 1]
    ranked[pos, RANK_LOCAL] = j
    ranked[pos, RANK_PRIMARY] = primary
    ranked[pos, RANK_SECONDARY] = secondary
    ranked[pos, RANK_FLAG] = 0
    return min(size + 1, cap)


@_hot
def _scan_top(
    group: I64, nodes: NodeArrays, work: Work, task: Task, cap: int, use_fgd: bool, shapes: I64
) -> int:
    cpu_free, mem_free, gpu_free, gpu_count, node_model = nodes
    slot_of, slot_cpu, slot_mem, slot_gpu = _slots(work)
    top = work[W_TOP]
    size = 0
    for j in range(group.shape[0]):
        # (written out rather than calling _eval_local: that measured 4x slower per node)
        n = int(group[j])
        slot = slot_of[j]
        if slot < 0:
            ok, primary, secondary = _eval_node(
                n, cpu_free, mem_free, gpu_free, gpu_count, node_model, task, use_fgd, shapes
            )
        else:
            ok, primary, secondary = _eval(
                int(slot_cpu[slot]),
                int(slot_mem[slot]),
                slot_gpu[slot],
                int(gpu_count[n]),
                int(node_model[n]),
                task,
                use_fgd,
                shapes,
            )
        last = size - 1
        if ok and (
            size < cap
            or _better(
                primary,
                secondary,
                group[j],
                top[last, RANK_PRIMARY],
                top[last, RANK_SECONDARY],
                group[top[last, RANK_LOCAL]],
            )
        ):
            size = _rank_insert(top, size, cap, j, primary, secondary, group)
    return size


@_hot
def _scan_top_memo(
    group: I64,
    nodes: NodeArrays,
    work: Work,
    task: Task,
    cap: int,
    use_fgd: bool,
    shapes: I64,
    node_version: I64,
    memo: I64,
) -> int:
    """``_scan_top`` for a domain none of whose nodes is touched yet, reading each node's
    evaluation of ``task`` from ``memo`` (see ``best_node_memo``) and refreshing stale rows."""
    cpu_free, mem_free, gpu_free, gpu_count, node_model = nodes
    top = work[W_TOP]
    size = 0
    for j in range(group.shape[0]):
        n = int(group[j])
        if memo[n, MEMO_VERSION] != node_version[n] or memo[n, MEMO_FITS] == MEMO_FLOOR:
            _memo_eval(
                n,
                cpu_free,
                mem_free,
                gpu_free,
                gpu_count,
                node_model,
                task,
                use_fgd,
                shapes,
                node_version,
                memo,
            )  # (written out, not through a shared inlined helper: that made this loop ~6x slower)
        if memo[n, MEMO_FITS] != 1:
            continue
        primary, secondary = int(memo[n, MEMO_PRIMARY]), int(memo[n, MEMO_SECONDARY])
        last = size - 1
        if size < cap or _better(
            primary,
            secondary,
            n,
            top[last, RANK_PRIMARY],
            top[last, RANK_SECONDARY],
            group[top[last, RANK_LOCAL]],
        ):
            size = _rank_insert(top, size, cap, j, primary, secondary, group)
    return size


@_jit
def _collect_top(
    group: I64,
    nodes: NodeArrays,
    work: Work,
    task: Task,
    cap: int,
    use_fgd: bool,
    shapes: I64,
    node_version: I64,
    memo: I64,
) -> int:
    """Fill the top list with the ``cap`` best feasible nodes of the domain; its size. With a
    memo (rows for every node; an empty one means none), the domain must be untouched and
    ``task`` the memo's shape."""
    if memo.shape[0] > 0:
        if use_fgd:
            return _scan_top_memo(group, nodes, work, task, cap, True, shapes, node_version, memo)
        return _scan_top_memo(group, nodes, work, task, cap, False, shapes, node_version, memo)
    if use_fgd:
        return _scan_top(group, nodes, work, task, cap, True, shapes)
    return _scan_top(group, nodes, work, task, cap, False, shapes)


@_jit
def _choose(group: I64, work: Work, n_top: int, n_dirty: int) -> tuple[int, int]:
    """(source, entry) of the best node now: the best untaken top entry or a touched node."""
    top, dirty = work[W_TOP], work[W_DIRTY]
    source, entry, best_p, best_s, best = FROM_NONE, -1, 0, 0, NO_NODE
    for k in range(n_top):
        if top[k, RANK_FLAG] == 0:
            source, entry = FROM_TOP, k
            best_p, best_s, best = top[k, RANK_PRIMARY], top[k, RANK_SECONDARY], group[top[k, RANK_LOCAL]]
            break
    for k in range(n_dirty):
        n = group[dirty[k, RANK_LOCAL]]
        if dirty[k, RANK_FLAG] != 0 and _better(
            dirty[k, RANK_PRIMARY], dirty[k, RANK_SECONDARY], n, best_p, best_s, best
        ):
            source, entry = FROM_DIRTY, k
            best_p, best_s, best = dirty[k, RANK_PRIMARY], dirty[k, RANK_SECONDARY], n
    return source, entry


@_jit
def _same_task(tasks: TaskArrays, a: int, b: int) -> bool:
    t_cpu, t_mem, t_gpus, t_milli, t_models = tasks
    return bool(
        t_cpu[a] == t_cpu[b]
        and t_mem[a] == t_mem[b]
        and t_gpus[a] == t_gpus[b]
        and t_milli[a] == t_milli[b]
        and t_models[a] == t_models[b]
    )


@_jit
def _task_at(tasks: TaskArrays, t: int) -> Task:
    t_cpu, t_mem, t_gpus, t_milli, t_models = tasks
    return _task(t_cpu[t], t_mem[t], t_gpus[t], t_milli[t], t_models[t])


@_jit
def _commit(j: int, task: Task, t: int, group: I64, nodes: NodeArrays, work: Work) -> None:
    """Place task ``t`` on the domain's ``j``-th node: its GPUs, local copy and the run's result."""
    cpu, mem, gpus, milli, _ = task
    slot = _touch(j, group, nodes, work)
    n = group[j]
    slot_gpu = work[W_SLOT_GPU]
    mask = _take(slot_gpu[slot], int(nodes[3][n]), gpus, milli)
    _allocate(slot, mask, cpu, mem, milli, work[W_SLOT_CPU], work[W_SLOT_MEM], slot_gpu, -1)
    work[W_RUN_NODE][t] = n
    work[W_RUN_MASK][t] = mask


@_jit
def _place_run(
    group: I64,
    nodes: NodeArrays,
    tasks: TaskArrays,
    start: int,
    end: int,
    use_fgd: bool,
    shapes: I64,
    work: Work,
    node_version: I64,
    memo: I64,
) -> tuple[int, int, int]:
    """Place the equal tasks ``start..end-1``; (how many were placed, primary sum, secondary sum).

    Scores depend only on a node's own state, so one pass ranks the untouched nodes for the
    whole run; after that only the node just placed on is evaluated again.
    """
    top, dirty = work[W_TOP], work[W_DIRTY]
    task = _task_at(tasks, start)
    n_top = _collect_top(group, nodes, work, task, end - start, use_fgd, shapes, node_version, memo)
    n_dirty, total_p, total_s = 0, 0, 0
    for t in range(start, end):
        source, k = _choose(group, work, n_top, n_dirty)
        if source == FROM_NONE:
            return t - start, total_p, total_s
        if source == FROM_TOP:
            top[k, RANK_FLAG] = 1
            for c in range(RANK_COLUMNS):
                dirty[n_dirty, c] = top[k, c]
            k = n_dirty
            n_dirty += 1
        j = int(dirty[k, RANK_LOCAL])
        total_p += dirty[k, RANK_PRIMARY]
        total_s += dirty[k, RANK_SECONDARY]
        _commit(j, task, t, group, nodes, work)
        ok, primary, secondary = _eval_local(j, group, nodes, _slots(work), task, use_fgd, shapes)
        dirty[k, RANK_PRIMARY] = primary
        dirty[k, RANK_SECONDARY] = secondary
        dirty[k, RANK_FLAG] = 1 if ok else 0
    return end - start, total_p, total_s


@_jit
def _place_in_domain(
    group: I64,
    nodes: NodeArrays,
    tasks: TaskArrays,
    use_fgd: bool,
    shapes: I64,
    work: Work,
    node_version: I64,
    memo: I64,
) -> tuple[int, int, int]:
    """Place the tasks in order, each on its best node of ``group``; (placed, primary, secondary).
    ``memo`` (of the first task's shape) serves the first run, while no node is touched."""
    n_tasks = tasks[0].shape[0]
    placed, total_p, total_s = 0, 0, 0
    while placed < n_tasks:
        end = placed + 1
        while end < n_tasks and _same_task(tasks, placed, end):
            end += 1
        run_memo = memo if placed == 0 else memo[:0]
        done, primary, secondary = _place_run(
            group, nodes, tasks, placed, end, use_fgd, shapes, work, node_version, run_memo
        )
        placed += done
        total_p += primary
        total_s += secondary
        if placed < end:
            break
    _forget_touched(work)
    return placed, total_p, total_s


# ---------------------------------------------------------------- gangs: all domains


@_jit
def _equal_tasks(tasks: TaskArrays) -> bool:
    """All tasks alike, with a well-formed shape (gpus == 0, or 1 <= milli <= 1000)."""
    t_gpus, t_milli = tasks[2], tasks[3]
    n_tasks = t_gpus.shape[0]
    if n_tasks == 0 or (t_gpus[0] > 0 and not 0 < t_milli[0] <= FULL_GPU):
        return False
    same = 1
    while same < n_tasks and _same_task(tasks, 0, same):
        same += 1
    return bool(same == n_tasks)


@_jit
def _search_domains(
    grouped: I64,
    starts: I64,
    domain: I32,
    nodes: NodeArrays,
    tasks: TaskArrays,
    use_fgd: bool,
    shapes: I64,
    out_node: I32,
    out_mask: U64,
    node_version: I64,
    memo: I64,
) -> tuple[int, int]:
    n_tasks = tasks[0].shape[0]
    n_dom = starts.shape[0] - 1
    work = _workspace(starts, n_tasks)
    demand = _demand(tasks)
    whole_min = _whole_min(tasks)
    equal = _equal_tasks(tasks)
    best_dom, best_p, best_s, best_partial = NO_DOMAIN, 0, 0, 0
    for d in range(n_dom):
        group = grouped[starts[d] : starts[d + 1]]
        if n_dom > 1:
            floor = 0
            if equal:
                bound, floor = _run_bound(group, nodes, _task_at(tasks, 0))
            else:
                bound = _domain_bound(group, nodes, demand, whole_min)
            if bound < n_tasks and (best_dom != NO_DOMAIN or bound <= best_partial):
                continue
            if equal and not use_fgd and best_dom != NO_DOMAIN and n_tasks * floor >= best_s:
                continue  # can't beat the best domain so far (BEST_FIT: primaries are all 0)
        placed, primary, secondary = _place_in_domain(
            group, nodes, tasks, use_fgd, shapes, work, node_version, memo
        )
        if placed < n_tasks:
            best_partial = max(best_partial, placed)
        elif best_dom == NO_DOMAIN or primary < best_p or (primary == best_p and secondary < best_s):
            best_dom, best_p, best_s = int(domain[group[0]]), primary, secondary
            out_node[:] = work[W_RUN_NODE]
            out_mask[:] = work[W_RUN_MASK]
    if best_dom == NO_DOMAIN:
        return NO_DOMAIN, best_partial
    return best_dom, n_tasks


@_jit
def place_gang(
    cands: I64,
    domain: I32,
    cpu_free: I64,
    mem_free: I64,
    gpu_free: I16,
    gpu_count: I32,
    node_model: I32,
    t_cpu: I64,
    t_mem: I64,
    t_gpus: I32,
    t_milli: I32,
    t_models: U64,
    policy: int,
    shapes: I64,
    out_node: I32,
    out_mask: U64,
) -> tuple[int, int]:
    """Place all tasks of a gang in one domain, or none; the inputs are not modified.

    Domains are tried in ascending id; in each, tasks go in the order given, each on its best
    node by ``policy`` against local copies of the touched nodes. The successful domain with
    the lowest summed (primary, secondary) score wins (tie: lowest id): ``out_node``/``out_mask``
    receive its placement and ``(domain id, T)`` is returned. Otherwise ``(-1, best_partial)``:
    the most leading tasks that fit in any one domain, and ``out_node`` = -1, ``out_mask`` = 0.
    """
    no_memo = np.zeros((0, MEMO_COLUMNS), dtype=np.int64)
    return place_gang_memo(
        cands,
        domain,
        cpu_free,
        mem_free,
        gpu_free,
        gpu_count,
        node_model,
        t_cpu,
        t_mem,
        t_gpus,
        t_milli,
        t_models,
        policy,
        shapes,
        out_node,
        out_mask,
        no_memo[:, 0],
        no_memo,
    )


@_jit
def place_gang_memo(
    cands: I64,
    domain: I32,
    cpu_free: I64,
    mem_free: I64,
    gpu_free: I16,
    gpu_count: I32,
    node_model: I32,
    t_cpu: I64,
    t_mem: I64,
    t_gpus: I32,
    t_milli: I32,
    t_models: U64,
    policy: int,
    shapes: I64,
    out_node: I32,
    out_mask: U64,
    node_version: I64,
    memo: I64,
) -> tuple[int, int]:
    """``place_gang``, reading and refreshing the nodes' evaluations of the *first* task's shape
    in ``memo`` as ``best_node_memo`` does (an empty memo: none). Same result as ``place_gang``."""
    out_node[:] = NO_NODE
    out_mask[:] = _ZERO
    nodes = (cpu_free, mem_free, gpu_free, gpu_count, node_model)
    tasks = (t_cpu, t_mem, t_gpus, t_milli, t_models)
    members = _distinct_in_domains(cands, domain, cpu_free.shape[0])
    grouped, starts = _group_by_domain(members, domain)
    return _search_domains(
        grouped,
        starts,
        domain,
        nodes,
        tasks,
        _uses_fgd(policy, shapes),
        shapes,
        out_node,
        out_mask,
        node_version,
        memo,
    )


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
