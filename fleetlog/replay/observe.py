"""Observers of a replayed or re-run history: the measures what-if compares and report plots,
and the task slices the timeline draws.

Both see the same things in a recorded replay and in a what-if run — inputs as they are folded
and decision batches after they are folded — so the two sides are measured alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

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
from fleetlog.measures import pct, wait_percentiles_s
from fleetlog.replay.source import Input


@dataclass
class Sample:
    at_ms: int
    gpu_total_milli: int
    gpu_used_milli: int
    pending: int
    running: int


@dataclass
class Measures:
    """The measures ``simulate`` and ``replay report`` share (:mod:`fleetlog.measures`), from the
    logs: allocation and queue depth at every instant — after each decision batch and after the
    inputs of each log time (the engine hands them over one log time at a time,
    :attr:`per_instant`) — waits for the first placement, preemptions, tenant GPU-time."""

    per_instant: ClassVar[bool] = True
    samples: list[Sample] = field(default_factory=list)
    submitted_at: dict[str, int] = field(default_factory=dict)
    waits_ms: dict[str, int] = field(default_factory=dict)
    preemptions: int = 0
    placements: int = 0
    tenant_gpu_ms: dict[str, float] = field(default_factory=dict)
    _usage: dict[str, int] = field(default_factory=dict)
    """Each tenant's GPU milli in use at the last sample (held until the next)."""

    def inputs(self, state: State, events: Sequence[Input]) -> None:
        for _, e, at_ms in events:
            if type(e) is JobSubmitted:
                self.submitted_at.setdefault(e.job_id, at_ms)
        self.sample(state)

    def decided(self, state: State, batch: DecisionBatch) -> None:
        preempted: dict[str, None] = {}  # one preemption of a job, however many of its tasks
        for d in batch.decisions:
            if isinstance(d, JobPlaced):
                self.placements += 1
                if d.job_id not in self.waits_ms and d.job_id in self.submitted_at:
                    self.waits_ms[d.job_id] = state.now_ms - self.submitted_at[d.job_id]
            elif isinstance(d, TaskPreempted):
                preempted[d.job_id] = None
        self.preemptions += len(preempted)
        self.sample(state)

    def sample(self, state: State) -> None:
        """The allocation and queue depth now (one sample per log time: the last wins)."""
        self._integrate(state.now_ms)
        total, used = gpu_totals(state)
        running = int(np.count_nonzero(state.jobs.view("state") == JobState.RUNNING))
        point = Sample(state.now_ms, total, used, state.pending_count, running)
        if self.samples and self.samples[-1].at_ms == point.at_ms:
            self.samples[-1] = point
        else:
            self.samples.append(point)
        names = state.names["tenant"].names
        held = sorted(state.usage.items())
        self._usage = {names[tenant]: use[2] for (tenant, cell), use in held if cell == -1 and use[2]}

    def _integrate(self, now_ms: int) -> None:
        """Tenant GPU-milli x ms since the last sample, at the usage held until now."""
        last = self.samples[-1].at_ms if self.samples else now_ms
        if now_ms > last:
            for tenant, use in self._usage.items():
                self.tenant_gpu_ms[tenant] = self.tenant_gpu_ms.get(tenant, 0.0) + use * (now_ms - last)

    def finish(self, state: State) -> None:
        """The end of the log: the last sample closes the allocation window."""
        self.sample(state)

    def summary(self) -> dict[str, Any]:
        """The shared measures (:data:`fleetlog.measures.ROWS`), percent and seconds."""
        share_total = sum(self.tenant_gpu_ms.values())
        return {
            "gpu_allocation_pct": self.allocation_pct(),
            "jobs_submitted": len(self.submitted_at),
            "jobs_placed": len(self.waits_ms),
            "jobs_never_placed": len(self.submitted_at) - len(self.waits_ms),
            "placements": self.placements,
            "preemptions": self.preemptions,
            "wait_s": wait_percentiles_s(list(self.waits_ms.values())),
            "tenant_share_pct": {t: pct(v, share_total) for t, v in sorted(self.tenant_gpu_ms.items())},
        }

    def allocation_pct(self) -> float | None:
        """Allocated over available GPU-time (GPUs of up nodes) from the first submission to the
        end of the log, each sample holding until the next; ``None`` when no GPU-time was
        available in that window (no job, no GPU node, or a window of no length)."""
        if not self.submitted_at or not self.samples:
            return None
        start, end = min(self.submitted_at.values()), self.samples[-1].at_ms
        bounds = [s.at_ms for s in self.samples[1:]] + [end]
        used = total = 0
        for sample, until in zip(self.samples, bounds, strict=True):
            lo, hi = max(sample.at_ms, start), min(until, end)
            if hi > lo:
                used += sample.gpu_used_milli * (hi - lo)
                total += sample.gpu_total_milli * (hi - lo)
        return pct(used, total)


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
            elif isinstance(e, TaskFailed) and e.requeue:
                self._close_job(e.job_id, at_ms, "withdrawn")
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
