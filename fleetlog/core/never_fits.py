"""Can a job ever fit on the fleet?  Judged on node shapes, never on what runs on the nodes.

A gang of 16 one-GPU tasks that must share a host waits forever on 8-GPU hosts: decide says so
with the ``never_fits`` reason, and the service refuses such a job at submit (as ``sbatch``
refuses a job no configured node can run).  The fleet is every node the state knows that was
not removed — a down node may come back — in the job's allowed cells.

Only necessary conditions are tested (each task fits some node's whole capacity; the tasks of
each group, and the gang's total, fit in one topology domain's whole capacity), so the answer
"never" is certain; a job that passes may still wait (packing is harder than sums).  With no
node in the allowed cells, or no node of an allowed GPU model, it answers nothing: hardware
the fleet has never reported may still join (decide says ``no_eligible_nodes`` meanwhile).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Final, NamedTuple

import numpy as np

from fleetlog.core.arrays import Array
from fleetlog.core.state import LEVEL_MASK, MAX_GPU_MODELS, SPREAD_HOST, TOPOLOGY_CODES, NodeStatus, State
from fleetlog.events.model import JobSubmitted

_LEVEL_NAMES: Final = {1: "block", 2: "rack", 3: "host"}
_MANY: Final = 1 << 40


class Shape(NamedTuple):
    """``tasks`` identical tasks; ``models``: a mask of allowed GPU model ids (0: any)."""

    tasks: int
    cpu: int
    mem: int
    gpus: int
    milli: int
    models: int


class Fleet:
    """The shapes of the nodes that could ever run a task (taken once, asked many times)."""

    def __init__(self, state: State) -> None:
        c, n = state.nodes.cols, state.nodes.size
        self.rows = np.flatnonzero(c["status"][:n] != int(NodeStatus.REMOVED))
        self.cell = c["cell"][self.rows].astype(np.int64)
        self.cpu = c["cpu_alloc"][self.rows].astype(np.int64)
        self.mem = c["mem_alloc"][self.rows].astype(np.int64)
        self.gpus = c["gpu_count"][self.rows].astype(np.int64)
        self.model = c["model"][self.rows].astype(np.int64)
        self.domains = {lv: c[name][self.rows].astype(np.int64) for lv, name in _LEVEL_NAMES.items()}
        h = hashlib.blake2b(digest_size=16)
        for col in (self.rows, self.cell, self.cpu, self.mem, self.gpus, self.model, *self.domains.values()):
            h.update(col.tobytes())
        self.fingerprint = h.digest()
        self.judged: dict[int, str | None] = {}
        """decide key id -> :meth:`never_fits` of such jobs (valid while the fingerprint is)."""

    def never_fits_job(self, state: State, job: int) -> str | None:
        """:meth:`never_fits` of job row ``job``, remembered by its decide key (equal keys:
        equal shapes, topology and allowed cells)."""
        keys = state.derived.job_keys.col  # (decide gave the job its key id before it failed)
        key = int(keys[job]) if job < keys.size else -1
        if key >= 0 and key in self.judged:
            return self.judged[key]
        topology = int(state.jobs.cols["topology"][job])
        found = self.never_fits(
            job_shapes(state, job),
            topology & LEVEL_MASK,
            state.job_cells.get(job),
            bool(topology & SPREAD_HOST),
        )
        if key >= 0:
            self.judged[key] = found
        return found

    def never_fits(
        self, shapes: Sequence[Shape], level: int, cells: tuple[int, ...] | None, spread: bool = False
    ) -> str | None:
        """Why the gang of ``shapes`` can never be placed (``level``: its required topology,
        0 for none; ``cells``: the allowed cell ids, None for any; ``spread``: at most one task
        per node), or None."""
        where = np.ones(self.rows.size, dtype=np.bool_) if cells is None else np.isin(self.cell, cells)
        if not where.any():
            return None
        caps = []
        for shape in shapes:
            cap = self._per_node(shape, where)
            if cap is None:
                return None
            if not cap.any():
                return f"no node can hold a task of {_describe(shape)} ({self._largest(where)})"
            caps.append(np.minimum(cap, 1) if spread else cap)
        found = self._no_domain(shapes, caps, level, where)
        if not spread:
            return found
        if found:
            return f"{found} (spread: one task a node)"
        return self._too_few_hosts(shapes, caps, level, where)

    def _too_few_hosts(
        self, shapes: Sequence[Shape], caps: list[Array], level: int, where: Array
    ) -> str | None:
        """A gang spread one task a node: why no domain has as many nodes that could hold one
        of its tasks as it has tasks, or None."""
        domain = self.domains[level] if level else self.cell
        usable = where & (domain >= 0) & (np.sum(caps, axis=0) > 0)
        tasks = sum(s.tasks for s in shapes)
        best = int(np.bincount(domain[usable]).max()) if usable.any() else 0
        if best >= tasks:
            return None
        what = _LEVEL_NAMES[level] if level else "cell"
        return (
            f"no {what} has {tasks} nodes for its {tasks} tasks (spread: one task a node; "
            f"the best has {best})"
        )

    def _per_node(self, shape: Shape, where: Array) -> Array | None:
        """How many tasks of ``shape`` each node could hold when empty (None: no node of an
        allowed GPU model is known)."""
        ok = where.copy()
        cap = np.full(self.rows.size, _MANY, dtype=np.int64)
        if shape.gpus:
            known = self.model >= 0
            if shape.models:
                bits = (np.uint64(shape.models) >> np.maximum(self.model, 0).astype(np.uint64)) & np.uint64(1)
                known &= bits.astype(np.bool_)
                if not (known & where).any():
                    return None
            ok &= known
            per_gpu = 1000 // max(1, shape.milli) if shape.gpus == 1 else 1
            cap = np.minimum(cap, self.gpus // shape.gpus * per_gpu)
        if shape.cpu:
            cap = np.minimum(cap, self.cpu // shape.cpu)
        if shape.mem:
            cap = np.minimum(cap, self.mem // shape.mem)
        return np.where(ok, cap, 0)

    def _no_domain(self, shapes: Sequence[Shape], caps: list[Array], level: int, where: Array) -> str | None:
        """Why no domain (a cell, or the required block/rack/host) holds the whole gang."""
        domain = self.domains[level] if level else self.cell
        inside = where & (domain >= 0)
        if not inside.any():
            return f"no node has a {_LEVEL_NAMES[level]} in its topology"
        ids = domain[inside]
        size = int(ids.max()) + 1
        held = np.zeros(size, dtype=np.int64)  # tasks of the gang a domain could hold
        room = np.ones(size, dtype=np.bool_)
        for shape, cap in zip(shapes, caps, strict=True):
            fits = np.bincount(ids, weights=np.minimum(cap[inside], shape.tasks), minlength=size)
            held += np.minimum(fits, shape.tasks).astype(np.int64)
            room &= fits >= shape.tasks
        for need, have in self._totals(shapes, caps, inside, ids, size):
            room &= have >= need
        if room[np.unique(ids)].any():
            return None
        tasks = sum(s.tasks for s in shapes)
        what = _LEVEL_NAMES[level] if level else "cell"
        best = int(held[np.unique(ids)].max())
        if best < tasks:
            return f"no {what} can hold all {tasks} tasks even when empty (the best holds {best})"
        return f"no {what} has the GPUs, CPU and memory of all {tasks} tasks together, even when empty"

    def _totals(
        self, shapes: Sequence[Shape], caps: list[Array], inside: Array, ids: Array, size: int
    ) -> list[tuple[int, Array]]:
        """(the gang's total, each domain's whole capacity) for GPU milli, CPU and memory, on
        the nodes that could hold some task of the gang."""
        usable = np.zeros(self.rows.size, dtype=np.bool_)
        for cap in caps:
            usable |= cap > 0
        usable = usable[inside]
        out = []
        for need, have in (
            (sum(s.tasks * s.gpus * s.milli for s in shapes), self.gpus * 1000),
            (sum(s.tasks * s.cpu for s in shapes), self.cpu),
            (sum(s.tasks * s.mem for s in shapes), self.mem),
        ):
            total = np.bincount(ids, weights=np.where(usable, have[inside], 0), minlength=size)
            out.append((need, total))
        return out

    def _largest(self, where: Array) -> str:
        return (
            f"the largest has {int(self.gpus[where].max())} GPUs, {int(self.cpu[where].max())} mCPU, "
            f"{int(self.mem[where].max())} MiB"
        )


def _describe(s: Shape) -> str:
    return f"{s.gpus} GPU x {s.milli} milli, {s.cpu} mCPU, {s.mem} MiB"


def fleet_of(state: State) -> Fleet:
    """The fleet of ``state`` — the previous call's, with what it judged, while no node changed
    shape, status (removed or not), cell or topology (``state.derived.fit_memo``: derived, not state)."""
    fresh, kept = Fleet(state), state.derived.fit_memo
    if isinstance(kept, Fleet) and kept.fingerprint == fresh.fingerprint:
        return kept
    state.derived.fit_memo = fresh
    return fresh


def job_shapes(state: State, job: int) -> list[Shape]:
    """Job row ``job``'s tasks as shapes, equal tasks counted together (in task order)."""
    tc = state.tasks.cols
    counts: dict[tuple[int, ...], int] = {}
    rows = state.job_tasks(job)
    cols = [tc[c][rows.start : rows.stop].tolist() for c in ("cpu", "mem", "gpus", "milli", "models")]
    for key in zip(*cols, strict=True):
        counts[key] = counts.get(key, 0) + 1
    return [Shape(n, *key) for key, n in counts.items()]  # (dict order: task order)


def never_fits_submitted(state: State, e: JobSubmitted, fleet: Fleet | None = None) -> str | None:
    """:meth:`Fleet.never_fits` of a submission not folded yet (the service's ingest): None when
    the state knows no node, or the job names no cell or GPU model the fleet knows."""
    if state.nodes.size == 0:
        return None
    cells = None
    if e.allowed_cells:
        cells = tuple(sorted({c for c in map(state.names["cell"].get, e.allowed_cells) if c >= 0}))
        if not cells:
            return None
    shapes = []
    for g in e.task_groups:
        mask = 0
        for m in g.gpu_models:
            found = state.names["model"].get(m)
            mask |= 1 << min(found, MAX_GPU_MODELS - 1) if found >= 0 else 0
        if g.gpu_models and not mask:
            return None
        shapes.append(Shape(g.count, g.cpu_milli, g.mem_mib, g.gpu_count, g.gpu_milli, mask))
    level = TOPOLOGY_CODES[e.required_topology] if e.required_topology else 0  # (the spread apart)
    return (fleet or Fleet(state)).never_fits(shapes, level, cells, e.spread == "host")
