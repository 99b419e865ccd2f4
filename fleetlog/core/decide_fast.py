"""The batch twins of decide's per-job path (:func:`fleetlog.core.schedule.schedule_job`): the
same decisions, in the same order, for runs of jobs at once.

- :func:`place_singles` places runs of one-task jobs with ``kernels.place_run`` (when the
  tenant is alone in its priority class, in one cell, with no quota and no reservation);
- :func:`settle_known` settles runs of jobs whose key already failed in this call;
- :func:`emit_placed` emits what ``place_run`` placed (the twin of ``place.commit``).

:func:`fleetlog.core.decide.consider` chooses between them and the plain path. This module
imports the plain path, never the other way; ``tests/core/test_decide_fast.py`` checks that
decide with these twins turned off (and with its memos dropped) decides the same.
"""

from __future__ import annotations

from typing import Final

import numpy as np

from fleetlog.core import kernels
from fleetlog.core.arrays import Array
from fleetlog.core.eligibility import eligible
from fleetlog.core.fold import mask_gpus
from fleetlog.core.memo import Shape
from fleetlog.core.schedule import reject, schedule_job
from fleetlog.core.scratch import Scratch, job_name
from fleetlog.events.model import JobPending, JobPlaced, TaskPlacement

SINGLES_CHUNK: Final = 64  # jobs whose columns place_singles reads at once


def place_singles(sc: Scratch, run: Array, at: int, stop: bool = False) -> int:
    """Schedule the jobs from ``at`` on while each is one task with no topology and no allowed
    cells of its own, or allowed cells that include the one cell (a cell shard's dispatched
    jobs: ``place.allowed_cells`` is then that cell, as for a job without): exactly what
    :func:`schedule_job` does for such a job when its tenant is alone in its priority class and
    there is one cell, no quota and no reservation. The placing is done by ``kernels.place_run``
    a chunk of jobs at a time; a job of a key that already failed is settled here, and one that
    does not fit goes through :func:`schedule_job`. The index of the first job left to the
    caller: ``run.size``, or a job of another kind, or the one after a reservation was made or
    free capacity swapped. ``stop`` (a merged run of several tenants, ``decide.merged``): the
    first job ``place_run`` does not place is left to the caller too, untouched."""
    state = sc.state
    jc, tc = state.jobs.cols, state.tasks.cols
    (cell,) = sc.cells
    everywhere = cands = sc.up_by_cell[cell]
    chunk = min(SINGLES_CHUNK, sc.memos.limit)  # (every shape of a chunk holds its slot)
    while at < run.size:
        jobs = run[at : at + chunk]
        simple = (jc["ntasks"][jobs] == 1) & (jc["topology"][jobs] == 0) & (sc.key_of[jobs] >= 0)
        if state.job_cells:  # allowed cells that hold the one cell: as if none (a dispatched job)
            allowed = state.job_cells.get
            simple &= np.fromiter((cell in allowed(j, sc.cells) for j in jobs.tolist()), np.bool_, jobs.size)
        if sc.constrained:  # (a chunk's jobs of one constraint class: its nodes are the candidates;
            classes = tc["cls"][jc["first_task"][jobs]]  # soft affinity: the plain path's tie-break)
            simple &= (classes == classes[0]) & ~sc.preferring(classes)
            cands = sc.eligible_in(everywhere, eligible(state, int(classes[0])))
        k = jobs.size if simple.all() else int(np.argmin(simple))
        if k == 0:
            return at
        jobs, firsts, keys = jobs[:k], jc["first_task"][jobs[:k]], sc.key_of[jobs[:k]]
        tasks = np.empty((k, kernels.RUN_COLUMNS), dtype=np.int64)
        for i, c in enumerate(("cpu", "mem", "gpus", "milli", "models")):
            tasks[:, i] = tc[c][firsts]
        if sc.policy_id == kernels.FGD:  # (best fit needs no memo)
            shapes: list[Shape] = list(map(tuple, tasks[:, :5].tolist()))
            tasks[:, kernels.RUN_SLOT] = [sc.memos.slot(shape) for shape in shapes]
        out = np.empty((k, 2), dtype=np.int64)
        done = 0
        while done < k:
            tasks[done:, kernels.RUN_SKIP] = [key in sc.failed for key in keys[done:].tolist()]
            placed = kernels.place_run(
                cands, sc.cpu_free, sc.mem_free, sc.gpu_free, sc.gpu_total, sc.gpu_count, sc.model,
                sc.policy_id, sc.shapes, sc.floor_table(), sc.node_version, sc.memos.store,
                tasks[done:], out[done:], sc.run_buffer(),
            )  # fmt: skip
            emit_placed(sc, jobs[done : done + placed], out[done : done + placed], cell)
            done += placed
            if done == k:
                break
            if stop:
                return at + done
            job = int(jobs[done])
            done += 1
            if tasks[done - 1, kernels.RUN_SKIP]:  # its key failed earlier in this call
                if not sc.policy.fail_unplaced:
                    return at + done - 1  # for settle_known: the whole run of such jobs at once
                reject(sc, job, sc.failed[int(keys[done - 1])])
                continue
            schedule_job(sc, job, unplaceable=True)  # it fits on none of cands: why, and what then
            if sc.reservations or sc.swapped:
                return at + done
        at += k
        if k < chunk and at < run.size:
            return at  # the next job is of another kind
    return at


