"""The scheduler's state: struct-of-arrays tables for nodes, jobs and tasks, plus tenants.

Everything here derives from the log alone: row ids come from the order events
arrived in, strings are interned in first-seen order, and no collection of
strings is ever iterated unsorted.
"""

from __future__ import annotations

import collections
import enum
import functools
from typing import Any, Final

import msgspec
import numpy as np

from fleetlog.core.arrays import Interner, Table, entries_sum
from fleetlog.core.observations import Observations
from fleetlog.events.model import CellSummary, JobReturned, PolicySet, metadata_bytes
from fleetlog.events.spec import NO_CONSTRAINTS as NO_CLASS
from fleetlog.events.spec import ConstraintsKey as ClassKey
from fleetlog.events.spec import NodeAttrs

JobMeta = tuple[dict[str, str], dict[str, str]]
"""A job's labels and annotations (``State.job_meta``)."""
META_ENTRY_BYTES: Final = 112
META_JOB_BYTES: Final = 256
"""What the state holds for a job's labels and annotations beyond their UTF-8: per entry, two
string objects and a map slot; per job, the two maps and their pair (measured with tracemalloc:
a job of 128 empty entries holds 10 KB, one at the 16 KiB bound 32 KB; issue 46)."""


def held_bytes(labels: dict[str, str], notes: dict[str, str]) -> int:
    """The memory one job's labels and annotations take in ``State.job_meta``, about: their
    UTF-8 bytes and the objects around them — what the per-tenant bound counts, so many tiny
    entries cannot hold more than the bound says."""
    return metadata_bytes(labels, notes) + META_ENTRY_BYTES * (len(labels) + len(notes)) + META_JOB_BYTES
Foreign = tuple[int, int, int, int, int, int]
"""A node's foreign work: wanted cpu, mem, GPUs; held cpu, mem, GPU mask (``State.node_foreign``)."""

MAX_GPUS: Final = 64
MAX_GPU_MODELS: Final = 64
FULL_GPU: Final = 1000
NO_LIMIT: Final = 1 << 62


class NodeStatus(enum.IntEnum):
    UP = 1
    DOWN = 2  # unhealthy or missed heartbeats: nothing new is placed, its tasks were requeued
    REMOVED = 3


class JobState(enum.IntEnum):
    PENDING = 0
    RUNNING = 1  # placed: every task has a node
    SUCCEEDED = 2
    FAILED = 3
    CANCELLED = 4
    REJECTED = 5
    RETURNED = 6  # a cell shard handed a dispatched job back to the dispatcher (docs/scale-out.md)
    RETIRED = 7  # ended and retired: its row is free until the tables are compacted (docs/retention.md)


class TaskState(enum.IntEnum):
    PENDING = 0
    PLACED = 1
    STARTED = 2
    FINISHED = 3


TOPOLOGY_NONE: Final = 0
TOPOLOGY_CODES: Final = {"block": 1, "rack": 2, "host": 3}
LEVEL_MASK: Final = 3
"""The jobs' ``topology`` column: its low bits are the required level (0: none, else a code of
``TOPOLOGY_CODES``), ..."""
SPREAD_HOST: Final = 4
"""... and this bit says "at most one task per node" (``JobSubmitted.spread == "host"``): one
column for both, so a job without a spread folds, digests and snapshots as before it existed."""
TERMINAL: Final = frozenset(
    {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.REJECTED, JobState.RETURNED}
)
"""States a job leaves only by a new dispatch (``RETURNED``, in a cell shard), else never."""
RETIRABLE: Final = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.REJECTED)
"""The ended states a job retires from, ``CoreConfig.retain_finished_ms`` after it ended (in
this order in ``State.retired_counts``)."""


