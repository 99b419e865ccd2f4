"""What a simulation measures, as the simulated world sees it (never by reading the scheduler).

Each job is pending, running, done or rejected.  The recorder keeps the counts, the time
each job waited for its first placement, the allocation curve against arrived demand
(inflate) and the utilisation and queue depth over time (replay).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Final


class JobStatus(enum.IntEnum):
    PENDING = 0
    RUNNING = 1
    DONE = 2
    REJECTED = 3


PENDING: Final = JobStatus.PENDING
RUNNING: Final = JobStatus.RUNNING
"""Bound once: ``JobStatus.PENDING`` is a lookup through the enum's metaclass at each use."""


@dataclass
class Sample:
    """The cell at one scheduling instant."""

    at_ms: int
    allocated_milli: int
    pending: int
    running: int


@dataclass
class Recorder:
    """Counts and series of one run; fed by the driver (arrivals) and the cell (everything else)."""

    capacity_milli: int
    status: dict[str, JobStatus] = field(default_factory=dict)
    arrived_at: dict[str, int] = field(default_factory=dict)
    demand_at: dict[str, int] = field(default_factory=dict)
    """Each job's arrived GPU demand (milli, cumulative) when it arrived: the curve's x."""
    counts: dict[JobStatus, int] = field(default_factory=lambda: dict.fromkeys(JobStatus, 0))
    placed_jobs: int = 0
    placements: int = 0
    rejections: int = 0
    preemptions: int = 0
    lost: int = 0
    node_failures: int = 0
    node_recoveries: int = 0
    demand_milli: int = 0
    ever_placed: set[str] = field(default_factory=set)  # membership only: never iterated
    waits_ms: list[int] = field(default_factory=list)
    curve: list[tuple[int, int]] = field(default_factory=list)
    """(arrived demand, allocated) in milli-GPUs after each placement or rejection."""
    samples: list[Sample] = field(default_factory=list)

    def _move(self, job_id: str, to: JobStatus) -> JobStatus | None:
        was = self.status.get(job_id)
        if was is not None:
            self.counts[was] -= 1
        self.status[job_id] = to
        self.counts[to] += 1
        return was

    def arrived(self, job_id: str, gpu_milli: int, now_ms: int) -> None:
        self.demand_milli += gpu_milli
        self.arrived_at[job_id] = now_ms
        self.demand_at[job_id] = self.demand_milli
        self._move(job_id, PENDING)

    def arrived_many(self, job_ids: Sequence[str], gpu_milli: Sequence[int], now_ms: int) -> None:
        """Jobs arrived together, in order: as many :meth:`arrived` calls, in C loops when none
        of them was submitted before (the usual case)."""
        if not self.status.keys().isdisjoint(job_ids):
            for job_id, milli in zip(job_ids, gpu_milli, strict=True):
                self.arrived(job_id, milli, now_ms)
            return
        demand = list(accumulate(gpu_milli, initial=self.demand_milli))
        self.demand_at.update(zip(job_ids, demand[1:], strict=True))
        self.demand_milli = demand[-1]
        self.arrived_at.update(dict.fromkeys(job_ids, now_ms))
        fresh = dict.fromkeys(job_ids, PENDING)  # a job listed twice counts once, as arrived() does
        self.status.update(fresh)
        self.counts[PENDING] += len(fresh)

    def placed(self, job_id: str, now_ms: int, allocated_milli: int) -> None:
        self.placements += 1
        arrived_at = self.arrived_at.get(job_id)
        if arrived_at is None:
            return  # a job this run did not submit
        counts, was = self.counts, self.status[job_id]
        counts[was] -= 1
        counts[RUNNING] += 1
        self.status[job_id] = RUNNING
        if was is PENDING and job_id not in self.ever_placed:
            self.ever_placed.add(job_id)
            self.placed_jobs += 1
            self.waits_ms.append(now_ms - arrived_at)
        self.curve.append((self.demand_at[job_id], allocated_milli))

    def rejected(self, job_id: str, allocated_milli: int) -> None:
        self.rejections += 1
        if job_id in self.arrived_at:
            self._move(job_id, JobStatus.REJECTED)
            self.curve.append((self.demand_at[job_id], allocated_milli))

    def stopped(self, job_id: str, preempted: bool) -> None:
        """A running gang stopped without finishing: preempted, or lost with a failed node."""
        if preempted:
            self.preemptions += 1
        else:
            self.lost += 1
        if self.status.get(job_id) == RUNNING:
            self._move(job_id, PENDING)

    def finished(self, job_id: str) -> None:
        if self.status.get(job_id) == RUNNING:
            self._move(job_id, JobStatus.DONE)

    def sample(self, now_ms: int, allocated_milli: int) -> None:
        """Record the cell at a scheduling instant (one sample per instant: the last wins)."""
        counts = self.counts
        sample = Sample(now_ms, allocated_milli, counts[PENDING], counts[RUNNING])
        if self.samples and self.samples[-1].at_ms == now_ms:
            self.samples[-1] = sample
        else:
            self.samples.append(sample)
