"""``decide(state, policy)``: the decisions to take now, as events. Pure: ``state`` is not changed.

The steps, in order, for each pending job:

1. **Order** — priority first; within a priority, the tenant with the lowest weighted
   dominant-resource share (DRF) goes next, recomputed after every placement; FIFO
   within a tenant (:mod:`fleetlog.core.order`).
2. **Quota** — the tenant's nominal quota per cell and in total, plus what it may
   borrow from its cohort's idle quota up to its borrowing limit.
3. **Place** — the whole gang or nothing, on up nodes of allowed cells and GPU models,
   within one block/rack/host when required, scored by the policy; a job allowed in
   several cells goes where it scores best.
4. **Preempt** — when it does not fit, a higher priority may evict lower ones and a
   tenant within its nominal quota may evict cohort borrowers: the fewest whole gangs,
   lowest priority and youngest first, never twice for one cause within a window.
5. **Reserve / backfill** — a gang that still does not fit reserves the domain it fits
   best in; later jobs may use reserved nodes only if they are expected to finish
   before the reservation can start.
6. **Explain** — every job left pending gets a reason code and its numbers
   (:mod:`fleetlog.core.explain`); a decision is emitted only when the reason changes.

The working copy of free capacity and usage lives in :class:`Scratch`.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from typing import Final

import numpy as np

from fleetlog.core import kernels
from fleetlog.core.arrays import Array
from fleetlog.core.explain import Outcome, explain_failure, run_gang
from fleetlog.core.fit import Fleet, fleet_of
from fleetlog.core.fold import mask_gpus
from fleetlog.core.order import drf_runs
from fleetlog.core.policy import Policy
from fleetlog.core.quota import borrowing_tenants, job_request, quota_check
from fleetlog.core.shapes import LEVELS
from fleetlog.core.state import NO_LIMIT, JobState, NodeStatus, State
from fleetlog.events.model import Decision, JobPending, JobPlaced, JobRejected, TaskPlacement, TaskPreempted

MEMO_ROWS: Final = 1 << 20  # node rows of remembered scores kept at most (32 bytes each: 32 MiB)
MAX_MEMOS: Final = 512  # task shapes whose node scores are remembered at once, at most


class Placement:
    """A gang's assignment: per task row its node and GPU mask, in one cell."""

    __slots__ = ("cell", "masks", "nodes", "score", "tasks")

    def __init__(
        self,
        cell: int,
        tasks: Sequence[int] | Array,
        nodes: Sequence[int] | Array,
        masks: Sequence[int] | Array,
        score: tuple[int, int],
    ) -> None:
        self.cell, self.tasks, self.nodes, self.masks, self.score = cell, tasks, nodes, masks, score


Shape = tuple[int, int, int, int, int]  # a task's (cpu, mem, gpus, milli, models)


class Memos:
    """``kernels.best_node_memo`` rows per task shape, in one int64[slots, N, MEMO_COLUMNS]
    store (so that ``kernels.place_run`` takes them all at once); past ``limit`` shapes, the
    least recently used one gives up its slot (bounded memory: a memo only saves work)."""

    __slots__ = ("limit", "slots", "store")

    def __init__(self, nodes: int, limit: int) -> None:
        self.limit = limit
        self.slots: dict[Shape, int] = {}  # in order of use, the most recent last
        self.store = np.full((0, nodes, kernels.MEMO_COLUMNS), -1, np.int64)  # (grows on first use)

    def slot(self, shape: Shape) -> int:
        slot = self.slots.pop(shape, None)
        if slot is None:
            if len(self.slots) >= self.limit:
                slot = self.slots.pop(next(iter(self.slots)))
                self.store[slot] = -1
            else:
                slot = len(self.slots)  # (slots 0 .. len - 1 are in use)
                if slot == self.store.shape[0]:
                    grown = np.full((min(self.limit, max(16, 2 * slot)), *self.store.shape[1:]), -1, np.int64)
                    grown[:slot] = self.store
                    self.store = grown
        self.slots[shape] = slot
        return slot

    def rows(self, shape: Shape) -> Array:
        """The memo of ``shape`` (a view into the store: use it before the next ``slot``)."""
        slot = self.slot(shape)  # (first: it may grow the store)
        rows: Array = self.store[slot]
        return rows

    def clear(self) -> None:
        self.slots.clear()
        self.store.fill(-1)


