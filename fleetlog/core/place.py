"""Step 3 of decide: place the whole gang or nothing, in the allowed cell where it scores best,
after step 2's quota check (:mod:`fleetlog.core.quota`); a placement taken is committed to the
working area and emitted as ``JobPlaced``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fleetlog.core.explain import explain_failure
from fleetlog.core.fitting import place_in_cell
from fleetlog.core.fold import mask_gpus
from fleetlog.core.quota import job_request, quota_check
from fleetlog.core.scratch import Outcome, Placement, Scratch, job_name
from fleetlog.events.model import JobPlaced, TaskPlacement


def allowed_cells(sc: Scratch, job: int) -> tuple[int, ...]:
    allowed = sc.state.job_cells.get(job)
    return sc.cells if allowed is None else tuple(c for c in allowed if c in sc.up_by_cell)


def may_backfill(sc: Scratch, job: int) -> bool:
    """A job may use reserved nodes when it is expected to end before every reservation starts."""
    expected = int(sc.state.jobs.cols["expected_ms"][job])
    if not sc.reservations or expected < 0:
        return False
    return all(sc.state.now_ms + expected <= start for _, _, start in sc.reservations)


def try_place(sc: Scratch, job: int, unplaceable: bool = False) -> Placement | Outcome:
    """Steps 2-3: quota, then the best-scoring cell where the whole gang fits (none when the
    caller knows it is ``unplaceable``)."""
    cells = allowed_cells(sc, job)
    if not cells:
        return explain_failure(sc, job, cells, "no_cells")
    quota_ok = [c for c in cells if not quota_check(sc.state, sc.usage, job, c, sc.policy.require_quota)]
    if not quota_ok:
        return explain_failure(sc, job, cells, "quota")
    if unplaceable:
        return explain_failure(sc, job, tuple(quota_ok), "capacity")
    best: Placement | None = None
    backfill = may_backfill(sc, job)
    for cell in quota_ok:
        found = place_in_cell(sc, job, cell, sc.candidates(cell, backfill, job))
        if found is not None and (best is None or found.score < best.score):
            best = found
    return best if best is not None else explain_failure(sc, job, tuple(quota_ok), "capacity")


def commit(sc: Scratch, job: int, p: Placement) -> None:
    """Take the placement's resources in the scratch copy and emit ``JobPlaced``."""
    state = sc.state
    tc = state.tasks.cols
    first = int(state.jobs.cols["first_task"][job])
    placements = []
    for i in range(len(p.tasks)):
        t, node, mask = int(p.tasks[i]), int(p.nodes[i]), int(p.masks[i])
        sc.take(node, np.uint64(mask), int(tc["cpu"][t]), int(tc["mem"][t]), int(tc["milli"][t]), -1)
        gpu_idx = mask_gpus(mask & ((1 << int(sc.gpu_count[node])) - 1))
        placements.append(TaskPlacement(t - first, sc.node_name(node), gpu_idx))
    add_usage(sc, job, p.cell, +1)
    placements.sort(key=lambda tp: tp.task_index)
    sc.decisions.append(
        JobPlaced(
            job_id=job_name(state, job), cell=state.names["cell"].names[p.cell], tasks=tuple(placements)
        )
    )


def add_usage(sc: Scratch, job: int, cell: int, sign: int) -> None:
    """Count (sign +1) or uncount (-1) ``job``'s request in its tenant's usage, in all and in ``cell``."""
    add_usages(sc, [(job, [sign * r for r in job_request(sc.state, job)])], cell)


def add_usages(sc: Scratch, placed: Sequence[tuple[int, Sequence[int]]], cell: int) -> None:
    """Add each (job, resources) of ``placed`` to the job's tenant's usage, in all and in ``cell``."""
    tenants = sc.state.jobs.cols["tenant"]
    for job, req in placed:
        tenant = int(tenants[job])
        for key in ((tenant, -1), (tenant, cell)):
            row = sc.usage.setdefault(key, [0, 0, 0])
            row[0] += req[0]
            row[1] += req[1]
            row[2] += req[2]
