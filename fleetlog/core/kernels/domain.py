"""Gangs: one domain (ranking, choosing and committing a run of tasks)."""

from __future__ import annotations

import numpy as np

from fleetlog.core.kernels.base import I64, MAX_GPUS, NO_NODE, Eval, NodeArrays, Task, TaskArrays, _hot, _jit
from fleetlog.core.kernels.domains import (
    FROM_DIRTY,
    FROM_NONE,
    FROM_TOP,
    RANK_COLUMNS,
    RANK_FLAG,
    RANK_LOCAL,
    RANK_PRIMARY,
    RANK_SECONDARY,
    W_DIRTY,
    W_META,
    W_RUN_MASK,
    W_RUN_NODE,
    W_SLOT_CPU,
    W_SLOT_GPU,
    W_SLOT_MEM,
    W_SLOT_NODE,
    W_SLOT_OF,
    W_TOP,
    Slots,
    Work,
)
from fleetlog.core.kernels.floor import _allocate
from fleetlog.core.kernels.gpus import _take
from fleetlog.core.kernels.memo import (
    MEMO_FITS,
    MEMO_FLOOR,
    MEMO_PRIMARY,
    MEMO_SECONDARY,
    MEMO_VERSION,
    _memo_eval,
)
from fleetlog.core.kernels.node import _better, _eval, _eval_node, _task

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
        n,
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
                n,
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
