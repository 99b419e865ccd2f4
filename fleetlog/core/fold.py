"""``fold(state, event, at_ms)``: apply one event to the state. One short handler per type.

Inputs advance ``state.offset``; decisions (inside a :class:`DecisionBatch`) do not.
Event time is the log's append time ``at_ms``; the fold never reads a clock.  A
well-formed event never makes the fold fail: a reference to an unknown job or
node (a stale observation, a duplicate submission) is a counted no-op.

This module is the spec, one event at a time. The service and replay fold in bulk through
its batch twins (:mod:`fleetlog.core.fold_batch`: the same state, faster), which import it;
it imports none of them. The handlers keep the droppable caches of ``state.derived`` as they
go (reason-text ids, the last heartbeat of each up node: see
:class:`~fleetlog.core.state.Derived`).
"""

from __future__ import annotations

import functools
from typing import Final

import msgspec
import numpy as np

from fleetlog.core import observe
from fleetlog.core.arrays import HASH_MASK, Array, entry_hash
from fleetlog.core.compact import compact
from fleetlog.core.constraints import (
    NO_ATTRS,
    NO_CLASS,
    ClassKey,
    NodeAttrs,
    class_key,
    node_attrs_of,
    untolerated,
)
from fleetlog.core.kernels.base import CPU_BOUND_MARK
from fleetlog.core.state import (
    FULL_GPU,
    MAX_GPU_MODELS,
    NO_LIMIT,
    RETIRABLE,
    SPREAD_HOST,
    SUM_CLASSES,
    SUM_DISPATCHES,
    SUM_JOB_CELLS,
    SUM_NODE_ATTRS,
    SUM_NODE_FOREIGN,
    SUM_REASON_TEXT,
    SUM_RECENT_SHAPES,
    SUM_RETIRED,
    SUM_RETURNED,
    TERMINAL,
    TEXT_IDS,
    TOPOLOGY_CODES,
    JobState,
    NodeStatus,
    Quota,
    Requeue,
    State,
    TaskState,
    shape_key,
)
from fleetlog.events.model import (
    DecisionBatch,
    Event,
    JobCancelled,
    JobDispatched,
    JobPending,
    JobPlaced,
    JobRejected,
    JobReturned,
    JobSubmitted,
    NodeDrained,
    NodeHeartbeat,
    NodeRemoved,
    PolicySet,
    QuotaSet,
    Resources,
    TaskFailed,
    TaskFinished,
    TaskGroup,
    TaskPreempted,
    TaskStarted,
    Tick,
)

CAUSE_CODES: Final = {"priority": 1, "reclaim": 2}
# Plain ints of the states written into columns: numpy probes an IntEnum member for the array
# protocols before storing it (through the enum metaclass, about a microsecond a store).
_UP: Final = int(NodeStatus.UP)
_PENDING: Final = int(JobState.PENDING)
_RUNNING: Final = int(JobState.RUNNING)
_RETURNED: Final = int(JobState.RETURNED)
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
        for decision in event.decisions:
            fold_decision(state, decision)
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
        case NodeDrained():
            on_node_drained(state, event)
        case TaskStarted():
            on_task_started(state, event)
        case TaskFinished():
            on_task_finished(state, event)
        case TaskFailed():
            on_task_failed(state, event)
        case QuotaSet():
            on_quota(state, event)
        case PolicySet():
            state.policy = event  # (the API's policy: no decision reads it)
        case Tick():
            pass  # (log time moved on: advance_time above did all a tick does)
        case JobDispatched():
            on_dispatched(state, event)
        case _:
            raise UnknownEventError(f"fold cannot apply {type(event).__name__}")


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
    """Move log time forward (never back), hand back dispatched jobs held too long; at each
    sweep, mark nodes whose heartbeats stopped as down and retire the jobs that ended long
    enough ago (:func:`retire`)."""
    state.now_ms = max(state.now_ms, at_ms)
    if state.now_ms >= state.next_return_ms:
        hand_back(state)
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
    retire(state)


