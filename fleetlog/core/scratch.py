"""decide's working area: what changes as decisions accumulate within one call.

:class:`Scratch` holds the working copy of free capacity and usage, the reservations and
failures of this call, and the node scores remembered per task shape (``fleetlog.core.memo``:
:class:`~fleetlog.core.memo.Memos`, kept for the next call in ``state.derived`` as a
:class:`~fleetlog.core.memo.MemoCache`, adopted by :meth:`Scratch.adopt`). The steps of
decide (:mod:`fleetlog.core.place`, :mod:`~fleetlog.core.preempt`, :mod:`~fleetlog.core.reserve`,
:mod:`~fleetlog.core.explain`) read and write it; this module imports none of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np

from fleetlog.core import kernels
from fleetlog.core.arrays import Array
from fleetlog.core.eligibility import job_eligible
from fleetlog.core.fold import CPU_BOUND_ROW, is_cpu_bound, mask_gpus
from fleetlog.core.memo import MAX_MEMOS, MEMO_ROWS, MemoCache, Memos, Shape
from fleetlog.core.never_fits import Fleet, fleet_of
from fleetlog.core.policy import Policy
from fleetlog.core.state import NO_LIMIT, JobState, NodeStatus, State
from fleetlog.core.typical import typical_pods
from fleetlog.events.model import Decision


class Outcome:
    """A reason code, its explanation, and whether jobs of the same key will fail alike."""

    __slots__ = ("cacheable", "message", "reason")

    def __init__(self, reason: str, message: str, cacheable: bool = True) -> None:
        self.reason, self.message, self.cacheable = reason, message, cacheable


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
        self.policy_id = policy_kernel(policy)
        self.shapes = policy_shapes(state, policy)
        up = c["status"][:n] == int(NodeStatus.UP)
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
        self.excluded: dict[tuple[int, bytes], dict[str, int]] = {}  # see explain.exclusions
        self._running: Array | None = None
        self._lowest: int | None = None
        self.node_version = np.zeros(n, dtype=np.int64)  # bumped whenever a node's free changes
        self.memos = Memos(n, max(1, min(MAX_MEMOS, MEMO_ROWS // max(1, n))))
        self._floor_table: Array | None = None
        self._fleet: Fleet | None = None
        self._run_buffer: Array | None = None
        self.swapped = False  # free capacity was swapped for a trial: nothing is kept for the next call
        self.constrained = bool(state.node_attrs) or len(state.classes) > 1  # (else no job is)
        self._preferring = np.zeros(0, dtype=np.bool_)

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
        free = (self.cpu_free, self.mem_free, self.gpu_free, self.gpu_count, self.model)
        return MemoCache(self.memo_key(), self.memos, self.node_version, free)

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
        """The node shapes :mod:`fleetlog.core.never_fits` judges "never fits" on, taken once per call."""
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
            self._running = np.flatnonzero(self.state.jobs.view("state") == int(JobState.RUNNING))
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

    def preferring(self, classes: Array) -> Array:
        """Per entry of ``classes``: has that constraint class soft affinity."""
        known = self.state.classes
        if len(self._preferring) != len(known):
            self._preferring = np.array([bool(c[3]) for c in known], dtype=np.bool_)
        return self._preferring[classes]

    def candidates(self, cell: int, backfill: bool, job: int = -1) -> Array:
        """Up nodes of ``cell``; reserved ones only for a job that may backfill; with ``job``,
        only those some task of the job may use by its constraints (:mod:`fleetlog.core.constraints`)."""
        nodes = self.up_by_cell.get(cell)
        if nodes is None:
            return np.zeros(0, dtype=np.int64)
        if job >= 0 and self.constrained:
            nodes = self.eligible_in(nodes, job_eligible(self.state, job))
        return nodes if backfill or not self.reservations else nodes[~self.reserved[nodes]]

    @staticmethod
    def eligible_in(nodes: Array, allowed: Array | None) -> Array:
        """``nodes`` narrowed to the ``allowed`` rows (None: all)."""
        return nodes if allowed is None else nodes[allowed[nodes]]


MEAN_VIEW_WEIGHT: Final = 8
"""The weight of the shape mix's view by (gpus, milli) against 1 for its view by CPU: each task
of the window counts 8 times at its group's mean CPU and once at its CPU bucket's. The CPU view
alone strands GPUs where CPU-hungry 1-GPU tasks are common (docs/scheduling.md "The shape
mix"); the lighter it weighs, the less it can. 8: the least weight that passes, as do the two
below it, the fairness runs of the real dispatcher (tests/sharded/test_fairness.py: 4 and up)
and the trap grid (benchmarks.trap: no cell more than a point worse than the mean view alone,
6 and up) — issue 23; benchmarks/README.md "the shape mix's two views"."""


def shape_matrix(state: State) -> Array:
    """The shape mix FGD scores against as rows (gpus, milli, mean cpu, weight): the window's
    shapes by (gpus, milli) at ``MEAN_VIEW_WEIGHT`` times their counts, then its GPU shapes by
    CPU bucket at their counts (both taken by fold: :func:`fleetlog.core.fold.take_shape_mix`).
    A row of the second view equal to one of the first but for its weight (a group whose tasks
    all fall in one CPU bucket) adds its weight to that row: the score is a sum over rows, linear
    in their weights, so the kernels do the same sum over fewer rows. When fold found the
    window CPU-bound (``fold.cpu_bound``: the view by CPU starts with ``fold.CPU_BOUND_ROW``),
    that marker, then the view by CPU alone at ``per_cpu_weights`` (with
    ``CoreConfig.cpu_bound_weights`` off: the same rows as otherwise): the kernels then score
    them as CPU-bound (each fractional row's own starvation term instead of one at the rows'
    mean)."""
    kept = state.derived.shape_rows
    if kept is not None and kept[0] is state.shape_mix and kept[1] is state.shape_mix_cpu:
        return kept[2]  # type: ignore[no-any-return]
    bound = is_cpu_bound(state)
    by_cpu = state.shape_mix_cpu[1:] if bound else state.shape_mix_cpu
    weights: dict[tuple[int, int, int], int] = {}
    if bound and state.config.cpu_bound_weights:  # (the view by CPU alone, by what a CPU buys)
        weights = dict(zip([(g, m, cpu) for g, m, cpu, _ in by_cpu], per_cpu_weights(by_cpu), strict=True))
    else:
        mean_weight = MEAN_VIEW_WEIGHT if by_cpu else 1  # (without it: the matrix as before)
        for g, m, cpu, n in state.shape_mix:
            weights[g, m, cpu] = mean_weight * n
        for g, m, cpu, n in by_cpu:
            weights[g, m, cpu] = weights.get((g, m, cpu), 0) + n
    rows = [CPU_BOUND_ROW] if bound else []  # (the kernels' marker first: scored as CPU-bound)
    rows += [(*key, w) for key, w in weights.items()]
    matrix = np.array(rows, dtype=np.int64).reshape(len(rows), 4)
    state.derived.shape_rows = (state.shape_mix, state.shape_mix_cpu, matrix)  # (read, never written)
    return matrix


def per_cpu_weights(rows: Sequence[tuple[int, int, int, int]]) -> list[int]:
    """The weights of the view by CPU's rows (gpus, milli, mean cpu, count) once the window is
    CPU-bound: each GPU row's count times the GPU milli its tasks take per CPU milli, over the
    window's (the rows': sum of gpus * milli over sum of cpu), rounded half up, at least 1 and
    at most ``MEAN_VIEW_WEIGHT`` times the rows' counts (what one row of the two views' matrix
    could weigh; a task asking no cpu counts as asking 1 milli). When CPU runs out first, what a
    room on a node is worth is the GPU its CPU places: a CPU-hungry shape's room weighs less
    than its count, a CPU-light one's more (issue 23, docs/scheduling.md "When CPU runs out
    first"). Rows without GPUs keep their counts (the kernels skip them). Exact integers."""
    taken = [(g * m if g > 0 else 0, max(cpu, 1), n) for g, m, cpu, n in rows]  # (GPU milli, cpu, count)
    gpu_rows = [row for row in taken if row[0] > 0 and row[2] > 0]
    window_cpu = sum(n * cpu for _, cpu, n in gpu_rows)
    window_milli = sum(n * milli for milli, _, n in gpu_rows)
    most = MEAN_VIEW_WEIGHT * sum(n for _, _, n in gpu_rows)
    out = []
    for milli, cpu, n in taken:
        if milli <= 0 or n <= 0:
            out.append(n)
            continue
        num, den = n * milli * window_cpu, cpu * window_milli
        out.append(min(most, max(1, (2 * num + den) // (2 * den))))
    return out


def policy_kernel(policy: Policy) -> int:
    """The kernels' policy id of a policy's scoring (both FGD rules are ``kernels.FGD``)."""
    return kernels.BEST_FIT if policy.scoring == "best-fit" else kernels.FGD


def policy_shapes(state: State, policy: Policy) -> Array:
    """The shape matrix a policy scores with: the window's mix (:func:`shape_matrix`), or for
    the published FGD rule its marker row then the typical pods (the policy's, else the
    window's mix cut as the published rule cuts a workload)."""
    if policy.scoring != "fgd-published":
        return shape_matrix(state)
    rows = policy.typical_pods or typical_pods(state.shape_mix)
    marker = ((kernels.PUBLISHED_MARK, 0, policy.tie_seed, 0),)  # (its cpu column: the tie seed)
    return np.array(marker + tuple(rows), dtype=np.int64).reshape(len(rows) + 1, 4)


def job_name(state: State, job: int) -> str:
    return state.names["job"].names[job]
