"""``fold(state, event, at_ms)``: apply one event to the state. One short handler per type.

Inputs advance ``state.offset``; decisions (inside a :class:`DecisionBatch`) do not.
Event time is the log's append time ``at_ms``; the fold never reads a clock.  A
well-formed event never makes the fold fail: a reference to an unknown job or
node (a stale observation, a duplicate submission) is a counted no-op.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from itertools import repeat
from typing import Final

import numpy as np

from fleetlog.core.arrays import HASH_MASK, Array, entry_hash
from fleetlog.core.state import (
    FULL_GPU,
    MAX_GPU_MODELS,
    SUM_JOB_CELLS,
    SUM_REASON_TEXT,
    SUM_RECENT_SHAPES,
    TERMINAL,
    TEXT_IDS,
    TOPOLOGY_CODES,
    JobState,
    NodeStatus,
    Quota,
    Requeue,
    State,
    TaskState,
)
from fleetlog.events.model import (
    DecisionBatch,
    Event,
    JobCancelled,
    JobPending,
    JobPlaced,
    JobRejected,
    JobSubmitted,
    NodeHeartbeat,
    NodeRemoved,
    QuotaSet,
    Resources,
    TaskFailed,
    TaskFinished,
    TaskPreempted,
    TaskStarted,
)

CAUSE_CODES: Final = {"priority": 1, "reclaim": 2}
# Plain ints of the states written into columns: numpy probes an IntEnum member for the array
# protocols before storing it (through the enum metaclass, about a microsecond a store).
_UP: Final = int(NodeStatus.UP)
_RUNNING: Final = int(JobState.RUNNING)
_SUCCEEDED: Final = int(JobState.SUCCEEDED)
_REJECTED: Final = int(JobState.REJECTED)
_TASK_PENDING: Final = int(TaskState.PENDING)
_PLACED: Final = int(TaskState.PLACED)
_STARTED: Final = int(TaskState.STARTED)
_FINISHED: Final = int(TaskState.FINISHED)


class UnknownEventError(TypeError):
    """``fold`` was given something that is not an event of the vocabulary."""


def fold(state: State, event: Event, at_ms: int) -> None:
    """Apply ``event``, appended to its log at ``at_ms``, to ``state``."""
    if isinstance(event, DecisionBatch):
        fold_decisions(state, event.decisions)
        return
    advance_time(state, at_ms)
    state.offset += 1
    match event:
        case NodeHeartbeat():
            on_heartbeat(state, event)
        case JobSubmitted():
            on_submitted(state, event)
        case JobCancelled():
            on_cancelled(state, event)
        case NodeRemoved():
            on_node_removed(state, event)
        case TaskStarted():
            on_task_started(state, event)
        case TaskFinished():
            on_task_finished(state, event)
        case TaskFailed():
            on_task_failed(state, event)
        case QuotaSet():
            on_quota(state, event)
        case _:
            raise UnknownEventError(f"fold cannot apply {type(event).__name__}")


def fold_many(state: State, events: Iterable[tuple[Event, int]]) -> None:
    """Fold (event, at_ms) pairs in order: the same state as :func:`fold` one by one, faster.

    The hot path is the steady heartbeat of a known, up node that reports what it reported
    last time (often the very same object: readers decode repeated bytes once): only its
    heartbeat time changes, so those are gathered and written at once, and the offset and
    log time are kept in locals until some other event needs the state. Runs of submissions
    are folded together (:func:`fold_submissions`).

    Nothing deferred crosses a node sweep: the first event at or after the sweep time is
    folded by :func:`fold` after every deferred write, whatever its type, so the sweep reads
    the heartbeat times the events before it wrote — however the inputs were chunked.
    """
    beats: dict[int, int] = {}
    cache = state.beat_cache
    now, sweep, steady = state.now_ms, state.next_sweep_ms, 0
    run: list[JobSubmitted] = []  # consecutive submissions, folded together
    run_at: list[int] = []
    # (at most one of ``run`` and ``steady`` is open: each closes the other's offset and clock)
    for event, at_ms in events:
        if at_ms < sweep:
            if type(event) is JobSubmitted:
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
        fold(state, event, at_ms)
        now, sweep = state.now_ms, state.next_sweep_ms
    if run:
        fold_submissions(state, run, run_at)
    if steady:
        state.offset += steady
        state.now_ms = now
    if beats:
        _write_beats(state, beats)


_JOB_COLUMNS: Final = (
    "tenant", "queue", "priority", "submitted_at", "seq", "first_task", "ntasks", "topology",
    "expected_ms", "req_cpu", "req_mem", "req_gpu",
)  # fmt: skip
_TASK_COLUMNS: Final = ("job", "cpu", "mem", "gpus", "milli", "models")


class NewJobs:
    """The rows of jobs submitted one after another, gathered in order (names interned, allowed
    cells and the shape window kept as each job comes) and their columns written at once."""

    __slots__ = ("first_job", "first_task", "jobs", "tasks")

    def __init__(self, state: State) -> None:
        self.first_job, self.first_task = state.jobs.size, state.tasks.size
        self.jobs: list[list[int]] = [[] for _ in _JOB_COLUMNS]
        self.tasks: list[list[int]] = [[] for _ in _TASK_COLUMNS]

    def take(self, state: State, e: JobSubmitted) -> None:
        """Fold ``e`` (the clock and offset already moved to it) but for the column writes."""
        names = state.names
        job_names = names["job"]
        if e.job_id in job_names.ids:
            state.duplicates += 1
            return
        job = job_names.intern(e.job_id)
        tenant, queue, priority, submitted, seq, first, ntasks, topo, expected, req_cpu, req_mem, req_gpu = (
            self.jobs
        )
        tenant.append(names["tenant"].intern(e.tenant))
        queue.append(names["queue"].intern(e.queue))
        priority.append(e.priority)
        submitted.append(state.now_ms)
        seq.append(state.offset - 1)
        first.append(self.first_task + len(self.tasks[0]))
        topo.append(TOPOLOGY_CODES[e.required_topology] if e.required_topology else 0)
        expected.append(-1 if e.expected_duration_ms is None else e.expected_duration_ms)
        if e.allowed_cells:
            cells = tuple(sorted({names["cell"].intern(c) for c in e.allowed_cells}))
            state.job_cells[job] = cells
            add_entry(state, SUM_JOB_CELLS, (job, cells), 1)
        n, cpu, mem, gpu = self._take_tasks(state, e, job)
        ntasks.append(n)
        req_cpu.append(cpu)
        req_mem.append(mem)
        req_gpu.append(gpu)
        state.shapes_seen += n
        if state.shapes_seen >= state.mix_due:
            take_shape_mix(state)
        state.pending_count += 1

    def _take_tasks(self, state: State, e: JobSubmitted, job: int) -> tuple[int, int, int, int]:
        """The job's task rows, group by group, its shapes remembered; (tasks, cpu, mem, GPU
        milli) in all."""
        t_job, t_cpu, t_mem, t_gpus, t_milli, t_models = self.tasks
        n = cpu = mem = gpu = 0
        for g in e.task_groups:
            mask = 0
            for m in g.gpu_models:
                mask |= 1 << model_id(state, m)
            count = g.count
            n += count
            cpu += count * g.cpu_milli
            mem += count * g.mem_mib
            gpu += count * g.gpu_count * g.gpu_milli
            t_job.extend([job] * count)
            t_cpu.extend([g.cpu_milli] * count)
            t_mem.extend([g.mem_mib] * count)
            t_gpus.extend([g.gpu_count] * count)
            t_milli.extend([g.gpu_milli] * count)
            t_models.extend([mask] * count)
            remember_shape(state, (g.gpu_count, g.gpu_milli, g.cpu_milli), count)
        return n, cpu, mem, gpu

    def write(self, state: State) -> None:
        """Add the rows (in the order their names were interned) and write their columns."""
        state.jobs.add(len(self.jobs[0]))
        state.tasks.add(len(self.tasks[0]))
        jc, tc = state.jobs.cols, state.tasks.cols  # (after the adds: a table that grows gets new arrays)
        for cols, names, rows, start in (
            (jc, _JOB_COLUMNS, self.jobs, self.first_job),
            (tc, _TASK_COLUMNS, self.tasks, self.first_task),
        ):
            for name, values in zip(names, rows, strict=True):
                if len(values) == 1:  # (one job, one task: a scalar store is several times cheaper)
                    cols[name][start] = values[0]
                else:
                    cols[name][start : start + len(values)] = values


def fold_submissions(state: State, events: Sequence[JobSubmitted], times: Sequence[int]) -> None:
    """:func:`fold` of each of ``events`` in order, at ``times``: the same state, with the new
    jobs' and tasks' columns written once for the run instead of job by job (:class:`NewJobs`).
    One by one when a node sweep falls due within the run."""
    if len(events) < 2 or max(times) >= state.next_sweep_ms:
        for event, at_ms in zip(events, times, strict=True):
            fold(state, event, at_ms)
        return
    new = NewJobs(state)
    for e, at_ms in zip(events, times, strict=True):
        state.now_ms = max(state.now_ms, at_ms)
        state.offset += 1
        new.take(state, e)
    new.write(state)


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
    if n < _FEW:
        fold_many(state, zip(events, times, strict=True))
        return
    rows = np.fromiter(map(state.steady_ids.get, map(id, events), repeat(-1, n)), dtype=np.int64, count=n)
    slow = np.flatnonzero(rows < 0).tolist()
    if len(slow) > n // 2 or any(type(events[i]) is DecisionBatch for i in slow):
        fold_many(state, zip(events, times, strict=True))
        return
    state.steady_gone = []  # (what a fold takes out of steady_ids, recorded while this runs)
    try:
        _fold_steady_runs(state, events, times, rows, slow)
    finally:
        state.steady_gone = None


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

    sweep = state.next_sweep_ms
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
        if state.next_sweep_ms != sweep or sweep_at <= j:
            sweep = state.next_sweep_ms
            sweep_at = _first_at_or_after(at, j + 1, sweep)
    flush(n)
    state.now_ms = int(now_after[-1])
    state.offset = offset0 + n


def _no_longer_steady(state: State, events: Sequence[Event], rows: Array, start: int) -> list[int]:
    """Indices from ``start`` of heartbeats counted steady whose cache entry a fold just
    dropped (a node went down or reported something new): marked -1 in ``rows``."""
    if not state.steady_gone:
        return []
    gone = np.fromiter(state.steady_gone, dtype=np.int64)
    state.steady_gone.clear()
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


def fold_decision(state: State, decision: object) -> None:
    """Apply one decision of a batch."""
    match decision:
        case JobPlaced():
            on_placed(state, decision)
        case TaskPreempted():
            on_preempted(state, decision)
        case JobRejected():
            on_rejected(state, decision)
        case JobPending():
            on_pending(state, decision)
        case _:
            raise UnknownEventError(f"fold cannot apply decision {type(decision).__name__}")


# --- time --------------------------------------------------------------------------------


def advance_time(state: State, at_ms: int) -> None:
    """Move log time forward (never back) and mark nodes whose heartbeats stopped as down."""
    state.now_ms = max(state.now_ms, at_ms)
    if state.now_ms < state.next_sweep_ms:
        return
    timeout = state.config.node_timeout_ms
    state.next_sweep_ms = state.now_ms + max(1, timeout // 4)
    nodes = state.nodes
    stale = (nodes.view("status") == NodeStatus.UP) & (
        nodes.view("last_heartbeat_ms") < state.now_ms - timeout
    )
    for row in np.flatnonzero(stale).tolist():
        node_down(state, row, NodeStatus.DOWN, "node_lost")


_NODE_DOWN_TEXT: Final = {
    "node_lost": "node {node} lost (no heartbeat for {silent} s)",
    "node_unhealthy": "node {node} reported itself unhealthy",
    "node_reshaped": "node {node} reported a new shape (CPU or GPU count)",
    "node_removed": "node {node} was removed",
}


def node_down(state: State, row: int, status: NodeStatus, cause: str) -> None:
    """Take node ``row`` out of service and requeue every job with a task on it (whole gangs),
    noting why (``cause``: a key of ``_NODE_DOWN_TEXT``) for status and explain."""
    state.nodes.cols["status"][row] = int(status)
    name = state.node_name(row)
    forget_beat(state, name)
    on_node = np.flatnonzero(state.tasks.view("node") == row)
    jobs = sorted({int(state.tasks.cols["job"][t]) for t in on_node.tolist()})
    if not jobs:
        return
    silent = state.now_ms - int(state.nodes.cols["last_heartbeat_ms"][row]) if cause == "node_lost" else 0
    seconds = f"{silent // 1000}.{silent % 1000:03d}".rstrip("0").rstrip(".")  # 80, 63.5, 3.001
    text = _NODE_DOWN_TEXT[cause].format(node=name, silent=seconds)
    note = Requeue(cause, state.now_ms, state.offset, text, node=name, silent_ms=silent)
    for job in jobs:
        release_job(state, job, JobState.PENDING)
        state.requeues[job] = note


# --- inputs ------------------------------------------------------------------------------


def on_heartbeat(state: State, e: NodeHeartbeat) -> None:
    names, nodes = state.names, state.nodes
    key = f"{e.cell}\x00{e.node}"
    row = names["node"].get(key)
    if row < 0:
        row = names["node"].intern(key)
        nodes.add()
        set_node_shape(state, row, e)
    elif int(nodes.cols["cpu_alloc"][row]) != e.cpu_milli or int(nodes.cols["gpu_count"][row]) != e.gpu_count:
        node_down(state, row, NodeStatus.DOWN, "node_reshaped")  # drain it, then take the new shape
        set_node_shape(state, row, e)
    nodes.cols["last_heartbeat_ms"][row] = state.now_ms
    status = int(nodes.cols["status"][row])
    if not e.healthy and status == NodeStatus.UP:
        node_down(state, row, NodeStatus.DOWN, "node_unhealthy")
    elif e.healthy and status != NodeStatus.UP:
        nodes.cols["status"][row] = _UP
    if e.healthy:
        hit = state.beat_cache.get(e.node)
        if hit is None or hit[1] is not e:  # (the same object again stays steady for fold_lists)
            forget_beat(state, e.node)
            state.beat_cache[e.node] = (row, e)
            state.steady_ids[id(e)] = row


def forget_beat(state: State, node: str) -> None:
    """Drop ``node``'s steady heartbeat from the fast-path caches."""
    hit = state.beat_cache.pop(node, None)
    gone = state.steady_gone
    if hit is not None and state.steady_ids.pop(id(hit[1]), None) is not None and gone is not None:
        gone.append(id(hit[1]))


