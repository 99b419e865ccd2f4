"""The placement kernels called over decide's working area (:class:`~fleetlog.core.scratch.Scratch`):
a gang or a single task in a set of candidate nodes, and a placement's score to compare cells.

Steps 3-6 of decide use these; nothing here decides what to do with the answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np

from fleetlog.core import kernels
from fleetlog.core.arrays import Array
from fleetlog.core.eligibility import eligible, job_classes, job_preferences, preference_weights
from fleetlog.core.scratch import Placement, Scratch
from fleetlog.core.shapes import LEVELS, task_arrays
from fleetlog.core.state import LEVEL_MASK, SPREAD_HOST

NO_MEMO = np.zeros((0, kernels.MEMO_COLUMNS), dtype=np.int64)


def run_gang(sc: Scratch, job: int, cands: np.ndarray) -> tuple[int, int, tuple[np.ndarray, ...]]:
    """The gang kernel on ``job`` over ``cands`` in the working copy: (domain or -1, tasks
    that fit, (task rows, node per task, GPU mask per task, cpu, mem, gpus, milli))."""
    topology = int(sc.state.jobs.cols["topology"][job])
    if topology & SPREAD_HOST:
        return spread_gang(sc, job, cands, topology & LEVEL_MASK)
    idx, cpu, mem, gpus, milli, models = task_arrays(sc.state, job)
    level = topology & LEVEL_MASK
    domain = sc.state.nodes.cols[LEVELS[level]][: sc.state.nodes.size] if level else sc.no_domain
    out_node = np.full(idx.size, -1, dtype=np.int32)
    out_mask = np.zeros(idx.size, dtype=np.uint64)
    node_model = sc.model
    classes = job_classes(sc.state, job) if sc.constrained else (0,)
    if len(classes) > 1:
        kinds = node_kinds(sc, job, idx, classes, cands)
        if kinds is None:
            return -1, 0, (idx, out_node, out_mask, cpu, mem, gpus, milli)
        cands, node_model, models = kinds
    free = (sc.cpu_free, sc.mem_free, sc.gpu_free, sc.gpu_count, node_model)
    first = (int(cpu[0]), int(mem[0]), int(gpus[0]), int(milli[0]), int(models[0])) if idx.size else None
    memo = sc.memo(first) if first is not None and node_model is sc.model else NO_MEMO
    chosen, count = kernels.place_gang_memo(
        cands,
        domain,
        *free,
        cpu,
        mem,
        gpus,
        milli,
        models,
        sc.policy_id,
        sc.shapes,
        out_node,
        out_mask,
        sc.node_version,
        memo,
    )
    return int(chosen), int(count), (idx, out_node, out_mask, cpu, mem, gpus, milli)


MAX_KINDS: Final = 64


def node_kinds(
    sc: Scratch, job: int, idx: Array, classes: tuple[int, ...], cands: Array
) -> tuple[Array, Array, Array] | None:
    """A gang whose tasks differ in constraint class, as the kernels take it: each candidate's
    *kind* — its GPU model and which of the job's classes may use it — stands for its model,
    and each task's models mask allows the kinds it may use (the kernels check that mask for
    every task). ``(cands, node kinds, task masks)``, or None when some task may use none of
    ``cands``. At most 64 kinds (a model mask's bits): the nodes of later kinds, in (model,
    classes) order, are left out (docs/scheduling.md)."""
    state = sc.state
    member = np.zeros(cands.size, dtype=np.uint64)
    for j, c in enumerate(classes):
        ok = eligible(state, c)
        mine = np.ones(cands.size, np.bool_) if ok is None else ok[cands]
        member |= mine.astype(np.uint64) << np.uint64(j)
    model = sc.model[cands].astype(np.int64)
    pairs, kind = np.unique(np.stack([model, member.view(np.int64)], axis=1), axis=0, return_inverse=True)
    kind = kind.reshape(-1)
    if pairs.shape[0] > MAX_KINDS:
        keep = kind < MAX_KINDS
        cands, kind, pairs = cands[keep], kind[keep], pairs[:MAX_KINDS]
    node_model = np.full(sc.model.size, MAX_KINDS - 1, dtype=np.int32)
    node_model[cands] = kind
    tc = state.tasks.cols
    task_cls = np.searchsorted(np.array(classes), tc["cls"][idx]).astype(np.uint64)
    gpu_models, one = tc["models"][idx], np.uint64(1)
    any_model = (tc["gpus"][idx] == 0) | (gpu_models == 0)
    masks = np.zeros(idx.size, dtype=np.uint64)
    for k, (m, bits) in enumerate(pairs.tolist()):
        allowed = ((np.uint64(bits & (1 << 64) - 1) >> task_cls) & one) > 0
        model_ok = any_model | (((gpu_models >> np.uint64(m)) & one) > 0) if 0 <= m < MAX_KINDS else any_model
        masks |= np.where(allowed & model_ok, one << np.uint64(k), np.uint64(0))
    if (masks == 0).any():
        return None
    return cands, node_model, masks


def partial_fit(sc: Scratch, job: int, cands: np.ndarray) -> int:
    """How many of ``job``'s tasks fit in its best domain among ``cands``."""
    return run_gang(sc, job, cands)[1] if cands.size else 0


