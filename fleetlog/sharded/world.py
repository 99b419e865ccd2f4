"""A simulated world around the in-process sharded driver (``fleetlog simulate --cells N --shards K``):
cells of 8-GPU nodes that heartbeat, tasks that start when placed and finish after their
duration, jobs of a few tenants arriving over virtual time. It shows the global layer (the
dispatcher, the cell shards, summaries and hand-backs) with no server and no log.

The world is what ``benchmarks/shards.py`` drives around plain heartbeats, with tasks that run
and end: the simulation harness (``fleetlog.simulation``) never imports the core, so this lives
beside the driver. Seeded (``random.Random(seed)``): the same arguments give the same run and
the same :meth:`ShardedFleet.digest`.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fleetlog.core import dispatch as d
from fleetlog.events import JobPlaced, JobSubmitted, NodeHeartbeat, TaskFinished, TaskGroup, TaskStarted
from fleetlog.events.model import JobReturned, TaskPreempted
from fleetlog.sharded.driver import FleetConfig, ShardedFleet

SHAPES = ((1, 4_000), (1, 4_000), (2, 8_000), (4, 16_000), (8, 24_000))
"""(GPUs, milli-CPU) of a task, drawn uniformly: small jobs are the most common."""
NODE_CPU, NODE_MEM, NODE_GPUS = 96_000, 786_432, 8


@dataclass(frozen=True)
class WorldSpec:
    """What to simulate."""

    cells: int
    shards: int
    nodes: int = 20
    """Nodes per cell."""
    jobs: int = 2_000
    tenants: int = 4
    seed: int = 1
    tick_ms: int = 1_000
    load: float = 1.2
    """Offered GPU load against the fleet's GPUs (above 1: contention, so shares matter)."""
    mean_duration_ms: int = 120_000
    hold_ms: int = 30_000

    def check(self) -> str:
        """What is wrong with the spec (``""``: nothing), in one line."""
        flags = {"nodes": "nodes-per-cell"}
        for name in ("cells", "shards", "nodes", "jobs", "tenants", "tick_ms", "mean_duration_ms"):
            if getattr(self, name) < 1:
                flag = flags.get(name, name.replace("_", "-"))
                return f"--{flag} must be at least 1 (got {getattr(self, name)})"
        if self.shards > self.cells:
            return (f"--shards {self.shards} is more than --cells {self.cells}: "
                    "every shard holds at least one cell")
        if self.cells > 1_024:
            return f"--cells {self.cells}: at most 1,024 cells (a job names at most 1,024 allowed cells)"
        if self.cells * self.nodes > 100_000:
            return (f"--cells x --nodes-per-cell is {self.cells * self.nodes:,} nodes: "
                    "at most 100,000 in one process")
        if not 0 < self.load <= 10:
            return f"load {self.load}: between 0 (excluded) and 10"
        return ""


def cell_name(i: int) -> str:
    return f"cell{i:03d}"


def cell_map(spec: WorldSpec) -> d.CellMap:
    """Cell i in partition i mod K: K shards, each holding every K-th cell."""
    return d.CellMap(tuple((cell_name(i), i % spec.shards) for i in range(spec.cells)))


def make_jobs(spec: WorldSpec) -> list[tuple[int, JobSubmitted, int]]:
    """(arrival ms, job, duration ms) in arrival order: one-task jobs and a few 2-task gangs
    of the tenants in turn, arrivals spread so the offered load is ``spec.load``."""
    rng = random.Random(spec.seed)
    gpus_total = spec.cells * spec.nodes * NODE_GPUS
    out, now = [], 0.0
    for i in range(spec.jobs):
        gpus, cpu = rng.choice(SHAPES)
        tasks = 2 if rng.random() < 0.1 else 1
        duration = max(spec.tick_ms, int(rng.expovariate(1 / spec.mean_duration_ms)))
        group = TaskGroup(count=tasks, cpu_milli=cpu, mem_mib=8_192 * gpus, gpu_count=gpus, gpu_milli=1_000)
        job = JobSubmitted(job_id=f"j{i:06d}", tenant=f"t{i % spec.tenants}", task_groups=(group,))
        out.append((int(now), job, duration))
        # mean GPU-ms offered per ms = load x fleet GPUs: the gap after a job of g GPUs
        now += rng.expovariate(spec.load * gpus_total / (spec.mean_duration_ms * gpus * tasks))
    return out


@dataclass
class CellCount:
    placed: int = 0
    returned: int = 0
    gpu_ms: dict[str, int] = field(default_factory=dict)
    """Tenant -> GPU-milliseconds its running tasks held here."""


@dataclass
class Running:
    cell: str
    tenant: str
    gpus: int
    """GPUs its tasks hold in all."""
    tasks_left: int