_RETIRABLE_CODES: Final = np.array([int(s) for s in RETIRABLE], dtype=np.int8)
_RETIRED: Final = int(JobState.RETIRED)


def retire(state: State) -> None:
    """The sweep's retirement (log time, so replay retires the same jobs at the same offsets):
    forget the ids retired longer than ``dedup_window_ms`` ago; retire every job that ended
    ``retain_finished_ms`` ago or earlier — its id released (remembered for the dedup window),
    its collections' entries dropped, its tenant's counter of its end state raised, its rows
    left free (``RETIRED``) — and compact the tables once free rows dominate."""
    config, now = state.config, state.now_ms
    order, retired = state.retired_order, state.retired
    while order and order[0][0] <= now - config.dedup_window_ms:
        at, name = order.popleft()
        if retired.get(name) == at:  # (else it retired again since: a later entry expires it)
            del retired[name]
            add_entry(state, SUM_RETIRED, (name, at), -1)
    if config.retain_finished_ms is None:
        return
    jc = state.jobs.cols
    states, ended = state.jobs.view("state"), state.jobs.view("ended_at_ms")
    due = np.isin(states, _RETIRABLE_CODES) & (ended >= 0) & (ended <= now - config.retain_finished_ms)
    rows = np.flatnonzero(due)
    if not rows.size:
        return
    names = state.names["job"]
    tenants, codes = jc["tenant"][rows].tolist(), states[rows].tolist()
    for row, tenant, code in zip(rows.tolist(), tenants, codes, strict=True):
        name = names.names[row]
        names.release(name)
        old = retired.pop(name, None)
        if old is not None:
            add_entry(state, SUM_RETIRED, (name, old), -1)
        retired[name] = now
        order.append((now, name))
        add_entry(state, SUM_RETIRED, (name, now), 1)
        counts = state.retired_counts.setdefault(tenant, [0] * len(RETIRABLE))
        counts[RETIRABLE.index(code)] += 1
        drop_reason_text(state, row)
        state.requeues.pop(row, None)
        meta = state.job_meta.pop(row, None)
        if meta is not None:
            state.derived.count_meta(tenant, *meta, -1)
        state.held.pop(row, None)
        cells = state.job_cells.pop(row, None)
        if cells is not None:
            add_entry(state, SUM_JOB_CELLS, (row, cells), -1)
        sent = state.dispatches.pop(row, None)
        if sent is not None:
            add_entry(state, SUM_DISPATCHES, (row, sent), -1)
    states[rows] = _RETIRED
    state.retired_rows += int(rows.size)
    if state.retired_rows >= config.compact_min_rows and state.retired_rows > state.live_jobs():
        compact(state)


def next_due(state: State) -> int:
    """The log time at which folding must next run :func:`advance_time`'s work (a node sweep
    or a hold's end): the batch twins defer nothing across it."""
    return min(state.next_sweep_ms, state.next_return_ms)


_NODE_DOWN_TEXT: Final = {
    "node_lost": "node {node} lost (no heartbeat for {silent} s)",
    "node_unhealthy": "node {node} reported itself unhealthy",
    "node_reshaped": "node {node} reported a new shape (CPU or GPU count)",
    "node_removed": "node {node} was removed",
    "node_tainted": "node {node} has taint {taint} (NoExecute) that the job does not tolerate",
}


def node_down(state: State, row: int, status: NodeStatus, cause: str) -> None:
    """Take node ``row`` out of service and requeue every job with a task on it (whole gangs),
    noting why (``cause``: a key of ``_NODE_DOWN_TEXT``) for status and explain."""
    state.nodes.cols["status"][row] = int(status)
    name = state.node_name(row)
    state.derived.forget_beat(name)
    on_node = np.flatnonzero(state.tasks.view("node") == row)
    jobs = sorted({int(state.tasks.cols["job"][t]) for t in on_node.tolist()})
    if jobs:
        requeue(state, jobs, row, cause)


