"""Step 6 of decide: why a job waits, as a reason code with the numbers behind it.

Reason codes (stable; see docs/scheduling.md):

- ``no_eligible_nodes`` — no up node in the allowed cells (with an allowed GPU model), or none
  its constraints allow: the message counts what excluded them (cordoned, an untolerated
  taint, a node selector label or affinity requirement not met: ``core/constraints.py``);
- ``quota_exhausted`` — the tenant's quota, plus what its cohort can lend, is used up;
- ``insufficient_capacity`` — no node has room for the (single) task now; the most free on a
  node it may use, and what excluded those with more (``core/room.py``);
- ``gang_does_not_fit`` — not every task of the gang fits at once;
- ``gang_does_not_fit_topology`` — no block/rack/host has room for the whole gang;
- ``never_fits`` — the job can never fit on the current fleet, even empty: no node, or no
  block/rack/host its gang must share, is big enough (node shapes, not usage: ``core/never_fits.py``);
- ``waiting_for_reservation`` — the job holds a reservation and waits for it to drain;
- ``unplaceable`` — (rejection, ``fail_unplaced`` policies) it did not fit on arrival.
"""

from __future__ import annotations

import collections

import numpy as np

from fleetlog.core import room
from fleetlog.core.arrays import Array
from fleetlog.core.constraints import NO_ATTRS, NodeAttrs, why_not
from fleetlog.core.eligibility import eligible, job_classes
from fleetlog.core.fitting import partial_fit
from fleetlog.core.quota import quota_check
from fleetlog.core.scratch import Outcome, Scratch
from fleetlog.core.shapes import LEVELS, task_arrays
from fleetlog.core.state import LEVEL_MASK, SPREAD_HOST

__all__ = ["Outcome", "capacity_failure", "eligible_exists", "explain_failure"]


def explain_failure(sc: Scratch, job: int, cells: tuple[int, ...], kind: str) -> Outcome:
    """Why ``job`` did not fit in ``cells``: ``kind`` is no_cells, quota or capacity."""
    state = sc.state
    names = ", ".join(state.names["cell"].names[c] for c in cells) or "(none up)"
    if kind == "no_cells":
        allowed = state.job_cells.get(job, ())
        wanted = ", ".join(state.names["cell"].names[c] for c in allowed) or "any cell"
        return Outcome("no_eligible_nodes", f"no node is up in the allowed cells ({wanted})")
    if kind == "quota":
        return Outcome(
            "quota_exhausted", quota_check(state, sc.usage, job, cells[0], sc.policy.require_quota)
        )
    return capacity_failure(sc, job, cells, names)


def capacity_failure(sc: Scratch, job: int, cells: tuple[int, ...], names: str) -> Outcome:
    state = sc.state
    idx, cpu, mem, gpus, milli, models = task_arrays(state, job)
    shape = f"{int(gpus[0])} GPU x {int(milli[0])} milli, {int(cpu[0])} mCPU, {int(mem[0])} MiB"
    excluded = constraint_failure(sc, job, cells, names) if sc.constrained else None
    if excluded is not None:
        return excluded
    if not eligible_exists(sc, cells, int(models[0]), int(gpus[0])):
        wanted = ", ".join(state.names["model"].names[m] for m in range(64) if int(models[0]) >> m & 1)
        return Outcome("no_eligible_nodes", f"no up node with GPU model {wanted or 'any'} in cells {names}")
    topology = int(state.jobs.cols["topology"][job])
    level = topology & LEVEL_MASK
    never = sc.fleet().never_fits_job(state, job)
    if never is not None:
        return Outcome("never_fits", f"can never fit on the current fleet: {never}")
    best, best_cell = 0, cells[0]
    if level or idx.size > 1:  # (one task alone: none fits, or it would have been placed)
        best = -1
        for cell in cells:
            fit = partial_fit(sc, job, sc.candidates(cell, False, job))
            if fit > best:
                best, best_cell = fit, cell
    where = state.names["cell"].names[best_cell]
    spread = " (spread: one task a node)" if topology & SPREAD_HOST else ""
    if level:
        return Outcome(
            "gang_does_not_fit_topology",
            f"no {LEVELS[level]} in cell {where} has room for all {idx.size} tasks ({shape} "
            f"largest); the best {LEVELS[level]} fits {best}{spread}",
        )
    if idx.size > 1:
        return Outcome(
            "gang_does_not_fit",
            f"only {best} of {idx.size} tasks ({shape} largest) fit at once in cell {where}{spread}",
        )
    return Outcome(
        "insufficient_capacity",
        f"no node in cells {names} has room for a task of {shape}; {room.most_free(sc, job, cells)}",
    )


