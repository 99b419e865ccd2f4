"""A scheduler loop and a Slurm backend over one file log, stepped together against the real cluster."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from fleetlog.backends.slurm import SlurmBackend, SlurmConfig
from fleetlog.core.policy import policy_named
from fleetlog.core.state import JobState
from fleetlog.events import Event, JobPlaced, JobSubmitted, NodeHeartbeat, TaskGroup, encode, envelope
from fleetlog.events.codec import CONTENT_TYPE_HEADER, decode
from fleetlog.events.model import Decision
from fleetlog.log.base import DECISIONS, INPUTS, LogStore, Message, Record
from fleetlog.log.consumer import decision_batches
from fleetlog.log.file import FileLogStore
from fleetlog.service.loop import LoopConfig, SchedulerLoop
from tests.slurm_cluster import SlurmCluster

_prefixes = itertools.count()


class SlurmJobView(msgspec.Struct, frozen=True):
    job_id: int
    name: str
    job_state: str
    nodes: str = ""
    tres_per_node: str = ""


class _Jobs(msgspec.Struct):
    jobs: list[SlurmJobView]


def job(
    job_id: str, tasks: int = 1, gpus: int = 0, cpu_milli: int = 1000, mem_mib: int = 256, priority: int = 0
) -> JobSubmitted:
    group = TaskGroup(
        count=tasks, cpu_milli=cpu_milli, mem_mib=mem_mib, gpu_count=gpus, gpu_milli=1000 if gpus else 0
    )
    return JobSubmitted(job_id=job_id, tenant="t", task_groups=(group,), priority=priority)


class Harness:
    """``scripts`` maps a job id to the shell its tasks run (default ``sleep 1``)."""

    def __init__(
        self,
        cluster: SlurmCluster,
        directory: Path,
        scripts: dict[str, str] | None = None,
        store: LogStore | None = None,
    ) -> None:
        self.cluster, self.directory = cluster, directory
        self.scripts = scripts or {}
        self.prefix = f"t{time.time_ns() % 10**9}x{next(_prefixes)}"
        self.store = store or FileLogStore(directory / "log")
        self.loop = SchedulerLoop(self.store, policy_named("default"), LoopConfig(check_invariants=True))
        self.backend = self.new_backend()

    def config(self, **overrides: object) -> SlurmConfig:
        base = SlurmConfig(
            prefix=self.prefix, slurm_conf=str(self.cluster.conf), heartbeat_ms=1000, poll_ms=100
        )
        return msgspec.structs.replace(base, **overrides)

    def new_backend(self, **overrides: object) -> SlurmBackend:
        return SlurmBackend(self.store, self.config(**overrides), self.workload)

    def workload(self, spec: JobSubmitted, task_index: int) -> str:
        return self.scripts.get(spec.job_id, "sleep 1")

    async def __aenter__(self) -> Harness:
        await self.store.open()
        await self.loop.recover()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.cancel_ours()
        await self.store.close()

    async def ready(self) -> None:
        """Step until the scheduler has every node's heartbeat."""
        await self.until(lambda events: len({e.node for e in events if isinstance(e, NodeHeartbeat)}) >= 4)

    async def submit(self, *jobs: JobSubmitted) -> None:
        await self.store.log(INPUTS).append([Message(encode(envelope(j, "test"))) for j in jobs])

    async def until(self, done: Callable[[list[Event]], bool], timeout_s: float = 60.0) -> list[Event]:
        """Step backend and scheduler together until ``done(inputs)`` holds; the inputs log's events."""
        deadline = time.monotonic() + timeout_s
        while True:
            await self.backend.step()
            await self.loop.step(20)
            inputs = await self.inputs()
            if done(inputs):
                return inputs
            if time.monotonic() > deadline:
                tail = "\n".join(repr(e) for e in inputs[-15:])
                raise AssertionError(f"condition not met within {timeout_s}s; inputs end with:\n{tail}")
            await asyncio.sleep(0.1)

    async def inputs(self) -> list[Event]:
        return await self.events(INPUTS)

    async def events(self, name: str) -> list[Event]:
        records = await self.read_all(name)
        return [decode(r.value, r.header(CONTENT_TYPE_HEADER)).event for r in records]

    async def read_all(self, name: str) -> list[Record]:
        """Every committed record of log ``name`` (Kafka returns a fetch at a time)."""
        log, records = self.store.log(name), []
        end = await log.end_offset()
        while len(records) < end:
            batch = await log.read(len(records), 100_000, timeout_ms=2000)
            if not batch:
                raise AssertionError(f"{name} log stalled at {len(records)} of {end}")
            records += batch
        return records

    async def decisions(self) -> list[Decision]:
        records = await self.read_all(DECISIONS)
        return [d for _, b in decision_batches(records) for d in b.decisions]

    async def placements(self) -> list[JobPlaced]:
        return [d for d in await self.decisions() if isinstance(d, JobPlaced)]

    def job_state(self, job_id: str) -> JobState:
        return JobState(int(self.loop.state.jobs.cols["state"][self.loop.state.job_row(job_id)]))

    def slurm_jobs(self) -> list[SlurmJobView]:
        """This test's jobs as Slurm lists them (names carry the test's prefix)."""
        jobs = msgspec.json.decode(self.cluster.command("squeue", "--json"), type=_Jobs).jobs
        return [j for j in jobs if j.name.startswith(self.prefix + ":")]

    async def cancel_ours(self) -> None:
        active = [str(j.job_id) for j in self.slurm_jobs() if j.job_state in {"PENDING", "RUNNING"}]
        if active:
            self.cluster.command("scancel", *active)


def of_type(events: list[Event], kind: type[Event], job_id: str | None = None) -> list[Event]:
    return [
        e for e in events if isinstance(e, kind) and (job_id is None or getattr(e, "job_id", None) == job_id)
    ]