class Scratch:
    """decide's working copy of what changes as decisions accumulate within one call."""

    def __init__(self, state: State, policy: Policy) -> None:
        n, c = state.nodes.size, state.nodes.cols
        self.state, self.policy = state, policy
        self.cpu_free, self.mem_free = c["cpu_free"][:n].copy(), c["mem_free"][:n].copy()
        width = max(1, int(c["gpu_count"][:n].max(initial=0)))  # GPU columns any node uses
        self.gpu_free = c["gpu_free"][:n, :width].copy()
        self.gpu_total = kernels.row_totals(self.gpu_free)
        self.gpu_count, self.model = c["gpu_count"][:n], c["model"][:n]
        self.usage = {k: list(v) for k, v in state.usage.items()}
        self.policy_id = kernels.FGD if policy.scoring == "fgd" else kernels.BEST_FIT
        self.shapes = shape_matrix(state)
        up = c["status"][:n] == NodeStatus.UP
        cells = c["cell"][:n]
        up_cells = cells[up]
        if up_cells.size and up_cells.min() >= 0:  # (cell ids are dense: counting beats sorting)
            self.cells = tuple(np.flatnonzero(np.bincount(up_cells)).tolist())
        else:
            self.cells = tuple(sorted({int(x) for x in np.unique(up_cells).tolist()}))
        self.up_by_cell = {cell: np.flatnonzero(up & (cells == cell)).astype(np.int64) for cell in self.cells}
        self.reserved = np.zeros(n, dtype=np.bool_)
        self.reservations: list[tuple[int, int, int]] = []  # (job, cell, start_ms)
        self.no_domain = np.zeros(n, dtype=np.int32)
        self.failed: dict[int, Outcome] = {}  # job key id -> the outcome every such job gets
        self.key_of = np.zeros(0, dtype=np.int64)  # job row -> key id, for this call's pending jobs
        self.victims: set[int] = set()
        self.decisions: list[Decision] = []
        self.node_names: dict[int, str] = {}
        self.eligible: dict[tuple[tuple[int, ...], int, int], bool] = {}  # see explain.eligible_exists
        self._running: Array | None = None
        self._lowest: int | None = None
        self.node_version = np.zeros(n, dtype=np.int64)  # bumped whenever a node's free changes
        self.memos = Memos(n, max(1, min(MAX_MEMOS, MEMO_ROWS // max(1, n))))
        self._floor_table: Array | None = None
        self._fleet: Fleet | None = None
        self._run_buffer: Array | None = None
        self.swapped = False  # free capacity was swapped for a trial: nothing is kept for the next call

    def adopt(self, kept: MemoCache | None) -> None:
        """Reuse what an earlier call remembered, for the nodes whose free capacity (and GPU
        count and model) are still exactly what it was learned on; the others get a new version."""
        if kept is None or kept.key != self.memo_key():
            return
        self.node_version = kernels.versions_after(
            kept.node_version,
            kept.cpu_free,
            self.cpu_free,
            kept.mem_free,
            self.mem_free,
            kept.gpu_free,
            self.gpu_free,
            kept.gpu_count,
            self.gpu_count,
            kept.model,
            self.model,
        )
        self.memos = kept.memos

    def keep(self) -> MemoCache | None:
        """What this call remembered, with the free capacity it holds for."""
        if self.swapped or not self.memos.slots:
            return None
        return MemoCache(self, self.memo_key())

    def memo_key(self) -> tuple[object, ...]:
        return (self.policy_id, self.shapes.tobytes(), self.shapes.shape, self.gpu_free.shape)

    def take(self, node: int, mask: np.uint64 | int, cpu: int, mem: int, milli: int, sign: int) -> None:
        """Take (sign -1) or give back (+1) a task's resources in the working copy (what
        ``kernels.allocate`` does, without a kernel call's argument unboxing)."""
        self.cpu_free[node] += sign * cpu
        self.mem_free[node] += sign * mem
        gpus = mask_gpus(int(mask))
        row = self.gpu_free[node]
        for g in gpus:  # scalar stores: several times cheaper than one fancy-indexed store
            row[g] += sign * milli
        self.gpu_total[node] += sign * milli * len(gpus)
        self.node_version[node] += 1

    def memo(self, shape: Shape) -> Array:
        """The remembered node evaluations of one task shape (see ``kernels.best_node_memo``)."""
        return self.memos.rows(shape)

    def run_buffer(self) -> Array:
        """``kernels.place_run``'s work buffer, made once per call."""
        if self._run_buffer is None:
            self._run_buffer = np.empty((self.node_version.size, 3), dtype=np.int64)
        return self._run_buffer

    def fleet(self) -> Fleet:
        """The node shapes :mod:`fleetlog.core.fit` judges "never fits" on, taken once per call."""
        if self._fleet is None:
            self._fleet = fleet_of(self.state)
        return self._fleet

    def floor_table(self) -> Array:
        """``kernels.floor_table`` of this call's shape mix, made once."""
        if self._floor_table is None:
            self._floor_table = kernels.floor_table(self.shapes)
        return self._floor_table

    def swap_free(self, free: tuple[Array, Array, Array, Array]) -> tuple[Array, Array, Array, Array]:
        """Install another working copy of free capacity; return the one it replaces."""
        old = (self.cpu_free, self.mem_free, self.gpu_free, self.gpu_total)
        self.cpu_free, self.mem_free, self.gpu_free, self.gpu_total = free
        self.memos.clear()
        self.swapped = True
        return old

    def running(self) -> Array:
        """Rows of running jobs (as of the state; this call's evictions are filtered later)."""
        if self._running is None:
            self._running = np.flatnonzero(self.state.jobs.view("state") == JobState.RUNNING)
        return self._running

    def lowest_running_priority(self) -> int:
        if self._lowest is None:  # (as of the state, like ``running``)
            running = self.running()
            self._lowest = int(self.state.jobs.cols["priority"][running].min()) if running.size else NO_LIMIT
        return self._lowest

    def node_name(self, row: int) -> str:
        name = self.node_names.get(row)
        if name is None:
            name = self.node_names[row] = self.state.node_name(row)
        return name

    def candidates(self, cell: int, backfill: bool) -> Array:
        """Up nodes of ``cell``; reserved ones only for a job that may backfill."""
        nodes = self.up_by_cell.get(cell)
        if nodes is None:
            return np.zeros(0, dtype=np.int64)
        return nodes if backfill or not self.reservations else nodes[~self.reserved[nodes]]


class MemoCache:
    """Node scores one ``decide`` call remembered (per task shape), the node versions they
    were taken at, and the free capacity those versions stand for at the end of the call."""

    __slots__ = ("cpu_free", "gpu_count", "gpu_free", "key", "mem_free", "memos", "model", "node_version")

    def __init__(self, sc: Scratch, key: tuple[object, ...]) -> None:
        self.key, self.memos, self.node_version = key, sc.memos, sc.node_version
        self.cpu_free, self.mem_free, self.gpu_free = sc.cpu_free, sc.mem_free, sc.gpu_free
        self.gpu_count, self.model = sc.gpu_count.copy(), sc.model.copy()  # (views of the state)


def shape_matrix(state: State) -> Array:
    """The shape mix FGD scores against as rows (gpus, milli, mean cpu, count), most common
    first (taken from the recent task shapes by fold: :func:`fleetlog.core.fold.take_shape_mix`)."""
    return np.array(state.shape_mix, dtype=np.int64).reshape(len(state.shape_mix), 4)


def decide(state: State, policy: Policy) -> list[Decision]:
    """The decisions for every pending job, in the order they were taken.

    What the call learns of node scores is left in ``state.decide_memo`` for the next call
    (derived, not state: the next call checks it against the nodes' free capacity first)."""
    sc = Scratch(state, policy)
    kept, state.decide_memo = state.decide_memo, None  # (gone if this call fails)
    sc.adopt(kept if isinstance(kept, MemoCache) else None)
    pending_rows = np.flatnonzero(state.jobs.view("state") == JobState.PENDING)
    sc.key_of = np.full(state.jobs.size, -1, dtype=np.int64)
    sc.key_of[pending_rows] = job_keys(state, pending_rows)
    runs = drf_runs(state, sc.usage)
    try:
        run = next(runs)
        while True:
            run = runs.send(consider(sc, run))
    except StopIteration:
        pass
    state.decide_memo = sc.keep()
    return sc.decisions


def consider(sc: Scratch, turn: tuple[Array, bool]) -> tuple[int, bool]:
    """Schedule the jobs of a tenant's run in order until one is placed — or all of them when
    the tenant is alone in its priority class: (how many, the last one was placed).

    Jobs whose key already failed in this call are settled in bulk (:func:`settle_known`):
    the same outcome, in the same order, without the per-job Python path."""
    run, alone = turn
    at, placed = 0, False
    fast = alone and len(sc.cells) == 1 and not sc.state.quotas and not sc.policy.require_quota
    while at < run.size:
        at = settle_known(sc, run, at)
        if fast and not sc.reservations and not sc.swapped:
            at = place_singles(sc, run, at)
            if at < run.size and (sc.reservations or sc.swapped):
                continue  # (the job before was scheduled: back to the general path)
        if at == run.size:
            break
        placed = schedule_job(sc, int(run[at]))
        at += 1
        if placed and not alone:
            return at, True
    return at, placed


SINGLES_CHUNK: Final = 64  # jobs whose columns place_singles reads at once


def place_singles(sc: Scratch, run: Array, at: int) -> int:
    """Schedule the jobs from ``at`` on while each is one task with no topology and no allowed
    cells of its own: exactly what :func:`schedule_job` does for such a job when its tenant is
    alone in its priority class and there is one cell, no quota and no reservation. The
    placing is done by ``kernels.place_run`` a chunk of jobs at a time; a job of a key that
    already failed is settled here, and one that does not fit goes through
    :func:`schedule_job`. The index of the first job left to the caller: ``run.size``, or a
    job of another kind, or the one after a reservation was made or free capacity swapped."""
    state = sc.state
    jc, tc = state.jobs.cols, state.tasks.cols
    (cell,) = sc.cells
    cands = sc.up_by_cell[cell]
    chunk = min(SINGLES_CHUNK, sc.memos.limit)  # (every shape of a chunk holds its slot)
    while at < run.size:
        jobs = run[at : at + chunk]
        simple = (jc["ntasks"][jobs] == 1) & (jc["topology"][jobs] == 0) & (sc.key_of[jobs] >= 0)
        if state.job_cells:
            simple &= np.fromiter((j not in state.job_cells for j in jobs.tolist()), np.bool_, jobs.size)
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


def emit_placed(sc: Scratch, jobs: Array, out: Array, cell: int) -> None:
    """``JobPlaced`` of one-task jobs placed by ``kernels.place_run`` (their resources are
    taken in the working copy already), and their usage."""
    state = sc.state
    job_names, cell_name = state.names["job"].names, state.names["cell"].names[cell]
    counts = sc.gpu_count[out[:, 0]].tolist()
    requests = zip(
        *(state.jobs.cols[c][jobs].tolist() for c in ("req_cpu", "req_mem", "req_gpu")), strict=True
    )
    placed: list[tuple[int, Sequence[int]]] = []
    for job, (node, mask), count, req in zip(jobs.tolist(), out.tolist(), counts, requests, strict=True):
        tasks = (TaskPlacement(0, sc.node_name(node), mask_gpus(mask & ((1 << count) - 1))),)
        sc.decisions.append(JobPlaced(job_id=job_names[job], cell=cell_name, tasks=tasks))
        placed.append((job, req))
    add_usages(sc, placed, cell)


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
    reasons, texts = state.jobs.cols["reason"][jobs], state.text_ids.of(jobs)
    changed = np.zeros(jobs.size, dtype=np.bool_)
    for key in np.unique(keys).tolist():
        outcome, mine = sc.failed[key], keys == key
        same = (reasons == state.reason_codes.get(outcome.reason) + 1) & (
            texts == state.text_index.get(outcome.message, -2)
        )
        changed |= mine & ~same
    for i in np.flatnonzero(changed).tolist():
        outcome = sc.failed[int(keys[i])]
        job_id = job_name(sc.state, int(jobs[i]))
        sc.decisions.append(JobPending(job_id=job_id, reason=outcome.reason, message=outcome.message))


def schedule_job(sc: Scratch, job: int, unplaceable: bool = False) -> bool:
    """Steps 2-6 for one job. True when it was placed (so its tenant's share changed).
    ``unplaceable``: the caller just found it fits on none of the nodes step 3 would try."""
    key = int(sc.key_of[job]) if job < sc.key_of.size and sc.key_of[job] >= 0 else job_key(sc.state, job)
    known = sc.failed.get(key)
    if known is not None:
        return reject(sc, job, known) if sc.policy.fail_unplaced else pending(sc, job, known)
    outcome = try_place(sc, job, unplaceable)
    if isinstance(outcome, Placement):
        commit(sc, job, outcome)
        return True
    if preempt_for(sc, job, outcome):
        return True
    if sc.policy.fail_unplaced:
        sc.failed[key] = outcome
        return reject(sc, job, outcome)
    outcome = reserve_for(sc, job, outcome)
    if outcome.cacheable:
        sc.failed[key] = outcome
    return pending(sc, job, outcome)


def reject(sc: Scratch, job: int, outcome: Outcome) -> bool:
    """``fail_unplaced`` policies: a job that does not fit now is rejected, with the reason."""
    message = f"{outcome.reason}: {outcome.message}"
    sc.decisions.append(JobRejected(job_id=job_name(sc.state, job), reason="unplaceable", message=message))
    return False


def job_key(state: State, job: int) -> int:
    """Jobs with equal keys succeed or fail alike (until capacity is freed in this call).
    The key is interned to a small integer, memoized per job (a job's shape never changes)."""
    return int(job_keys(state, np.array([job], dtype=np.int64))[0])


def job_keys(state: State, rows: Array) -> Array:
    """:func:`job_key` of each of ``rows``: the memoized ones at once, the others computed."""
    keys: Array = state.job_keys.of(rows)
    new = np.flatnonzero(keys < 0)
    if new.size == 0:
        return keys
    jc, tc = state.jobs.cols, state.tasks.cols
    jobs = rows[new]
    single = jc["ntasks"][jobs] == 1
    firsts = np.where(single, jc["first_task"][jobs], 0)  # (a job of no task has no row)
    # one-task jobs (most): the key from the columns at once, the task's shape as integers
    tenant, priority, topology, expected = (
        jc[c][jobs].tolist() for c in ("tenant", "priority", "topology", "expected_ms")
    )
    shape = zip(*(tc[c][firsts].tolist() for c in ("cpu", "mem", "gpus", "milli", "models")), strict=True)
    cells = (
        [state.job_cells.get(job, ()) for job in jobs.tolist()] if state.job_cells else repeat((), jobs.size)
    )
    ids, key_ids = [], state.key_ids
    one_task_keys = zip(tenant, priority, topology, expected, cells, shape, strict=True)
    for job, one, key in zip(jobs.tolist(), single.tolist(), one_task_keys, strict=True):
        ids.append(key_ids.setdefault(key if one else _job_key(state, job), len(key_ids)))
    keys[new] = ids
    state.job_keys.cover(int(jobs.max()))
    state.job_keys.col[jobs] = ids
    return keys


def _job_key(state: State, job: int) -> tuple[object, ...]:
    """A gang's key: its task columns as bytes (a one-task job's are integers: never equal)."""
    jc, tc = state.jobs.cols, state.tasks.cols
    rows = state.job_tasks(job)
    shape = tuple(tc[c][rows.start : rows.stop].tobytes() for c in ("cpu", "mem", "gpus", "milli", "models"))
    return (
        int(jc["tenant"][job]),
        int(jc["priority"][job]),
        int(jc["topology"][job]),
        int(jc["expected_ms"][job]),
        state.job_cells.get(job, ()),
        shape,
    )


def job_name(state: State, job: int) -> str:
    return state.names["job"].names[job]


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
        found = place_in_cell(sc, job, cell, sc.candidates(cell, backfill))
        if found is not None and (best is None or found.score < best.score):
            best = found
    return best if best is not None else explain_failure(sc, job, tuple(quota_ok), "capacity")


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
    many = len(sc.cells) > 1 and cell >= 0
    score = gang_score(sc, out_node, out_mask, (cpu, mem, gpus, milli)) if many else (0, 0)
    return Placement(cell, idx, out_node, out_mask, score)


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
    if node < 0:
        return None
    mask = int(kernels.pick_gpus(sc.gpu_free[node], int(sc.gpu_count[node]), gpus, milli))
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


def pending(sc: Scratch, job: int, outcome: Outcome) -> bool:
    """Record why ``job`` waits; emit a decision only when the reason or its numbers changed."""
    state = sc.state
    code = int(state.jobs.cols["reason"][job])
    same = code > 0 and state.reason_codes.names[code - 1] == outcome.reason
    if not (same and state.reason_text.get(job) == outcome.message):
        sc.decisions.append(
            JobPending(job_id=job_name(state, job), reason=outcome.reason, message=outcome.message)
        )
    return False


# --- step 4: preemption ------------------------------------------------------------------


def preempt_for(sc: Scratch, job: int, failure: Outcome) -> bool:
    """Try priority preemption, then quota reclaim; on success emit evictions and the placement."""
    if failure.reason not in ("insufficient_capacity", "gang_does_not_fit", "gang_does_not_fit_topology"):
        return False
    for cause, enabled in (("priority", sc.policy.preemption), ("reclaim", sc.policy.reclaim)):
        if not enabled:
            continue
        victims = victim_candidates(sc, job, cause)
        chosen = minimal_victims(sc, job, victims) if victims else None
        if chosen is not None:
            evict(sc, job, chosen[0], cause)
            commit(sc, job, chosen[1])
            sc.failed.clear()  # capacity was freed: earlier failures may fit now
            return True
    return False


def victim_candidates(sc: Scratch, job: int, cause: str) -> list[int]:
    """Running jobs ``job`` may evict for ``cause``, in eviction order, at most ``max_victims``."""
    state = sc.state
    jc = state.jobs.cols
    prio = int(jc["priority"][job])
    if cause == "priority" and prio <= sc.lowest_running_priority():
        return []
    tenants = borrowing_tenants(state, sc.usage, job) if cause == "reclaim" else set()
    if cause == "reclaim" and not tenants:
        return []
    running = sc.running()
    if cause == "priority":
        running = running[jc["priority"][running] < prio]
    else:
        running = running[np.isin(jc["tenant"][running], np.array(sorted(tenants), dtype=np.int32))]
    cells = set(allowed_cells(sc, job))
    recent = (jc["preempted_at_ms"][running] >= 0) & (
        jc["preempted_at_ms"][running] > state.now_ms - sc.policy.thrash_window_ms
    )
    same_cause = jc["preempt_cause"][running] == (1 if cause == "priority" else 2)
    running = running[~(recent & same_cause)]
    order = np.lexsort((-running, -jc["placed_at_ms"][running], jc["priority"][running]))
    out = [
        int(v) for v in running[order].tolist() if int(jc["cell"][v]) in cells and int(v) not in sc.victims
    ]
    return out[: sc.policy.max_victims]


def minimal_victims(sc: Scratch, job: int, victims: list[int]) -> tuple[list[int], Placement] | None:
    """The smallest prefix of ``victims`` that makes room, then drop any that are not needed."""
    chosen: list[int] = []
    for v in victims:
        chosen.append(v)
        if trial_place(sc, job, chosen) is not None:
            break
    else:
        return None
    for v in list(chosen[:-1]):
        fewer = [x for x in chosen if x != v]
        if trial_place(sc, job, fewer) is not None:
            chosen = fewer
    placement = trial_place(sc, job, chosen)
    return (chosen, placement) if placement is not None else None


def trial_place(sc: Scratch, job: int, victims: list[int]) -> Placement | None:
    """Where ``job`` would go if ``victims`` were evicted (a what-if on a copy)."""
    current = (sc.cpu_free, sc.mem_free, sc.gpu_free, sc.gpu_total)
    saved = sc.swap_free((current[0].copy(), current[1].copy(), current[2].copy(), current[3].copy()))
    try:
        for v in victims:
            release_in_scratch(sc, v)
        found = try_place(sc, job)
    finally:
        sc.swap_free(saved)
    return found if isinstance(found, Placement) else None


def release_in_scratch(sc: Scratch, victim: int) -> None:
    tc = sc.state.tasks.cols
    for t in sc.state.job_tasks(victim):
        node = int(tc["node"][t])
        if node >= 0:
            sc.take(node, tc["gpu_mask"][t], int(tc["cpu"][t]), int(tc["mem"][t]), int(tc["milli"][t]), 1)


def evict(sc: Scratch, job: int, victims: list[int], cause: str) -> None:
    state = sc.state
    by = job_name(state, job)
    for v in victims:
        release_in_scratch(sc, v)
        add_usage(sc, v, int(state.jobs.cols["cell"][v]), -1)
        sc.victims.add(v)
        first = int(state.jobs.cols["first_task"][v])
        for t in state.job_tasks(v):
            sc.decisions.append(
                TaskPreempted(
                    job_id=job_name(state, v),
                    task_index=t - first,
                    by_job_id=by,
                    cause=cause,
                    message=f"{cause} preemption for job {by}",
                )
            )


# --- step 5: reservation -----------------------------------------------------------------


def reserve_for(sc: Scratch, job: int, failure: Outcome) -> Outcome:
    """A blocked gang reserves the domain with the most free GPU share in which it would fit
    once drained (a gang that fits nowhere even on empty nodes reserves nothing)."""
    state, policy = sc.state, sc.policy
    if (
        not policy.reserve
        or len(sc.reservations) >= policy.max_reservations
        or failure.reason not in ("gang_does_not_fit", "gang_does_not_fit_topology")
    ):
        return failure
    cell = allowed_cells(sc, job)[0]
    cands = sc.candidates(cell, False)
    level = int(state.jobs.cols["topology"][job])
    domain = (
        state.nodes.cols[LEVELS[level]][: state.nodes.size][cands]
        if level
        else np.zeros(cands.size, np.int64)
    )
    nodes = drained_fit(sc, job, cands, domain)
    if nodes is None:
        return failure
    sc.reserved[nodes] = True
    start = reservation_start(state, nodes)
    sc.reservations.append((job, cell, start))
    where = (
        state.names["topo"].names[int(domain[np.searchsorted(cands, nodes[0])])].split("\x00")[-1]
        if level
        else "its cell"
    )
    when = "unknown (a job running there has no expected duration)" if start >= NO_LIMIT else f"{start} ms"
    return Outcome(
        "waiting_for_reservation",
        f"{failure.message}; reserved {nodes.size} nodes of {where}; expected free at {when}",
        False,
    )


def drained_fit(sc: Scratch, job: int, cands: Array, domain: Array) -> Array | None:
    """The nodes of the domain (most free GPU share first, at most 8 tried) where ``job``
    would fit if every task running there ended, or None."""
    valid = domain >= 0
    if not valid.any():
        return None
    free = sc.gpu_free[cands].sum(axis=1, dtype=np.int64)
    totals = np.bincount(domain[valid], weights=free[valid]).astype(np.int64)
    present = np.unique(domain[valid])
    for d in present[np.lexsort((present, -totals[present]))][:8].tolist():
        nodes: Array = cands[domain == d]
        if fits_when_drained(sc, job, nodes):
            return nodes
    return None


def fits_when_drained(sc: Scratch, job: int, nodes: Array) -> bool:
    c, n = sc.state.nodes.cols, sc.state.nodes.size
    full = np.where(np.arange(c["gpu_free"].shape[1]) < c["gpu_count"][:n, None], 1000, 0).astype(np.int16)
    drained = (c["cpu_alloc"][:n].copy(), c["mem_alloc"][:n].copy(), full, full.sum(axis=1, dtype=np.int64))
    saved = sc.swap_free(drained)
    try:
        return place_in_cell(sc, job, -1, nodes) is not None
    finally:
        sc.swap_free(saved)


def reservation_start(state: State, nodes: Array) -> int:
    """When every task now running on ``nodes`` is expected to have ended (NO_LIMIT if unknown)."""
    tc, jc = state.tasks.cols, state.jobs.cols
    on = np.flatnonzero(np.isin(state.tasks.view("node"), nodes))
    jobs = np.unique(tc["job"][on])
    if jobs.size == 0:
        return state.now_ms
    expected = jc["expected_ms"][jobs]
    if (expected < 0).any():
        return NO_LIMIT
    return int((jc["placed_at_ms"][jobs] + expected).max())