def constraint_failure(sc: Scratch, job: int, cells: tuple[int, ...], names: str) -> Outcome | None:
    """``no_eligible_nodes`` when some task of ``job`` may use no up node of ``cells`` by its
    constraints, saying what excluded how many nodes (kube-scheduler's way: "0/N nodes ..."),
    or None."""
    state = sc.state
    up = [sc.up_by_cell[c] for c in cells if c in sc.up_by_cell]
    nodes = np.concatenate(up) if up else np.zeros(0, dtype=np.int64)
    tc = state.tasks.cols
    rows = state.job_tasks(job)
    task_cls = tc["cls"][rows.start : rows.stop]
    for cls in job_classes(state, job):
        allowed = eligible(state, cls)
        if allowed is None:
            continue
        mine = rows.start + np.flatnonzero(task_cls == cls)
        gpus, models = int(tc["gpus"][mine].max()), int(np.bitwise_or.reduce(tc["models"][mine]))
        able = hosts(sc, nodes, gpus, models)  # (could take its GPUs: else the wait is capacity's)
        if allowed[nodes[able]].any():
            continue
        counts = exclusions(sc, cls, nodes)
        small = int((allowed[nodes] & ~able).sum())
        if small:
            counts = dict(counts)
            del counts["eligible"]
            counts[f"with fewer than {gpus} GPUs of the models it may use"] = small
        said = ", ".join(f"{n} {why}" for why, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
        group = "" if len(job_classes(state, job)) == 1 else " for some of its tasks"
        return Outcome(
            "no_eligible_nodes",
            f"0/{nodes.size} up nodes in cells {names} are eligible{group}: {said or 'no node is up'}",
        )
    return None


def hosts(sc: Scratch, nodes: Array, gpus: int, models: int) -> Array:
    """Which of ``nodes`` have at least ``gpus`` GPUs of one of ``models`` (0: any)."""
    if gpus == 0:
        return np.ones(nodes.size, dtype=np.bool_)
    able = sc.gpu_count[nodes] >= gpus
    if models:
        m = sc.model[nodes]
        able &= (m >= 0) & ((np.uint64(models) >> np.maximum(m, 0).astype(np.uint64)) & np.uint64(1) > 0)
    return able


def exclusions(sc: Scratch, cls: int, nodes: Array) -> dict[str, int]:
    """How many of ``nodes`` each reason excludes for class ``cls`` (remembered for the call)."""
    key = (cls, nodes.tobytes())
    found = sc.excluded.get(key)
    if found is None:
        state, seen = sc.state, dict[NodeAttrs, str]()
        spec, attrs, counts = state.classes[cls], state.node_attrs, collections.Counter[str]()
        for row in nodes.tolist():
            if row in state.drained:  # (an operator's cordon, named as such)
                counts["drained"] += 1
                continue
            node = attrs.get(row, NO_ATTRS)
            why = seen.get(node)
            if why is None:
                why = seen[node] = why_not(spec, node) or "eligible"
            counts[why] += 1
        found = sc.excluded[key] = dict(counts)
    return found


def eligible_exists(sc: Scratch, cells: tuple[int, ...], models: int, gpus: int) -> bool:
    """Is there an up node in ``cells`` that could ever host the task's GPU model? (Remembered
    for the call: up nodes and their models do not change within it.)"""
    key = (cells, models, gpus)
    found = sc.eligible.get(key)
    if found is None:
        found = sc.eligible[key] = _eligible_exists(sc, cells, models, gpus)
    return found


def _eligible_exists(sc: Scratch, cells: tuple[int, ...], models: int, gpus: int) -> bool:
    if gpus == 0 or models == 0:
        return any(sc.up_by_cell.get(c, np.zeros(0)).size for c in cells)
    for cell in cells:
        nodes = sc.up_by_cell.get(cell, np.zeros(0, dtype=np.int64))
        m = sc.model[nodes]
        if (
            (m >= 0) & ((np.uint64(models) >> np.maximum(m, 0).astype(np.uint64)) & np.uint64(1)).astype(bool)
        ).any():
            return True
    return False