def settle_known(sc: Scratch, run: Array, at: int) -> int:
    """Settle the jobs from ``at`` on whose key already failed in this call — exactly as
    :func:`pending` would, one after another — and return the index of the first job that
    needs scheduling."""
    if sc.policy.fail_unplaced or not sc.failed:
        return at
    failed = np.fromiter(sc.failed, dtype=np.int64, count=len(sc.failed))
    end, size = at, 16
    while end < run.size:  # find the first job of an untried key, looking further each round
        known = np.isin(sc.key_of[run[end : end + size]], failed)
        if not known.all():
            end += int(np.argmin(known))
            break
        end, size = end + known.size, size * 4
    if end > at:
        emit_changed_pending(sc, run[at:end], sc.key_of[run[at:end]])
    return end


def emit_changed_pending(sc: Scratch, jobs: Array, keys: Array) -> None:
    """:func:`pending` for each of ``jobs`` (all of known failed keys), in order."""
    state = sc.state
    reasons, texts = state.jobs.cols["reason"][jobs], state.derived.text_ids.of(jobs)
    changed = np.zeros(jobs.size, dtype=np.bool_)
    for key in np.unique(keys).tolist():
        outcome, mine = sc.failed[key], keys == key
        same = (reasons == state.reason_codes.get(outcome.reason) + 1) & (
            texts == state.derived.text_index.get(outcome.message, -2)
        )
        changed |= mine & ~same
    for i in np.flatnonzero(changed).tolist():
        outcome = sc.failed[int(keys[i])]
        job_id = job_name(sc.state, int(jobs[i]))
        sc.decisions.append(JobPending(job_id=job_id, reason=outcome.reason, message=outcome.message))


def emit_placed(sc: Scratch, jobs: Array, out: Array, cell: int) -> None:
    """``JobPlaced`` of one-task jobs placed by ``kernels.place_run`` (their resources are
    taken in the working copy already), and their usage (summed per tenant first)."""
    state = sc.state
    job_names, cell_name = state.names["job"].names, state.names["cell"].names[cell]
    counts = sc.gpu_count[out[:, 0]].tolist()
    tenants = state.jobs.cols["tenant"][jobs].tolist()
    requests = zip(
        *(state.jobs.cols[c][jobs].tolist() for c in ("req_cpu", "req_mem", "req_gpu")), strict=True
    )
    append, node_name, gpus_of = sc.decisions.append, sc.node_name, _GPUS.get
    summed: dict[int, list[int]] = {}
    for job, (node, mask), count, tenant, req in zip(
        jobs.tolist(), out.tolist(), counts, tenants, requests, strict=True
    ):
        gpus = gpus_of((mask, count))
        if gpus is None:
            gpus = _gpus(mask, count)
        append(
            JobPlaced(job_id=job_names[job], cell=cell_name, tasks=(TaskPlacement(0, node_name(node), gpus),))
        )
        row = summed.get(tenant)
        if row is None:
            summed[tenant] = list(req)
        else:
            row[0], row[1], row[2] = row[0] + req[0], row[1] + req[1], row[2] + req[2]
    for tenant, total in summed.items():
        for key in ((tenant, -1), (tenant, cell)):
            row = sc.usage.setdefault(key, [0, 0, 0])
            row[0], row[1], row[2] = row[0] + total[0], row[1] + total[1], row[2] + total[2]


_GPUS: dict[tuple[int, int], tuple[int, ...]] = {}
"""The GPU indices of (mask, the node's GPU count), remembered (a pure function; bounded)."""


def _gpus(mask: int, count: int) -> tuple[int, ...]:
    if len(_GPUS) >= 4096:
        _GPUS.clear()
    gpus = _GPUS[(mask, count)] = mask_gpus(mask & ((1 << count) - 1))
    return gpus