def set_node_shape(state: State, row: int, e: NodeHeartbeat) -> None:
    """Take allocatable capacity, model and topology from a heartbeat; the node must be empty."""
    c, names = state.nodes.cols, state.names
    c["cell"][row] = names["cell"].intern(e.cell)
    path = [f"{e.cell}\x00" + "/".join(e.topology[: i + 1]) for i in range(len(e.topology))]
    for level, name in zip(("block", "rack", "host"), path, strict=False):
        c[level][row] = names["topo"].intern(name)
    c["model"][row] = model_id(state, e.gpu_model) if e.gpu_count else -1
    c["cpu_alloc"][row] = c["cpu_free"][row] = e.cpu_milli
    c["mem_alloc"][row] = c["mem_free"][row] = e.mem_mib
    c["gpu_count"][row] = e.gpu_count
    c["gpu_free"][row, :] = 0
    c["gpu_free"][row, : e.gpu_count] = FULL_GPU


def model_id(state: State, model: str) -> int:
    """The id of a GPU model; models past the 64th share the last id (documented limit)."""
    return min(state.names["model"].intern(model), MAX_GPU_MODELS - 1)


def on_submitted(state: State, e: JobSubmitted) -> None:
    new = NewJobs(state)
    new.take(state, e)
    new.write(state)


