"""The global dispatcher's core (issue 17, docs/scale-out.md): which cell each pending job goes to.

Pure, like the rest of ``core/``: it folds the global partition (submissions, cancellations,
quota changes, the cell shards' ``CellSummary`` and ``JobReturned``) in log order with log time,
and :func:`dispatch` decides from nothing else, so the same partition gives the same
``JobDispatched`` events in any process.  It imports no placement module: a cell shard places,
the dispatcher only chooses the cell.

Steps of :func:`dispatch`: (1) each cell's room: its latest summary less what was dispatched to
it since (``JobDispatched.seq`` past the summary's ``dispatched_seq``); (2) fleet-wide usage the
same way; (3) pending jobs in priority order, tenants by weighted DRF, FIFO within a tenant
(:func:`fleetlog.core.shares.weighted_share`); (4) fleet-wide quotas with cohort borrowing
(:func:`fleetlog.core.quota.limit_in`); (5) the cell: among the job's allowed cells it fits in,
the one where its tenant has the least share (:class:`Spread`), then the one with the most room
for it at the step's start (:func:`room_for`), ties to the smaller cell id; a job no summary can
hold waits with a reason. Runs of equal jobs take a fast path that decides the same
(:func:`_dispatch_equal`; ``dispatch(state, runs=False)`` is the plain twin, job by job).
"""

from __future__ import annotations

import bisect
import functools
import heapq
import operator
import re
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

import msgspec

from fleetlog.core.quota import RESOURCES, Usage, limit_in
from fleetlog.core.shares import SCALE, weighted_share
from fleetlog.core.state import Quota
from fleetlog.events.model import (
    GPU_BUCKETS,
    MAX_DISPATCH_ATTEMPTS,
    PRINTABLE_NAME,
    CellSummary,
    FreeSlots,
    JobCancelled,
    JobDispatched,
    JobReturned,
    JobSubmitted,
    QuotaSet,
    TaskGroup,
)

MAX_NAME: Final = 253
"""The longest identifier an event holds (``fleetlog.events.model.Name``): a cell of the map too."""
_IDENTIFIER: Final = re.compile(PRINTABLE_NAME).match
PENDING: Final = "pending"
HELD: Final = "held"
CANCELLED: Final = "cancelled"
# Reason codes: why a job waits (JobPending-like) and why an input is refused (dead letter).
NO_SUMMARY: Final = "no_cell_summary"
NO_ROOM: Final = "no_cell_has_room"
NO_KNOWN_CELL: Final = "no_allowed_cell_in_map"
QUOTA: Final = "quota_exhausted"
UNKNOWN_CELL: Final = "unknown_cell"
WRONG_PARTITION: Final = "wrong_partition"
STALE_SUMMARY: Final = "stale_summary"
STALE_RETURN: Final = "stale_return"
UNKNOWN_JOB: Final = "unknown_job"
TOO_MANY_RETURNS: Final = "returned_too_often"

Row = list[int]
"""A summary row as the dispatcher draws on it: [slots, cpu_milli, mem_mib, GPUs owed (the
GPUs smaller tasks took from the row's nodes, less than one of its slots: :func:`_draw`),
node_cpu_milli, node_mem_mib (the most on one node: a task needing more fits none of the row's
nodes; never above the row's totals)]."""
Room = dict[tuple[str, int], Row]


class DispatchInputError(ValueError):
    """An event the dispatcher does not fold (not one of the global partition's kinds)."""


@dataclass(frozen=True)
class CellMap:
    """The configuration's stable cell -> partition map (never a hash: see docs/scale-out.md)."""

    partitions: tuple[tuple[str, int], ...]

    def __post_init__(self) -> None:
        cells = [c for c, _ in self.partitions]
        if cells != sorted(set(cells)):
            raise ValueError("the cell map lists each cell once, sorted by cell")
        for cell, partition in self.partitions:
            if len(cell) > MAX_NAME or not _IDENTIFIER(cell):
                raise ValueError(f"cell {cell[:64]!r}: a cell is named like every identifier: 1 to "
                                 f"{MAX_NAME} printable characters, no spaces (docs/events.md)")
            if partition < 0:
                raise ValueError(f"cell {cell!r}: partition {partition} is negative")

    def partition_of(self, cell: str) -> int | None:
        return self._partition.get(cell)

    @functools.cached_property
    def _partition(self) -> dict[str, int]:
        return dict(self.partitions)

    @functools.cached_property
    def cells(self) -> tuple[str, ...]:
        return tuple(c for c, _ in self.partitions)


class Job(msgspec.Struct, gc=False):
    """What the dispatcher knows of one job. A struct the cyclic GC does not track (it holds
    no reference back to anything that holds it: no cycle): the dispatcher keeps one per job it
    ever saw, and each full collection scanned them all (about a sixth of the dispatcher's time
    at 128,000 jobs). Encoded as the dataclass it was: the same snapshot bytes."""

    spec: JobSubmitted
    tenant: int
    demand: tuple[int, int, int]
    status: str = PENDING
    cell: str = ""
    attempt: int = 0
    seq: int = 0
    """The ``JobDispatched.seq`` of its current dispatch."""
    returned: dict[str, int] = msgspec.field(default_factory=dict)
    """Cells that returned it -> the cell's summary seq when it did: not sent back until newer."""
    reason: str = ""


@dataclass
class DispatchState:
    """The dispatcher's state: folded from the global partition alone."""

    cells: CellMap
    offset: int = 0
    now_ms: int = 0
    jobs: dict[str, Job] = field(default_factory=dict)
    """In log order (insertion order is submission order)."""
    tenants: dict[str, int] = field(default_factory=dict)
    quotas: dict[tuple[int, int], Quota] = field(default_factory=dict)
    """Fleet-wide quotas only (key cell -1); a cell's own quota is its shard's to apply."""
    summaries: dict[str, CellSummary] = field(default_factory=dict)
    dispatch_seq: dict[str, int] = field(default_factory=dict)
    cancels: list[tuple[str, JobCancelled]] = field(default_factory=list)
    """Cancellations of held jobs, for the holding cell's partition (sent with the next step)."""


