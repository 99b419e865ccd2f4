"""Gangs spread one task a node (``JobSubmitted.spread``): every domain tried (``place_spread``)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from fleetlog.core.kernels.base import I16, I32, I64, U64, NodeArrays, TaskArrays, _hot, _jit
from fleetlog.core.kernels.domain import _same_task
from fleetlog.core.kernels.frag import _uses_fgd
from fleetlog.core.kernels.node import _eval_node, _task

Bools = npt.NDArray[np.bool_]


@_jit
def place_spread(
    cands: I64,
    starts: I64,
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
    t_class: I64,
    allowed: Bools,
    weight: I64,
    policy: int,
    shapes: I64,
    out_pos: I64,
) -> tuple[int, int]:
    """A gang whose tasks each take a node of their own, in one domain. ``cands`` holds each
    domain's candidates as one run, ``cands[starts[k]:starts[k + 1]]`` (runs in the order the
    caller ranks domains); ``allowed[c, j]`` / ``weight[c, j]``: whether a task of class row
    ``c`` (``t_class``) may use the candidate at position ``j``, and its soft affinity there.

    In each run, the tasks in order, each on the unused allowed candidate with the lowest
    (primary, secondary) score, then the highest weight, then the lowest node index — scored
    on the free capacity as it is (a node takes one task, so no task sees another's). The run
    whose every task is placed with the lowest summed (primary, secondary) wins, then the
    earliest. ``out_pos``: each task's position in ``cands`` in the winning run (else -1).
    Returns (the winning run or -1, the most tasks placed in one run)."""
    nodes = (cpu_free, mem_free, gpu_free, gpu_count, node_model)
    tasks = (t_cpu, t_mem, t_gpus, t_milli, t_models)
    n_tasks = t_cpu.shape[0]
    used = np.zeros(cpu_free.shape[0], dtype=np.bool_)
    pos = np.full(n_tasks, -1, dtype=np.int64)
    size = cands.shape[0]
    work = (np.zeros(size, np.int64), np.zeros(size, np.int64), np.zeros(size, np.int64))
    best_run, most = -1, 0
    best_p, best_s = 0, 0
    for k in range(starts.shape[0] - 1):
        placed, total_p, total_s = _in_run(
            starts[k], starts[k + 1], cands, nodes, tasks, t_class, allowed, weight, policy, shapes,
            used, pos, work,
        )  # fmt: skip
        for t in range(placed):
            used[cands[pos[t]]] = False
        most = max(most, placed)
        if placed == n_tasks and (best_run < 0 or (total_p, total_s) < (best_p, best_s)):
            best_run, best_p, best_s = k, total_p, total_s
            out_pos[:] = pos
        pos[:] = -1
    if best_run < 0:
        out_pos[:] = -1
    return best_run, most


@_hot
def _in_run(
    lo: int,
    hi: int,
    cands: I64,
    nodes: NodeArrays,
    tasks: TaskArrays,
    t_class: I64,
    allowed: Bools,
    weight: I64,
    policy: int,
    shapes: I64,
    used: Bools,
    pos: I64,
    work: tuple[I64, I64, I64],
) -> tuple[int, int, int]:
    """The tasks in order on the candidates ``cands[lo:hi]`` (one run), each on the best one
    whose node is not ``used`` (marked as it is taken; ``pos``: its position): (tasks placed
    before the first that fits nowhere, their summed primary and secondary scores). A run of
    alike tasks (shape and class) scores each candidate once for all of them: a node takes one
    task, so no task of the run changes another's score."""
    cpu_free, mem_free, gpu_free, gpu_count, node_model = nodes
    t_cpu, t_mem, t_gpus, t_milli, t_models = tasks
    fit, prim, sec = work  # (the candidates that fit, listed in fit[:fits]; their scores)
    use_fgd = _uses_fgd(policy, shapes)
    n_tasks = t_cpu.shape[0]
    total_p, total_s, placed, i = 0, 0, 0, 0
    while i < n_tasks and placed == i:
        end = i + 1
        while end < n_tasks and t_class[end] == t_class[i] and _same_task(tasks, i, end):
            end += 1
        task = _task(t_cpu[i], t_mem[i], t_gpus[i], t_milli[i], t_models[i])
        may, wc = allowed[t_class[i]], weight[t_class[i]]
        fits = 0
        for j in range(lo, hi):
            n = int(cands[j])
            if used[n] or not may[j]:
                continue
            ok, p, s = _eval_node(
                n, cpu_free, mem_free, gpu_free, gpu_count, node_model, task, use_fgd, shapes
            )
            if ok:
                fit[fits], prim[j], sec[j] = j, p, s
                fits += 1
        for t in range(i, end):
            found = -1
            for f in range(fits):
                j = fit[f]
                if not used[cands[j]] and (found < 0 or _before(j, found, prim, sec, wc, cands)):
                    found = j
            if found < 0:
                break
            used[cands[found]] = True
            pos[t] = found
            total_p += prim[found]
            total_s += sec[found]
            placed += 1
        i = end
    return placed, total_p, total_s


@_hot
def _before(j: int, found: int, prim: I64, sec: I64, weight: I64, cands: I64) -> bool:
    """Candidate ``j`` ranks before ``found``: lower (primary, secondary), higher weight, lower node."""
    if prim[j] != prim[found]:
        return prim[j] < prim[found]  # type: ignore[no-any-return]
    if sec[j] != sec[found]:
        return sec[j] < sec[found]  # type: ignore[no-any-return]
    if weight[j] != weight[found]:
        return weight[j] > weight[found]  # type: ignore[no-any-return]
    return cands[j] < cands[found]  # type: ignore[no-any-return]
