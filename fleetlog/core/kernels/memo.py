"""One node, one task, remembered: ``best_node_memo`` and ``place_run`` over a caller's memo of node
evaluations (see the package docstring)."""

from __future__ import annotations

import numpy as np

from fleetlog.core.kernels.base import I16, I32, I64, NO_NODE, NodeArrays, Task, _hot, _jit
from fleetlog.core.kernels.floor import _fgd_floor, _floor_table
from fleetlog.core.kernels.frag import _uses_fgd
from fleetlog.core.kernels.gpus import _has_bit
from fleetlog.core.kernels.node import _better, _eval_node, _take_scored, _task
from fleetlog.core.kernels.summary import _best_summary

# ---------------------------------------------------------------- one node, one task, remembered

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
    k = tasks.shape[0]
    # FGD over a run of one shape: a tournament tree of the nodes' keys (below place_run), built
    # for the shape of two jobs in a row; another shape meanwhile scans, and keeps it current
    size, tree, keys, leaf_of = _tree_arrays(cands.shape[0], memos.shape[1] if use_fgd and k > 1 else -1)
    tree_slot = -1
    tree_task = _task(0, 0, 0, 0, np.uint64(0))
    for j in range(k):
        if tasks[j, RUN_SKIP] != 0:
            return j
        cpu, mem, gpus, milli = int(tasks[j, 0]), int(tasks[j, 1]), int(tasks[j, 2]), int(tasks[j, 3])
        task = _task(cpu, mem, gpus, milli, np.uint64(tasks[j, 4]))
        if use_fgd:
            slot = tasks[j, RUN_SLOT]
            memo = memos[slot]
            if slot != tree_slot and j + 1 < k and tasks[j + 1, RUN_SLOT] == slot:
                tree_slot, tree_task = slot, task
                _tree_build(tree, size, keys, leaf_of, cands, nodes, task, table, node_version, memo)
            if slot == tree_slot:
                n = _tree_best(tree, size, keys, cands, nodes, task, shapes, node_version, memo)
            else:
                n = _best_memo_floors(cands, nodes, task, shapes, table, stale, node_version, memo)
        else:  # best fit: pruned by the free totals, as best_node_summary (no memo needed)
            n = _best_summary(cands, gpu_total, nodes, task)
        if n < 0:
            return j
        take = (gpus, milli, int(cpu_free[n]), cpu)
        mask = _take_on(n, take, gpu_free, gpu_count, gpu_total, use_fgd, shapes)
        cpu_free[n] -= cpu
        mem_free[n] -= mem
        node_version[n] += 1
        out[j, 0], out[j, 1] = n, np.int64(mask)
        if tree_slot >= 0 and leaf_of[n] >= 0:  # the node's key moved: its leaf again
            memo = memos[tree_slot]
            _floor_row(n, nodes, tree_task, table, node_version, memo)
            ok = _leaf_key(int(leaf_of[n]), keys, cands, memo)
            _tree_set(tree, size, int(leaf_of[n]), ok, keys, cands)
    return int(k)


@_jit
def _take_on(
    n: int,
    take: tuple[int, int, int, int],
    gpu_free: I16,
    gpu_count: I32,
    gpu_total: I64,
    use_fgd: bool,
    shapes: I64,
) -> np.uint64:
    """Take a task of ``take`` = (gpus, milli, the node's free cpu, the task's cpu) on node
    ``n`` (``pick_gpus_scored``'s GPUs), its CPU and memory left to the caller; the GPU mask."""
    gpus, milli, cpu_avail, cpu = take
    mask = _take_scored(gpu_free[n], int(gpu_count[n]), gpus, milli, cpu_avail, cpu, use_fgd, shapes)
    for i in range(int(gpu_count[n])):
        if _has_bit(mask, i):
            gpu_free[n, i] -= milli
            gpu_total[n] -= milli
    return mask


# A tournament tree over the candidates (leaf j: cands[j]) for place_run: each leaf's key is the
# node's remembered FGD score, or a floor under it (MEMO_FLOOR), or none (the node does not fit);
# each inner entry holds the leaf of its subtree's least key by ``_better`` ((primary, secondary,
# node) in order). The root's leaf, when its key is a score, is the node _best_memo_floors
# chooses: every other key is at least it, and a floor is at most the score it stands under. A
# floor at the root is scored in full and the tree mended, until a score is at the root. So a
# placement costs O(log N) instead of a pass over N nodes; the tree is built in one pass.