def requeue(state: State, jobs: list[int], row: int, cause: str, taint: str = "") -> None:
    """Requeue ``jobs`` (whole gangs) because of node ``row``, noting ``cause``."""
    name = state.node_name(row)
    silent = state.now_ms - int(state.nodes.cols["last_heartbeat_ms"][row]) if cause == "node_lost" else 0
    seconds = f"{silent // 1000}.{silent % 1000:03d}".rstrip("0").rstrip(".")  # 80, 63.5, 3.001
    text = _NODE_DOWN_TEXT[cause].format(node=name, silent=seconds, taint=taint)
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
        state.derived.attrs_version += 1  # (a new row: every class's eligibility grows)
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
    if e.labels or e.taints or e.unschedulable or row in state.node_attrs:  # (most fleets: none)
        attrs = node_attrs_of(e)
        if row in state.drained:  # (an operator's drain holds whatever the heartbeat says)
            state.drained[row] = (state.drained[row][0], e.unschedulable)
            attrs = (attrs[0], attrs[1], True)
        if attrs != state.node_attrs.get(row, NO_ATTRS):
            set_node_attrs(state, row, attrs)
    held = True
    if e.foreign_cpu_milli or e.foreign_mem_mib or e.foreign_gpus or row in state.node_foreign:
        want = (e.foreign_cpu_milli, e.foreign_mem_mib, e.foreign_gpus)
        old = state.node_foreign.get(row)
        if old is None or old[:3] != want or not _holds_all(old):
            held = set_node_foreign(state, row, *want)
    if e.healthy and held:
        state.derived.remember_beat(e.node, row, e)  # (for the batch fold's steady heartbeats)
    elif not held:  # (the same heartbeat again must come back here: fleetlog's tasks may have left)
        state.derived.forget_beat(e.node)


def set_node_foreign(state: State, row: int, cpu: int, mem: int, gpus: int) -> bool:
    """Work this scheduler does not own now holds ``cpu``, ``mem`` and ``gpus`` whole GPUs of
    node ``row``: the node's free capacity is short of them. Only what is free can be held (the
    backend saw foreign work start on what fleetlog's tasks hold, a race the real system
    settles): the rest is taken when the same heartbeat comes again after those tasks left.
    GPUs held before stay held, then free ones are taken from the highest index down.
    Whether all of it is held."""
    nc = state.nodes.cols
    old = state.node_foreign.pop(row, None)
    kept = 0
    if old is not None:
        add_entry(state, SUM_NODE_FOREIGN, (row, old), -1)
        nc["cpu_free"][row] += old[3]
        nc["mem_free"][row] += old[4]
        _shift_gpus(nc, row, old[5], FULL_GPU)
        kept = old[5]
    if not (cpu or mem or gpus):
        return True
    take_cpu = min(cpu, max(int(nc["cpu_free"][row]), 0))
    take_mem = min(mem, max(int(nc["mem_free"][row]), 0))
    nc["cpu_free"][row] -= take_cpu
    nc["mem_free"][row] -= take_mem
    free, count = nc["gpu_free"][row], int(nc["gpu_count"][row])
    down = range(count - 1, -1, -1)
    mask = taken = 0
    for g in [g for g in down if kept >> g & 1] + [g for g in down if not kept >> g & 1]:
        if taken == gpus:
            break
        if int(free[g]) == FULL_GPU:
            mask |= 1 << g
            taken += 1
    _shift_gpus(nc, row, mask, -FULL_GPU)
    entry = (cpu, mem, gpus, take_cpu, take_mem, mask)
    state.node_foreign[row] = entry
    add_entry(state, SUM_NODE_FOREIGN, (row, entry), 1)
    return _holds_all(entry)


def _holds_all(f: tuple[int, int, int, int, int, int]) -> bool:
    return f[0] == f[3] and f[1] == f[4] and f[2] == f[5].bit_count()


