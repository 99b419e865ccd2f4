"""Step 6 of decide: why a job waits, as a reason code with the numbers behind it.

Reason codes (stable; see docs/scheduling.md):

- ``no_eligible_nodes`` — no up node in the allowed cells (with an allowed GPU model);
- ``quota_exhausted`` — the tenant's quota, plus what its cohort can lend, is used up;
- ``insufficient_capacity`` — no node has room for the (single) task now;
- ``gang_does_not_fit`` — not every task of the gang fits at once;
- ``gang_does_not_fit_topology`` — no block/rack/host has room for the whole gang;
- ``never_fits`` — the job can never fit on the current fleet, even empty: no node, or no
  block/rack/host its gang must share, is big enough (node shapes, not usage: ``core/never_fits.py``);
- ``waiting_for_reservation`` — the job holds a reservation and waits for it to drain;
- ``unplaceable`` — (rejection, ``fail_unplaced`` policies) it did not fit on arrival.
"""

from __future__ import annotations

import numpy as np

from fleetlog.core import kernels
from fleetlog.core.fitting import partial_fit
from fleetlog.core.quota import quota_check
from fleetlog.core.scratch import Outcome, Scratch
from fleetlog.core.shapes import LEVELS, task_arrays

__all__ = ["Outcome", "capacity_failure", "eligible_exists", "explain_failure", "most_free"]


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
    if not eligible_exists(sc, cells, int(models[0]), int(gpus[0])):
        wanted = ", ".join(state.names["model"].names[m] for m in range(64) if int(models[0]) >> m & 1)
        return Outcome("no_eligible_nodes", f"no up node with GPU model {wanted or 'any'} in cells {names}")
    level = int(state.jobs.cols["topology"][job])
    never = sc.fleet().never_fits_job(state, job)
    if never is not None:
        return Outcome("never_fits", f"can never fit on the current fleet: {never}")
    best, best_cell = 0, cells[0]
    if level or idx.size > 1:  # (one task alone: none fits, or it would have been placed)
        best = -1
        for cell in cells:
            fit = partial_fit(sc, job, sc.candidates(cell, False))
            if fit > best:
                best, best_cell = fit, cell
    where = state.names["cell"].names[best_cell]
    if level:
        return Outcome(
            "gang_does_not_fit_topology",
            f"no {LEVELS[level]} in cell {where} has room for all {idx.size} tasks ({shape} "
            f"largest); the best {LEVELS[level]} fits {best}",
        )
    if idx.size > 1:
        return Outcome(
            "gang_does_not_fit",
            f"only {best} of {idx.size} tasks ({shape} largest) fit at once in cell {where}",
        )
    return Outcome(
        "insufficient_capacity",
        f"no node in cells {names} has room for a task of {shape}; {most_free(sc, cells)}",
    )


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


def most_free(sc: Scratch, cells: tuple[int, ...]) -> str:
    """The most free capacity on any one up node of ``cells``, for the explanation."""
    nodes = np.concatenate([sc.up_by_cell[c] for c in cells if c in sc.up_by_cell] or [np.zeros(0, np.int64)])
    if nodes.size == 0:
        return "no node is up"
    whole, share, cpu, mem = kernels.most_free(nodes, sc.cpu_free, sc.mem_free, sc.gpu_free)
    return (
        f"the most free on one node: {int(whole)} whole GPUs, a GPU with {int(share)} milli free, "
        f"{int(cpu)} mCPU, {int(mem)} MiB"
    )