def place_in_cell(sc: Scratch, job: int, cell: int, cands: Array) -> Placement | None:
    """Run the gang kernel over ``cands``; the placement with its score, or None."""
    state = sc.state
    if cands.size == 0:
        return None
    jc = state.jobs.cols
    if jc["ntasks"][job] == 1 and not jc["topology"][job]:
        return place_single(sc, cell, cands, int(jc["first_task"][job]))
    chosen, _, (idx, out_node, out_mask, cpu, mem, gpus, milli) = run_gang(sc, job, cands)
    if chosen < 0:
        return None
    weights = job_preferences(state, job) if sc.constrained else None
    if weights is not None and not jc["topology"][job] & SPREAD_HOST:  # (spread: task by task)
        out_node, out_mask = preferred_gang(sc, job, cands, weights, out_node, out_mask)
    many = len(sc.cells) > 1 and cell >= 0
    score = gang_score(sc, out_node, out_mask, (cpu, mem, gpus, milli)) if many else (0, 0)
    return Placement(cell, idx, out_node, out_mask, score)


def preferred_gang(
    sc: Scratch, job: int, cands: Array, weights: Array, nodes: Array, masks: Array
) -> tuple[Array, Array]:
    """Soft affinity for a gang: the placement the kernel finds on the candidates whose
    weight is at least a level — the highest level first, above the least-preferred node of
    the placement without preferences — when its score (:func:`gang_score`) is no worse than
    that placement's; else that placement."""
    tasks = task_arrays(sc.state, job)[1:5]
    at_least = int(weights[nodes].min())
    levels = np.unique(weights[cands])
    levels = levels[levels > at_least][::-1]
    if not levels.size:
        return nodes, masks
    score = gang_score(sc, nodes, masks, tasks)
    for level in levels.tolist():
        chosen, _, (_, n2, m2, *_) = run_gang(sc, job, cands[weights[cands] >= level])
        if chosen >= 0 and gang_score(sc, n2, m2, tasks) <= score:
            return n2, m2
    return nodes, masks


def spread_gang(
    sc: Scratch, job: int, cands: Array, level: int
) -> tuple[int, int, tuple[np.ndarray, ...]]:
    """:func:`run_gang` for a gang spread one task a node (``JobSubmitted.spread``), by
    ``kernels.place_spread``: in each domain of ``level`` (the cell when 0), ascending, the
    tasks in order, each on the best node (by the policy, then soft affinity, then index) of
    the domain's candidates its class may use and no earlier task took; the domain whose
    placement of every task scores best, then the lowest. ``(domain or -1, the most tasks
    placed in one domain, arrays as run_gang's)``."""
    state = sc.state
    idx, cpu, mem, gpus, milli, models = task_arrays(state, job)
    out_node = np.full(idx.size, -1, dtype=np.int32)
    out_mask = np.zeros(idx.size, dtype=np.uint64)
    arrays = (idx, out_node, out_mask, cpu, mem, gpus, milli)
    domain = np.zeros(cands.size, np.int64)
    if level:
        domain = state.nodes.cols[LEVELS[level]][: state.nodes.size][cands].astype(np.int64)
    order = np.lexsort((cands, domain))
    order = order[domain[order] >= 0]
    nodes, domain = cands[order].astype(np.int64), domain[order]
    starts = np.flatnonzero(np.diff(domain, prepend=-2, append=-1)).astype(np.int64)
    classes, t_class = np.unique(state.tasks.cols["cls"][idx], return_inverse=True)
    allowed = np.ones((classes.size, nodes.size), dtype=np.bool_)
    weight = np.zeros((classes.size, nodes.size), dtype=np.int64)
    if sc.constrained:
        for k, c in enumerate(classes.tolist()):
            ok, w = eligible(state, c), preference_weights(state, c)
            if ok is not None:
                allowed[k] = ok[nodes]
            if w is not None:
                weight[k] = w[nodes]
    pos = np.full(idx.size, -1, dtype=np.int64)
    free = (sc.cpu_free, sc.mem_free, sc.gpu_free, sc.gpu_count, sc.model)
    run, most = kernels.place_spread(
        nodes, starts, *free, cpu, mem, gpus, milli, models, t_class.reshape(-1).astype(np.int64),
        allowed, weight, sc.policy_id, sc.shapes, pos,
    )  # fmt: skip
    if run < 0:
        return -1, int(most), arrays
    out_node[:] = nodes[pos]
    for i, n in enumerate(out_node.tolist()):  # (one task a node: each node's GPUs as they are)
        out_mask[i] = kernels.pick_gpus(sc.gpu_free[n], int(sc.gpu_count[n]), int(gpus[i]), int(milli[i]))
    return int(domain[starts[run]]), idx.size, arrays