def set_node_attrs(state: State, row: int, attrs: NodeAttrs) -> None:
    """Node ``row``'s labels, taints and cordon are now ``attrs``; a ``NoExecute`` taint
    requeues the gangs on it with a task that does not tolerate it."""
    old = state.node_attrs.pop(row, None)
    if old is not None:
        add_entry(state, SUM_NODE_ATTRS, (row, old), -1)
    if attrs != NO_ATTRS:
        state.node_attrs[row] = attrs
        add_entry(state, SUM_NODE_ATTRS, (row, attrs), 1)
    state.derived.attrs_version += 1
    if not any(t[2] == "NoExecute" for t in attrs[1]):
        return
    tc = state.tasks.cols
    on_node = np.flatnonzero(state.tasks.view("node") == row)
    evicted: dict[int, str] = {}
    for t in on_node.tolist():
        job = int(tc["job"][t])
        taint = untolerated(state.classes[int(tc["cls"][t])], attrs, ("NoExecute",))
        if taint is not None and job not in evicted:
            evicted[job] = f"{taint[0]}{'=' + taint[1] if taint[1] else ''}"
    for job in sorted(evicted):
        requeue(state, [job], row, "node_tainted", evicted[job])


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
    old = state.node_foreign.pop(row, None)
    if old is not None:  # (all free again: the heartbeat holds its foreign work anew)
        add_entry(state, SUM_NODE_FOREIGN, (row, old), -1)


def model_id(state: State, model: str) -> int:
    """The id of a GPU model; models past the 64th share the last id (documented limit)."""
    return min(state.names["model"].intern(model), MAX_GPU_MODELS - 1)


def on_submitted(state: State, e: JobSubmitted) -> None:
    """A new pending job: its row, then its tasks' rows group by group (a job id seen before
    is a duplicate, counted and dropped)."""
    names = state.names
    if state.known_job(e.job_id):  # (a retired job's id too, within the dedup window)
        state.duplicates += 1
        return
    job = names["job"].intern(e.job_id)
    state.jobs.add()
    jc = state.jobs.cols
    jc["tenant"][job] = names["tenant"].intern(e.tenant)
    jc["queue"][job] = names["queue"].intern(e.queue)
    jc["priority"][job] = e.priority
    jc["submitted_at"][job] = state.now_ms
    jc["seq"][job] = state.offset - 1
    jc["first_task"][job] = state.tasks.size
    jc["topology"][job] = topology_code(e)
    jc["expected_ms"][job] = -1 if e.expected_duration_ms is None else e.expected_duration_ms
    if e.allowed_cells:
        cells = tuple(sorted({names["cell"].intern(c) for c in e.allowed_cells}))
        state.job_cells[job] = cells
        add_entry(state, SUM_JOB_CELLS, (job, cells), 1)
    totals = [0, 0, 0, 0]  # tasks, cpu, mem, GPU milli
    for g in e.task_groups:
        add_tasks(state, job, g)
        for i, amount in enumerate((1, g.cpu_milli, g.mem_mib, g.gpu_count * g.gpu_milli)):
            totals[i] += g.count * amount
    for name, value in zip(("ntasks", "req_cpu", "req_mem", "req_gpu"), totals, strict=True):
        jc[name][job] = value
    state.shapes_seen += totals[0]
    if state.shapes_seen >= state.mix_due:
        take_shape_mix(state)
    state.pending_count += 1
    keep_meta(state, job, int(jc["tenant"][job]), e)


def keep_meta(state: State, job: int, tenant: int, e: JobSubmitted) -> None:
    """Job ``job``'s labels and annotations, if it has any (``State.job_meta``: nothing kept,
    no cost, for a job without them), counted to its ``tenant``'s metadata bytes (never the
    payload: the state does not keep it)."""
    if e.labels or e.annotations:
        state.job_meta[job] = (e.labels, e.annotations)
        state.derived.count_meta(tenant, e.labels, e.annotations, 1)


