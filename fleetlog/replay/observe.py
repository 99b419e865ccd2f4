"""Observers of a replayed or re-run history: the measures what-if compares and report plots,
and the task slices the timeline draws.

Both see the same things in a recorded replay and in a what-if run — inputs as they are folded
and decision batches after they are folded — so the two sides are measured alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fleetlog.core.state import JobState, State
from fleetlog.core.views import gpu_totals
from fleetlog.events.model import (
    DecisionBatch,
    JobCancelled,
    JobPlaced,
    JobSubmitted,
    TaskFailed,
    TaskFinished,
    TaskPreempted,
)
from fleetlog.replay.source import Input

PERCENTILES = (50, 90, 99)


@dataclass
class Sample:
    at_ms: int
    gpu_total_milli: int
    gpu_used_milli: int
    pending: int
    running: int


@dataclass
class Measures:
    """Allocation and queue depth after every batch, pending times, preemptions, tenant GPU-time."""

    samples: list[Sample] = field(default_factory=list)
    submitted_at: dict[str, int] = field(default_factory=dict)
    waits_ms: dict[str, int] = field(default_factory=dict)
    preemptions: int = 0
    placements: int = 0
    tenant_gpu_ms: dict[str, float] = field(default_factory=dict)
    _last_ms: int | None = None

    def inputs(self, state: State, events: Sequence[Input]) -> None:
        for _, e, at_ms in events:
            if type(e) is JobSubmitted:
                self.submitted_at.setdefault(e.job_id, at_ms)

    def decided(self, state: State, batch: DecisionBatch) -> None:
        self._integrate(state)
        for d in batch.decisions:
            if isinstance(d, JobPlaced):
                self.placements += 1
                if d.job_id not in self.waits_ms and d.job_id in self.submitted_at:
                    self.waits_ms[d.job_id] = state.now_ms - self.submitted_at[d.job_id]
            elif isinstance(d, TaskPreempted):
                self.preemptions += 1
        self.sample(state)

    def sample(self, state: State) -> None:
        total, used = gpu_totals(state)
        running = int(np.count_nonzero(state.jobs.view("state") == JobState.RUNNING))
        point = Sample(state.now_ms, total, used, state.pending_count, running)
        if self.samples and self.samples[-1].at_ms == point.at_ms:
            self.samples[-1] = point
        else:
            self.samples.append(point)

    def _integrate(self, state: State) -> None:
        """Tenant GPU-milli x ms since the last batch, at the usage held until now."""
        if self._last_ms is not None and state.now_ms > self._last_ms:
            dt = state.now_ms - self._last_ms
            names = state.names["tenant"].names
            for (tenant, cell), use in sorted(state.usage.items()):
                if cell == -1 and use[2]:
                    self.tenant_gpu_ms[names[tenant]] = (
                        self.tenant_gpu_ms.get(names[tenant], 0.0) + use[2] * dt
                    )
        self._last_ms = state.now_ms

    def finish(self, state: State) -> None:
        self._integrate(state)
        self.sample(state)

    def summary(self) -> dict[str, Any]:
        """The comparable numbers: time-weighted allocation, pending-time percentiles, preemptions,
        each tenant's share of GPU-time."""
        waits = np.array(sorted(self.waits_ms.values()), dtype=np.float64)
        share_total = sum(self.tenant_gpu_ms.values())
        return {
            "gpu_allocation": round(self.allocation(), 4),
            "placements": self.placements,
            "jobs_placed": len(self.waits_ms),
            "jobs_never_placed": len(self.submitted_at) - len(self.waits_ms),
            "preemptions": self.preemptions,
            "pending_ms": {
                f"p{p}": (float(np.percentile(waits, p)) if waits.size else None) for p in PERCENTILES
            },
            "tenant_share": {t: round(v / share_total, 4) for t, v in sorted(self.tenant_gpu_ms.items())}
            if share_total
            else {},
        }

    def allocation(self) -> float:
        """Allocated over available GPU, weighted by how long each sample held."""
        used = total = 0.0
        for a, b in zip(self.samples, self.samples[1:], strict=False):
            dt = b.at_ms - a.at_ms
            used += a.gpu_used_milli * dt
            total += a.gpu_total_milli * dt
        return used / total if total else 0.0


@dataclass
class Slice:
    job_id: str
    task: int
    node: str
    cell: str
    start_ms: int
    end_ms: int
    end: str
    gpus: tuple[int, ...] = ()
    """The GPU indices the task holds on its node (one for a fractional GPU, none for CPU only)."""


@dataclass(frozen=True)
class Preemption:
    """One ``TaskPreempted`` decision: which task stopped, for which job, when."""

    job_id: str
    task: int
    by_job_id: str
    at_ms: int


@dataclass
class Slices:
    """Each task's time on a node: from its placement to its finish, failure, preemption,
    cancellation or its node's loss (seen when the job stops running); and every preemption,
    so the timeline can draw an arrow from the preemptor to its victim."""

    open: dict[str, dict[int, Slice]] = field(default_factory=dict)
    done: list[Slice] = field(default_factory=list)
    preemptions: list[Preemption] = field(default_factory=list)

    def inputs(self, state: State, events: Sequence[Input]) -> None:
        for _, e, at_ms in events:
            if isinstance(e, TaskFinished) and not e.exit_code:
                self._close(e.job_id, e.task_index, at_ms, "finished")
            elif isinstance(e, TaskFinished | TaskFailed):
                self._close_job(e.job_id, at_ms, "failed")
            elif isinstance(e, JobCancelled):
                self._close_job(e.job_id, at_ms, "cancelled")
        self._sweep(state)

    def decided(self, state: State, batch: DecisionBatch) -> None:
        for d in batch.decisions:
            if isinstance(d, TaskPreempted):
                self.preemptions.append(Preemption(d.job_id, d.task_index, d.by_job_id, state.now_ms))
                self._close_job(d.job_id, state.now_ms, f"preempted by {d.by_job_id}")
            elif isinstance(d, JobPlaced):
                self._close_job(d.job_id, state.now_ms, "placed again")
                self.open[d.job_id] = {
                    t.task_index: Slice(
                        d.job_id, t.task_index, t.node, d.cell, state.now_ms, -1, "", tuple(t.gpu_indices)
                    )
                    for t in d.tasks
                }

    def finish(self, state: State) -> None:
        self._sweep(state)
        for job_id in sorted(self.open):
            self._close_job(job_id, state.now_ms, "running at the end of the log")

    def _sweep(self, state: State) -> None:
        """Close the slices of jobs that stopped running without a task event (node lost)."""
        for job_id in sorted(self.open):
            row = state.job_row(job_id)
            if row < 0 or int(state.jobs.cols["state"][row]) != JobState.RUNNING:
                self._close_job(job_id, state.now_ms, "node lost")

    def _close_job(self, job_id: str, at_ms: int, why: str) -> None:
        for task in sorted(self.open.get(job_id, {})):
            self._close(job_id, task, at_ms, why)

    def _close(self, job_id: str, task: int, at_ms: int, why: str) -> None:
        tasks = self.open.get(job_id)
        found = tasks.pop(task, None) if tasks is not None else None
        if found is not None:
            found.end_ms, found.end = at_ms, why
            self.done.append(found)
        if tasks is not None and not tasks:
            del self.open[job_id]