def preferred(sc: Scratch, cands: Array, task: kernels.Task, weights: Array, node: int) -> int:
    """Soft affinity for one task (``kernels.preferred_node``): of the candidates that score
    as ``node`` does (the best), the one whose weight is highest, then the lowest index."""
    free = (sc.cpu_free, sc.mem_free, sc.gpu_free, sc.gpu_count, sc.model)
    return int(kernels.preferred_node(cands, weights, node, *free, *task, sc.policy_id, sc.shapes))


def place_single(sc: Scratch, cell: int, cands: Array, t: int) -> Placement | None:
    """The fast path for a one-task job (task row ``t``) with no topology: the best node, then
    its GPUs (a placement of one-element tuples)."""
    tc = sc.state.tasks.cols
    cpu, mem, gpus, milli = int(tc["cpu"][t]), int(tc["mem"][t]), int(tc["gpus"][t]), int(tc["milli"][t])
    models = tc["models"][t]
    free = (sc.cpu_free, sc.mem_free, sc.gpu_free, sc.gpu_count, sc.model)
    if sc.policy_id == kernels.BEST_FIT:
        node = kernels.best_node_summary(cands, sc.gpu_total, *free, cpu, mem, gpus, milli, models)
    else:
        memo = sc.memo((cpu, mem, gpus, milli, int(models)))
        node = kernels.best_node_memo(
            cands, *free, cpu, mem, gpus, milli, models, sc.policy_id, sc.shapes, sc.node_version, memo
        )
    weights = preference_weights(sc.state, int(tc["cls"][t])) if sc.constrained else None
    if weights is not None:
        node = preferred(sc, cands, (cpu, mem, gpus, milli, models), weights, int(node))
    if node < 0:
        return None
    cpu_avail = int(sc.cpu_free[node])
    mask = int(
        kernels.pick_gpus_scored(
            sc.gpu_free[node], int(sc.gpu_count[node]), gpus, milli, cpu_avail, cpu, sc.policy_id, sc.shapes
        )
    )
    many = len(sc.cells) > 1 and cell >= 0
    score = gang_score(sc, (node,), (mask,), ((cpu,), (mem,), (gpus,), (milli,))) if many else (0, 0)
    return Placement(cell, (t,), (node,), (mask,), score)


def gang_score(
    sc: Scratch,
    nodes: Sequence[int] | Array,
    masks: Sequence[int] | Array,
    tasks: tuple[Sequence[int] | Array, ...],
) -> tuple[int, int]:
    """How good a placement is, to compare cells: its tasks' node scores summed, each taken
    as the gang's earlier tasks would leave the node (then the working copy is restored)."""
    cpu, mem, gpus, milli = tasks
    primary = secondary = 0
    for i in range(len(nodes)):
        n = int(nodes[i])
        a, b = kernels.node_score(
            n,
            sc.cpu_free,
            sc.gpu_free,
            sc.gpu_count,
            int(cpu[i]),
            int(gpus[i]),
            int(milli[i]),
            sc.policy_id,
            sc.shapes,
        )
        primary, secondary = primary + int(a), secondary + int(b)
        sc.take(n, masks[i], int(cpu[i]), int(mem[i]), int(milli[i]), -1)
    for i in range(len(nodes)):
        sc.take(int(nodes[i]), masks[i], int(cpu[i]), int(mem[i]), int(milli[i]), 1)
    return primary, secondary