def topology_code(e: JobSubmitted) -> int:
    """The jobs' ``topology`` column of a submission: its required level, with the spread bit."""
    level = TOPOLOGY_CODES[e.required_topology] if e.required_topology else 0
    return level | (SPREAD_HOST if e.spread == "host" else 0)


def add_tasks(state: State, job: int, g: TaskGroup) -> None:
    """The rows of one task group of ``job``; their shape remembered (the shape window)."""
    mask = models_mask(state, g)
    first = state.tasks.add(g.count)
    tc, rows = state.tasks.cols, slice(first, first + g.count)
    tc["job"][rows], tc["cpu"][rows], tc["mem"][rows] = job, g.cpu_milli, g.mem_mib
    tc["gpus"][rows], tc["milli"][rows], tc["models"][rows] = g.gpu_count, g.gpu_milli, mask
    cls = class_id(state, g)
    if cls:  # (new rows hold class 0)
        tc["cls"][rows] = cls
    remember_shape(state, (g.gpu_count, g.gpu_milli, g.cpu_milli), g.count)


def models_mask(state: State, g: TaskGroup) -> int:
    """The bitmask of the GPU models a group's tasks may use (0: any; a task without GPUs: 0,
    its ``gpu_models`` interned but not a constraint)."""
    mask = 0
    for m in g.gpu_models:
        mask |= 1 << model_id(state, m)
    return mask if g.gpu_count else 0


def class_id(state: State, g: TaskGroup) -> int:
    """The id of a group's constraint class, interned when new (first-seen order)."""
    key = class_key(g)
    return 0 if key is NO_CLASS else intern_class(state, key)


def intern_class(state: State, key: ClassKey) -> int:
    found = state.class_ids.get(key)
    if found is None:
        found = state.class_ids[key] = len(state.classes)
        state.classes.append(key)
        add_entry(state, SUM_CLASSES, (found, key), 1)
    return found