def take_shape_mix(state: State) -> None:
    """Take the shape mix from the window now, and when to take it next: at every doubling
    of the tasks seen until the window is full, then every ``shape_mix_every`` tasks."""
    live = [(key, n, cpu) for key, (n, cpu) in state.shape_stats.items() if n > 0]
    top = sorted(live, key=lambda entry: (-entry[1], entry[0]))[:MAX_SHAPES]
    state.shape_mix = tuple((g, m, cpu // n, n) for (g, m), n, cpu in top)
    seen, config = state.shapes_seen, state.config
    if seen < config.shape_window:
        state.mix_due = min(2 * seen, config.shape_window)
    else:
        state.mix_due = seen + max(1, config.shape_mix_every)


MAX_SHAPES: Final = 32  # rows of the shape mix: the most common (gpus, milli) of the window


def remember_shape(state: State, shape: tuple[int, int, int], count: int) -> None:
    """Keep the last ``shape_window`` task shapes: the distribution the FGD score measures against."""
    window, change = state.config.shape_window, 0
    ring, stats, at = state.recent_shapes, state.shape_stats, state.recent_next
    key, cpu = (shape[0], shape[1]), shape[2]
    for _ in range(min(count, window)):
        if len(ring) < window:
            ring.append(shape)
        else:
            old = ring[at]
            gone = stats[old[0], old[1]]
            gone[0] -= 1
            gone[1] -= old[2]
            change -= _window_entry_hash(at, old)
            ring[at] = shape
        row = stats.get(key)
        if row is None:
            row = stats[key] = [0, 0]
        row[0] += 1
        row[1] += cpu
        change += _window_entry_hash(at, shape)
        at = (at + 1) % window
    state.recent_next = at
    state.sums[SUM_RECENT_SHAPES] = (state.sums[SUM_RECENT_SHAPES] + change) & HASH_MASK


@functools.lru_cache(maxsize=1 << 16)
def _window_entry_hash(at: int, shape: tuple[int, int, int]) -> int:
    """``entry_hash((at, shape))``, remembered: a window slot sees the same few shapes again."""
    return entry_hash((at, shape))


def count_shape(state: State, shape: tuple[int, int, int], sign: int) -> None:
    stats = state.shape_stats.setdefault((shape[0], shape[1]), [0, 0])
    stats[0] += sign
    stats[1] += sign * shape[2]


def on_cancelled(state: State, e: JobCancelled) -> None:
    job = state.job_row(e.job_id)
    if job < 0 or int(state.jobs.cols["state"][job]) in TERMINAL:
        state.ignored += 1
        return
    release_job(state, job, JobState.CANCELLED)


def on_node_removed(state: State, e: NodeRemoved) -> None:
    row = state.node_row(e.cell, e.node)
    if row < 0:
        state.ignored += 1
        return
    node_down(state, row, NodeStatus.REMOVED, "node_removed")


def task_row(state: State, job_id: str, index: int) -> int:
    """The task row for (job, index) of a running job, or -1."""
    job = state.job_row(job_id)
    if (
        job < 0
        or index >= int(state.jobs.cols["ntasks"][job])
        or int(state.jobs.cols["state"][job]) != JobState.RUNNING
    ):
        return -1
    return int(state.jobs.cols["first_task"][job]) + index


def on_task_started(state: State, e: TaskStarted) -> None:
    t = task_row(state, e.job_id, e.task_index)
    if t < 0 or int(state.tasks.cols["state"][t]) != TaskState.PLACED:
        state.ignored += 1
        return
    state.tasks.cols["state"][t] = _STARTED


def on_task_finished(state: State, e: TaskFinished) -> None:
    t = task_row(state, e.job_id, e.task_index)
    if t < 0 or int(state.tasks.cols["state"][t]) == TaskState.FINISHED:
        state.ignored += 1
        return
    job = int(state.tasks.cols["job"][t])
    if e.exit_code != 0:
        release_job(state, job, JobState.FAILED)
        return
    free_task(state, t)
    state.tasks.cols["state"][t] = _FINISHED
    state.jobs.cols["tasks_done"][job] += 1
    if state.jobs.cols["tasks_done"][job] == state.jobs.cols["ntasks"][job]:
        state.jobs.cols["state"][job] = _SUCCEEDED


def on_task_failed(state: State, e: TaskFailed) -> None:
    t = task_row(state, e.job_id, e.task_index)
    if t < 0:
        state.ignored += 1
        return
    release_job(state, int(state.tasks.cols["job"][t]), JobState.FAILED)


def on_quota(state: State, e: QuotaSet) -> None:
    tenant = state.tenant_id(e.tenant)
    cell = state.names["cell"].intern(e.cell) if e.cell else -1
    limit = None if e.borrowing_limit is None else triple(e.borrowing_limit)
    state.quotas[(tenant, cell)] = Quota(triple(e.nominal), limit, e.cohort, e.weight_milli)


def triple(r: Resources) -> tuple[int, int, int]:
    return (r.cpu_milli, r.mem_mib, r.gpu_milli)


# --- decisions ---------------------------------------------------------------------------


def on_placed(state: State, d: JobPlaced) -> None:
    job = state.job_row(d.job_id)
    cell = state.names["cell"].get(d.cell)
    if job < 0 or int(state.jobs.cols["state"][job]) != JobState.PENDING or cell < 0:
        raise ValueError(f"decision places job {d.job_id!r}, which is not pending in cell {d.cell!r}")
    first = int(state.jobs.cols["first_task"][job])
    for p in d.tasks:
        mask = 0
        for g in p.gpu_indices:
            mask |= 1 << g
        take_task(state, first + p.task_index, state.node_row(d.cell, p.node), mask, cell)
    state.jobs.cols["state"][job] = _RUNNING
    state.jobs.cols["cell"][job] = cell
    state.jobs.cols["placed_at_ms"][job] = state.now_ms
    state.jobs.cols["reason"][job] = 0
    drop_reason_text(state, job)
    state.requeues.pop(job, None)
    state.pending_count -= 1


def on_placed_many(state: State, placed: Sequence[JobPlaced]) -> None:
    """:func:`on_placed` of each of ``placed``, in order: when every one places one task of a
    pending job (no job twice) on an up node, all at once; otherwise one by one (which
    raises at the first bad one, as it always did)."""
    job_ids, cell_ids = state.names["job"].ids, state.names["cell"].ids
    jobs, cells, nodes, masks, indices = [], [], [], [], []
    for d in placed:
        if len(d.tasks) != 1:
            break
        p = d.tasks[0]
        jobs.append(job_ids.get(d.job_id, -1))
        cells.append(cell_ids.get(d.cell, -1))
        nodes.append(state.node_row(d.cell, p.node))
        masks.append(_mask_of(p.gpu_indices))
        indices.append(p.task_index)
    jc, tc, nc = state.jobs.cols, state.tasks.cols, state.nodes.cols
    job_rows, node_rows = np.array(jobs, dtype=np.int64), np.array(nodes, dtype=np.int64)
    if (
        len(jobs) < len(placed)
        or min(jobs) < 0
        or min(cells) < 0
        or min(nodes) < 0
        or len(set(jobs)) < len(jobs)
        or (jc["state"][job_rows] != JobState.PENDING).any()
        or (nc["status"][node_rows] != NodeStatus.UP).any()
    ):
        for d in placed:
            on_placed(state, d)
        return
    tasks = jc["first_task"][job_rows] + np.array(indices, dtype=np.int64)
    cpu, mem, milli, gpus = (tc[c][tasks] for c in ("cpu", "mem", "milli", "gpus"))
    np.subtract.at(nc["cpu_free"], node_rows, cpu)
    np.subtract.at(nc["mem_free"], node_rows, mem)
    counts = nc["gpu_count"][node_rows].tolist()
    gpu_rows, gpu_cols, gpu_take = [], [], []
    for node, mask, count, share in zip(nodes, masks, counts, milli.tolist(), strict=True):
        for g in mask_gpus(mask & ((1 << count) - 1)):
            gpu_rows.append(node)
            gpu_cols.append(g)
            gpu_take.append(share)
    where = (np.array(gpu_rows, dtype=np.int64), np.array(gpu_cols, dtype=np.int64))
    np.subtract.at(nc["gpu_free"], where, np.array(gpu_take, dtype=nc["gpu_free"].dtype))
    tc["node"][tasks], tc["gpu_mask"][tasks] = node_rows, np.array(masks, dtype=np.uint64)
    tc["state"][tasks] = _PLACED
    tenants = jc["tenant"][job_rows].tolist()
    requests = zip(cpu.tolist(), mem.tolist(), (milli * gpus).tolist(), strict=True)
    for job, tenant, cell, (c, m, g) in zip(jobs, tenants, cells, requests, strict=True):
        for key in ((tenant, -1), (tenant, cell)):
            counter = state.usage.setdefault(key, [0, 0, 0])
            counter[0] += c
            counter[1] += m
            counter[2] += g
        if job in state.reason_text:
            drop_reason_text(state, job)
        if job in state.requeues:
            del state.requeues[job]
    jc["state"][job_rows], jc["cell"][job_rows], jc["placed_at_ms"][job_rows] = _RUNNING, cells, state.now_ms
    jc["reason"][job_rows] = 0
    state.pending_count -= len(jobs)


@functools.lru_cache(maxsize=1 << 12)
def _mask_of(gpu_indices: tuple[int, ...]) -> int:
    mask = 0
    for g in gpu_indices:
        mask |= 1 << g
    return mask


def on_preempted(state: State, d: TaskPreempted) -> None:
    job = state.job_row(d.job_id)
    if job < 0 or int(state.jobs.cols["state"][job]) != JobState.RUNNING:
        return  # the gang was already requeued by an earlier task of the same decision
    release_job(state, job, JobState.PENDING)
    state.jobs.cols["preempted_at_ms"][job] = state.now_ms
    state.jobs.cols["preempt_cause"][job] = CAUSE_CODES.get(d.cause, 0)
    state.requeues[job] = Requeue(
        "preempted",
        state.now_ms,
        state.offset,  # (a batch is folded at its ``as_of``)
        f"preempted by job {d.by_job_id} ({d.cause})",
        by_job_id=d.by_job_id,
        preempt_cause=d.cause,
    )


def on_rejected(state: State, d: JobRejected) -> None:
    job = state.job_row(d.job_id)
    if job >= 0 and int(state.jobs.cols["state"][job]) == JobState.PENDING:
        state.jobs.cols["state"][job] = _REJECTED
        drop_reason_text(state, job)
        state.requeues.pop(job, None)
        state.pending_count -= 1


def on_pending(state: State, d: JobPending) -> None:
    job = state.job_row(d.job_id)
    if job >= 0:
        state.jobs.cols["reason"][job] = state.reason_codes.intern(d.reason) + 1
        set_reason_text(state, job, d.message)


def set_reason_text(state: State, job: int, text: str) -> None:
    """Record why ``job`` waits, keeping the digest's entry sum and the text ids."""
    drop_reason_text(state, job)
    state.reason_text[job] = text
    add_entry(state, SUM_REASON_TEXT, (job, text), 1)
    if len(state.text_index) >= TEXT_IDS:  # bounded: number the texts in use afresh
        number_reason_texts(state)
    else:
        state.text_ids.put(job, state.text_index.setdefault(text, len(state.text_index)))


def number_reason_texts(state: State) -> None:
    """Give every job's reason text its id in ``text_ids``, numbering the texts afresh."""
    state.text_index.clear()
    for row, text in state.reason_text.items():
        state.text_ids.put(row, state.text_index.setdefault(text, len(state.text_index)))


def drop_reason_text(state: State, job: int) -> None:
    old = state.reason_text.pop(job, None)
    if old is not None:
        add_entry(state, SUM_REASON_TEXT, (job, old), -1)
        state.text_ids.put(job, -1)


def add_entry(state: State, which: int, entry: tuple[object, ...], sign: int) -> None:
    """Keep ``state.sums[which]`` (see ``State.sums``) as ``entry`` comes (+1) or goes (-1)."""
    state.sums[which] = (state.sums[which] + sign * entry_hash(entry)) & HASH_MASK


# --- allocation --------------------------------------------------------------------------


def usage_rows(state: State, job: int, cell: int) -> tuple[list[int], list[int]]:
    """The tenant's usage counters: in every cell, and in ``cell``."""
    tenant = int(state.jobs.cols["tenant"][job])
    total = state.usage.setdefault((tenant, -1), [0, 0, 0])
    in_cell = state.usage.setdefault((tenant, cell), [0, 0, 0])
    return total, in_cell


def take_task(state: State, t: int, node: int, mask: int, cell: int) -> None:
    tc, nc = state.tasks.cols, state.nodes.cols
    if node < 0 or int(nc["status"][node]) != NodeStatus.UP:
        raise ValueError(f"decision places task {t} on node {node}, which is not up")
    cpu, mem, milli = int(tc["cpu"][t]), int(tc["mem"][t]), int(tc["milli"][t])
    nc["cpu_free"][node] -= cpu
    nc["mem_free"][node] -= mem
    if mask:
        _shift_gpus(nc, node, mask, -milli)
    tc["node"][t], tc["gpu_mask"][t], tc["state"][t] = node, mask, _PLACED
    _count_usage(state, int(tc["job"][t]), cell, cpu, mem, milli * int(tc["gpus"][t]))


def free_task(state: State, t: int) -> None:
    """Give task ``t``'s resources back to its node and its tenant's usage."""
    tc, nc = state.tasks.cols, state.nodes.cols
    node = int(tc["node"][t])
    if node < 0:
        return
    cpu, mem, milli, mask = int(tc["cpu"][t]), int(tc["mem"][t]), int(tc["milli"][t]), int(tc["gpu_mask"][t])
    nc["cpu_free"][node] += cpu
    nc["mem_free"][node] += mem
    if mask:
        _shift_gpus(nc, node, mask, milli)
    tc["node"][t], tc["gpu_mask"][t] = -1, 0
    job = int(tc["job"][t])
    _count_usage(state, job, int(state.jobs.cols["cell"][job]), -cpu, -mem, -milli * int(tc["gpus"][t]))


def _shift_gpus(nc: dict[str, Array], node: int, mask: int, delta: int) -> None:
    """Add ``delta`` to the free share of the node's GPUs in ``mask`` (those it has)."""
    row = nc["gpu_free"][node]
    for g in mask_gpus(mask & ((1 << int(nc["gpu_count"][node])) - 1)):
        row[g] += delta  # scalar stores: several times cheaper than one fancy-indexed store


def _count_usage(state: State, job: int, cell: int, cpu: int, mem: int, gpu: int) -> None:
    for counter in usage_rows(state, job, cell):
        counter[0] += cpu
        counter[1] += mem
        counter[2] += gpu


@functools.lru_cache(maxsize=1 << 12)
def mask_gpus(mask: int) -> tuple[int, ...]:
    """The GPU indices set in ``mask`` (ascending)."""
    return tuple(g for g in range(mask.bit_length()) if mask >> g & 1)


def release_job(state: State, job: int, to: JobState) -> None:
    """Free every task of ``job`` and move it to ``to`` (PENDING requeues the whole gang)."""
    jc = state.jobs.cols
    was = int(jc["state"][job])
    for t in state.job_tasks(job):
        free_task(state, t)
        state.tasks.cols["state"][t] = _TASK_PENDING if to == JobState.PENDING else _FINISHED
    jc["state"][job] = int(to)
    if to != JobState.PENDING:
        state.requeues.pop(job, None)
    jc["cell"][job] = -1
    jc["tasks_done"][job] = 0
    if was == JobState.PENDING and to != JobState.PENDING:
        state.pending_count -= 1
    elif was != JobState.PENDING and to == JobState.PENDING:
        state.pending_count += 1