class _Index:
    """What :func:`dispatch` would otherwise find by a scan of every job the dispatcher ever
    saw, twice a step: the pending jobs, and each cell's dispatches in ``seq`` order (an entry
    stands while its job is still held there under that seq). Derived from ``jobs`` alone:
    not snapshotted (an attribute, not a field), built on first use, kept by the fold and
    :func:`_send`; :func:`scan_pending` and :func:`scan_in_flight` are its plain twins."""

    __slots__ = ("order", "pending", "resort", "sent")

    def __init__(self, state: DispatchState) -> None:
        self.order = {job_id: i for i, job_id in enumerate(state.jobs)}
        """Each job's place in log order (``jobs`` is in submission order)."""
        self.pending = {job_id: j for job_id, j in state.jobs.items() if j.status == PENDING}
        self.resort = False
        """A job went back to pending (returned): ``pending`` is no longer in log order."""
        self.sent: dict[str, list[tuple[int, Job]]] = {}
        for j in sorted((j for j in state.jobs.values() if j.status == HELD), key=lambda j: (j.cell, j.seq)):
            self.sent.setdefault(j.cell, []).append((j.seq, j))


def _index(state: DispatchState) -> _Index:
    index: _Index | None = state.__dict__.get("_index")
    if index is None:
        index = state.__dict__["_index"] = _Index(state)
    return index


@dataclass(frozen=True)
class Step:
    """What one :func:`dispatch` decided: dispatches, cancellations to forward, waiting reasons
    that changed (job id, reason code, message)."""

    dispatched: tuple[JobDispatched, ...]
    cancels: tuple[tuple[str, JobCancelled], ...]
    waiting: tuple[tuple[str, str, str], ...]


# --- fold -------------------------------------------------------------------------------------


def fold(state: DispatchState, event: object, at_ms: int) -> str:
    """Fold one event of the global partition at log time ``at_ms``; ``""`` when applied, else
    why it is refused (``code: message``), for the dead letters — nothing else changes then."""
    state.offset += 1
    state.now_ms = max(state.now_ms, at_ms)
    match event:
        case JobSubmitted():
            return _on_submitted(state, event)
        case JobCancelled():
            return _on_cancelled(state, event)
        case QuotaSet():
            return _on_quota(state, event)
        case CellSummary():
            return _on_summary(state, event)
        case JobReturned():
            return _on_returned(state, event)
        case _:
            raise DispatchInputError(f"the dispatcher does not fold {type(event).__name__}")


def fold_all(state: DispatchState, records: Sequence[tuple[object, int]]) -> list[tuple[int, str]]:
    """:func:`fold` of each ``(event, at_ms)`` in order; the refused ones' places in
    ``records`` and why. A submission is folded inline (:func:`_on_submitted`'s work without
    its calls: one per job, thousands a step); the rest by :func:`fold`."""
    refused: list[tuple[int, str]] = []
    jobs, tenants, index = state.jobs, state.tenants, _index(state)
    pending, order = index.pending, index.order
    for i, (event, at_ms) in enumerate(records):
        if type(event) is not JobSubmitted:
            why = fold(state, event, at_ms)
            if why:
                refused.append((i, why))
            continue
        state.offset += 1
        state.now_ms = max(state.now_ms, at_ms)
        job_id, groups = event.job_id, event.task_groups
        if job_id in jobs:
            continue
        if len(groups) != 1:
            _on_submitted(state, event)
            continue
        g = groups[0]
        tenant = tenants.get(event.tenant)
        if tenant is None:
            tenant = tenants[event.tenant] = len(tenants)
        jobs[job_id] = pending[job_id] = Job(
            event, tenant, (g.count * g.cpu_milli, g.count * g.mem_mib, g.count * g.gpu_count * g.gpu_milli))
        order[job_id] = len(order)
    return refused


def _tenant(state: DispatchState, name: str) -> int:
    return state.tenants.setdefault(name, len(state.tenants))


def _on_submitted(state: DispatchState, e: JobSubmitted) -> str:
    if e.job_id in state.jobs:
        return ""  # the first submission counts, as in the cell's fold
    if len(e.task_groups) == 1:  # (the common case, without three sums over a generator)
        g = e.task_groups[0]
        demand = (g.count * g.cpu_milli, g.count * g.mem_mib, g.count * g.gpu_count * g.gpu_milli)
    else:
        demand = (
            sum(g.count * g.cpu_milli for g in e.task_groups),
            sum(g.count * g.mem_mib for g in e.task_groups),
            sum(g.count * g.gpu_count * g.gpu_milli for g in e.task_groups),
        )
    index = _index(state)  # (built before the job is added: it takes the job here)
    job = state.jobs[e.job_id] = Job(e, _tenant(state, e.tenant), demand)
    index.pending[e.job_id] = job
    index.order[e.job_id] = len(index.order)
    return ""


def _on_cancelled(state: DispatchState, e: JobCancelled) -> str:
    job = state.jobs.get(e.job_id)
    if job is None or job.status == CANCELLED:
        return ""
    if job.status == HELD:
        state.cancels.append((job.cell, e))
    job.status = CANCELLED
    _index(state).pending.pop(e.job_id, None)
    return ""


def _on_quota(state: DispatchState, e: QuotaSet) -> str:
    if e.cell:
        return ""  # a cell's quota: its shard applies it (forwarded by a later step)
    limit = e.borrowing_limit
    state.quotas[(_tenant(state, e.tenant), -1)] = Quota(
        nominal=(e.nominal.cpu_milli, e.nominal.mem_mib, e.nominal.gpu_milli),
        borrowing_limit=None if limit is None else (limit.cpu_milli, limit.mem_mib, limit.gpu_milli),
        cohort=e.cohort,
        weight_milli=e.weight_milli,
    )
    return ""