def take_shape_mix(state: State) -> None:
    """Take the shape mix from the window now, and when to take it next: at every doubling
    of the tasks seen until the window is full, then every ``shape_mix_every`` tasks. Two
    views of the window: its shapes by (gpus, milli) at their mean CPU (``shape_mix``, as
    before issue 23) and its GPU shapes by ``shape_key`` (``shape_mix_cpu``)."""
    by_gpu: dict[tuple[int, int], list[int]] = {}
    keyed = []
    for (gpus, milli, bucket), (n, cpu) in state.shape_stats.items():
        if n > 0:
            row = by_gpu.setdefault((gpus, milli), [0, 0])
            row[0] += n
            row[1] += cpu
            if gpus > 0:
                keyed.append(((gpus, milli, bucket), n, cpu))
    top = sorted(((key, n, cpu) for key, (n, cpu) in by_gpu.items()), key=lambda e: (-e[1], e[0]))
    state.shape_mix = tuple((g, m, cpu // n, n) for (g, m), n, cpu in top[:MAX_SHAPES])
    keyed.sort(key=lambda e: (-e[1], e[0]))
    rows = keyed[: max(0, state.config.shape_cpu_rows)]  # (a negative count: none, not all but some)
    view = tuple((g, m, cpu // n, n) for (g, m, _), n, cpu in rows)
    bound = view and state.config.cpu_bound_rule and cpu_bound(state)
    state.shape_mix_cpu = (CPU_BOUND_ROW, *view) if bound else view
    seen, config = state.shapes_seen, state.config
    if seen < config.shape_window:
        state.mix_due = min(2 * seen, config.shape_window)
    else:
        state.mix_due = seen + max(1, config.shape_mix_every)


MAX_SHAPES: Final = 32  # rows of the shape mix: the most common (gpus, milli) of the window

CPU_BOUND_ROW: Final = (CPU_BOUND_MARK, 0, 0, 0)
"""The first row of ``State.shape_mix_cpu`` when the window is CPU-bound (``cpu_bound``): the
kernels' marker (``kernels.CPU_BOUND_MARK``, weight 0), which ``scratch.shape_matrix`` puts
first in the matrix (a row of the view, it is snapshotted and digested with it)."""


def is_cpu_bound(state: State) -> bool:
    """The shape mix was last taken from a CPU-bound window (its view by CPU is marked)."""
    return state.shape_mix_cpu[:1] == (CPU_BOUND_ROW,)


def cpu_bound(state: State) -> bool:
    """The window asks more of the fleet's CPU than of its GPUs: its tasks' cpu (CPU-only
    tasks' too) over the cpu of every node not removed exceeds their GPU milli over those
    nodes' GPU milli. CPU, not GPU, then runs out first (issue 23; docs/scheduling.md)."""
    cpu, milli = 0, 0
    for (gpus, share, _), (n, cpu_sum) in state.shape_stats.items():
        cpu += cpu_sum
        milli += n * gpus * share  # (a CPU-only task's gpus are 0)
    c, size = state.nodes.cols, state.nodes.size
    kept = c["status"][:size] != int(NodeStatus.REMOVED)
    fleet_cpu = int(c["cpu_alloc"][:size][kept].sum())
    fleet_milli = int(c["gpu_count"][:size][kept].sum()) * FULL_GPU
    return milli > 0 and cpu * fleet_milli > fleet_cpu * milli


def remember_shape(state: State, shape: tuple[int, int, int], count: int) -> None:
    """Keep the last ``shape_window`` task shapes: the distribution the FGD score measures against."""
    window, change = state.config.shape_window, 0
    ring, stats, at = state.recent_shapes, state.shape_stats, state.recent_next
    key, cpu = shape_key(shape), shape[2]
    for _ in range(min(count, window)):
        if len(ring) < window:
            ring.append(shape)
        else:
            old = ring[at]
            gone = stats[shape_key(old)]
            gone[0] -= 1
            gone[1] -= old[2]
            change -= window_entry_hash(at, old)
            ring[at] = shape
        row = stats.get(key)
        if row is None:
            row = stats[key] = [0, 0]
        row[0] += 1
        row[1] += cpu
        change += window_entry_hash(at, shape)
        at = (at + 1) % window
    state.recent_next = at
    state.sums[SUM_RECENT_SHAPES] = (state.sums[SUM_RECENT_SHAPES] + change) & HASH_MASK


@functools.lru_cache(maxsize=1 << 16)
def window_entry_hash(at: int, shape: tuple[int, int, int]) -> int:
    """``entry_hash((at, shape))``, remembered: a window slot sees the same few shapes again."""
    return entry_hash((at, shape))


def count_shape(state: State, shape: tuple[int, int, int], sign: int) -> None:
    stats = state.shape_stats.setdefault(shape_key(shape), [0, 0])
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
    state.drained.pop(row, None)  # (a node that comes back is not drained: kubectl's way)
    if row in state.node_attrs:
        set_node_attrs(state, row, NO_ATTRS)
    if row in state.node_foreign:
        set_node_foreign(state, row, 0, 0, 0)


def on_node_drained(state: State, e: NodeDrained) -> None:
    """An operator's drain (or its undoing): the node's cordon is the heartbeat's own or the
    drain's; ``state.drained`` keeps the reason and the heartbeat's own cordon to go back to."""
    row = state.node_row(e.cell, e.node)
    if row < 0 or int(state.nodes.cols["status"][row]) == NodeStatus.REMOVED:
        state.ignored += 1
        return
    labels, taints, cordoned = state.node_attrs.get(row, NO_ATTRS)
    if e.drained:
        own = state.drained[row][1] if row in state.drained else cordoned
        state.drained[row] = (e.reason, own)
        cordoned = True
    elif row in state.drained:
        cordoned = state.drained.pop(row)[1]
    attrs = (labels, taints, cordoned)
    if attrs != state.node_attrs.get(row, NO_ATTRS):
        set_node_attrs(state, row, attrs)


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
        observe.ignored(state, e, t)
        return
    state.tasks.cols["state"][t] = _STARTED
    observe.started_on(state, e, t)


def on_task_finished(state: State, e: TaskFinished) -> None:
    t = task_row(state, e.job_id, e.task_index)
    if t < 0 or int(state.tasks.cols["state"][t]) == TaskState.FINISHED:
        state.ignored += 1
        observe.ignored(state, e, t)
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
        state.jobs.cols["ended_at_ms"][job] = state.now_ms


def on_task_failed(state: State, e: TaskFailed) -> None:
    t = task_row(state, e.job_id, e.task_index)
    if t < 0:
        state.ignored += 1
        observe.ignored(state, e, t)
        return
    if e.requeue:
        withdraw(state, int(state.tasks.cols["job"][t]), int(state.tasks.cols["node"][t]), e.reason)
        return
    release_job(state, int(state.tasks.cols["job"][t]), JobState.FAILED)


def withdraw(state: State, job: int, row: int, reason: str) -> None:
    """The backend withdrew ``job``'s placement (task on node ``row`` could not run: Slurm kept it
    pending behind its own work): requeue the gang, noting ``reason``, and hold at once the
    foreign work its nodes report, which the placement stood in the way of (set_node_foreign),
    so the next decision does not pin the job to the same busy node again."""
    rows = sorted({int(state.tasks.cols["node"][t]) for t in state.job_tasks(job)} - {-1})
    release_job(state, job, JobState.PENDING)
    text = reason or f"the backend withdrew the placement on node {state.node_name(row)}"
    state.requeues[job] = Requeue("withdrawn", state.now_ms, state.offset, text, node=state.node_name(row))
    for node in rows:
        old = state.node_foreign.get(node)
        if old is not None and not _holds_all(old):
            set_node_foreign(state, node, *old[:3])


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
        state.jobs.cols["ended_at_ms"][job] = state.now_ms
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
    derived = state.derived
    if len(derived.text_index) >= TEXT_IDS:  # bounded: number the texts in use afresh
        derived.number_texts(state.reason_text)
    else:
        derived.text_ids.put(job, derived.text_index.setdefault(text, len(derived.text_index)))


def drop_reason_text(state: State, job: int) -> None:
    old = state.reason_text.pop(job, None)
    if old is not None:
        add_entry(state, SUM_REASON_TEXT, (job, old), -1)
        state.derived.text_ids.put(job, -1)


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
        if was not in TERMINAL:  # (a failure reported of an ended job: it ended when it ended)
            jc["ended_at_ms"][job] = state.now_ms
    jc["cell"][job] = -1
    jc["tasks_done"][job] = 0
    if was == JobState.PENDING and to != JobState.PENDING:
        state.pending_count -= 1
    elif was != JobState.PENDING and to == JobState.PENDING:
        state.pending_count += 1


# --- cell shards: dispatched jobs (docs/scale-out.md) ------------------------------------


def on_dispatched(state: State, e: JobDispatched) -> None:
    """A job the dispatcher sends to one of this shard's cells: folded as its submission
    restricted to that cell, held until placed or handed back. Ignored (counted): a cell this
    shard does not hold, a resend or an older attempt, a job this shard holds already or that
    ended here, a job submitted here directly. A job returned here earlier and dispatched here
    again (a newer attempt) is reopened."""
    cells = state.config.cells
    if cells and e.cell not in cells:
        state.ignored += 1
        return
    cell = state.names["cell"].intern(e.cell)
    state.dispatched_seq[cell] = max(state.dispatched_seq.get(cell, 0), e.seq)
    job = state.job_row(e.job.job_id)
    if job < 0 and e.job.job_id in state.retired:  # ended and retired here: a resend
        state.ignored += 1
        return
    if job < 0:
        on_submitted(state, msgspec.structs.replace(e.job, allowed_cells=(e.cell,)))
        job = state.job_row(e.job.job_id)
    else:
        last = state.dispatches.get(job)
        if last is None or e.attempt <= last[1] or int(state.jobs.cols["state"][job]) != _RETURNED:
            state.ignored += 1
            return
        reopen(state, job, cell)
    old = state.dispatches.get(job)
    if old is not None:
        add_entry(state, SUM_DISPATCHES, (job, old), -1)
    state.dispatches[job] = (cell, e.attempt, e.seq, state.now_ms)
    add_entry(state, SUM_DISPATCHES, (job, state.dispatches[job]), 1)
    hold(state, job, state.now_ms + state.config.hold_ms)


def reopen(state: State, job: int, cell: int) -> None:
    """A returned job dispatched here again: pending in ``cell`` from now, FIFO from now."""
    jc = state.jobs.cols
    jc["state"][job] = _PENDING
    jc["submitted_at"][job] = state.now_ms
    jc["seq"][job] = state.offset - 1
    jc["reason"][job] = 0
    old = state.job_cells.get(job)
    if old is not None:
        add_entry(state, SUM_JOB_CELLS, (job, old), -1)
    state.job_cells[job] = (cell,)
    add_entry(state, SUM_JOB_CELLS, (job, (cell,)), 1)
    gone = state.returned.pop(job, None)
    if gone is not None:
        add_entry(state, SUM_RETURNED, (job, gone), -1)
    state.pending_count += 1


def hold(state: State, job: int, until_ms: int) -> None:
    state.held.pop(job, None)
    state.held[job] = until_ms
    state.next_return_ms = min(state.next_return_ms, until_ms)


def hand_back(state: State) -> None:
    """Return every held job whose hold has ended (log time) and that was never placed; drop
    from ``held`` the jobs placed or ended since."""
    jc, now, nxt = state.jobs.cols, state.now_ms, NO_LIMIT
    for job, until in list(state.held.items()):
        if int(jc["state"][job]) != _PENDING or int(jc["placed_at_ms"][job]) >= 0:
            del state.held[job]  # placed once (the cell owns it now) or ended
        elif until > now:
            nxt = min(nxt, until)
        else:
            return_job(state, job)
    state.next_return_ms = nxt


def return_job(state: State, job: int) -> None:
    """Hand ``job`` back: its ``JobReturned`` (reason: its pending reason code) is kept for the
    shard's loop to write, and the job leaves the cell (``RETURNED``, no longer pending)."""
    cell, attempt, _, at_ms = state.dispatches[job]
    code = int(state.jobs.cols["reason"][job])
    reason = state.reason_codes.names[code - 1] if code else HOLD_EXPIRED
    text = state.reason_text.get(job, "")
    message = f"not placed within {state.now_ms - at_ms} ms of its dispatch" + (f": {text}" if text else "")
    state.returned[job] = JobReturned(
        job_id=state.names["job"].names[job],
        cell=state.names["cell"].names[cell],
        attempt=attempt,
        reason=reason,
        as_of=state.offset,
        message=message[:4096],
    )
    add_entry(state, SUM_RETURNED, (job, state.returned[job]), 1)
    state.jobs.cols["state"][job] = _RETURNED
    drop_reason_text(state, job)
    state.requeues.pop(job, None)
    del state.held[job]
    state.pending_count -= 1


HOLD_EXPIRED: Final = "hold_expired"
"""A returned job's reason when no decide said why it waits (it never saw a decide step)."""


def rebuild_held(state: State) -> None:
    """``held`` and ``next_return_ms`` from ``dispatches`` (restore)."""
    jc, hold_ms = state.jobs.cols, state.config.hold_ms
    state.held, state.next_return_ms = {}, NO_LIMIT
    for job, (_, _, _, at_ms) in state.dispatches.items():
        if int(jc["state"][job]) == _PENDING and int(jc["placed_at_ms"][job]) < 0:
            hold(state, job, at_ms + hold_ms)
