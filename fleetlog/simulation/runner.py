"""One seeded simulation, end to end: plan the arrivals, open the log, run, summarise."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from fleetlog.backends.simulated.clock import VirtualClock
from fleetlog.backends.simulated.cluster import Cluster
from fleetlog.log.base import LogStore
from fleetlog.log.logdir import prepare_log_dir
from fleetlog.simulation.driver import (
    Progress,
    SchedulerFactory,
    Simulation,
    Stop,
    open_store,
    setup_messages,
)
from fleetlog.simulation.modes import Mode, arrivals
from fleetlog.simulation.report import Measured, RunSummary, summarise
from fleetlog.simulation.spec import SpecError
from fleetlog.simulation.workload import Workload

Measurer = Callable[[LogStore], Awaitable[Measured]]
"""The shared measures of a run's log store (``fleetlog.replay.summary.measure_store``, injected)."""
MAX_HEARTBEATS: Final = 20_000_000
"""About a minute of appending and folding heartbeats: a replay needing more must be compressed."""


@dataclass(frozen=True)
class RunConfig:
    """What one run simulates. ``policy`` is the name of the policy the scheduler runs (its full spec)."""

    cluster: Cluster
    workload: Workload
    mode: Mode
    seed: int
    policy: str
    log_dir: Path | None = None
    """Where the file log goes (missing or empty; an existing log is refused); ``None``: in memory."""


async def run_simulation(
    config: RunConfig,
    make_scheduler: SchedulerFactory,
    progress: Progress | None = None,
    stop: Stop | None = None,
    measure: Measurer | None = None,
) -> RunSummary:
    """Run ``config`` with the scheduler ``make_scheduler`` builds on the run's log store (until
    ``stop()`` says so, if given: the summary is then of what was simulated); then ``measure`` the
    run's log (the shared measures, as ``replay report`` computes them)."""
    jobs = arrivals(config.mode, config.workload, config.cluster, config.seed)
    check_heartbeats(config, jobs[-1].arrival_ms if jobs else 0)
    if config.log_dir is not None:  # the command replaced an earlier log if it was told to
        prepare_log_dir(config.log_dir, replace=False)
    clock = VirtualClock()
    async with open_store(config.log_dir, clock) as store:
        sim = Simulation(
            config.cluster,
            jobs,
            config.mode,
            store=store,
            clock=clock,
            seed=config.seed,
            setup=setup_messages(config.workload),
        )
        stats = await sim.run(make_scheduler(store), progress, stop)
        measured = await measure(store) if measure is not None else None
    cluster = config.cluster
    head = {
        "seed": config.seed,
        "policy": config.policy,
        "mode": config.mode.text,
        "cluster": cluster.source,
        "workload": config.workload.source,
        "nodes": len(cluster.nodes),
        "gpus": cluster.gpu_milli // 1000,
    }
    counters = {
        "inputs": stats.inputs,
        "decisions": stats.decisions,
        "steps": stats.steps,
        "virtual_s": stats.virtual_ms / 1000,
        "wall_s": round(stats.wall_s, 4),
        "interrupted": stats.interrupted,
    }
    target = config.mode.ratio if config.mode.name == "inflate" else None
    return summarise(head, sim.recorder, target, counters, measured)


def check_heartbeats(config: RunConfig, last_arrival_ms: int) -> None:
    """Refuse a replay whose virtual span needs more heartbeats than a simulation should write
    (every node reports every period, or the scheduler takes it for dead): say how to compress it."""
    if config.mode.name != "replay":
        return
    span_ms = last_arrival_ms + config.mode.drain_ms
    beats = (span_ms // config.cluster.behaviour.heartbeat_ms + 1) * len(config.cluster.nodes)
    if beats > MAX_HEARTBEATS:
        speed = math.ceil(config.mode.speed * beats / MAX_HEARTBEATS)
        raise SpecError(
            f"replay of {config.workload.source} spans {span_ms / 86_400_000:,.1f} days of virtual time: "
            f"{beats:,} heartbeats from {len(config.cluster.nodes):,} nodes (at most {MAX_HEARTBEATS:,}); "
            f"compress the arrivals with --mode 'replay?speed={speed}' or more"
        )


def is_seed_dir(name: str) -> bool:
    """``seed-N``: one seed's log of a multi-seed run (``fleetlog simulate --seeds N``)."""
    return name.startswith("seed-") and name[5:].isdigit()
