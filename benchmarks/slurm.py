"""Jobs submitted and observed running per second through the Slurm backend, on a real cluster.

    python -m benchmarks.slurm --json [--quick | --smoke] [--repeats N]

``--smoke`` (CI): 4 jobs, one run after a 2-job warm-up — a test that it runs.

One run: a fresh embedded file log; the backend's heartbeats bring in the cluster's nodes; then
``JOBS`` one-task jobs (1 CPU, 100 MiB, ``sleep 600``) are appended to the inputs log at once and
the clock runs until the backend has appended a ``TaskStarted`` for every one of them, stepping
the scheduling loop and the backend in turns as the tests do (decide → ``JobPlaced`` → ``sbatch``
pinned to the chosen node → ``squeue --json`` sees it RUNNING → ``TaskStarted`` in the log). The
jobs are cancelled afterwards and the cluster drains before the next run.

- ``backend_jobs_running_per_s``: median over runs of jobs / seconds from the append to the last
  ``TaskStarted``;
- ``raw_sbatch_jobs_running_per_s`` (the baseline, same process, same cluster): the same number of
  pinned ``sbatch`` calls made directly (same concurrency), until ``squeue`` lists them all RUNNING;
- ``ratio``: backend / raw — what fleetlog's loop, logs and reconciliation cost on top of Slurm.

A warm-up of 16 raw jobs runs first (the first jobs after a start launch several times slower).
The cluster is started for the run (``tests/slurm_cluster.py``): 4 nodes of 64 declared CPUs on
this machine, under ``var/slurm-bench-<pid>``, stopped by PID at the end.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import emit, machine, parse
from fleetlog.backends.slurm import SlurmBackend, SlurmClient, SlurmConfig
from fleetlog.backends.slurm.client import Submission
from fleetlog.core.policy import policy_named
from fleetlog.events import JobSubmitted, TaskGroup, encode, envelope
from fleetlog.log.base import INPUTS, Message
from fleetlog.log.file import FileLogStore
from fleetlog.service.loop import LoopConfig, SchedulerLoop
from tests.slurm_cluster import REPO, SlurmCluster

NODES, CPUS = 4, 64
CONCURRENCY = 4
_runs = itertools.count()


def jobs(n: int) -> list[Message]:
    group = TaskGroup(count=1, cpu_milli=1000, mem_mib=100)
    return [
        Message(encode(envelope(JobSubmitted(job_id=f"b{i}", tenant="bench", task_groups=(group,)), "bench")))
        for i in range(n)
    ]


async def through_backend(cluster: SlurmCluster, n: int) -> float:
    """Seconds from appending ``n`` jobs to the backend's ``TaskStarted`` for the last of them."""
    config = SlurmConfig(
        prefix=f"bench{next(_runs)}", slurm_conf=str(cluster.conf), poll_ms=0, submit_concurrency=CONCURRENCY
    )
    with tempfile.TemporaryDirectory() as tmp:
        async with FileLogStore(Path(tmp), fsync="never") as store:
            loop = SchedulerLoop(store, policy_named("default"), LoopConfig())
            backend = SlurmBackend(store, config, lambda job, index: "sleep 600")
            await backend.step()  # the first heartbeats
            await loop.step(0)
            await store.log(INPUTS).append(jobs(n))
            started = time.perf_counter()
            while backend.stats.reported.get("started", 0) < n:
                await loop.step(0)
                await backend.step()
            elapsed = time.perf_counter() - started
            await cancel_all(cluster, config.prefix)
    return elapsed


async def raw_sbatch(cluster: SlurmCluster, n: int) -> float:
    """Seconds for ``n`` pinned sbatch calls (``CONCURRENCY`` at a time) until all are RUNNING."""
    client = SlurmClient(str(cluster.conf))
    gate = asyncio.Semaphore(CONCURRENCY)
    prefix = f"raw{next(_runs)}"

    async def one(i: int) -> int:
        options = (
            f"--job-name={prefix}:{i}",
            f"--nodelist=n{i % NODES + 1}",
            "--cpus-per-task=1",
            "--mem=100M",
        )
        async with gate:
            return await client.submit(Submission((*options, "--output=/dev/null"), "#!/bin/sh\nsleep 600\n"))

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    while sum(1 for j in await client.jobs() if j.name.startswith(prefix) and j.job_state == "RUNNING") < n:
        pass
    elapsed = time.perf_counter() - started
    await cancel_all(cluster, prefix)
    return elapsed


async def cancel_all(cluster: SlurmCluster, prefix: str) -> None:
    """Cancel the run's jobs and wait until Slurm has none of them active (the nodes are free)."""
    client = SlurmClient(str(cluster.conf))
    while True:
        active = [
            j.job_id for j in await client.jobs() if j.name.startswith(prefix) and j.job_state != "CANCELLED"
        ]
        if not active:
            return
        await client.cancel(active)
        await asyncio.sleep(0.5)


async def measure(n: int, repeats: int, warm_up: int = 16) -> dict[str, Any]:
    run_dir = REPO / "var" / f"slurm-bench-{os.getpid()}"  # (its own: a test session may run beside)
    cluster = SlurmCluster(run_dir, nodes=NODES, cpus=CPUS, mem_mib=32768, gpus=0)
    cluster.start()
    try:
        await raw_sbatch(cluster, warm_up)  # warm-up: the first jobs after a start launch slowly
        backend_s, raw_s = [], []
        for _ in range(repeats):
            raw_s.append(await raw_sbatch(cluster, n))
            backend_s.append(await through_backend(cluster, n))
    finally:
        cluster.close()
    backend_rate, raw_rate = n / statistics.median(backend_s), n / statistics.median(raw_s)
    return {
        "benchmark": "slurm",
        "jobs_per_run": n,
        "repeats": repeats,
        "nodes": NODES,
        "cpus_per_node": CPUS,
        "submit_concurrency": CONCURRENCY,
        "backend_jobs_running_per_s": round(backend_rate, 1),
        "raw_sbatch_jobs_running_per_s": round(raw_rate, 1),
        "ratio": round(backend_rate / raw_rate, 2),
        "backend_seconds": [round(s, 2) for s in backend_s],
        "raw_seconds": [round(s, 2) for s in raw_s],
        "machine": machine(),
    }


def main() -> None:
    args = parse(__doc__.splitlines()[0])
    n, repeats, warm_up = (4, 1, 2) if args.smoke else (64, 3, 16) if args.quick else (200, args.repeats, 16)
    emit(asyncio.run(measure(n, repeats, warm_up)), args.json)


if __name__ == "__main__":
    main()
