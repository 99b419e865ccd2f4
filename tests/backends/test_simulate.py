"""Simulations driving the real service loop: reproducible to the byte, replay-verifiable, and
measuring what the scheduler did (inflate and replay modes, node failures)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fleetlog.backends.simulated import VirtualClock
from fleetlog.core.policy import policy_named
from fleetlog.events import JobPlaced, JobSubmitted, NodeHeartbeat, TaskFinished
from fleetlog.log.base import INPUTS
from fleetlog.log.file import FileLogStore
from fleetlog.log.memory import MemoryLogStore
from fleetlog.replay.summary import measure_store
from fleetlog.replay.verify import verify
from fleetlog.service.loop import LoopConfig, SchedulerLoop
from fleetlog.simulation import (
    Mode,
    RunConfig,
    Simulation,
    arrivals,
    load_cluster,
    load_workload,
    parse_mode,
    run_simulation,
)
from fleetlog.simulation.clusters import read_node_list
from fleetlog.simulation.metrics import JobStatus
from fleetlog.simulation.workload import read_pod_list
from tests.backends.helpers import (
    POD_HEADER,
    decisions,
    inputs,
    log_files,
    nodes_csv,
    pod,
    scheduler,
    write_csv,
)

BUSY_CLUSTER = "synthetic?nodes=6&hosts_per_rack=2&mtbf_h=2&mttr_s=600"
BUSY_WORKLOAD = "synthetic?jobs=80&load=1.5&max_h=1"


def busy(seed: int, log_dir: Path | None) -> RunConfig:
    """A small run with gangs, two priorities, quotas, preemptions and node failures."""
    cluster = load_cluster(BUSY_CLUSTER)
    return RunConfig(
        cluster, load_workload(BUSY_WORKLOAD, cluster, seed), parse_mode("replay"), seed, "default", log_dir
    )


async def test_the_same_seed_writes_byte_identical_logs_and_another_seed_does_not(tmp_path: Path) -> None:
    runs = [
        await run_simulation(busy(seed, tmp_path / name), scheduler(), measure=measure_store)
        for name, seed in (("a", 5), ("b", 5), ("c", 6))
    ]
    a, b, c = (log_files(tmp_path / name) for name in "abc")
    assert a == b
    assert a.keys() == c.keys()
    assert a != c
    assert runs[0].node_failures > 0
    assert runs[0].preemptions is not None
    assert runs[0].preemptions > 0
    assert runs[0].done > 0


def test_logs_are_identical_across_processes_with_different_hash_seeds(tmp_path: Path) -> None:
    for name, hash_seed in (("p1", "1"), ("p2", "2")):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "fleetlog.cli",
                "simulate",
                "--cluster",
                BUSY_CLUSTER,
                "--workload",
                BUSY_WORKLOAD,
                "--seed",
                "9",
                "--log",
                str(tmp_path / name / "log"),
                "--report",
                str(tmp_path / name / "report"),
                "--json",
            ],
            check=True,
            env=env,
            capture_output=True,
            timeout=300,
        )
    assert log_files(tmp_path / "p1" / "log") == log_files(tmp_path / "p2" / "log")


async def test_replay_verifies_every_decision_batch_of_a_simulated_log(tmp_path: Path) -> None:
    summary = await run_simulation(busy(3, tmp_path / "log"), scheduler())
    async with FileLogStore(tmp_path / "log") as store:
        report = await verify(store)
        committed = await store.committed_offset(LoopConfig().group)
        end = await store.log(INPUTS).end_offset()
    assert committed == end  # the run ends with every input folded
    assert report.ok, report.divergence
    assert report.batches > 0
    assert report.decisions == summary.decisions


async def test_a_node_failure_requeues_the_gang_and_it_runs_again_elsewhere() -> None:
    cluster = load_cluster("synthetic?nodes=2&mtbf_h=0")
    workload = load_workload("synthetic?jobs=1&gang=0&frac=0&constrained=0&max_h=1", cluster, 1)
    job = workload.jobs[0]
    mode = Mode("replay", drain_ms=24 * 3_600_000)
    clock = VirtualClock()
    async with MemoryLogStore(clock=clock) as store:
        sim = Simulation(cluster, (job,), mode, store=store, clock=clock, seed=1)
        loop = SchedulerLoop(store, policy_named("default"), LoopConfig(check_invariants=True))
        first_node = "node-00000"  # the first node wins the tie on an empty cluster
        sim.timers.at(30_000, lambda now: sim.cell.fail(first_node))
        await sim.run(loop)
        placements = [d for d in await decisions(store) if isinstance(d, JobPlaced)]
        finished = [t for t, e in await inputs(store) if isinstance(e, TaskFinished)]
    assert [p.tasks[0].node for p in placements] == [first_node, "node-00001"]
    assert (sim.recorder.lost, sim.recorder.placements, sim.recorder.counts[JobStatus.DONE]) == (1, 2, 1)
    assert len(finished) == 1
    assert finished[0] >= 30_000 + (job.duration_ms or 0)


def tiny_openb(tmp_path: Path) -> tuple[Path, Path]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    nodes = nodes_csv(tmp_path / "nodes.csv")
    pods = write_csv(
        tmp_path / "pods.csv",
        POD_HEADER,
        [
            pod("whole", gpus=1),
            pod("half", milli=500),
            pod("quarter", milli=250),
            pod("pair", gpus=2),
            pod("four", gpus=4),
            pod("cpu", gpus=0),
            pod("t4only", spec="T4", milli=600),
            pod("big", gpus=8),
        ],
    )
    return nodes, pods


Placements = list[tuple[str, tuple[object, ...]]]


async def run_inflate(
    tmp_path: Path, mode: str, policy: str, seed: int = 1
) -> tuple[Simulation, SchedulerLoop, Placements]:
    """An inflate run on three trace nodes; the simulation, the scheduler and every placement."""
    nodes, pods = tiny_openb(tmp_path)
    cluster = load_cluster(str(nodes))
    jobs = arrivals(parse_mode(mode), read_pod_list(pods), cluster, seed)
    clock = VirtualClock()
    async with MemoryLogStore(clock=clock) as store:
        sim = Simulation(cluster, jobs, parse_mode(mode), store=store, clock=clock, seed=seed)
        loop = SchedulerLoop(
            store, policy_named(policy, fail_unplaced=True), LoopConfig(check_invariants=True)
        )
        await sim.run(loop)
        placed: Placements = [(d.job_id, d.tasks) for d in await decisions(store) if isinstance(d, JobPlaced)]
    return sim, loop, placed


async def test_inflate_submits_up_to_the_target_and_decides_each_job_on_arrival(tmp_path: Path) -> None:
    sim, loop, _ = await run_inflate(tmp_path, "inflate?ratio=1.3", "fgd")
    r, cap = sim.recorder, sim.cluster.gpu_milli
    demands = [j.gpu_milli for j in sim.jobs]
    assert sum(demands) >= 1.3 * cap > sum(demands[:-1])  # arrivals stop once the target is reached
    assert r.counts[JobStatus.PENDING] == 0
    assert r.placed_jobs + r.counts[JobStatus.REJECTED] == len(sim.jobs)
    xs = [x for x, _ in r.curve]
    assert xs == sorted(xs)
    assert len(xs) == len(sim.jobs)
    assert all(0 <= y <= cap for _, y in r.curve)
    held = sum(usage[2] for (_, cell), usage in loop.state.usage.items() if cell == -1)
    assert held == sim.cell.allocated_milli == r.curve[-1][1]  # the cell's view is the scheduler's


async def test_inflate_decides_one_by_one_whatever_the_batch_of_arrivals_per_step(tmp_path: Path) -> None:
    one, _, one_placed = await run_inflate(tmp_path / "one", "inflate?batch=1", "best-fit", seed=4)
    many, _, many_placed = await run_inflate(tmp_path / "many", "inflate?batch=1000", "best-fit", seed=4)
    assert one_placed == many_placed
    assert one_placed
    assert one.steps > many.steps


async def test_replay_submits_at_trace_times_and_jobs_depart_after_their_durations(tmp_path: Path) -> None:
    nodes = nodes_csv(tmp_path / "nodes.csv", ["n0,16000,65536,2,T4"])
    pods = write_csv(
        tmp_path / "pods.csv",
        POD_HEADER,
        [
            pod("a", gpus=2, created=100, scheduled=100, deleted=700),  # fills the node for 600 s
            pod("b", gpus=1, created=200, scheduled=None, deleted=500),  # never scheduled: runs 300 s
            pod("c", gpus=1, created=300, scheduled=900, deleted=1000),
        ],
    )  # runs 100 s
    cluster = load_cluster(str(nodes))
    config = RunConfig(cluster, read_pod_list(pods), parse_mode("replay?speed=10"), 1, "default", None)
    jobs = arrivals(config.mode, config.workload, cluster, 1)
    assert [(j.job_id, j.arrival_ms, j.duration_ms) for j in jobs] == [
        ("a", 0, 600_000),
        ("b", 10_000, 300_000),
        ("c", 20_000, 100_000),
    ]
    clock = VirtualClock()
    async with MemoryLogStore(clock=clock) as store:
        sim = Simulation(cluster, jobs, config.mode, store=store, clock=clock, seed=1)
        await sim.run(scheduler()(store))
        events = await inputs(store)
    submitted = [(t, e.job_id) for t, e in events if isinstance(e, JobSubmitted)]
    assert submitted == [(0, "a"), (10_000, "b"), (20_000, "c")]
    finished = {e.job_id: t for t, e in events if isinstance(e, TaskFinished)}
    assert finished["b"] >= finished["a"] + 300_000
    assert finished["c"] >= finished["a"] + 100_000
    waits = sorted(sim.recorder.waits_ms)  # a at once; b and c until a departs (after 600 s)
    assert waits[0] == 0
    assert waits[1] >= 600_000 - 20_000
    assert waits[2] >= 600_000 - 10_000
    assert sim.recorder.counts[JobStatus.DONE] == 3
    assert all(e.healthy for _, e in events if isinstance(e, NodeHeartbeat))


async def test_a_trace_cluster_is_read_in_file_order(tmp_path: Path) -> None:
    nodes = read_node_list(nodes_csv(tmp_path / "nodes.csv"))
    assert [(n.name, n.gpu_count, n.gpu_model) for n in nodes] == [
        ("n0", 2, "T4"),
        ("n1", 2, "T4"),
        ("n2", 8, "G2"),
    ]