class CoreConfig(msgspec.Struct, frozen=True):
    """Settings that change what ``fold`` computes; recorded in every snapshot."""

    node_timeout_ms: int = 60_000
    """A node with no heartbeat for this long (in log time) is down."""
    shape_window: int = 4096
    """How many recent task submissions the fragmentation score's shape distribution covers."""
    shape_mix_every: int = 2048
    """How often (in submitted tasks) the shape mix the fragmentation score uses is taken from
    the window once it is full; before that, at every doubling (1, 2, 4, ... tasks). Between
    two refreshes the mix is fixed, so decide can remember node scores from one call to the next."""
    shape_cpu_rows: int = 12
    """Rows of the shape mix's view by CPU (``State.shape_mix_cpu``): the most common GPU shapes
    of the window by ``shape_key``; ``default`` scores against it beside the (gpus, milli) mix
    (issue 23: 12 did as well as 16, 24 or 32). 0: no such view, the (gpus, milli) mix alone, as
    every fleetlog before 2026-12-06 decided: replay a log recorded before then with 0
    (``service.shape_cpu_rows``; docs/replay.md)."""
    cpu_bound_rule: bool = True
    """When the window asks more of the fleet's CPU than of its GPUs (``fold.cpu_bound``),
    ``default`` scores with each fractional shape's own starvation term and none at the rows'
    mean, against the rows ``cpu_bound_weights`` says (issue 23, docs/scheduling.md "When CPU
    runs out first"). False: the starvation term at the mean whatever the window asks, as every
    fleetlog before 2026-12-07 decided; replay a log recorded before then with it off (and
    ``cpu_bound_weights`` off: ``service.cpu_bound_rule``; docs/replay.md)."""
    cpu_bound_weights: bool = True
    """Once a window is CPU-bound (``cpu_bound_rule``), ``default`` scores against the view by
    CPU alone, each row weighted by the GPU its tasks take per CPU they take against the
    window's (``scratch.per_cpu_weights``; issue 23, docs/scheduling.md "When CPU runs out
    first"). False: both views 8 to 1 at their counts, as fleetlog decided from the CPU-bound
    rule (d932362, 2026-12-07) until this setting; replay a log recorded then with it off
    (``service.cpu_bound_weights``; docs/replay.md)."""
    most_free_usable: bool = True
    """An ``insufficient_capacity`` reason counts the most free room only on nodes the job may
    use (its constraints, GPU models, not drained) and names what excluded the nodes with more
    (``core/room.py``; issue 47). False: over every up node of its cells, as every fleetlog
    before 2026-12-07 said; replay a log recorded before then with it off
    (``service.most_free_usable``; docs/replay.md)."""
    hold_ms: int = 30_000
    """A cell shard hands a dispatched job back (``JobReturned``) when it has waited this long
    (log time) since its dispatch without being placed. Only dispatched jobs are held."""
    cells: tuple[str, ...] = ()
    """The cells this shard holds: a ``JobDispatched`` to another cell is ignored. Empty: any
    (the single shard, which never sees a dispatch)."""
    retain_finished_ms: int | None = 3_600_000
    """A job that succeeded, failed, was cancelled or rejected retires (leaves the state: its
    rows freed, its id forgotten but for the dedup window) at the first node sweep this long
    (log time) after it ended. ``None``: never (the state grows with history)."""
    dedup_window_ms: int = 86_400_000
    """A retired job's id is remembered this long (log time) after it retired: a resend of its
    ``JobSubmitted`` (or ``JobDispatched``) is a duplicate. After it, the id is a new job's."""
    compact_min_rows: int = 4096
    """The job table is compacted (retired rows dropped, rows renumbered in order) once its
    retired rows are this many and more than its live ones."""


BEFORE_FIELDS: Final = {
    "hold_ms": 30_000, "cells": (), "shape_cpu_rows": 0, "cpu_bound_rule": False, "cpu_bound_weights": False,
    "most_free_usable": False,
}
"""Fields of :class:`CoreConfig` added after the first snapshots, at the value that behaves as
fleetlog did before they existed: left out of a snapshot's and a digest's config at that value
and read back as it where absent, so a log or snapshot of an older fleetlog verifies and
restores digest for digest. The cell-shard fields (``hold_ms``, ``cells``) at their defaults:
a single shard's digest is what it was before them; ``shape_cpu_rows`` at 0, no view of the
shape mix by CPU (its default is 12); ``cpu_bound_rule`` off, the two views whatever the
window asks (its default is on); ``cpu_bound_weights`` off, CPU-bound windows scored against
both views at their counts (its default is on); ``most_free_usable`` off, a capacity reason's
room counted over every up node (its default is on)."""