def _on_summary(state: DispatchState, e: CellSummary) -> str:
    partition = state.cells.partition_of(e.cell)
    if partition is None:
        return f"{UNKNOWN_CELL}: a summary of cell {e.cell!r}, which the cell map does not name"
    if partition != e.partition:
        return (f"{WRONG_PARTITION}: a summary of cell {e.cell!r} from partition {e.partition}; "
                f"the cell map puts it in partition {partition}")
    last = state.summaries.get(e.cell)
    if last is not None and e.seq <= last.seq:
        return (f"{STALE_SUMMARY}: summary {e.seq} of cell {e.cell!r} after summary {last.seq} "
                "(a resend, or a fenced shard's)")
    state.summaries[e.cell] = e
    return ""


def _on_returned(state: DispatchState, e: JobReturned) -> str:
    if state.cells.partition_of(e.cell) is None:
        return (f"{UNKNOWN_CELL}: job {e.job_id!r} returned by cell {e.cell!r}, "
                "which the cell map does not name")
    job = state.jobs.get(e.job_id)
    if job is None:
        return f"{UNKNOWN_JOB}: cell {e.cell!r} returned job {e.job_id!r}, never submitted"
    if job.status != HELD or job.cell != e.cell or job.attempt != e.attempt:
        return (f"{STALE_RETURN}: cell {e.cell!r} returned attempt {e.attempt} of job {e.job_id!r}, "
                f"which is {job.status} (attempt {job.attempt}, cell {job.cell!r})")
    summary = state.summaries.get(e.cell)
    job.returned[e.cell] = summary.seq if summary is not None else 0
    job.status, job.reason = PENDING, f"returned by {e.cell}: {e.reason}"
    index = _index(state)
    index.pending[e.job_id], index.resort = job, True
    return ""


# --- the cells' room ---------------------------------------------------------------------------


def bucket_of(gpu_count: int) -> int:
    """The summary bucket a task of ``gpu_count`` GPUs draws on (a share of one GPU: bucket 1)."""
    return next(b for b in GPU_BUCKETS if b >= gpu_count)


def in_flight(state: DispatchState) -> dict[str, list[Job]]:
    """Per cell, the held jobs its latest summary does not count yet, in dispatch order: from
    each cell's dispatches past its summary's ``dispatched_seq`` (:class:`_Index`)."""
    out: dict[str, list[Job]] = {}
    for cell, sent in _index(state).sent.items():
        summary = state.summaries.get(cell)
        start = 0 if summary is None else bisect.bisect_right(sent, summary.dispatched_seq, key=_seq_of)
        jobs = [j for seq, j in sent[start:] if j.status == HELD and j.seq == seq and j.cell == cell]
        if jobs:
            out[cell] = jobs
    return out


def _seq_of(entry: tuple[int, Job]) -> int:
    return entry[0]


def scan_in_flight(state: DispatchState) -> dict[str, list[Job]]:
    """:func:`in_flight`'s plain twin: a scan of every job."""
    out: dict[str, list[Job]] = {}
    for job in state.jobs.values():
        if job.status != HELD:
            continue
        summary = state.summaries.get(job.cell)
        if summary is None or job.seq > summary.dispatched_seq:
            out.setdefault(job.cell, []).append(job)
    for jobs in out.values():
        jobs.sort(key=lambda j: j.seq)
    return out


def rooms(state: DispatchState, flying: dict[str, list[Job]] | None = None) -> dict[str, Room]:
    """Step 1: each summarised cell's room, less what was dispatched to it since its summary
    (``flying``: :func:`in_flight`, when the caller has it)."""
    flying = in_flight(state) if flying is None else flying
    out: dict[str, Room] = {}
    for cell in state.cells.cells:
        summary = state.summaries.get(cell)
        if summary is None:
            continue
        room = {(f.gpu_model, f.gpus): row_of(f) for f in summary.free}
        _take_all(room, [j.spec for j in flying.get(cell, ())])
        out[cell] = room
    return out


def row_of(f: FreeSlots) -> Row:
    """A summary's row as the dispatcher draws on it (:data:`Row`); a row written before the
    ``node_`` fields is bound by its totals alone."""
    cpu = f.cpu_milli if f.node_cpu_milli is None else min(f.node_cpu_milli, f.cpu_milli)
    mem = f.mem_mib if f.node_mem_mib is None else min(f.node_mem_mib, f.mem_mib)
    return [f.slots, f.cpu_milli, f.mem_mib, 0, cpu, mem]


def usage(state: DispatchState, flying: dict[str, list[Job]] | None = None) -> Usage:
    """Step 2: fleet-wide usage by tenant (key ``(tenant, -1)``): the summaries' plus in flight.
    A tenant the dispatcher never saw (no job, no quota here) cannot change a decision: skipped."""
    out: Usage = {}
    for cell in state.cells.cells:
        summary = state.summaries.get(cell)
        for u in summary.usage if summary is not None else ():
            tenant = state.tenants.get(u.tenant)
            if tenant is None:
                continue
            row = out.setdefault((tenant, -1), [0, 0, 0])
            for i, value in enumerate((u.cpu_milli, u.mem_mib, u.gpu_milli)):
                row[i] += value
    for jobs in (in_flight(state) if flying is None else flying).values():
        for (tenant, demand), n in _tally(jobs):
            row = out.setdefault((tenant, -1), [0, 0, 0])
            for i in range(3):
                row[i] += n * demand[i]
    return out


_TENANT: Final = operator.attrgetter("tenant")
_DEMAND: Final = operator.attrgetter("demand")


def _tally(jobs: list[Job]) -> list[tuple[tuple[int, tuple[int, int, int]], int]]:
    """``jobs`` counted by tenant and demand, in order of first appearance: their demands added
    as many times at once (sums of integers: the same totals in any grouping)."""
    return list(Counter(zip(map(_TENANT, jobs), map(_DEMAND, jobs), strict=True)).items())


