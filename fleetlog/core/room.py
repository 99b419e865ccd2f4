"""The room an ``insufficient_capacity`` reason reports (issue 47): the most free on one node
the job may use, and what excluded the nodes that had more.

A job that waits for capacity is told how much room there is, so its owner can tell "wait"
from "ask for less". Counted over every up node, that number can name room the job may never
take (a node tainted for maintenance, of another GPU model, drained by an operator), and the
owner waits for nothing. With ``CoreConfig.most_free_usable`` the number counts only the nodes
the job may use (its constraints, its GPU models, not drained; down nodes and other cells are
never counted), and the excluded nodes with more room than that are counted by what excluded
them. Off, the first text (every up node of the cells), as logs recorded before it decided.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

import numpy as np

from fleetlog.core import kernels
from fleetlog.core.arrays import Array
from fleetlog.core.constraints import NO_ATTRS, why_not
from fleetlog.core.eligibility import job_eligible
from fleetlog.core.scratch import Scratch
from fleetlog.core.state import FULL_GPU

__all__ = ["most_free"]


def most_free(sc: Scratch, job: int, cells: tuple[int, ...]) -> str:
    """The most free capacity on one up node of ``cells`` that ``job`` (one task) may use, and
    what excluded the nodes with more room, for the explanation."""
    nodes = np.concatenate([sc.up_by_cell[c] for c in cells if c in sc.up_by_cell] or [np.zeros(0, np.int64)])
    if nodes.size == 0:
        return "no node is up"
    if not sc.state.config.most_free_usable:
        return "the most free on one node: " + _free(sc, nodes)
    usable = usable_mask(sc, job, nodes)
    if usable.all():  # (nothing excluded: the number is the fleet's, and the text the first one)
        return "the most free on one node: " + _free(sc, nodes)
    mine, others = nodes[usable], nodes[~usable]
    said = "no node it may use is up"
    if mine.size:
        said = f"the most free on a node it may use: {_free(sc, mine)}"
    room = _room(sc, job)
    best = int(room(mine).max(initial=0))
    more = others[room(others) > best]
    if more.size == 0:
        return said
    counts = collections.Counter(_why(sc, job, row) for row in more.tolist())
    named = ", ".join(f"{n} {why}" for why, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    plural = "" if more.size == 1 else "s"
    return f"{said} ({more.size} node{plural} with more room excluded: {named})"


def _free(sc: Scratch, nodes: Array) -> str:
    whole, share, cpu, mem = kernels.most_free(nodes, sc.cpu_free, sc.mem_free, sc.gpu_free)
    return f"{int(whole)} whole GPUs, a GPU with {int(share)} milli free, {int(cpu)} mCPU, {int(mem)} MiB"


def usable_mask(sc: Scratch, job: int, nodes: Array) -> Array:
    """Which of ``nodes`` (up, in the job's cells) ``job`` may use: its constraints allow it
    (taints, selectors, affinity, cordons), no operator drained it, and its GPUs are of a model
    the job allows (when it asks for GPUs and names models)."""
    state = sc.state
    allowed = job_eligible(state, job)
    ok = np.ones(nodes.size, dtype=np.bool_) if allowed is None else allowed[nodes].copy()
    if state.drained:
        ok &= ~np.isin(nodes, np.array(sorted(state.drained), dtype=np.int64))
    gpus, models = _gpu_ask(sc, job)
    if gpus and models:
        m = sc.model[nodes]
        ok &= (m >= 0) & ((np.uint64(models) >> np.maximum(m, 0).astype(np.uint64)) & np.uint64(1) > 0)
    return ok


def _gpu_ask(sc: Scratch, job: int) -> tuple[int, int]:
    """The GPUs the job's (first) task asks for and the models it allows (0: any)."""
    tc, first = sc.state.tasks.cols, sc.state.job_tasks(job).start
    return int(tc["gpus"][first]), int(tc["models"][first])


def _room(sc: Scratch, job: int) -> Callable[[Array], Array]:
    """Per node, the room that matters to the task: whole free GPUs when it asks for whole GPUs,
    the most free share on one GPU for a fraction of one, else free CPU."""
    tc, first = sc.state.tasks.cols, sc.state.job_tasks(job).start
    if int(tc["gpus"][first]) and int(tc["milli"][first]) >= FULL_GPU:
        return lambda rows: np.asarray((sc.gpu_free[rows] == FULL_GPU).sum(axis=1))
    if int(tc["gpus"][first]):
        return lambda rows: np.asarray(sc.gpu_free[rows].max(axis=1, initial=0))
    return lambda rows: np.asarray(sc.cpu_free[rows])


def _why(sc: Scratch, job: int, row: int) -> str:
    """What excludes node ``row`` for ``job``: drained, its constraints' first reason
    (kube-scheduler's wording), else its GPU model."""
    state = sc.state
    if row in state.drained:
        return "drained"
    cls = int(state.tasks.cols["cls"][state.job_tasks(job).start])
    why = why_not(state.classes[cls], state.node_attrs.get(row, NO_ATTRS))
    if why is not None:
        return why if why.startswith(("cordoned", "not ")) else f"with {why}"
    return f"with GPU model {state.names['model'].names[int(sc.model[row])]}"
