"""Workloads: the jobs a simulation submits, from an openb pod list or a seeded generator.

A workload is a list of jobs with a submission time and a true duration (what the job
would run for; the scheduler only ever sees ``expected_duration_ms``, when given), plus
setup events (tenant quotas) submitted before the first job.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final

from fleetlog.backends.simulated.cluster import Cluster
from fleetlog.events import InputEvent, JobSubmitted, QuotaSet, Resources, TaskGroup
from fleetlog.events.model import TopologyLevel
from fleetlog.simulation.clusters import MAX_GPUS_PER_NODE
from fleetlog.simulation.csvfile import Row, read_rows
from fleetlog.simulation.durations import load_durations
from fleetlog.simulation.spec import Spec, SpecError, TraceError, looks_like_path, parse_spec
from fleetlog.simulation.traces import openb_file

POD_COLUMNS: Final = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
TIME_COLUMNS: Final = ("creation_time", "deletion_time", "scheduled_time")
SYNTHETIC_PARAMS: Final = (
    "jobs",
    "load",
    "tenants",
    "prod",
    "gang",
    "frac",
    "cpu",
    "constrained",
    "durations",
    "duration_scale",
    "max_h",
)
OPENB_TENANT: Final = "openb"
PROD_PRIORITY: Final = 100


@dataclass(frozen=True)
class JobSpec:
    """One job of a workload: the event submitted, when, and how long it really runs."""

    event: JobSubmitted
    arrival_ms: int = 0
    duration_ms: int | None = None
    """How long each task runs once started; ``None``: until the simulation ends."""

    @property
    def job_id(self) -> str:
        return self.event.job_id

    @property
    def gpu_milli(self) -> int:
        """The job's total GPU request in milli-GPUs."""
        return sum(g.count * g.gpu_count * g.gpu_milli for g in self.event.task_groups)

    @property
    def tasks(self) -> int:
        return sum(g.count for g in self.event.task_groups)


@dataclass(frozen=True)
class Workload:
    """Jobs in submission order; ``timed`` when arrival times and durations come from a trace or
    a generator (replay mode needs them)."""

    jobs: tuple[JobSpec, ...]
    setup: tuple[InputEvent, ...] = ()
    source: str = "synthetic"
    timed: bool = True

    @property
    def gpu_milli(self) -> int:
        return sum(j.gpu_milli for j in self.jobs)


def load_workload(text: str, cluster: Cluster, seed: int) -> Workload:
    """The workload a ``--workload`` argument names: ``synthetic[?...]``, ``openb[:VARIANT]``, a CSV path."""
    spec = parse_spec(text)
    if spec.kind == "synthetic":
        spec.check_known(SYNTHETIC_PARAMS)
        return synthetic_workload(spec, cluster, seed)
    spec.check_known(())
    if spec.kind == "openb" or spec.kind.startswith("openb:"):
        variant = spec.kind.partition(":")[2] or "default"
        return read_pod_list(openb_file(f"openb_pod_list_{variant}.csv"))
    if looks_like_path(spec.kind):
        return read_pod_list(Path(spec.kind))
    raise SpecError(f"--workload {text!r}: not 'synthetic', 'openb[:VARIANT]' or a CSV file that exists")


# --- openb pod lists -----------------------------------------------------------------------


def read_pod_list(path: Path) -> Workload:
    """Pods of an openb pod-list CSV in file order, each one job of one task.

    Times (seconds from the trace start) are used when the file has them: the pod arrives at
    ``creation_time`` and runs ``deletion_time - scheduled_time`` (or ``- creation_time``
    when it was never scheduled)."""
    jobs: list[JobSpec] = []
    seen: dict[str, int] = {}
    timed = True
    for row in read_rows(path, POD_COLUMNS):
        job = pod_job(row)
        if job.job_id in seen:
            raise row.error(f"pod {job.job_id!r} is listed twice (first on line {seen[job.job_id]})")
        seen[job.job_id] = row.line
        timed = timed and all(c in row.values for c in TIME_COLUMNS)
        jobs.append(with_times(row, job) if timed else job)
    if not jobs:
        raise TraceError(path, 0, "no pods (the file has a header but no data lines)")
    return Workload(tuple(jobs), (), str(path), timed)


def pod_job(row: Row) -> JobSpec:
    """One pod row as a one-task job; its resource columns are checked against the event rules."""
    name = row.text("name")
    if not name or len(name) > 253:
        raise row.error("column 'name': a pod name of 1..253 characters is required")
    gpus, milli = row.integer("num_gpu", 0, MAX_GPUS_PER_NODE), row.integer("gpu_milli", 0, 1000)
    if (gpus == 0) != (milli == 0) or (gpus > 1 and milli != 1000):
        raise row.error(
            f"num_gpu {gpus} with gpu_milli {milli}: a pod takes 0 GPUs with 0 milli, one GPU "
            "with 1..1000 milli, or several whole GPUs (1000)"
        )
    models = tuple(sorted({m.strip() for m in row.text("gpu_spec").split("|") if m.strip()}))
    if any(len(m) > 253 for m in models) or len(models) > 64:
        raise row.error("column 'gpu_spec': at most 64 models of at most 253 characters")
    group = TaskGroup(
        count=1,
        cpu_milli=row.integer("cpu_milli", 0, 1 << 40),
        mem_mib=row.integer("memory_mib", 0, 1 << 40),
        gpu_count=gpus,
        gpu_milli=milli,
        gpu_models=models,
    )
    return JobSpec(JobSubmitted(job_id=name, tenant=OPENB_TENANT, task_groups=(group,)))


