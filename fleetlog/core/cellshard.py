"""A cell shard's own shard events (issue 17, docs/scale-out.md): what it writes to the global
partition besides its decisions.

Pure, like the rest of ``core/``. A cell shard is today's shard (``fold``/``decide`` over its
cell partition) that also folds ``JobDispatched`` (:func:`fleetlog.core.fold.on_dispatched`) and
hands back, in fold and by log time, the dispatched jobs it could not place within
``CoreConfig.hold_ms`` (:func:`fleetlog.core.fold.hand_back`). This module is what its loop
calls after each step:

- :func:`returns`: the ``JobReturned`` events folded since the last step, to write;
- :func:`cell_summary`: the ``CellSummary`` of one of its cells now;
- :func:`summary_due`: whether that summary is worth writing (:class:`SummaryRule`);
- :func:`due_summaries`: the summaries of a step, by that rule, with the seq rule
  (``seq`` = ``as_of``: a function of the cell partition's log, so recovery and replay
  make the same ones).
"""

from __future__ import annotations

from typing import Final

import msgspec
import numba
import numpy as np
import numpy.typing as npt

from fleetlog.core.dispatch import take
from fleetlog.core.state import FULL_GPU, MAX_GPU_MODELS, JobState, NodeStatus, State
from fleetlog.events.model import (
    GPU_BUCKETS,
    MAX_SUMMARY_ENTRIES,
    MAX_SUMMARY_TENANTS,
    CellSummary,
    FreeSlots,
    JobReturned,
    JobSubmitted,
    Resources,
    TaskGroup,
    TenantUsage,
)

_PENDING: Final = int(JobState.PENDING)
_UP: Final = int(NodeStatus.UP)


