"""Gangs: all domains (``place_gang``, ``place_gang_memo``)."""

from __future__ import annotations

import numpy as np

from fleetlog.core.kernels.base import (
    _ZERO,
    FULL_GPU,
    I16,
    I32,
    I64,
    NO_DOMAIN,
    NO_NODE,
    U64,
    NodeArrays,
    TaskArrays,
    _jit,
)
from fleetlog.core.kernels.domain import _place_in_domain, _same_task, _task_at, _workspace
from fleetlog.core.kernels.domains import (
    W_RUN_MASK,
    W_RUN_NODE,
    _demand,
    _distinct_in_domains,
    _domain_bound,
    _group_by_domain,
    _run_bound,
    _whole_min,
)
from fleetlog.core.kernels.frag import _uses_fgd
from fleetlog.core.kernels.memo import MEMO_COLUMNS

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