def with_times(row: Row, job: JobSpec) -> JobSpec:
    """``job`` with its trace arrival time and duration (both in milliseconds)."""
    created = row.number("creation_time")
    deleted = row.optional_number("deletion_time")
    scheduled = row.optional_number("scheduled_time")
    if deleted is None:
        return replace(job, arrival_ms=round(created * 1000))
    started = created if scheduled is None else scheduled
    if deleted < started:
        raise row.error(f"deletion_time {deleted:g} is before the pod started ({started:g})")
    duration_ms = max(1000, round((deleted - started) * 1000))
    return replace(job, arrival_ms=round(created * 1000), duration_ms=duration_ms)


# --- the seeded generator ------------------------------------------------------------------


def synthetic_workload(spec: Spec, cluster: Cluster, seed: int) -> Workload:
    """``jobs`` jobs of seeded shapes, tenants and priority classes, with Poisson arrivals at a
    rate that offers ``load`` times the cluster's GPU capacity on average."""
    rng = random.Random(f"fleetlog-sim/{seed}/workload")
    scale, max_h = spec.number("duration_scale", 1.0, 1e-6), spec.number("max_h", 6.0, 0.0, 1e6)
    durations = load_durations(spec.text_param("durations", "builtin"), scale, round(max_h * 3_600_000))
    tenants = spec.integer("tenants", 3, 1, 1000)
    shapes = Shapes(
        spec.number("frac", 0.3, 0, 1),
        spec.number("gang", 0.1, 0, 1),
        spec.number("constrained", 0.1, 0, 1),
        cluster.gpu_models,
        spec.number("cpu", 0.0, 0, 1),
    )
    prod = spec.number("prod", 0.2, 0, 1)
    jobs = []
    for i in range(spec.integer("jobs", 600, 1, 10_000_000)):
        duration = durations.sample_ms(rng)
        group, topology = shapes.draw(rng)
        tenant, priority = f"tenant-{rng.randrange(tenants)}", PROD_PRIORITY if rng.random() < prod else 0
        estimate = round(duration * rng.uniform(1.0, 2.0))  # users overestimate
        event = JobSubmitted(
            job_id=f"job-{i:06d}",
            tenant=tenant,
            priority=priority,
            task_groups=(group,),
            required_topology=topology,
            expected_duration_ms=estimate,
        )
        jobs.append(JobSpec(event, 0, duration))
    timed = poisson_arrivals(rng, jobs, spec.number("load", 1.1, 1e-6, 100.0) * cluster.gpu_milli)
    return Workload(tuple(timed), quotas(tenants, cluster), spec.text or "synthetic", True)


@dataclass(frozen=True)
class Shapes:
    """The task-shape mix: fractional single GPUs, whole GPUs (1-8), rack-local gangs of 8-GPU
    tasks, and CPU-only tasks (none by default: the draws of existing seeds stay as they were)."""

    frac: float
    gang: float
    constrained: float
    models: tuple[str, ...]
    cpu: float = 0.0

    def draw(self, rng: random.Random) -> tuple[TaskGroup, TopologyLevel | None]:
        """One job's task group and required topology."""
        u = rng.random()
        if self.gang + self.frac <= u < self.gang + self.frac + self.cpu:
            cpu_milli, mem_mib = rng.choice((1_000, 2_000, 4_000, 8_000)), rng.choice((2_048, 8_192))
            return TaskGroup(count=1, cpu_milli=cpu_milli, mem_mib=mem_mib), None
        if u < self.gang:
            count, gpus, milli = rng.choice((2, 2, 4)), 8, 1000
        elif u < self.gang + self.frac:
            count, gpus, milli = 1, 1, rng.choice((100, 200, 250, 300, 400, 500, 600, 750))
        else:
            count, gpus, milli = 1, rng.choice((1, 1, 1, 2, 2, 4, 8)), 1000
        constrained = self.models and gpus < 8 and rng.random() < self.constrained
        models = (rng.choice(self.models),) if constrained else ()
        per_gpu_cpu = rng.choice((2_000, 4_000, 6_000, 8_000))
        group = TaskGroup(
            count=count,
            cpu_milli=max(500, per_gpu_cpu * gpus * milli // 1000),
            mem_mib=rng.choice((8_192, 16_384, 32_768)) * gpus,
            gpu_count=gpus,
            gpu_milli=milli,
            gpu_models=models,
        )
        return group, "rack" if count > 1 else None


def poisson_arrivals(rng: random.Random, jobs: list[JobSpec], offered_gpu_milli: float) -> list[JobSpec]:
    """Give ``jobs`` Poisson arrival times whose mean rate offers ``offered_gpu_milli`` of GPU load."""
    mean_work = sum(j.gpu_milli * (j.duration_ms or 0) for j in jobs) / len(jobs)  # milli-GPU x ms
    mean_gap_ms = max(1.0, mean_work / offered_gpu_milli) if offered_gpu_milli else 1000.0
    at, out = 0.0, []
    for job in jobs:
        out.append(replace(job, arrival_ms=math.floor(at)))
        at += rng.expovariate(1.0 / mean_gap_ms)
    return out


def quotas(tenants: int, cluster: Cluster) -> tuple[InputEvent, ...]:
    """An equal share of the cell per tenant as nominal quota, in one cohort: idle quota is lent
    and reclaimed."""
    nominal = Resources(
        cpu_milli=cluster.cpu_milli // tenants,
        mem_mib=cluster.mem_mib // tenants,
        gpu_milli=cluster.gpu_milli // tenants,
    )
    return tuple(QuotaSet(tenant=f"tenant-{t}", nominal=nominal, cohort="shared") for t in range(tenants))