def take(room: Room, spec: JobSubmitted, commit: bool) -> bool:
    """Draw ``spec``'s tasks from ``room`` (changed only when ``commit``): whether every task
    found a row (a gang: all in this room, or none). Asked without ``commit`` for one task
    group, nothing is drawn: the rows it may take from (one bucket, other models) do not share
    nodes, so no draw changes another's fit."""
    if not commit and len(spec.task_groups) == 1:
        return _fits(room, spec.task_groups[0])
    work = room if commit else {k: list(v) for k, v in room.items()}
    return all(_draw_group(work, g, g.count) for g in spec.task_groups)


def _draw_group(work: Room, g: TaskGroup, count: int) -> bool:
    """Draw ``count`` tasks of ``g``'s shape from the rows in order (each row as many as fit);
    whether all found a row (what did is drawn either way)."""
    bucket, left = bucket_of(g.gpu_count), count
    models = g.gpu_models
    for key in sorted(work):
        if key[1] != bucket or (models and key[0] not in models) or (bucket and not key[0]):
            continue
        row = work[key]
        if g.cpu_milli > row[4] or g.mem_mib > row[5]:
            continue  # no node of the row can give one task what it needs
        fits = min(row[0], row[1] // g.cpu_milli if g.cpu_milli else left,
                   row[2] // g.mem_mib if g.mem_mib else left, left)
        if fits > 0:
            _draw(work, key, fits, max(g.gpu_count, 1) if bucket else 0, g.cpu_milli, g.mem_mib)
            left -= fits
        if left == 0:
            break
    return left == 0


def _take_all(room: Room, specs: list[JobSubmitted]) -> None:
    """``take(room, spec, commit=True)`` of each of ``specs`` in order, a run of equal one-group
    specs as one draw of all their tasks: the same rows, as each job of the run draws from the
    first row it fits in, filling the rows in order, and a draw's costs (slots owed, carried;
    CPU and memory, floored at zero) add up alike drawn at once or task by task (twin-tested)."""
    i = 0
    while i < len(specs):
        spec, n = specs[i], 1
        if len(spec.task_groups) == 1:
            while i + n < len(specs) and specs[i + n].task_groups == spec.task_groups:
                n += 1
        if n == 1:
            take(room, spec, commit=True)
        else:
            _draw_group(room, spec.task_groups[0], spec.task_groups[0].count * n)
        i += n


def _fits(room: Room, g: TaskGroup) -> bool:
    """Whether the rows of ``room`` hold ``g``'s tasks (``take`` of one group, nothing drawn)."""
    bucket, left = bucket_of(g.gpu_count), g.count
    for (model, b), row in room.items():
        if b != bucket or (g.gpu_models and model not in g.gpu_models) or (bucket and not model):
            continue
        if g.cpu_milli > row[4] or g.mem_mib > row[5]:
            continue
        left -= min(row[0], row[1] // g.cpu_milli if g.cpu_milli else left,
                    row[2] // g.mem_mib if g.mem_mib else left, left)
        if left <= 0:
            return True
    return left <= 0


def _draw(room: Room, key: tuple[str, int], tasks: int, gpus: int, cpu: int, mem: int) -> None:
    """Take ``tasks`` tasks of ``gpus`` whole GPUs from row ``key``, and what they cost from the
    model's other buckets (the same nodes): ``gpus / bucket`` of a slot each, the fraction
    carried in the row (``row[3]``, GPUs owed), so eight 1-GPU tasks take one 8-GPU slot, as a
    cell that packs them does. Not a whole slot per task: that counted every 1-GPU task as
    spoiling an 8-GPU slot, and made a cell look full of big slots it still had (the fairness
    benchmark, docs/scale-out.md)."""
    model, drawn = key
    cpu, mem = tasks * cpu, tasks * mem
    for (m, bucket), row in room.items():  # (no max(): this runs for every row, every job)
        if m != model:
            continue
        if bucket == drawn:
            row[0] -= tasks
        elif bucket and gpus:
            owed = row[3] + tasks * gpus
            slots = row[0] - owed // bucket
            row[0], row[3] = slots if slots > 0 else 0, owed % bucket
        left = row[1] - cpu
        row[1] = left if left > 0 else 0
        left = row[2] - mem
        row[2] = left if left > 0 else 0
        # one node has no more than all of them
        row[4], row[5] = row[1] if row[4] > row[1] else row[4], row[2] if row[5] > row[2] else row[5]


Kind = tuple[int, tuple[str, ...] | None]
"""What a job's cell score reads: its largest task's bucket and the GPU models it may use
(``None``: any)."""


def kind_of(spec: JobSubmitted) -> Kind:
    """The rows a job's cell score reads (:func:`room_for`): its largest task's (by GPUs, CPU,
    memory) bucket, of the models that task may use."""
    g = max(spec.task_groups, key=lambda g: (g.gpu_count, g.cpu_milli, g.mem_mib))
    return (bucket_of(g.gpu_count), tuple(sorted(set(g.gpu_models))) if g.gpu_models else None)


def room_for(room: Room, kind: Kind) -> int:
    """A cell's room for a job of ``kind``: the most free slots in any one row it may draw its
    largest task from (one GPU model's nodes). The largest row, not the rows' sum: a cell with
    many models is not roomier for a job than one with one large row of the model it lands on
    (summed, the openb quality benchmark lost about a point). It only shrinks as the room does
    (:class:`Scores` relies on it)."""
    bucket, models = kind
    out = 0
    for (m, b), row in room.items():
        if b == bucket and (models is None or m in models) and (m or not bucket) and row[0] > out:
            out = row[0]
    return out


# --- dispatch -----------------------------------------------------------------------------------


def dispatch(state: DispatchState, runs: bool = True) -> Step:
    """Decide and apply one step: every pending job dispatched to a cell or left waiting with a
    reason; the cancellations folded since the last step, for their holding cells. Without
    fleet-wide quotas, a run of :func:`run_least` or more jobs in a row of the order asking
    for one and the same task group, free of cell lists and returns (a burst of equal jobs,
    the common case), is decided by :func:`_dispatch_equal`, the rest job by job;
    ``runs=False`` decides every job by the plain per-job loop, its twin (tests)."""
    flying = in_flight(state)
    spread = Spread.of(state, flying)
    room, used = rooms(state, flying), spread.usage() if runs else usage(state, flying)
    scores = Scores(room, spread=spread)
    jobs = (_ordered if runs else scan_ordered)(state, used, _fleet(state))
    dispatched: list[JobDispatched] = []
    left: list[tuple[Job, str]] = []
    cut = _runs(jobs, run_least(len(room))) if runs and not state.quotas else [(0, len(jobs), None)]
    for start, end, group in cut:
        sent, kept = (_dispatch_plain(state, scores, jobs[start:end], used) if group is None
                      else _dispatch_equal(state, scores, jobs[start:end], group))
        dispatched += sent
        left += kept
    waiting: list[tuple[str, str, str]] = []
    for job, why in left:
        reason = why or _no_cell_reason(state, job)
        if reason != job.reason:
            job.reason = reason
            code, _, message = reason.partition(": ")
            waiting.append((job.spec.job_id, code, message))
    cancels, state.cancels = tuple(state.cancels), []
    return Step(tuple(dispatched), cancels, tuple(waiting))


def _dispatch_plain(state: DispatchState, scores: Scores, jobs: list[Job],
                    used: Usage) -> tuple[list[JobDispatched], list[tuple[Job, str]]]:
    """Steps 4 and 5, a job at a time: the dispatches, and the jobs left waiting (with their
    quota reason, ``""`` when no cell holds them)."""
    dispatched: list[JobDispatched] = []
    left: list[tuple[Job, str]] = []
    for job in jobs:
        quota_free = not state.quotas and job.attempt < MAX_DISPATCH_ATTEMPTS
        reason = "" if quota_free else _quota_reason(state, used, job)
        cell = "" if reason else _choose(state, scores, job)
        if cell:
            dispatched.append(_send(state, job, cell))
            scores.take(cell, job.spec, job.tenant, job.demand)
            row, (cpu, mem, gpu) = used.setdefault((job.tenant, -1), [0, 0, 0]), job.demand
            row[0], row[1], row[2] = row[0] + cpu, row[1] + mem, row[2] + gpu
        else:
            left.append((job, reason))
    return dispatched, left


def _fleet(state: DispatchState) -> tuple[int, int, int]:
    totals = [s.total for s in (state.summaries.get(c) for c in state.cells.cells) if s is not None]
    return (sum(t.cpu_milli for t in totals), sum(t.mem_mib for t in totals),
            sum(t.gpu_milli for t in totals))


def _ordered(state: DispatchState, used: Usage, fleet: tuple[int, int, int]) -> list[Job]:
    """Step 3: pending jobs by priority (higher first); within a priority tenants take turns by
    weighted DRF (ties to the tenant seen first), FIFO within a tenant.  Shares are those before
    this step's dispatches plus each tenant's jobs in the order taken (``demand`` added as if
    each were dispatched), so the order is fixed before any cell is chosen: each job's key is
    its tenant's share before it, a tenant's keys never fall, so taking turns (the smallest
    share next, :func:`scan_ordered`'s heap) is the keys sorted, with the tenant then the place
    in its queue breaking ties."""
    classes: dict[int, dict[int, list[Job]]] = {}
    for job in _pending(state):
        classes.setdefault(-job.spec.priority, {}).setdefault(job.tenant, []).append(job)
    out: list[Job] = []
    for prio in sorted(classes):
        queues = classes[prio]
        if len(queues) == 1:
            out.extend(*queues.values())
            continue
        keys: list[tuple[int, int, int]] = []
        for t, queue in queues.items():
            keys += _turns(state.quotas.get((t, -1)), used.get((t, -1), [0, 0, 0]), fleet, t, queue)
        keys.sort()
        out += [queues[t][i] for _, t, i in keys]
    return out


def _turns(quota: Quota | None, used: list[int], fleet: tuple[int, int, int], tenant: int,
           queue: list[Job]) -> list[tuple[int, int, int]]:
    """Each of ``queue``'s jobs keyed (the tenant's :func:`weighted_share` before it, ``tenant``,
    its place), ``weighted_share`` inline: once a job."""
    base = quota.nominal if quota is not None and any(quota.nominal) else fleet
    weight = quota.weight_milli if quota is not None else 1000
    b0, b1, b2 = base
    cpu, mem, gpu = used
    out = []
    for i, job in enumerate(queue):
        share = cpu * SCALE // b0 if b0 > 0 else 0
        if b1 > 0 and mem * SCALE // b1 > share:
            share = mem * SCALE // b1
        if b2 > 0 and gpu * SCALE // b2 > share:
            share = gpu * SCALE // b2
        out.append((share * 1000 // weight, tenant, i))
        d0, d1, d2 = job.demand
        cpu, mem, gpu = cpu + d0, mem + d1, gpu + d2
    return out


def scan_ordered(state: DispatchState, used: Usage, fleet: tuple[int, int, int]) -> list[Job]:
    """:func:`_ordered`'s plain twin: tenants take turns through a heap of their shares."""
    classes: dict[int, dict[int, deque[Job]]] = {}
    for job in scan_pending(state):
        classes.setdefault(-job.spec.priority, {}).setdefault(job.tenant, deque()).append(job)
    out: list[Job] = []
    for prio in sorted(classes):
        queues = classes[prio]
        share = {t: list(used.get((t, -1), [0, 0, 0])) for t in queues}
        heap = [(weighted_share(state.quotas.get((t, -1)), share[t], fleet), t) for t in sorted(queues)]
        heapq.heapify(heap)
        while heap:
            _, t = heapq.heappop(heap)
            job = queues[t].popleft()
            out.append(job)
            share[t] = [share[t][i] + job.demand[i] for i in range(3)]
            if queues[t]:
                heapq.heappush(heap, (weighted_share(state.quotas.get((t, -1)), share[t], fleet), t))
    return out


def _pending(state: DispatchState) -> list[Job]:
    """The pending jobs in log order (:class:`_Index`, back in order after a return)."""
    index = _index(state)
    if index.resort:
        index.pending = dict(sorted(index.pending.items(), key=lambda item: index.order[item[0]]))
        index.resort = False
    return list(index.pending.values())


def scan_pending(state: DispatchState) -> list[Job]:
    """:func:`_pending`'s plain twin: a scan of every job."""
    return [j for j in state.jobs.values() if j.status == PENDING]


def _quota_reason(state: DispatchState, used: Usage, job: Job) -> str:
    """Step 4: ``""`` when the job fits its tenant's fleet-wide quota (with cohort borrowing)."""
    if job.attempt >= MAX_DISPATCH_ATTEMPTS:
        return f"{TOO_MANY_RETURNS}: dispatched {job.attempt} times, the most is {MAX_DISPATCH_ATTEMPTS}"
    key = (job.tenant, -1)
    quota = state.quotas.get(key)
    if quota is None:
        return ""
    have = used.get(key, [0, 0, 0])
    limit = limit_in(state.quotas, used, key, quota)
    for i, name in enumerate(RESOURCES):
        if job.demand[i] and have[i] + job.demand[i] > limit[i]:
            return (f"{QUOTA}: tenant {job.spec.tenant} uses {have[i]} of {quota.nominal[i]} {name} nominal "
                    f"fleet-wide, the job needs {job.demand[i]} and may use {limit[i]} in all")
    return ""


def candidates(state: DispatchState, job: Job) -> list[str]:
    """The cells ``job`` may go to, sorted: allowed (all if none named) and in the map, less
    those that returned it and have written no newer summary since."""
    if not job.spec.allowed_cells and not job.returned:
        return list(state.cells.cells)  # (the common case, without a set per job)
    allowed = set(job.spec.allowed_cells)
    out = []
    for cell in state.cells.cells:
        if allowed and cell not in allowed:
            continue
        summary = state.summaries.get(cell)
        seen = job.returned.get(cell)
        if seen is not None and (summary is None or summary.seq <= seen):
            continue
        out.append(cell)
    return out


class Spread:
    """Each tenant's share of each cell: what its jobs take there (the cell's latest summary's
    ``usage``, plus the jobs in flight to it and this step's dispatches) over the cell's
    ``total``, the largest of CPU, memory and GPUs, in parts per billion. The first key of the
    choice of cell (:class:`Scores`): a tenant's job goes to a cell where the tenant has least,
    so each cell gets a slice of every tenant's jobs in proportion to its size, each cell's own
    DRF order sees the fleet's mix, and the cells' placements add up to the fleet's shares.
    Chosen by room alone, each job shape piled into the cells the others had not reached, and a
    cell given only CPU-heavy and small jobs could not hold them together (the fairness
    benchmark, docs/scale-out.md)."""

    def __init__(self, totals: dict[str, tuple[int, int, int]] | None = None,
                 used: dict[tuple[str, int], list[int]] | None = None) -> None:
        self.totals = totals if totals is not None else {}
        self.used = used if used is not None else {}
        """(cell, tenant) -> [cpu_milli, mem_mib, gpu_milli]."""
        self.shares = {key: self._share(key) for key in self.used}
        """(cell, tenant) -> :meth:`share`, kept as ``used`` changes (asked several times a job)."""

    @classmethod
    def of(cls, state: DispatchState, flying: dict[str, list[Job]] | None = None) -> Spread:
        """From the latest summaries and the jobs in flight (``flying``: :func:`in_flight`'s,
        when the caller has it). A tenant the dispatcher never saw is skipped, as in
        :func:`usage`."""
        flying = in_flight(state) if flying is None else flying
        totals, used = {}, {}
        for cell in state.cells.cells:
            summary = state.summaries.get(cell)
            if summary is None:
                continue
            t = summary.total
            totals[cell] = (t.cpu_milli, t.mem_mib, t.gpu_milli)
            for u in summary.usage:
                tenant = state.tenants.get(u.tenant)
                if tenant is not None:
                    used[(cell, tenant)] = [u.cpu_milli, u.mem_mib, u.gpu_milli]
        out = cls(totals, used)
        for cell, jobs in flying.items():
            for (tenant, demand), n in _tally(jobs):
                out.add(cell, tenant, (n * demand[0], n * demand[1], n * demand[2]))
        return out

    def share(self, cell: str, tenant: int) -> int:
        return self.shares.get((cell, tenant), 0)

    def usage(self) -> Usage:
        """:func:`usage` from what :meth:`of` gathered: each tenant's use summed over the
        cells (the same sums, each in-flight job counted once, not twice a step)."""
        out: Usage = {}
        for (_, tenant), row in self.used.items():
            have = out.get((tenant, -1))
            if have is None:
                out[(tenant, -1)] = list(row)
            else:
                have[0], have[1], have[2] = have[0] + row[0], have[1] + row[1], have[2] + row[2]
        return out

    def _share(self, key: tuple[str, int]) -> int:
        used, total = self.used[key], self.totals.get(key[0])
        if total is None:
            return 0
        out = 0
        for u, t in zip(used, total, strict=True):  # (no max() over a generator: once a dispatch)
            if t > 0 and u * SCALE // t > out:
                out = u * SCALE // t
        return out

    def add(self, cell: str, tenant: int, demand: tuple[int, int, int]) -> None:
        key = (cell, tenant)
        row = self.used.setdefault(key, [0, 0, 0])
        for i in range(3):
            row[i] += demand[i]
        self.shares[key] = self._share(key)

    def grow(self, cell: str, tenant: int, demand: tuple[int, int, int]) -> int:
        """:meth:`add`, then the new :meth:`share` (:meth:`_share` inline: once a dispatch)."""
        key = (cell, tenant)
        row = self.used.get(key)
        if row is None:
            row = self.used[key] = [0, 0, 0]
        cpu, mem, gpu = row[0] + demand[0], row[1] + demand[1], row[2] + demand[2]
        row[0], row[1], row[2] = cpu, mem, gpu
        total, out = self.totals.get(cell), 0
        if total is not None:
            if total[0] > 0:
                out = cpu * SCALE // total[0]
            if total[1] > 0 and mem * SCALE // total[1] > out:
                out = mem * SCALE // total[1]
            if total[2] > 0 and gpu * SCALE // total[2] > out:
                out = gpu * SCALE // total[2]
        self.shares[key] = out
        return out


class Scores:
    """Step 5's choice of cell, fast: for each job shape (its task groups) and tenant asked this
    step, a heap of the cells by the tenant's share of the cell (:class:`Spread`, least first),
    then the room for the shape at the step's start (:func:`room_for`, largest first), ties to
    the smaller id. Within a step a tenant's share of a cell only grows, and only by its own
    :meth:`take` into that cell, so an entry computed before the tenant's last take there is a
    lower bound of its key: it is recomputed when it reaches the top, and the first current top
    the job fits in (the room now) is the plain answer (a cell it does not fit is dropped from
    that heap: rooms only shrink, it will not fit later in the step either). A take makes one
    entry stale, in its tenant's heap only: the room at the step's start, not the room left,
    breaks ties, else every tenant's heap would recompute the cell after each take. O(log
    cells) per job instead of a loop over every cell. ``remember=False`` is the plain twin
    (tests): every candidate cell asked in turn. Without a ``spread`` every share is 0."""

    def __init__(self, room: dict[str, Room], remember: bool = True, spread: Spread | None = None) -> None:
        self.room, self.remember = room, remember
        self.spread = spread if spread is not None else Spread()
        self.start = {c: {k: [row[0]] for k, row in r.items()} for c, r in room.items()}
        """Each cell's slots at the step's start (what :func:`room_for` reads), for the ties."""
        self.version: dict[tuple[str, int], int] = {}
        """(cell, tenant) -> the tenant's takes into the cell this step."""
        self.heaps: dict[tuple[tuple[TaskGroup, ...], int], list[tuple[int, int, str, int]]] = {}
        self.kinds: dict[tuple[TaskGroup, ...], Kind] = {}
        self.sized: dict[tuple[str, Kind], int] = {}
        """(cell, kind) -> :func:`room_for` at the step's start."""

    def kind(self, spec: JobSubmitted) -> Kind:
        kind = self.kinds.get(spec.task_groups)
        if kind is None:
            kind = self.kinds[spec.task_groups] = kind_of(spec)
        return kind

    def key(self, cell: str, kind: Kind, tenant: int) -> tuple[int, int, str]:
        """What the choice minimises: the tenant's share of the cell now, then less room at the
        step's start, then the id."""
        size = self.sized.get((cell, kind))
        if size is None:
            size = self.sized[(cell, kind)] = room_for(self.start[cell], kind)
        return self.spread.share(cell, tenant), -size, cell

    def best(self, spec: JobSubmitted, cells: list[str] | None = None, tenant: int = -1) -> str:
        """The cell among ``cells`` (``None``: every cell with a room) that ``spec`` of
        ``tenant`` fits in with the least :meth:`key`; ``""`` when it fits in none."""
        if cells is not None or not self.remember:
            return self._plain(spec, sorted(self.room) if cells is None else cells, tenant)
        heap = self.heaps.get((spec.task_groups, tenant))
        kind, room, version = self.kind(spec), self.room, self.version
        if heap is None:
            heap = [(*self.key(c, kind, tenant), version.get((c, tenant), 0)) for c in sorted(room)]
            heapq.heapify(heap)
            self.heaps[(spec.task_groups, tenant)] = heap
        while heap:
            _, size, cell, seen = heap[0]
            now = version.get((cell, tenant), 0)
            if seen != now:
                heapq.heapreplace(heap, (self.spread.share(cell, tenant), size, cell, now))
            elif take(room[cell], spec, commit=False):
                return cell
            else:
                heapq.heappop(heap)
        return ""

    def _plain(self, spec: JobSubmitted, cells: list[str], tenant: int) -> str:
        best: tuple[int, int, str] | None = None
        kind = self.kind(spec)
        for cell in cells:
            room = self.room.get(cell)
            if room is None or not take(room, spec, commit=False):
                continue
            key = self.key(cell, kind, tenant)
            if best is None or key < best:
                best = key
        return "" if best is None else best[2]

    def take(self, cell: str, spec: JobSubmitted, tenant: int = -1,
             demand: tuple[int, int, int] = (0, 0, 0)) -> None:
        take(self.room[cell], spec, commit=True)
        self.spread.add(cell, tenant, demand)
        self.version[(cell, tenant)] = self.version.get((cell, tenant), 0) + 1


def _choose(state: DispatchState, scores: Scores, job: Job) -> str:
    """Step 5: among the candidate cells the job fits in, the one where its tenant has the least
    share (:class:`Spread`), then the most room for it at the step's start (:func:`room_for`:
    the most free slots in one row of its largest task's bucket), ties to the smaller id. Asked
    before the job is drawn, so the same for every cell whatever row the job would fall through
    to (the slots left in the rows drawn on, the first rule, could grow as a room shrank: no
    heap could keep them)."""
    if not job.spec.allowed_cells and not job.returned:
        return scores.best(job.spec, tenant=job.tenant)
    return scores.best(job.spec, candidates(state, job), job.tenant)


def run_least(cells: int) -> int:
    """The shortest run :func:`_dispatch_equal` takes over ``cells`` summarised cells: it
    counts every cell's room for the shape and builds a heap per tenant, so a run shorter than
    about a quarter of the cells costs more than the plain loop (measured: even at 16 jobs over
    64 cells, 256 over 1,024), and a few jobs are not worth it at all."""
    return max(64, cells // 4)


def _runs(jobs: list[Job], least: int) -> list[tuple[int, int, TaskGroup | None]]:
    """``jobs`` cut into ranges ``[start, end)`` in order: the runs of at least ``least`` jobs
    in a row that ask for one and the same task group, name no cell, were never returned and
    are under the attempts' bound, with their group; between them, ranges for the plain loop
    (group ``None``)."""
    out: list[tuple[int, int, TaskGroup | None]] = []
    i, n, plain = 0, len(jobs), 0
    while i < n:
        groups = jobs[i].spec.task_groups
        if len(groups) != 1 or not _runs_with(jobs[i], groups):
            i += 1
            continue
        j = i + 1
        while j < n and _runs_with(jobs[j], groups):
            j += 1
        if j - i >= least:
            out += [(plain, i, None)] if plain < i else []
            out.append((i, j, groups[0]))
            plain = j
        i = j
    return out + ([(plain, n, None)] if plain < n else [])


def _runs_with(job: Job, groups: tuple[TaskGroup, ...]) -> bool:
    """Whether ``job`` may join a run of jobs asking for ``groups`` (:func:`_runs`)."""
    spec = job.spec
    return (spec.task_groups is groups or spec.task_groups == groups) and not spec.allowed_cells \
        and not job.returned and job.attempt < MAX_DISPATCH_ATTEMPTS


def _dispatch_equal(state: DispatchState, scores: Scores, jobs: list[Job],
                    g: TaskGroup) -> tuple[list[JobDispatched], list[tuple[Job, str]]]:
    """:func:`_dispatch_plain` for a run of equal jobs (one group ``g``, :func:`_runs`), the
    same decisions at a fraction of the work. Only jobs of ``g``'s shape draw during the run,
    so each cell holds a known number of them (:func:`held`): the n-th fits iff n are no more,
    a count instead of a look at the rows; each cell's room is drawn once at the end (what
    the n draws one by one leave: :func:`_take_all`'s rule). Each tenant's heap holds every
    cell that still holds one, keyed as :meth:`Scores.key`; a take changes only the taking
    tenant's share of that cell, so its entry is replaced there and then (the plain heap's
    lazy recompute, done at once); a full cell is popped when it reaches a top, as the plain
    heap drops a cell the job does not fit. The plain heaps' entries of the tenants' shares
    are marked stale (:attr:`Scores.version`) for the jobs after the run."""
    kind, spread, demand = scores.kind(jobs[0].spec), scores.spread, jobs[0].demand
    cells = sorted(scores.room)
    start = {c: held(scores.room[c], g) // g.count for c in cells}
    free = dict(start)
    heaps: dict[int, list[tuple[int, int, str]]] = {}
    dispatched: list[JobDispatched] = []
    left: list[tuple[Job, str]] = []
    pop, replace, grow = heapq.heappop, heapq.heapreplace, spread.grow
    # (:func:`_send` inline, its lookups once)
    index, seqs, as_of = _index(state), state.dispatch_seq, state.offset
    pending, sent = index.pending, index.sent
    for job in jobs:
        tenant = job.tenant
        heap = heaps.get(tenant)
        if heap is None:
            heap = heaps[tenant] = [scores.key(c, kind, tenant) for c in cells if free[c]]
            heapq.heapify(heap)
        while heap and not free[heap[0][2]]:
            pop(heap)
        if not heap:
            left.append((job, ""))
            continue
        _, size, cell = heap[0]
        free[cell] -= 1
        replace(heap, (grow(cell, tenant, demand), size, cell))
        seq = seqs[cell] = seqs.get(cell, 0) + 1
        attempt = job.attempt + 1
        job.status, job.cell, job.attempt, job.seq, job.reason = HELD, cell, attempt, seq, ""
        del pending[job.spec.job_id]
        sent.setdefault(cell, []).append((seq, job))
        dispatched.append(JobDispatched(job=job.spec, cell=cell, attempt=attempt, seq=seq, as_of=as_of))
    for cell in cells:
        taken = start[cell] - free[cell]
        if taken:
            _draw_group(scores.room[cell], g, g.count * taken)
        for tenant in heaps:
            scores.version[(cell, tenant)] = scores.version.get((cell, tenant), 0) + 1
    return dispatched, left


def held(room: Room, g: TaskGroup) -> int:
    """How many tasks of ``g``'s shape the rows of ``room`` hold in all (:func:`_fits` sums
    the same, stopping at ``g.count``). A draw of the shape takes its tasks off this count and
    nothing more from the rows the shape reads (its bucket: one row per model; a draw changes
    the model's other buckets only), so the n-th job of ``k`` tasks fits iff ``n * k`` tasks
    are held (twin-tested against drawing job by job)."""
    bucket, out = bucket_of(g.gpu_count), 0
    for (model, b), row in room.items():
        if b != bucket or (g.gpu_models and model not in g.gpu_models) or (bucket and not model):
            continue
        if g.cpu_milli > row[4] or g.mem_mib > row[5]:
            continue
        n = row[0]
        if g.cpu_milli and row[1] // g.cpu_milli < n:
            n = row[1] // g.cpu_milli
        if g.mem_mib and row[2] // g.mem_mib < n:
            n = row[2] // g.mem_mib
        out += n
    return out


def _no_cell_reason(state: DispatchState, job: Job) -> str:
    allowed = set(job.spec.allowed_cells)
    known = [c for c in state.cells.cells if not allowed or c in allowed]
    if not known:
        return f"{NO_KNOWN_CELL}: none of the cells {sorted(allowed)} is in the cell map"
    cells = candidates(state, job)
    if not [c for c in cells if c in state.summaries]:
        back = sorted(job.returned)
        if back and not cells:
            return f"{NO_ROOM}: returned by {', '.join(back)}; waiting for a newer summary showing room"
        return f"{NO_SUMMARY}: no summary yet from cells {', '.join(known)}"
    return f"{NO_ROOM}: no summary of cells {', '.join(cells)} shows room for the job"


def _send(state: DispatchState, job: Job, cell: str) -> JobDispatched:
    seq = state.dispatch_seq.get(cell, 0) + 1
    state.dispatch_seq[cell] = seq
    job.status, job.cell, job.attempt, job.seq, job.reason = HELD, cell, job.attempt + 1, seq, ""
    index = _index(state)
    del index.pending[job.spec.job_id]
    index.sent.setdefault(cell, []).append((seq, job))
    return JobDispatched(job=job.spec, cell=cell, attempt=job.attempt, seq=seq, as_of=state.offset)