class Requeue(msgspec.Struct, frozen=True, omit_defaults=True):
    """Why a placed job went back to pending (kept until it is placed again or ends): what
    ``status`` and ``explain`` say before the next decide explains the wait.  Kept by fold and
    snapshotted, but not digested: it never changes a decision (derived from the log alone)."""

    cause: str
    """``preempted``, ``node_lost`` (no heartbeat), ``node_unhealthy``, ``node_reshaped``,
    ``node_removed``, ``node_tainted`` (a ``NoExecute`` taint the job does not tolerate) or
    ``withdrawn`` (the backend withdrew the placement: ``TaskFailed`` with ``requeue``)."""
    requeued_at_ms: int
    """Log time of the requeue (the input or decision batch that did it)."""
    inputs_offset: int
    """Inputs folded when it happened: a preemption's decision batch was computed at it (``as_of``)."""
    message: str
    node: str = ""
    silent_ms: int = 0
    """``node_lost``: how long the node had been silent."""
    by_job_id: str = ""
    """``preempted``: the job it made room for."""
    preempt_cause: str = ""
    """``preempted``: ``priority`` or ``reclaim``."""


class Quota(msgspec.Struct):
    """A tenant's quota in one cell (cell -1 = every cell). Resources in (cpu milli, MiB, GPU milli)."""

    nominal: tuple[int, int, int]
    borrowing_limit: tuple[int, int, int] | None
    cohort: str
    weight_milli: int


