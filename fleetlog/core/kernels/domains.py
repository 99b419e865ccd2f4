"""Gangs: domains (grouping, demand, bounds) and a ``place_gang`` call's work arrays."""

from __future__ import annotations

from typing import Final

import numpy as np

from fleetlog.core.kernels.base import (
    DEMAND_COLUMNS,
    DEMAND_CPU,
    DEMAND_MEM,
    DEMAND_MILLI,
    DEMAND_WHOLE_GPUS,
    DEMAND_WHOLE_TASKS,
    DENSE_DOMAIN_FACTOR,
    DENSE_DOMAIN_SLACK,
    FULL_GPU,
    I16,
    I32,
    I64,
    NO_FLOOR,
    U64,
    UNBOUNDED,
    NodeArrays,
    Task,
    TaskArrays,
    _hot,
    _jit,
)
from fleetlog.core.kernels.gpus import _model_ok
from fleetlog.core.kernels.node import _best_fit

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
    if cpu_avail < cpu or mem_avail < mem or not _model_ok(models, model):
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