class World:
    """The fleet and its simulated cells: :meth:`run` until every job ended, or nothing moved
    for longer than two hold times after the last arrival."""

    def __init__(self, spec: WorldSpec) -> None:
        self.spec = spec
        self.fleet = ShardedFleet(FleetConfig(cell_map(spec), hold_ms=spec.hold_ms))
        self.counts = {c: CellCount() for c in self.fleet.config.cells.cells}
        self.nodes = {c: [NodeHeartbeat(cell=c, node=f"{c}-n{n:04d}", cpu_milli=NODE_CPU, mem_mib=NODE_MEM,
                                        gpu_count=NODE_GPUS, gpu_model="A100",
                                        topology=("b0", f"r{n // 16}", f"n{n:04d}"))
                          for n in range(spec.nodes)] for c in self.counts}
        self.jobs: dict[str, tuple[JobSubmitted, int]] = {}
        self.finishes: list[tuple[int, str, int]] = []
        """Heap of (ms, job, task): tasks that end then."""
        self.running: dict[str, Running] = {}
        self.dispatched = self.finished = 0

    def run(self, progress: Callable[[int, int], None] = lambda done, total: None) -> dict[str, Any]:
        """Arrivals by virtual time, a fleet step per tick, every node's heartbeat every 10 s."""
        arrivals, fleet, tick = make_jobs(self.spec), self.fleet, self.spec.tick_ms
        for cell, beats in self.nodes.items():
            fleet.to_cell(cell, *beats)
        k = quiet = 0
        while self.finished < len(arrivals):
            while k < len(arrivals) and arrivals[k][0] <= fleet.now_ms:
                _, job, duration = arrivals[k]
                self.jobs[job.job_id] = (job, duration)
                fleet.submit(job)
                k += 1
            moved = self._step()
            progress(self.finished, len(arrivals))
            quiet = 0 if moved or k < len(arrivals) or self.running else quiet + 1
            if quiet * tick > 2 * self.spec.hold_ms + 10_000:
                break  # what waits now waits for good (no room will free up)
            self._advance()
        return self.report(len(arrivals))

    def _advance(self) -> None:
        fleet, tick = self.fleet, self.spec.tick_ms
        for run in self.running.values():
            held = self.counts[run.cell].gpu_ms
            held[run.tenant] = held.get(run.tenant, 0) + run.gpus * tick
        fleet.advance(tick)
        if fleet.now_ms % 10_000 < tick:
            for cell, beats in self.nodes.items():
                fleet.to_cell(cell, *beats)
        while self.finishes and self.finishes[0][0] <= fleet.now_ms:
            _, job_id, task = heapq.heappop(self.finishes)
            job = self.running.get(job_id)
            if job is None:
                continue  # preempted meanwhile: its tasks run again when placed again
            fleet.to_cell(job.cell, TaskFinished(job_id=job_id, task_index=task))
            job.tasks_left -= 1
            if not job.tasks_left:
                del self.running[job_id]
                self.finished += 1

    def _step(self) -> bool:
        step = self.fleet.step()
        self.dispatched += len(step.dispatched)
        for out in step.outs:
            for decision in out.decisions:
                if isinstance(decision, JobPlaced):
                    self._started(decision)
                elif isinstance(decision, TaskPreempted):
                    self.running.pop(decision.job_id, None)
            for event in out.to_global:
                if isinstance(event, JobReturned):
                    self.counts[event.cell].returned += 1
        return bool(step.dispatched or step.placed or any(o.to_global for o in step.outs))

    def _started(self, placed: JobPlaced) -> None:
        job, duration = self.jobs[placed.job_id]
        self.counts[placed.cell].placed += 1
        gpus = sum(g.count * g.gpu_count for g in job.task_groups)
        self.running[placed.job_id] = Running(placed.cell, job.tenant, gpus, len(placed.tasks))
        starts = [TaskStarted(job_id=placed.job_id, task_index=t.task_index, node=t.node)
                  for t in placed.tasks]
        self.fleet.to_cell(placed.cell, *starts)
        end = self.fleet.now_ms + duration
        for t in placed.tasks:
            heapq.heappush(self.finishes, (end, placed.job_id, t.task_index))

    def report(self, jobs: int) -> dict[str, Any]:
        """Per cell and fleet-wide: placements, GPU allocation over the run, returns, and each
        tenant's share of the GPU-time the fleet ran."""
        spec, fleet = self.spec, self.fleet
        elapsed = max(fleet.now_ms, 1)
        cell_gpus = spec.nodes * NODE_GPUS
        per_cell: list[dict[str, Any]] = []
        fleet_ms: dict[str, int] = {}
        for cell, count in self.counts.items():
            for tenant, ms in count.gpu_ms.items():
                fleet_ms[tenant] = fleet_ms.get(tenant, 0) + ms
            per_cell.append({
                "cell": cell, "shard": fleet.config.cells.partition_of(cell), "placed": count.placed,
                "returned": count.returned,
                "gpu_allocation_pct": round(100 * sum(count.gpu_ms.values()) / (cell_gpus * elapsed), 2),
                "tenant_share_pct": _pct(count.gpu_ms),
            })
        waiting = sum(1 for j in fleet.dispatcher.jobs.values() if j.status == d.PENDING)
        return {
            "cells": spec.cells, "shards": spec.shards, "nodes_per_cell": spec.nodes, "jobs": jobs,
            "seed": spec.seed, "placed": sum(c["placed"] for c in per_cell), "finished": self.finished,
            "dispatched": self.dispatched, "returned": sum(c["returned"] for c in per_cell),
            "waiting": waiting, "refused": len(fleet.refused),
            "gpu_allocation_pct": round(100 * sum(fleet_ms.values()) / (cell_gpus * spec.cells * elapsed), 2),
            "tenant_share_pct": _pct(fleet_ms), "virtual_s": round(fleet.now_ms / 1_000, 1),
            "steps": fleet.steps, "digest": fleet.digest(), "per_cell": per_cell,
        }


def _pct(by_tenant: dict[str, int]) -> dict[str, float]:
    """Each tenant's share of the total, in percent (sorted by tenant)."""
    total = sum(by_tenant.values())
    return {t: round(100 * v / total, 2) if total else 0.0 for t, v in sorted(by_tenant.items())}