@_jit
def _floor_row(n: int, nodes: NodeArrays, task: Task, table: I64, node_version: I64, memo: I64) -> None:
    """Node ``n``'s memo row from its floor (MEMO_FLOOR) or as not fitting, as
    _best_memo_floors writes a stale row (a call of its own: only stale nodes pay for it)."""
    cpu_free, mem_free, gpu_free, gpu_count, node_model = nodes
    ok, floor, secondary = _fgd_floor(
        int(cpu_free[n]), int(mem_free[n]), gpu_free[n], int(gpu_count[n]), int(node_model[n]), task, table
    )
    memo[n, MEMO_VERSION] = node_version[n]
    memo[n, MEMO_FITS] = MEMO_FLOOR if ok else 0
    memo[n, MEMO_PRIMARY] = floor if ok else 0
    memo[n, MEMO_SECONDARY] = secondary if ok else 0


@_hot
def _leaf_key(j: int, keys: I64, cands: I64, memo: I64) -> bool:
    """Leaf ``j``'s key into ``keys[j]`` from its node's current memo row; False: it does not fit."""
    n = cands[j]
    if memo[n, MEMO_FITS] == 0:
        return False
    keys[j, 0], keys[j, 1] = memo[n, MEMO_PRIMARY], memo[n, MEMO_SECONDARY]
    return True


@_jit
def _tree_arrays(leaves: int, nodes: int) -> tuple[int, I64, I64, I64]:
    """(size, tree, keys, leaf_of) of a tree over ``leaves`` candidates among ``nodes`` nodes
    (``nodes`` < 0: no tree, empty arrays: a run of one job, or best fit)."""
    size = 1
    while size < leaves:
        size *= 2
    if nodes < 0:
        return (
            size,
            np.empty(0, dtype=np.int64),
            np.empty((0, 2), dtype=np.int64),
            np.empty(0, dtype=np.int64),
        )
    return (
        size,
        np.empty(2 * size, dtype=np.int64),
        np.empty((leaves, 2), dtype=np.int64),
        np.full(nodes, -1, dtype=np.int64),
    )


@_hot
def _tree_pick(a: int, b: int, keys: I64, cands: I64) -> int:
    """The leaf of the lesser key (-1: no leaf)."""
    if a < 0:
        return b
    if b < 0:
        return a
    return a if _better(keys[a, 0], keys[a, 1], cands[a], keys[b, 0], keys[b, 1], cands[b]) else b


@_hot
def _tree_set(tree: I64, size: int, j: int, ok: bool, keys: I64, cands: I64) -> None:
    """Leaf ``j`` now holds ``keys[j]`` (``ok``) or nothing: mend the path to the root."""
    i = size + j
    tree[i] = j if ok else -1
    i //= 2
    while i >= 1:
        tree[i] = _tree_pick(tree[2 * i], tree[2 * i + 1], keys, cands)
        i //= 2


@_jit
def _tree_build(
    tree: I64,
    size: int,
    keys: I64,
    leaf_of: I64,
    cands: I64,
    nodes: NodeArrays,
    task: Task,
    table: I64,
    node_version: I64,
    memo: I64,
) -> None:
    """Every leaf's key for ``task`` (and ``leaf_of``: node -> leaf), then the inner entries."""
    tree[:] = -1
    for j in range(cands.shape[0]):
        n = cands[j]
        leaf_of[n] = j
        if memo[n, MEMO_VERSION] != node_version[n]:
            _floor_row(n, nodes, task, table, node_version, memo)
        if _leaf_key(j, keys, cands, memo):
            tree[size + j] = j
    for i in range(size - 1, 0, -1):
        tree[i] = _tree_pick(tree[2 * i], tree[2 * i + 1], keys, cands)


@_jit
def _tree_best(
    tree: I64,
    size: int,
    keys: I64,
    cands: I64,
    nodes: NodeArrays,
    task: Task,
    shapes: I64,
    node_version: I64,
    memo: I64,
) -> int:
    """The node _best_memo_floors chooses (NO_NODE: none fits): floors at the root scored in full."""
    cpu_free, mem_free, gpu_free, gpu_count, node_model = nodes
    while True:
        j = int(tree[1])
        if j < 0:
            return NO_NODE
        n = int(cands[j])
        if memo[n, MEMO_FITS] == 1:
            return n
        ok, primary, secondary = _memo_eval(
            n, cpu_free, mem_free, gpu_free, gpu_count, node_model, task, True, shapes, node_version, memo
        )
        keys[j, 0], keys[j, 1] = primary, secondary
        _tree_set(tree, size, j, ok, keys, cands)


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