class SummaryRule(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """When a cell shard writes its cell's summary (log time of its cell partition)."""

    every_ms: int = 5_000
    """At least this often, even when nothing changed materially (the dispatcher's usage and
    pending depth ride on it)."""
    material_milli: int = 125
    """A free row whose slots changed by at least this share of the larger of old and new
    (milli: 125 = 1/8) is a material change, and so is a row that appears or disappears, or a
    change of the cell's total (a node up, down or reshaped)."""


def returns(state: State, since: int) -> list[JobReturned]:
    """The jobs handed back while folding inputs from offset ``since`` on, in the order to write
    them (by ``as_of``, then job id): the loop writes those of each step with its decisions."""
    out = [r for r in state.returned.values() if r.as_of >= since]
    return sorted(out, key=lambda r: (r.as_of, r.job_id))


def summary_due(last: CellSummary | None, fresh: CellSummary, rule: SummaryRule) -> bool:
    """Whether ``fresh`` should be written, ``last`` being the cell's last summary written."""
    if last is None or fresh.at_ms - last.at_ms >= rule.every_ms or fresh.total != last.total:
        return True
    old = {(f.gpu_model, f.gpus): f.slots for f in last.free}
    new = {(f.gpu_model, f.gpus): f.slots for f in fresh.free}
    if old.keys() != new.keys():
        return True
    return any(abs(new[k] - old[k]) * 1000 >= rule.material_milli * max(new[k], old[k]) for k in sorted(new))


def due_summaries(
    state: State, partition: int, rule: SummaryRule, memo: CapacityMemo | None = None
) -> list[CellSummary]:
    """The summaries to write after a step, one per held cell (``CoreConfig.cells``, in order)
    whose summary is due against the last one written; each is kept as the cell's last
    (``State.summaries``). ``seq`` is ``as_of``, the inputs folded so far: every step that
    writes one folded at least one more input, so it is strictly increasing per cell, across
    restarts and takeovers too, and a function of the log alone. Nothing before the first
    input (``seq`` starts at 1). ``memo``: skip computing the summaries that can only be due by
    time when it is not time (:class:`CapacityMemo`; the same result without it)."""
    if state.offset < 1:
        return []
    nodes_changed = memo is None or memo.nodes_changed(state)
    held = held_by_cell(state) if memo is not None else {}
    out = []
    for cell in state.config.cells:
        last = state.summaries.get(cell)
        if last is not None and last.seq >= state.offset:
            continue  # (this step's already: called twice at one offset)
        key = held.get(state.names["cell"].get(cell), ())
        by_time = last is None or state.now_ms - last.at_ms >= rule.every_ms
        if memo is not None and not (nodes_changed or by_time) and memo.held.get(cell) == key:
            continue  # the same total and free rows as when last computed: not due
        fresh = cell_summary(state, cell, partition, state.offset)
        if memo is not None:
            memo.held[cell] = key
        if summary_due(last, fresh, rule):
            state.summaries[cell] = fresh
            out.append(fresh)
    if memo is not None and nodes_changed:
        memo.remember_nodes(state)
    return out


_CAPACITY: Final = ("cell", "model", "gpu_count", "status", "cpu_alloc", "mem_alloc", "cpu_free",
                    "mem_free", "gpu_free")
"""The node columns a summary's ``total`` and ``free`` are computed from."""


class CapacityMemo:
    """What the cells' ``total`` and ``free`` rows were last computed from (the loop keeps one,
    never snapshotted): the nodes' capacity columns and each cell's held jobs. A cell for which
    both are unchanged has the same ``total`` and ``free`` rows, so its summary can only be due
    by time: :func:`due_summaries` does not compute it (about 1 ms per 1,000 nodes, and more per
    held job). The summaries are the same with it or without it (recovery runs without it, and
    the tests compare the two)."""

    def __init__(self) -> None:
        self.columns: dict[str, np.ndarray] = {}
        self.held: dict[str, Held] = {}
        """cell -> :func:`held_by_cell`'s key when its summary was last computed."""

    def nodes_changed(self, state: State) -> bool:
        return not self.columns or not all(
            np.array_equal(self.columns[c], state.nodes.view(c)) for c in _CAPACITY)

    def remember_nodes(self, state: State) -> None:
        self.columns = {c: state.nodes.view(c).copy() for c in _CAPACITY}


Held = tuple[tuple[int, int], ...]


def held_by_cell(state: State) -> dict[int, Held]:
    """cell id -> its held jobs not placed yet, as sorted (dispatch seq, job row) pairs: what the
    summary takes off the free rows, in the order it does."""
    out: dict[int, list[tuple[int, int]]] = {}
    for job in _waiting_held(state):
        cell, _, seq, _ = state.dispatches[job]
        out.setdefault(cell, []).append((seq, job))
    return {c: tuple(sorted(v)) for c, v in out.items()}


def _waiting_held(state: State) -> list[int]:
    """The held jobs still pending and never placed, in ``State.held`` order (it may still list
    jobs placed or ended since its last sweep: in a busy cell nearly all of them, so the two
    columns are read for all at once, not job by job)."""
    if not state.held:
        return []
    rows = np.fromiter(state.held, dtype=np.int64, count=len(state.held))
    jc = state.jobs.cols
    keep = (jc["state"][rows] == _PENDING) & (jc["placed_at_ms"][rows] < 0)
    return rows[keep].tolist()  # type: ignore[no-any-return]


def cell_summary(state: State, cell: str, partition: int, seq: int) -> CellSummary:
    """The summary of ``cell`` as the shard's state has it now: the healthy nodes' total, its
    pending depth, free rows net of its held jobs, usage by tenant (both cut to the event's
    bounds, :func:`cut_free` and :func:`cut_usage`)."""
    cid = state.names["cell"].get(cell)
    up = _up_nodes(state, cid)
    nc = state.nodes.cols
    total = Resources(
        cpu_milli=int(nc["cpu_alloc"][up].sum()),
        mem_mib=int(nc["mem_alloc"][up].sum()),
        gpu_milli=int(nc["gpu_count"][up].sum()) * FULL_GPU,
    )
    pending = _pending_in(state, cid)
    room = {(m, b): [s, c, mm, 0, nc_, nm] for m, b, s, c, mm, nc_, nm in free_rows(state, up)}
    held = _held_in(state, cid)
    for job in held:
        take(room, spec_of(state, job), commit=True)
    free = [FreeSlots(m, b, *row[:3], *row[4:]) for (m, b), row in sorted(room.items()) if row[0] > 0]
    return CellSummary(
        cell=cell,
        partition=partition,
        seq=seq,
        as_of=state.offset,
        at_ms=state.now_ms,
        total=total,
        dispatched_seq=state.dispatched_seq.get(cid, 0) if cid >= 0 else 0,
        pending=len(pending),
        free=tuple(cut_free(free)),
        usage=tuple(cut_usage(usage_rows(state, cid, held))),
    )


def _up_nodes(state: State, cid: int) -> np.ndarray:
    """Rows of the up nodes of cell ``cid`` (none if the shard never saw the cell)."""
    if cid < 0:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero((state.nodes.view("status") == _UP) & (state.nodes.view("cell") == cid))


def _pending_in(state: State, cid: int) -> list[int]:
    """Pending jobs allowed in cell ``cid`` (a dispatched job is allowed in its cell alone)."""
    rows = np.flatnonzero(state.jobs.view("state") == _PENDING).tolist()
    return [j for j in rows if cid in state.job_cells.get(j, (cid,))] if cid >= 0 else []


def _held_in(state: State, cid: int) -> list[int]:
    """Dispatched jobs of cell ``cid`` waiting and never placed, in dispatch (seq) order
    (``State.held`` may still list jobs placed or ended since its last sweep: filtered)."""
    dispatches = state.dispatches
    out = [(dispatches[job][2], job) for job in _waiting_held(state) if dispatches[job][0] == cid]
    return [job for _, job in sorted(out)]


def free_rows(state: State, up: np.ndarray) -> list[tuple[str, int, int, int, int, int, int]]:
    """``(gpu_model, bucket, slots, cpu_milli, mem_mib, node_cpu_milli, node_mem_mib)`` over
    nodes ``up``, node by node: bucket ``b`` > 0 has ``whole free GPUs // b`` slots per node (a
    GPU with a share taken is not free), and the free CPU and memory of the nodes with a slot,
    in total and the most on one of them; bucket 0 (tasks without GPUs) counts each node's free
    milli-CPU as slots (a task needs at least one: the CPU and memory totals are what bound it),
    over nodes with free CPU and memory. Nodes without GPUs are model ``""``. Rows without a
    slot are left out. One pass of a numba kernel over the nodes (:func:`_free_table`: this
    runs for every cell at every step)."""
    nc, names = state.nodes.cols, state.names["model"].names
    width = int(nc["gpu_count"][up].max(initial=0))  # (past it no node has a GPU, nor a slot)
    buckets = np.array([b for b in GPU_BUCKETS if b <= width], dtype=np.int64)
    if up.size == 0:
        return []
    table = _free_table(
        up.astype(np.int64), nc["model"], nc["gpu_count"], nc["cpu_free"], nc["mem_free"], nc["gpu_free"],
        width, buckets,
    )  # fmt: skip
    out = []
    for m, i in zip(*np.nonzero(table[:, :, 0] > 0), strict=True):
        slots, cpu, mem, most_cpu, most_mem = table[m, i].tolist()
        out.append((names[m - 1] if m > 0 else "", int(buckets[i]), slots, cpu, mem, most_cpu, most_mem))
    return sorted(out)


@numba.njit(cache=True)
def _free_table(
    up: npt.NDArray[np.int64], model: npt.NDArray[np.int32], gpu_count: npt.NDArray[np.int32],
    cpu_free: npt.NDArray[np.int64], mem_free: npt.NDArray[np.int64], gpu_free: npt.NDArray[np.int16],
    width: int, buckets: npt.NDArray[np.int64],
) -> npt.NDArray[np.int64]:  # fmt: skip
    """Per model id + 1 (0: nodes without GPUs) and bucket: slots, CPU and memory of the nodes
    with a slot, the most CPU and memory on one of them (integers: the same sums in any order)."""
    out = np.zeros((MAX_GPU_MODELS + 1, buckets.shape[0], 5), dtype=np.int64)
    for row in up:
        m = model[row] + 1 if gpu_count[row] > 0 else 0
        cpu, mem = max(cpu_free[row], 0), max(mem_free[row], 0)
        whole = 0
        for g in range(width):
            if gpu_free[row, g] == FULL_GPU:
                whole += 1
        for i in range(buckets.shape[0]):
            b = buckets[i]
            slots = (cpu if cpu > 0 and mem > 0 else 0) if b == 0 else whole // b
            if slots > 0:
                cell = out[m, i]
                cell[0] += slots
                cell[1] += cpu
                cell[2] += mem
                cell[3] = max(cell[3], cpu)
                cell[4] = max(cell[4], mem)
    return out


def spec_of(state: State, job: int) -> JobSubmitted:
    """Job row ``job`` as a submission, as much as the dispatcher's :func:`take` reads: one task
    group per run of equal task shapes."""
    tc, models = state.tasks.cols, state.names["model"].names
    groups: list[TaskGroup] = []
    for t in state.job_tasks(job):
        mask = int(tc["models"][t])
        shape = (int(tc["cpu"][t]), int(tc["mem"][t]), int(tc["gpus"][t]), int(tc["milli"][t]))
        wanted = tuple(models[m] for m in range(len(models)) if mask >> m & 1)
        last = groups[-1] if groups else None
        if last is not None and (last.cpu_milli, last.mem_mib, last.gpu_count, last.gpu_milli) == shape:
            groups[-1] = msgspec.structs.replace(last, count=last.count + 1)
        else:
            groups.append(TaskGroup(1, *shape, gpu_models=wanted))
    tenant = state.names["tenant"].names[int(state.jobs.cols["tenant"][job])]
    return JobSubmitted(job_id=state.names["job"].names[job], tenant=tenant, task_groups=tuple(groups))


def usage_rows(state: State, cid: int, held: list[int]) -> list[TenantUsage]:
    """What each tenant's jobs in cell ``cid`` take: placed (the fold's usage counters) plus
    held and not placed yet (their requests). Sorted by tenant; tenants at zero left out."""
    rows: dict[int, list[int]] = {}
    for (tenant, cell), used in state.usage.items():
        if cell == cid and cid >= 0:
            rows[tenant] = list(used)
    jc = state.jobs.cols
    for job in held:
        row = rows.setdefault(int(jc["tenant"][job]), [0, 0, 0])
        for i, col in enumerate(("req_cpu", "req_mem", "req_gpu")):
            row[i] += int(jc[col][job])
    names = state.names["tenant"].names
    return sorted(
        (TenantUsage(names[t], *row) for t, row in rows.items() if any(row)), key=lambda u: u.tenant
    )


def cut_free(rows: list[FreeSlots]) -> list[FreeSlots]:
    """At most ``MAX_SUMMARY_ENTRIES`` rows: past it, the rows with the fewest slots are left out
    (ties: the larger key), so the dispatcher sees the most room; the rest stays sorted. A state
    cannot reach it today (64 GPU models and no GPUs, 8 buckets: 520 rows)."""
    if len(rows) <= MAX_SUMMARY_ENTRIES:
        return rows
    keep = sorted(rows, key=lambda f: (-f.slots, f.gpu_model, f.gpus))[:MAX_SUMMARY_ENTRIES]
    return sorted(keep, key=lambda f: (f.gpu_model, f.gpus))


def cut_usage(rows: list[TenantUsage]) -> list[TenantUsage]:
    """At most ``MAX_SUMMARY_TENANTS`` rows: past it, the tenants using least are left out (by
    GPU, then CPU, then memory; ties: the larger name), so the fleet-wide DRF shares of the
    biggest users stay exact and only the smallest are under-counted."""
    if len(rows) <= MAX_SUMMARY_TENANTS:
        return rows
    keep = sorted(rows, key=lambda u: (-u.gpu_milli, -u.cpu_milli, -u.mem_mib, u.tenant))
    return sorted(keep[:MAX_SUMMARY_TENANTS], key=lambda u: u.tenant)