@functools.lru_cache(maxsize=1 << 12)  # (fold calls it twice a task; a workload has few shapes)
def shape_key(shape: tuple[int, int, int]) -> tuple[int, int, int]:
    """The shape mix's key of a task shape (gpus, milli, cpu): its GPUs and milli, and its CPU
    rounded up to a power of two of cores (1, 2, 4, 8, ... cores; 0 to 1,000 milli is 1). The
    FGD score tests each row's CPU against a node's free CPU, so a group's mean CPU would hide
    the CPU-hungry shapes that CPU-poor nodes strand (docs/scheduling.md, "The shape mix")."""
    return shape[0], shape[1], 1 << max(0, (shape[2] - 1) // 1000).bit_length()


def _node_table() -> Table:
    i32, i64 = np.int32, np.int64
    return Table(
        {
            "cell": (i32, (), -1),
            "block": (i32, (), -1),
            "rack": (i32, (), -1),
            "host": (i32, (), -1),
            "model": (i32, (), -1),
            "gpu_count": (i32, (), 0),
            "status": (np.int8, (), NodeStatus.UP),
            "cpu_alloc": (i64, (), 0),
            "mem_alloc": (i64, (), 0),
            "cpu_free": (i64, (), 0),
            "mem_free": (i64, (), 0),
            "gpu_free": (np.int16, (MAX_GPUS,), 0),
            "last_heartbeat_ms": (i64, (), 0),
        }
    )


def _job_table() -> Table:
    i32, i64 = np.int32, np.int64
    return Table(
        {
            "tenant": (i32, (), -1),
            "queue": (i32, (), -1),
            "priority": (i32, (), 0),
            "state": (np.int8, (), JobState.PENDING),
            "submitted_at": (i64, (), 0),
            "seq": (i64, (), 0),
            "first_task": (i64, (), 0),
            "ntasks": (i32, (), 0),
            "cell": (i32, (), -1),
            "topology": (np.int8, (), 0),
            "expected_ms": (i64, (), -1),
            "placed_at_ms": (i64, (), -1),
            "preempted_at_ms": (i64, (), -1),
            "preempt_cause": (np.int8, (), 0),
            "reason": (np.int16, (), 0),
            "tasks_done": (i32, (), 0),
            "req_cpu": (i64, (), 0),
            "req_mem": (i64, (), 0),
            "req_gpu": (i64, (), 0),
            "ended_at_ms": (i64, (), -1),
        }
    )


def _task_table() -> Table:
    i32, i64 = np.int32, np.int64
    return Table(
        {
            "job": (i64, (), -1),
            "cpu": (i64, (), 0),
            "mem": (i64, (), 0),
            "gpus": (i32, (), 0),
            "milli": (i32, (), 0),
            "models": (np.uint64, (), 0),
            "node": (i32, (), -1),
            "gpu_mask": (np.uint64, (), 0),
            "state": (np.int8, (), TaskState.PENDING),
            "cls": (i32, (), 0),
        }
    )


TEXT_IDS = 1 << 16


class RowIds:
    """A growable int64 column of ids per job row, -1 where unknown (derived data, kept out of
    the tables so that it is neither digested nor snapshotted)."""

    __slots__ = ("col",)

    def __init__(self) -> None:
        self.col = np.full(64, -1, dtype=np.int64)

    def of(self, rows: Any) -> Any:
        """The ids of ``rows`` (an int or an array of rows)."""
        self.cover(int(np.max(rows, initial=0)))
        return self.col[rows]

    def put(self, row: int, value: int) -> None:
        self.cover(row)
        self.col[row] = value

    def cover(self, row: int) -> None:
        if row >= self.col.size:
            grown = np.full(max(row + 1, 2 * self.col.size), -1, dtype=np.int64)
            grown[: self.col.size] = self.col
            self.col = grown


SUM_REASON_TEXT = 0
SUM_JOB_CELLS = 1
SUM_RECENT_SHAPES = 2
SUM_DISPATCHES = 3
SUM_RETURNED = 4
SUM_RETIRED = 5
SUM_NODE_ATTRS = 6
SUM_CLASSES = 7
SUM_NODE_FOREIGN = 8


class Derived:
    """What fold and decide keep only to be fast: every field is rebuilt from the rest of the
    state (``Derived.of(state)``; an empty one is right for an empty state), none is digested
    or snapshotted. Droppable: replacing ``state.derived`` with ``Derived.of(state)`` at any
    point changes no later decision and no digest, only speed (tests/core/test_derived.py).

    One object, dropped whole: the fields lean on each other (``fit_memo`` remembers answers
    by the key ids of ``key_ids``; ``text_ids`` are ids in ``text_index``)."""

    __slots__ = (
        "attrs_version", "beat_cache", "decide_memo", "eligibility", "fit_memo", "job_keys", "key_ids",
        "meta_bytes", "policy_roles", "shape_rows", "steady_gone", "steady_ids", "text_ids", "text_index",
    )  # fmt: skip

    def __init__(self) -> None:
        self.job_keys = RowIds()
        """job row -> its decide key id (a job's shape never changes; ``fleetlog.core.schedule.job_keys``)."""
        self.key_ids: dict[tuple[object, ...], int] = {}
        """decide key -> its id."""
        self.text_ids = RowIds()
        """job row -> an id of its ``State.reason_text`` (equal texts, equal ids; kept by fold)."""
        self.text_index: dict[str, int] = {}
        """reason text -> its id in ``text_ids`` (renumbered when it grows past TEXT_IDS)."""
        self.beat_cache: dict[str, tuple[int, object]] = {}
        """node name -> (row, its last heartbeat) while up: the batch fold's steady heartbeats
        (``fleetlog.core.fold_batch``); fold keeps it, as it keeps ``steady_ids``."""
        self.steady_ids: dict[int, int] = {}
        """``id()`` of each heartbeat object in ``beat_cache`` -> its node row (the cache holds
        the objects, so their ids stay theirs): ``fold_lists`` finds steady heartbeats with
        C-level lookups."""
        self.steady_gone: list[int] | None = None
        """While ``fold_lists`` runs, the ids taken out of ``steady_ids`` since it last looked
        (None otherwise, so folding without it keeps no record that grows)."""
        self.fit_memo: object | None = None
        """The fleet's node shapes and which decide keys can never fit on them
        (``fleetlog.core.never_fits.fleet_of``; checked by a fingerprint before any use)."""
        self.policy_roles: tuple[PolicySet | None, dict[str, Any]] | None = None
        """The newest ``PolicySet`` and each principal's roles under it (``fleetlog.core.authorize``)."""
        self.decide_memo: object | None = None
        """What the last ``decide`` call learned of node scores, for the next call to reuse
        where nodes did not change (``fleetlog.core.memo.MemoCache``; checked against the free
        capacity it was learned on before any use)."""
        self.attrs_version = 0
        """Raised by fold whenever a node's labels, taints or cordon change (or a node row is
        added): ``eligibility`` is valid for one version."""
        self.eligibility: object | None = None
        """Each constraint class's eligible nodes (``fleetlog.core.constraints.Eligibility``,
        built for one ``attrs_version``)."""
        self.shape_rows: tuple[object, object, Any] | None = None
        """The shape matrix ``decide`` scores with and the two views it was made of
        (``fleetlog.core.scratch.shape_matrix``; valid while both views are those very objects:
        fold replaces them at each refresh of the mix)."""
        self.meta_bytes: dict[int, int] | None = None
        """tenant id -> :func:`held_bytes` of the labels and annotations ``State.job_meta`` holds
        for its jobs (:meth:`State.metadata_bytes`: the service's per-tenant bound); ``None``:
        counted afresh at the next ask (a restore sets the tables after the caches)."""

    @classmethod
    def of(cls, state: State) -> Derived:
        """The caches of ``state`` rebuilt: the reason texts numbered, the rest empty (filled
        again as fold and decide go)."""
        derived = cls()
        derived.number_texts(state.reason_text)
        return derived

    def forget_jobs(self, state: State) -> None:
        """Drop what is kept by job row (a compaction renumbered the rows): the decide keys and
        what was learned by them, the reason-text ids (numbered afresh). The nodes' heartbeats
        stay: a compaction within a ``fold_lists`` run keeps the steady ones it is tracking."""
        self.job_keys, self.key_ids = RowIds(), {}
        self.fit_memo = self.decide_memo = None
        self.text_ids = RowIds()
        self.number_texts(state.reason_text)

    def count_meta(self, tenant: int, labels: dict[str, str], notes: dict[str, str], sign: int) -> None:
        """Add (``sign`` 1) or take away (-1) one job's labels and annotations from ``tenant``'s bytes."""
        if self.meta_bytes is not None:
            total = self.meta_bytes.get(tenant, 0) + sign * held_bytes(labels, notes)
            if total:
                self.meta_bytes[tenant] = total
            else:
                self.meta_bytes.pop(tenant, None)

    def number_texts(self, reason_text: dict[int, str]) -> None:
        """Give every job's reason text its id in ``text_ids``, numbering the texts afresh."""
        self.text_index.clear()
        for row, text in reason_text.items():
            self.text_ids.put(row, self.text_index.setdefault(text, len(self.text_index)))

    def remember_beat(self, node: str, row: int, beat: object) -> None:
        """``beat`` is the last heartbeat of up node ``node`` (row ``row``)."""
        hit = self.beat_cache.get(node)
        if hit is None or hit[1] is not beat:  # (the same object again stays steady for fold_lists)
            self.forget_beat(node)
            self.beat_cache[node] = (row, beat)
            self.steady_ids[id(beat)] = row

    def forget_beat(self, node: str) -> None:
        """Drop ``node``'s steady heartbeat (it went down or reshaped)."""
        hit = self.beat_cache.pop(node, None)
        gone = self.steady_gone
        if hit is not None and self.steady_ids.pop(id(hit[1]), None) is not None and gone is not None:
            gone.append(id(hit[1]))


class State:
    """The whole scheduler state. Mutated only by :func:`fleetlog.core.fold.fold` (and its batch
    twins, :mod:`fleetlog.core.fold_batch`), except ``derived``, which decide writes too."""

    policy: PolicySet | None = None
    """The last ``PolicySet`` folded: the API's authorization policy (``fleetlog.service.authz``).
    Snapshotted, never digested: no decision reads it (docs/service.md, "Who may do what")."""

    def __init__(self, config: CoreConfig | None = None) -> None:
        self.config = config or CoreConfig()
        self.now_ms = 0
        self.offset = 0  # the next input offset to fold (== number of inputs folded)
        self.next_sweep_ms = 0
        self.nodes = _node_table()
        self.jobs = _job_table()
        self.tasks = _task_table()
        self.names = {
            k: Interner() for k in ("cell", "node", "topo", "model", "tenant", "queue", "job", "cohort")
        }
        self.job_cells: dict[int, tuple[int, ...]] = {}  # job row -> allowed cell ids (absent = any)
        self.usage: dict[tuple[int, int], list[int]] = {}  # (tenant, cell or -1 = all) -> [cpu, mem, gpu]
        self.quotas: dict[tuple[int, int], Quota] = {}  # (tenant id, cell id or -1) -> quota
        self.recent_shapes: list[tuple[int, int, int]] = []  # ring of (gpus, milli, cpu) of submitted tasks
        self.recent_next = 0
        self.shape_stats: dict[tuple[int, int, int], list[int]] = {}
        """``shape_key`` -> [count, cpu sum] over ``recent_shapes`` (kept by fold, rebuilt on
        restore, not snapshotted; not in ``derived``: fold reads it to take the shape mix)."""
        self.shape_mix: tuple[tuple[int, int, int, int], ...] = ()
        """The shape mix by (gpus, milli): (gpus, milli, mean cpu, count) rows, most common first,
        taken at the last refresh (``CoreConfig.shape_mix_every``); ``shape_mix_cpu``: the GPU
        shapes by ``shape_key``, taken with it. ``default`` scores against both (``scratch.
        shape_matrix``); the published rule's typical pods are the first when none are given."""
        self.shape_mix_cpu: tuple[tuple[int, int, int, int], ...] = ()
        self.shapes_seen, self.mix_due = 0, 1  # shapes since the start; when to take the mix again
        self.reason_text: dict[int, str] = {}  # job row -> explanation of its pending reason
        self.sums = [0, 0, 0, 0, 0, 0, 0, 0, 0]
        """Running :func:`~fleetlog.core.arrays.entries_sum` of ``reason_text`` items,
        ``job_cells`` items, ``(index, shape)`` of ``recent_shapes``, ``dispatches`` items,
        ``returned`` items, ``retired`` items, ``node_attrs`` items, ``(id, class)`` of
        ``classes`` and ``node_foreign`` items (see SUM_*): what the
        digest hashes instead of those collections (kept by fold, rebuilt on restore by
        :func:`collection_sums`; not in ``derived``: the digest reads it)."""
        self.reason_codes, self.pending_count = Interner(), 0  # reason codes of JobPending decisions
        self.requeues: dict[int, Requeue] = {}
        """job row -> why it was last requeued, while it waits (see :class:`Requeue`)."""
        self.job_meta: dict[int, JobMeta] = {}
        """job row -> its submission's (labels, annotations), for the jobs that have any: what
        the read API shows (docs/api.md). Kept by fold and snapshotted, never digested: no
        decision reads it (docs/events.md, "Labels, annotations and payload")."""
        self.dispatches: dict[int, tuple[int, int, int, int]] = {}
        """Cell shards: job row -> (cell id, attempt, seq, log time) of its latest accepted
        ``JobDispatched``."""
        self.dispatched_seq: dict[int, int] = {}  # cell id -> the last JobDispatched.seq folded
        self.returned: dict[int, JobReturned] = {}
        """job row -> the ``JobReturned`` that handed it back (until it is dispatched here again)."""
        self.summaries: dict[str, CellSummary] = {}
        """Cell shards: cell -> the last ``CellSummary`` its loop wrote (``cellshard.due_summaries``
        keeps it, at the recorded steps, so recovery rebuilds it). Snapshotted, not digested: it is
        what the loop wrote, not what a decision reads."""
        self.held: dict[int, int] = {}
        """job row -> when its hold ends (log time), for dispatched jobs not placed yet (dropped
        lazily once placed or ended). Rebuilt on restore from ``dispatches``, not snapshotted."""
        self.next_return_ms = NO_LIMIT  # the earliest end of a hold in ``held`` (rebuilt with it)
        self.duplicates = 0  # JobSubmitted for a job id already known (idempotent resend)
        self.ignored, self.observations = 0, Observations()  # ignored task reports: count; why (undigested)
        self.retired: dict[str, int] = {}
        """Retired job id -> the log time it retired, for ``CoreConfig.dedup_window_ms``: the
        dedup window (expired oldest first, by ``retired_order``)."""
        self.retired_order: collections.deque[tuple[int, str]] = collections.deque()
        """(retired at, job id) in the order jobs retired; an entry whose id retired again
        later is stale (``retired`` holds the later time) and is skipped when it expires."""
        self.retired_rows = 0  # rows of the job table whose job retired (free until compacted)
        self.retired_counts: dict[int, list[int]] = {}
        """tenant id -> how many of its jobs retired from each of ``RETIRABLE``'s states."""
        self._constraint_tables()
        self.derived = Derived()
        """Caches rebuilt from the rest (see :class:`Derived`): droppable, never digested or snapshotted."""

    def _constraint_tables(self) -> None:
        # node row -> its labels, taints and cordon (``fleetlog.core.constraints``), for the nodes
        # that have any; the constraint classes of task groups by id (the ``cls`` task column:
        # interned in first-seen order, class 0 "no constraint") and their ids
        self.node_attrs: dict[int, NodeAttrs] = {}
        self.classes: list[ClassKey] = [NO_CLASS]
        self.class_ids: dict[ClassKey, int] = {NO_CLASS: 0}
        self.drained: dict[int, tuple[str, bool]] = {}
        """node row -> (reason, the heartbeat's own cordon) of the nodes an operator drained
        (``NodeDrained``): their cordon in ``node_attrs`` holds until the drain is undone."""
        self.node_foreign: dict[int, Foreign] = {}
        """node row -> what work this scheduler does not own holds on it (the heartbeat's
        ``foreign_*``): wanted (cpu, mem, GPUs) and held (cpu, mem, GPU mask) — held is what the
        node's free capacity is short of, at most what was free
        (:func:`fleetlog.core.fold.set_node_foreign`)."""

    # --- lookups -------------------------------------------------------------------------

    def node_row(self, cell: str, node: str) -> int:
        return self.names["node"].get(f"{cell}\x00{node}")

    def node_name(self, row: int) -> str:
        return self.names["node"].names[row].split("\x00", 1)[1]

    def job_row(self, job_id: str) -> int:
        return self.names["job"].get(job_id)

    def known_job(self, job_id: str) -> bool:
        """``job_id`` is in the state or retired within the dedup window (a resend of its
        submission is a duplicate)."""
        return job_id in self.names["job"].ids or job_id in self.retired

    def live_jobs(self) -> int:
        """Rows of the job table whose job has not retired."""
        return self.jobs.size - self.retired_rows

    def tenant_id(self, tenant: str) -> int:
        return self.names["tenant"].intern(tenant)

    def metadata_bytes(self, tenant: str) -> int:
        """The memory the labels and annotations of ``tenant``'s jobs take in the state (from
        submission until the jobs retire; :func:`held_bytes`); counted once after a restore, then
        kept by fold."""
        derived = self.derived
        if derived.meta_bytes is None:
            tenants = self.jobs.cols["tenant"]
            derived.meta_bytes = {}
            for row, (labels, notes) in self.job_meta.items():
                derived.count_meta(int(tenants[row]), labels, notes, 1)
        tenant_id = self.names["tenant"].ids.get(tenant)
        return 0 if tenant_id is None else derived.meta_bytes.get(tenant_id, 0)

    def job_tasks(self, job: int) -> range:
        first = int(self.jobs.cols["first_task"][job])
        return range(first, first + int(self.jobs.cols["ntasks"][job]))


def collection_sums(state: State) -> list[int]:
    """``State.sums`` computed afresh from the collections (restore, and the invariants)."""
    sums = [0, 0, 0, 0, 0, 0, 0, 0, 0]
    sums[SUM_NODE_ATTRS] = entries_sum(state.node_attrs.items())
    sums[SUM_NODE_FOREIGN] = entries_sum(state.node_foreign.items())
    sums[SUM_CLASSES] = entries_sum(enumerate(state.classes[1:], 1))
    sums[SUM_RETIRED] = entries_sum(state.retired.items())
    sums[SUM_DISPATCHES] = entries_sum(state.dispatches.items())
    sums[SUM_RETURNED] = entries_sum(state.returned.items())
    sums[SUM_REASON_TEXT] = entries_sum(state.reason_text.items())
    sums[SUM_JOB_CELLS] = entries_sum(state.job_cells.items())
    sums[SUM_RECENT_SHAPES] = entries_sum(enumerate(state.recent_shapes))
    return sums
