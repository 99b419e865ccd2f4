"""The batch twins of :mod:`fleetlog.core.fold`: the same state, faster, for runs of events.

:mod:`fleetlog.core.fold` is the spec: one short handler per event. This module folds what the
service and replay read in bulk — steady heartbeats written with numpy, runs of submissions'
columns written at once (:class:`NewJobs`), runs of one-task placements at once
(:func:`on_placed_many`) — and falls back on the spec's handlers for everything else. It
imports the spec, never the other way. Each twin is checked against folding one event at a
time by ``tests/core/test_fold_batch.py`` (every chunking, gaps past the node timeout,
duplicates, unknown jobs and nodes).

The steady heartbeats are the objects ``state.derived.beat_cache`` holds, which the spec's
``on_heartbeat`` keeps (a derived cache: see :class:`~fleetlog.core.state.Derived`).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Sequence
from itertools import accumulate, repeat
from typing import Any, Final, TypeGuard

import msgspec
import numba
import numpy as np

from fleetlog.core.arrays import HASH_MASK, Array
from fleetlog.core.fold import (
    class_id,
    drop_reason_text,
    fold,
    fold_decision,
    keep_meta,
    models_mask,
    next_due,
    on_placed,
    remember_shape,
    take_shape_mix,
    topology_code,
    window_entry_hash,
)
from fleetlog.core.state import (
    SUM_DISPATCHES,
    SUM_JOB_CELLS,
    SUM_RECENT_SHAPES,
    JobState,
    NodeStatus,
    State,
    TaskState,
    shape_key,
)
from fleetlog.events.model import (
    DecisionBatch,
    Event,
    JobCancelled,
    JobDispatched,
    JobPlaced,
    JobSubmitted,
    NodeHeartbeat,
    QuotaSet,
    TaskFailed,
    TaskFinished,
    TaskGroup,
    TaskStarted,
)

_RUNNING: Final = int(JobState.RUNNING)  # (plain ints: see fleetlog.core.fold)
_PLACED: Final = int(TaskState.PLACED)


def fold_fast(state: State, event: Event, at_ms: int) -> None:
    """:func:`~fleetlog.core.fold.fold` of one event: the same state, with a decision batch's
    runs of one-task placements applied at once (:func:`fold_decisions`)."""
    if isinstance(event, DecisionBatch):
        fold_decisions(state, event.decisions)
    else:
        fold(state, event, at_ms)


def fold_many(state: State, events: Iterable[tuple[Event, int]]) -> None:
    """Fold (event, at_ms) pairs in order: the same state as :func:`fold` one by one, faster.

    The hot path is the steady heartbeat of a known, up node that reports what it reported
    last time (often the very same object: readers decode repeated bytes once): only its
    heartbeat time changes, so those are gathered and written at once, and the offset and
    log time are kept in locals until some other event needs the state. Runs of submissions
    are folded together (:func:`fold_submissions`).

    Nothing deferred crosses a node sweep or the end of a cell shard's hold
    (:func:`~fleetlog.core.fold.next_due`): the first event at or after it is folded by
    :func:`fold` after every deferred write, whatever its type, so the sweep reads the heartbeat
    times the events before it wrote, and a hold ends at the same input — however the inputs
    were chunked.
    """
    beats: dict[int, int] = {}
    cache = state.derived.beat_cache
    now, sweep, steady = state.now_ms, next_due(state), 0
    run: list[JobSubmitted | JobDispatched] = []  # consecutive submissions and dispatches, folded together
    run_at: list[int] = []
    # (at most one of ``run`` and ``steady`` is open: each closes the other's offset and clock)
    for event, at_ms in events:
        if at_ms < sweep:
            if type(event) is JobSubmitted or type(event) is JobDispatched:
                if steady:
                    state.offset += steady
                    state.now_ms, steady = now, 0
                run.append(event)
                run_at.append(at_ms)
                continue
            if type(event) is NodeHeartbeat:
                hit = cache.get(event.node)
                if hit is not None and (hit[1] is event or hit[1] == event):
                    if run:
                        fold_submissions(state, run, run_at)
                        run, run_at, now = [], [], state.now_ms
                        sweep = next_due(state)  # (a dispatch holds a job: a hold may end sooner)
                        if at_ms >= sweep:
                            _write_beats(state, beats)
                            fold_fast(state, event, at_ms)
                            now, sweep = state.now_ms, next_due(state)
                            continue
                    steady += 1
                    now = at_ms if at_ms > now else now  # max() costs a call per heartbeat
                    beats[hit[0]] = now
                    continue
        if run:
            fold_submissions(state, run, run_at)
            run, run_at = [], []
        if steady:
            state.offset += steady
            state.now_ms, steady = now, 0
        if beats:
            _write_beats(state, beats)
        fold_fast(state, event, at_ms)
        now, sweep = state.now_ms, next_due(state)
    if run:
        fold_submissions(state, run, run_at)
    if steady:
        state.offset += steady
        state.now_ms = now
    if beats:
        _write_beats(state, beats)


_JOB_COLUMNS: Final = (
    "tenant", "queue", "priority", "submitted_at", "seq", "first_task", "topology", "expected_ms",
)  # fmt: skip
"""The job columns a run's rows carry, in order (then the job's kind: :class:`NewJobs`)."""
_KIND_COLUMNS: Final = ("ntasks", "req_cpu", "req_mem", "req_gpu")
_TASK_COLUMNS: Final = ("cpu", "mem", "gpus", "milli")
Shape = tuple[int, int, int]


class NewJobs:
    """The rows of jobs submitted (or dispatched) one after another, gathered in order and
    written at once: names interned as each job comes (their running hash taken once for the
    run), each distinct tuple of task groups (the job's *kind*) read once — its models
    interned, its masks, totals and task rows — and each job's tasks taken from its kind's
    with numpy; consecutive equal shapes go to the shape window in one call, the entry
    hashes of the run's allowed cells and dispatches are summed once."""

    __slots__ = (
        "cell_entries", "cell_ids", "dispatch_entries", "first_job", "first_task", "jobs", "kind_of",
        "kind_tasks", "kinds", "queues", "shape", "shape_count", "tasks", "tenants",
    )  # fmt: skip

    def __init__(self, state: State) -> None:
        self.first_job, self.first_task = state.jobs.size, state.tasks.size
        self.jobs: list[tuple[int, ...]] = []
        """Per job: the values of ``_JOB_COLUMNS``, then its kind."""
        self.tasks = 0
        self.kind_of: dict[tuple[TaskGroup, ...], int] = {}
        self.kinds: list[tuple[int, int, int, int, tuple[tuple[Shape, int], ...]]] = []
        """Per kind: tasks, cpu, mem and GPU milli in all, its (shape, count) of each group."""
        self.kind_tasks: list[list[tuple[int, int, int, int, int, int]]] = []
        """Per kind: its task rows (cpu, mem, gpus, milli, models mask, constraint class)."""
        self.tenants: dict[str, int] = {}
        self.queues: dict[str, int] = {}
        self.cell_ids: dict[str, int] = {}
        self.cell_entries: list[tuple[int, tuple[int, ...]]] = []
        self.dispatch_entries: list[tuple[int, tuple[int, int, int, int]]] = []
        self.shape: Shape | None = None
        self.shape_count = 0

    def take(self, state: State, e: JobSubmitted, cell: tuple[int] | None = None) -> int:
        """Fold ``e`` (the clock and offset already moved to it) but for the column writes;
        ``cell``: the one cell id it is allowed in instead of its own allowed cells (a
        dispatch: :meth:`dispatch`). Its job row, or -1 for a duplicate."""
        names = state.names
        job_names = names["job"]
        if e.job_id in job_names.ids or e.job_id in state.retired:
            state.duplicates += 1
            return -1
        job = job_names.add(e.job_id)
        tenant = self.tenants.get(e.tenant)
        if tenant is None:
            tenant = self.tenants[e.tenant] = names["tenant"].intern(e.tenant)
        queue = self.queues.get(e.queue)
        if queue is None:
            queue = self.queues[e.queue] = names["queue"].intern(e.queue)
        cells: tuple[int, ...] | None = cell
        if cells is None and e.allowed_cells:
            cells = tuple(sorted({names["cell"].intern(c) for c in e.allowed_cells}))
        kind = self.kind_of.get(e.task_groups)
        if kind is None:
            kind = self.kind(state, e.task_groups)
        topo = topology_code(e)
        expected = -1 if e.expected_duration_ms is None else e.expected_duration_ms
        first = self.first_task + self.tasks
        row = (tenant, queue, e.priority, state.now_ms, state.offset - 1, first, topo, expected, kind)
        self.jobs.append(row)
        if cells:
            state.job_cells[job] = cells
            self.cell_entries.append((job, cells))
        self.tasks += self.shapes(state, kind)
        state.pending_count += 1
        keep_meta(state, job, tenant, e)
        return job

    def shapes(self, state: State, kind: int) -> int:
        """A job of ``kind``'s tasks into the shape window (gathered while the shape repeats),
        the shape mix taken when it falls due; its number of tasks."""
        n, _, _, _, shapes = self.kinds[kind]
        window = state.config.shape_window
        for shape, count in shapes:
            if shape == self.shape and self.shape_count + count <= window:
                self.shape_count += count  # (remember_shape caps a call at the window: not past it)
            else:
                self._remember(state)
                self.shape, self.shape_count = shape, count
        state.shapes_seen += n
        if state.shapes_seen >= state.mix_due:
            self._remember(state)
            take_shape_mix(state)
        return n

    def dispatch(self, state: State, e: JobDispatched) -> None:
        """``fold.on_dispatched`` of a job new to this shard, to a cell it holds (the clock and
        offset already moved to it; :func:`plain_dispatch` says which): its submission
        restricted to the cell, but for the column writes, then the dispatch remembered and
        held."""
        cell = self.cell_ids.get(e.cell)
        if cell is None:
            cell = self.cell_ids[e.cell] = state.names["cell"].intern(e.cell)
        seqs = state.dispatched_seq
        seqs[cell] = max(seqs.get(cell, 0), e.seq)
        job = self.take(state, e.job, (cell,))
        now = state.now_ms
        entry = state.dispatches[job] = (cell, e.attempt, e.seq, now)
        self.dispatch_entries.append((job, entry))
        until = now + state.config.hold_ms
        state.held[job] = until  # (fold.hold of a new job row: never held before)
        state.next_return_ms = min(state.next_return_ms, until)

    def kind(self, state: State, groups: tuple[TaskGroup, ...]) -> int:
        """Read a new tuple of task groups: its models interned (in the spec's order), its rows."""
        rows: list[tuple[int, int, int, int, int, int]] = []
        shapes: list[tuple[Shape, int]] = []
        n = cpu = mem = gpu = 0
        for g in groups:
            mask = models_mask(state, g)
            cls = class_id(state, g)
            count = g.count
            n += count
            cpu += count * g.cpu_milli
            mem += count * g.mem_mib
            gpu += count * g.gpu_count * g.gpu_milli
            rows += [(g.cpu_milli, g.mem_mib, g.gpu_count, g.gpu_milli, mask, cls)] * count
            shapes.append(((g.gpu_count, g.gpu_milli, g.cpu_milli), count))
        kind = self.kind_of[groups] = len(self.kinds)
        self.kinds.append((n, cpu, mem, gpu, tuple(shapes)))
        self.kind_tasks.append(rows)
        return kind

    def shapes_of_run(self, state: State, kinds: list[int]) -> list[int]:
        """:meth:`shapes` of jobs of ``kinds`` in order; a run of one kind of one task group (a
        steady stream) gathered up to each job at which the mix falls due, not job by job."""
        n, _, _, _, groups = self.kinds[kinds[0]]
        window = state.config.shape_window
        if len(groups) != 1 or groups[0][1] > window or kinds.count(kinds[0]) < len(kinds):
            return [self.shapes(state, k) for k in kinds]
        shape, count = groups[0]
        left = len(kinds)
        while left:
            jobs = min(left, max(1, -(-(state.mix_due - state.shapes_seen) // n)))  # (up to the mix's job)
            self._gather(state, shape, jobs * count, window)
            state.shapes_seen += jobs * n
            if state.shapes_seen >= state.mix_due:
                self._remember(state)
                take_shape_mix(state)
            left -= jobs
        return [n] * len(kinds)

    def _gather(self, state: State, shape: Shape, total: int, window: int) -> None:
        """``total`` tasks of ``shape`` (jobs of ``shape``'s count each, at most the window) into
        the gathered run, in calls of at most the window: each task is one slot's step of
        ``remember_shape`` however the calls are cut, while none is cut at the window."""
        while total:
            if self.shape != shape or self.shape_count == window:
                self._remember(state)
                self.shape, self.shape_count = shape, 0
            piece = min(total, window - self.shape_count)
            self.shape_count += piece
            total -= piece

    def _remember(self, state: State) -> None:
        """The gathered run of one shape into the shape window."""
        if self.shape is not None:
            remember_run(state, self.shape, self.shape_count)
            self.shape, self.shape_count = None, 0

    def write(self, state: State) -> None:
        """Add the rows (in the order their names were interned), write their columns and the
        run's entry sums and shapes."""
        self._remember(state)
        if self.cell_entries:
            _add_entries(state, SUM_JOB_CELLS, self.cell_entries)
        if self.dispatch_entries:
            _add_entries(state, SUM_DISPATCHES, self.dispatch_entries)
        if not self.jobs:
            return
        count, first = len(self.jobs), self.first_job
        state.jobs.add(count)
        state.tasks.add(self.tasks)
        jc, tc = state.jobs.cols, state.tasks.cols  # (after the adds: a table that grows gets new arrays)
        rows = np.array(self.jobs, dtype=np.int64)
        for i, name in enumerate(_JOB_COLUMNS):
            jc[name][first : first + count] = rows[:, i]
        kinds = rows[:, -1]
        totals = np.array([k[:4] for k in self.kinds], dtype=np.int64)[kinds]
        for i, name in enumerate(_KIND_COLUMNS):
            jc[name][first : first + count] = totals[:, i]
        per_job = totals[:, 0]
        tasks = slice(self.first_task, self.first_task + self.tasks)
        tc["job"][tasks] = np.repeat(np.arange(first, first + count, dtype=np.int64), per_job)
        table = [row for rows_of in self.kind_tasks for row in rows_of]
        starts = np.cumsum([0] + [len(r) for r in self.kind_tasks])[:-1]
        if len(table) == len(self.kind_tasks):  # (every kind one task: the kinds index the rows)
            source = kinds
        else:
            within = np.arange(self.tasks) - np.repeat(np.cumsum(per_job) - per_job, per_job)
            source = np.repeat(starts[kinds], per_job) + within
        values = np.array([row[:4] for row in table], dtype=np.int64)[source]
        for i, name in enumerate(_TASK_COLUMNS):
            tc[name][tasks] = values[:, i]
        tc["models"][tasks] = np.array([row[4] for row in table], dtype=np.uint64)[source]
        if any(row[5] for row in table):
            tc["cls"][tasks] = np.array([row[5] for row in table], dtype=np.int32)[source]


_ENCODE: Final = msgspec.msgpack.Encoder().encode


def _add_entries(state: State, which: int, entries: list[Any]) -> None:
    """:func:`~fleetlog.core.fold.add_entry` of each of ``entries`` (+1): the sum is order-free.
    (:func:`~fleetlog.core.arrays.entry_hash` inlined: a third less per entry.)"""
    blake, word = hashlib.blake2b, int.from_bytes
    change = sum([word(blake(_ENCODE(e), digest_size=8).digest(), "little") for e in entries])
    state.sums[which] = (state.sums[which] + change) & HASH_MASK


def remember_run(state: State, shape: Shape, count: int) -> None:
    """:func:`~fleetlog.core.fold.remember_shape` of ``count`` tasks of ``shape``: the same
    window, its ring filled with one extend while it is not full, and nothing but the slot
    moved when every slot it overwrites holds that shape already (a steady mix)."""
    window, ring, at = state.config.shape_window, state.recent_shapes, state.recent_next
    if len(ring) + count <= window and at == len(ring):
        ring.extend([shape] * count)
        key = shape_key(shape)
        row = state.shape_stats.get(key)
        if row is None:
            row = state.shape_stats[key] = [0, 0]
        row[0] += count
        row[1] += count * shape[2]
        change = sum(window_entry_hash(a, shape) for a in range(at, at + count))
        state.recent_next = (at + count) % window
        state.sums[SUM_RECENT_SHAPES] = (state.sums[SUM_RECENT_SHAPES] + change) & HASH_MASK
    elif len(ring) == window and at + count <= window and ring[at : at + count].count(shape) == count:
        state.recent_next = (at + count) % window
    else:
        remember_shape(state, shape, count)


def fold_submissions(
    state: State, events: Sequence[JobSubmitted | JobDispatched], times: Sequence[int]
) -> None:
    """:func:`fold` of each of ``events`` in order, at ``times``: the same state, with the new
    jobs' and tasks' columns written once for the run instead of job by job (:class:`NewJobs`),
    dispatches of new jobs too (a cell shard's runs of ``JobDispatched``). One by one when a
    node sweep or a hold's end falls due within the run (a dispatch moves the next hold's end:
    checked at each event); a dispatch the batch does not take (:func:`plain_dispatch`) is
    folded by the spec after the rows gathered so far are written."""
    if len(events) < 2 or max(times) >= next_due(state):
        for event, at_ms in zip(events, times, strict=True):
            fold(state, event, at_ms)
        return
    if dispatch_run(state, events, times):
        return
    new, due = NewJobs(state), next_due(state)
    for e, at_ms in zip(events, times, strict=True):
        if at_ms >= due or (type(e) is JobDispatched and plain_dispatch(state, e)):
            new.write(state)
            fold(state, e, at_ms)
            new, due = NewJobs(state), next_due(state)
            continue
        state.now_ms = max(state.now_ms, at_ms)
        state.offset += 1
        if type(e) is JobDispatched:
            new.dispatch(state, e)
            due = min(due, state.next_return_ms)
        else:
            new.take(state, e)  # type: ignore[arg-type]
    new.write(state)


def dispatch_run(state: State, events: Sequence[JobSubmitted | JobDispatched], times: Sequence[int]) -> bool:
    """Fold a run that is all dispatches of distinct jobs new to the shard, to cells it holds,
    with no node sweep or hold's end (the run's own first included) at or before its last
    time — a cell shard's steady input — all at once: the same state as
    :meth:`NewJobs.dispatch` event by event, each step a comprehension over the run. False,
    and nothing folded, for any other run."""
    if any(type(e) is not JobDispatched for e in events):
        return False
    sent: list[JobDispatched] = events  # type: ignore[assignment]
    specs = [e.job for e in sent]
    ids = [j.job_id for j in specs]
    names, config = state.names, state.config
    cell_names = [e.cell for e in sent]
    nows = list(accumulate(times, max, initial=state.now_ms))[1:]
    if (
        len(set(ids)) < len(ids)
        or not names["job"].ids.keys().isdisjoint(ids)
        or not state.retired.keys().isdisjoint(ids)
        or (config.cells and not set(cell_names).issubset(config.cells))
        or nows[-1] >= min(next_due(state), nows[0] + config.hold_ms)
    ):
        return False
    new, offset, first = NewJobs(state), state.offset, state.jobs.size
    cell_of = {c: names["cell"].intern(c) for c in dict.fromkeys(cell_names)}  # (first met, first interned)
    cells = [cell_of[c] for c in cell_names]
    seqs = [e.seq for e in sent]
    _raise_seqs(state, cells, seqs)
    names["job"].add_many(ids)
    rows = range(first, first + len(ids))
    tenant_of = {t: names["tenant"].intern(t) for t in dict.fromkeys([j.tenant for j in specs])}
    queue_of = {q: names["queue"].intern(q) for q in dict.fromkeys([j.queue for j in specs])}
    kind_of = new.kind_of
    kinds = [kind_of[g] if g in kind_of else new.kind(state, g) for g in [j.task_groups for j in specs]]
    tasks = new.shapes_of_run(state, kinds)
    firsts = list(accumulate(tasks, initial=new.first_task))[:-1]
    new.tasks = sum(tasks)
    new.jobs = list(zip(
        [tenant_of[j.tenant] for j in specs], [queue_of[j.queue] for j in specs], [j.priority for j in specs],
        nows, range(offset, offset + len(ids)), firsts,
        [topology_code(j) for j in specs],
        [-1 if j.expected_duration_ms is None else j.expected_duration_ms for j in specs], kinds,
        strict=True,
    ))  # fmt: skip
    allowed = {c: (c,) for c in cell_of.values()}
    new.cell_entries = [(job, allowed[c]) for job, c in zip(rows, cells, strict=True)]
    state.job_cells.update(new.cell_entries)
    entries = list(zip(cells, [e.attempt for e in sent], seqs, nows, strict=True))
    new.dispatch_entries = list(zip(rows, entries, strict=True))
    state.dispatches.update(new.dispatch_entries)
    state.held.update(zip(rows, [now + config.hold_ms for now in nows], strict=True))  # (new: never held)
    state.next_return_ms = min(state.next_return_ms, nows[0] + config.hold_ms)
    state.pending_count += len(ids)
    for job, spec in zip(rows, specs, strict=True):
        keep_meta(state, job, tenant_of[spec.tenant], spec)
    state.now_ms, state.offset = nows[-1], offset + len(ids)
    new.write(state)
    return True


def _raise_seqs(state: State, cells: list[int], seqs: list[int]) -> None:
    """``dispatched_seq`` of each cell: the largest of its seqs, the cells in the order met."""
    top: dict[int, int] = {}
    if cells.count(cells[0]) == len(cells):
        top[cells[0]] = max(seqs)  # (one cell: the common case)
    for cell, seq in zip(cells, seqs, strict=True) if not top else ():
        top[cell] = max(top.get(cell, 0), seq)
    for cell, seq in top.items():
        state.dispatched_seq[cell] = max(state.dispatched_seq.get(cell, 0), seq)


def plain_dispatch(state: State, e: JobDispatched) -> bool:
    """Whether ``fold.on_dispatched`` must fold ``e`` (it reads the job's columns): a job the
    shard knows (a resend, a reopen, a job of its own) or a cell it does not hold (ignored)."""
    cells = state.config.cells
    return bool(cells and e.cell not in cells) or state.known_job(e.job.job_id)


def _all_dispatches(events: Sequence[Event]) -> TypeGuard[Sequence[JobDispatched]]:
    """Whether every one of ``events`` is a ``JobDispatched`` (a cell shard's steady input)."""
    return all(type(e) is JobDispatched for e in events)


def _write_beats(state: State, beats: dict[int, int]) -> None:
    rows = np.fromiter(beats.keys(), dtype=np.int64, count=len(beats))
    state.nodes.cols["last_heartbeat_ms"][rows] = np.fromiter(
        beats.values(), dtype=np.int64, count=len(beats)
    )
    beats.clear()


# events whose fold neither reads nor writes heartbeat times, node status or the heartbeat
# caches (so steady heartbeats around them may be written later, all at once)
_BEAT_NEUTRAL: Final = frozenset(
    {JobSubmitted, JobCancelled, QuotaSet, TaskStarted, TaskFinished, TaskFailed}
)
_FEW: Final = 64


def fold_lists(state: State, events: Sequence[Event], times: Sequence[int]) -> None:
    """:func:`fold_many` of ``zip(events, times)``, the same state, for long runs of inputs.

    Steady heartbeats (the very objects ``beat_cache`` holds, before the next node sweep) are
    found with C-level lookups and their times written with numpy, a few calls per run
    instead of Python per event. The other events are folded one by one, with the clock and
    offset they would see; heartbeat times are written before any event that could read them.
    """
    n = len(events)
    if n and type(events[0]) is JobDispatched and max(times) < next_due(state) and _all_dispatches(events):
        fold_submissions(state, events, times)  # (what fold_many does with it: one run)
        return
    if n < _FEW:
        fold_many(state, zip(events, times, strict=True))
        return
    steady = state.derived.steady_ids
    rows = np.fromiter(map(steady.get, map(id, events), repeat(-1, n)), dtype=np.int64, count=n)
    slow = np.flatnonzero(rows < 0).tolist()
    if len(slow) > n // 2 or any(type(events[i]) is DecisionBatch for i in slow):
        fold_many(state, zip(events, times, strict=True))
        return
    state.derived.steady_gone = []  # (what a fold takes out of steady_ids, recorded while this runs)
    try:
        _fold_steady_runs(state, events, times, rows, slow)
    finally:
        state.derived.steady_gone = None


def _fold_steady_runs(
    state: State, events: Sequence[Event], times: Sequence[int], rows: Array, slow: list[int]
) -> None:
    """:func:`fold_lists`' fast path: ``rows`` holds each steady heartbeat's node row (-1 for
    the others, whose indices are ``slow``)."""
    n = len(events)
    at = np.fromiter(times, dtype=np.int64, count=n)
    now0, offset0 = state.now_ms, state.offset
    now_after = np.maximum.accumulate(np.maximum(at, now0))  # the clock after each event
    flushed = 0

    def flush(end: int) -> None:
        nonlocal flushed
        seg = rows[flushed:end]
        steady = seg >= 0
        hb = state.nodes.cols["last_heartbeat_ms"]  # (re-read: folding new nodes grows the table)
        np.maximum.at(hb, seg[steady], now_after[flushed:end][steady])  # times only grow
        flushed = end

    sweep = next_due(state)
    sweep_at = _first_at_or_after(at, 0, sweep)
    k = 0
    while True:
        j = min(slow[k] if k < len(slow) else n, sweep_at)
        if j >= n:
            break
        event, at_ms = events[j], int(at[j])
        if type(event) not in _BEAT_NEUTRAL or at_ms >= sweep:
            flush(j)
        state.now_ms = int(now_after[j - 1]) if j else now0
        state.offset = offset0 + j
        rows[j] = -1  # folded here, not in a flush
        fold(state, event, at_ms)
        if k < len(slow) and slow[k] == j:
            k += 1
        stale = _no_longer_steady(state, events, rows, j + 1)
        if stale:
            slow, k = sorted(set(slow[k:]) | set(stale)), 0
        if next_due(state) != sweep or sweep_at <= j:
            sweep = next_due(state)
            sweep_at = _first_at_or_after(at, j + 1, sweep)
    flush(n)
    state.now_ms = int(now_after[-1])
    state.offset = offset0 + n


def _no_longer_steady(state: State, events: Sequence[Event], rows: Array, start: int) -> list[int]:
    """Indices from ``start`` of heartbeats counted steady whose cache entry a fold just
    dropped (a node went down or reported something new): marked -1 in ``rows``."""
    if not state.derived.steady_gone:
        return []
    gone = np.fromiter(state.derived.steady_gone, dtype=np.int64)
    state.derived.steady_gone.clear()
    ids = np.fromiter(map(id, events[start:]), dtype=np.int64, count=len(events) - start)
    stale = start + np.flatnonzero(np.isin(ids, gone) & (rows[start:] >= 0))
    rows[stale] = -1
    return [int(i) for i in stale.tolist()]


def _first_at_or_after(at: Array, start: int, when: int) -> int:
    """The first index from ``start`` whose time is ``when`` or later (``len(at)``: none)."""
    hits = np.flatnonzero(at[start:] >= when)
    return start + int(hits[0]) if hits.size else at.size


_FEW_PLACED: Final = 8  # shorter runs of JobPlaced are folded one by one


def fold_decisions(state: State, decisions: Sequence[object]) -> None:
    """Apply a batch's decisions in order; runs of ``JobPlaced`` go to :func:`on_placed_many`."""
    i, n = 0, len(decisions)
    while i < n:
        j = i
        while j < n and type(decisions[j]) is JobPlaced:
            j += 1
        if j - i >= _FEW_PLACED:
            on_placed_many(state, decisions[i:j])  # type: ignore[arg-type]
            i = j
            continue
        for decision in decisions[i : max(j, i + 1)]:
            fold_decision(state, decision)
        i = max(j, i + 1)


def on_placed_many(state: State, placed: Sequence[JobPlaced]) -> None:
    """:func:`on_placed` of each of ``placed``, in order: when every one places one task of a
    pending job (no job twice) on an up node, all at once — the tasks' and nodes' columns with
    numpy (a GPU column at a time), the tenants' usage summed per (tenant, cell) in the order
    the spec first meets them; otherwise one by one (which raises at the first bad one, as it
    always did)."""
    one = [d.tasks[0] for d in placed if len(d.tasks) == 1]
    if len(one) < len(placed):
        for d in placed:
            on_placed(state, d)
        return
    job_ids, cell_ids, node_ids = state.names["job"].ids, state.names["cell"].ids, state.names["node"].ids
    jobs = [job_ids.get(d.job_id, -1) for d in placed]
    cells = [cell_ids.get(d.cell, -1) for d in placed]
    nodes = [node_ids.get(f"{d.cell}\x00{p.node}", -1) for d, p in zip(placed, one, strict=True)]
    jc, tc, nc = state.jobs.cols, state.tasks.cols, state.nodes.cols
    job_rows, node_rows = np.array(jobs, dtype=np.int64), np.array(nodes, dtype=np.int64)
    if (
        min(jobs) < 0
        or min(cells) < 0
        or min(nodes) < 0
        or len(set(jobs)) < len(jobs)
        or (jc["state"][job_rows] != JobState.PENDING).any()
        or (nc["status"][node_rows] != NodeStatus.UP).any()
    ):
        for d in placed:
            on_placed(state, d)
        return
    masks = np.array([_mask_of(p.gpu_indices) for p in one], dtype=np.uint64)
    tasks = jc["first_task"][job_rows] + np.array([p.task_index for p in one], dtype=np.int64)
    cpu, mem, milli, gpus = (tc[c][tasks] for c in ("cpu", "mem", "milli", "gpus"))
    free = (nc["cpu_free"], nc["mem_free"], nc["gpu_free"], nc["gpu_count"])
    _take_many(*free, node_rows, masks, cpu, mem, milli)
    tc["node"][tasks], tc["gpu_mask"][tasks] = node_rows, masks
    tc["state"][tasks] = _PLACED
    cell_rows = np.array(cells, dtype=np.int64)
    _count_usage_many(state, jc["tenant"][job_rows].astype(np.int64), cell_rows, cpu, mem, milli * gpus)
    texts, requeues = state.reason_text, state.requeues
    for job in [j for j in jobs if j in texts]:
        drop_reason_text(state, job)
    for job in [j for j in jobs if j in requeues]:
        del requeues[job]
    jc["state"][job_rows], jc["cell"][job_rows] = _RUNNING, cell_rows
    jc["placed_at_ms"][job_rows], jc["reason"][job_rows] = state.now_ms, 0
    state.pending_count -= len(jobs)


@numba.njit(cache=True)
def _take_many(
    cpu_free: Array, mem_free: Array, gpu_free: Array, gpu_count: Array, nodes: Array, masks: Array,
    cpu: Array, mem: Array, milli: Array,
) -> None:  # fmt: skip
    """:func:`~fleetlog.core.fold.take_task`'s node writes for each placement: its CPU and memory,
    and ``milli`` of each GPU of its mask that its node has (tasks may share a node, or a GPU)."""
    for k in range(nodes.shape[0]):
        node = nodes[k]
        cpu_free[node] -= cpu[k]
        mem_free[node] -= mem[k]
        mask = masks[k]
        for g in range(gpu_count[node]):
            if (mask >> np.uint64(g)) & np.uint64(1):
                gpu_free[node, g] -= milli[k]


@numba.njit(cache=True)
def _usage_sums(tenants: Array, cells: Array, amounts: Array) -> tuple[Array, Array]:
    """The (tenant, cell) pairs in the order first met, and the sum of ``amounts`` per pair."""
    width = cells.max() + 1
    index: dict[int, int] = {-1: -1}  # (typed by its first entry, a pair no row makes)
    first = np.empty(tenants.shape[0], dtype=np.int64)
    sums = np.zeros((tenants.shape[0], amounts.shape[1]), dtype=np.int64)
    k = 0
    for i in range(tenants.shape[0]):
        pair = tenants[i] * width + cells[i]
        if pair in index:
            j = index[pair]
        else:
            j = index[pair] = k
            first[k] = i
            k += 1
        sums[j] += amounts[i]
    return first[:k], sums[:k]


def _count_usage_many(state: State, tenants: Array, cells: Array, cpu: Array, mem: Array, gpu: Array) -> None:
    """The usage counters of each placement's (tenant, every cell) and (tenant, cell), summed per
    pair and added in the order the one-by-one fold first meets each pair (so the dict's keys
    come in the same order)."""
    amounts = np.stack([cpu, mem, gpu], axis=1).astype(np.int64)
    first, sums = _usage_sums(tenants, cells, amounts)
    usage = state.usage
    for row, (c, m, g) in zip(first.tolist(), sums.tolist(), strict=True):
        tenant, cell = int(tenants[row]), int(cells[row])
        for key in ((tenant, -1), (tenant, cell)):
            counter = usage.setdefault(key, [0, 0, 0])
            counter[0] += c
            counter[1] += m
            counter[2] += g


@functools.lru_cache(maxsize=1 << 12)
def _mask_of(gpu_indices: tuple[int, ...]) -> int:
    mask = 0
    for g in gpu_indices:
        mask |= 1 << g
    return mask
