"""Scale-out (issue 17): one shard over the whole fleet against the dispatcher and cell shards.

    python -m benchmarks.shards --json [--quick | --smoke] [--repeats N] [--traces PATH]

All three parts run the pure core in process, without a log (``fleetlog.sharded``: the
dispatcher and one ``State`` per cell shard, joined as their partitions join them, on a virtual
clock); the single shard is one ``State`` over every node, stepped as the service loop steps it
(fold the inputs, decide, fold the decision batch). Same policy (``default``: FGD) everywhere.

- **Scale** (``single_shard_per_s``, ``split_one_process_per_s``, ``split_two_processes_per_s``):
  a fleet of C cells x N nodes of 8 A100 (64 x 1,000; ``--quick`` 64 x 250), cell-agnostic
  one-task 1-GPU jobs of 4 tenants submitted 8,000 per dispatcher step (the loop's batch);
  placements per wall second from the first submission until every job is placed (a) by one
  shard over every node (fewer jobs: it is the slow one), (b) by the dispatcher and C cell
  shards in this process, (c) the same with most partitions stepped in a child process
  (``fleetlog.sharded.procs``; the exchange over a pipe counted), the dispatcher and the other
  partitions here: as many as even the two processes' CPU time by the dispatcher's and the
  cells' CPU seconds measured in the (b) run just before (:func:`parent_share`). Both
  pipelined (``FleetConfig(pipeline=True)``: the dispatcher's step k+1 runs while the cells run
  step k). Median of ``--repeats`` fresh fleets
  each. (b) and (c) must write the same digest (checked: else the run fails).
- **Quality** (``alloc_single_shard``, ``alloc_split``): the openb inflate protocol (the FGD
  paper's: jobs plus seeded copies to 130% of the GPUs, shuffled, 64 per step, never leaving)
  on ``openb_node_list_gpu_node.csv``; GPU allocation % when all have arrived, mean over seeds
  1..S; single shard with ``fail_unplaced`` (the protocol), split: the node list round-robin in
  4 cells, jobs allowed in every cell, cells hand back after 1 ms of log time what they cannot
  place (not rejected: another cell may fit it), the dispatcher re-dispatches elsewhere.
- **Fairness** (``drf_max_delta_points``): 4 equal-weight tenants of different shapes each
  asking for twice the fleet (4 cells x 25 nodes), submitted interleaved at once; each tenant's
  dominant share of the fleet once it is full, single shard vs split; the largest difference.
- ``kafka_latency_*`` and ``takeover_*``: :mod:`benchmarks.shards_kafka` (real ``fleetlog run
  --role dispatch`` and ``--role cell`` processes on a broker: ``FLEETLOG_KAFKA`` or one started
  for the run); ``--no-kafka`` skips it, and at ``--smoke`` it runs on its own (its own smoke
  test): null then, with the reason under ``not_measured``.

``--smoke`` (CI): 4 cells x 20 nodes, 400 jobs, 3% of openb's arrivals, one seed, one repeat.
"""

from __future__ import annotations

import argparse
import functools
import gc
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from benchmarks.common import add_smoke, emit, machine
from benchmarks.simulate import find_traces
from fleetlog.core import dispatch as d
from fleetlog.core.cellshard import SummaryRule
from fleetlog.core.decide import decide
from fleetlog.core.digest import digest
from fleetlog.core.fold_batch import fold_fast, fold_lists
from fleetlog.core.policy import Policy, policy_named
from fleetlog.core.state import CoreConfig, State
from fleetlog.events import JobPlaced, JobSubmitted, NodeHeartbeat, TaskGroup
from fleetlog.events.model import DecisionBatch, Event
from fleetlog.service.loop import keep_recovered
from fleetlog.service.warmup import warm_up
from fleetlog.sharded import FleetConfig, ShardedFleet
from fleetlog.sharded.driver import CellShard, LocalShards, ShardOut
from fleetlog.sharded.procs import close_all, split_groups
from fleetlog.simulation import load_cluster, load_workload, parse_mode
from fleetlog.simulation.modes import inflate

STEP_JOBS: Final = 8_000
"""Submissions per dispatcher step in the scale part (the service loop folds up to 10,000)."""
SCALE_SUMMARIES: Final = SummaryRule(material_milli=0)
"""The scale part's cells write a summary every step they fold something. With the default rule
(a change of 1/8 of a row's slots, or 5 s of log time) and 125 placements per cell per step out
of 8,000 slots, a summary is rarely due while the clock stands still, and the dispatcher re-takes
at every step each job dispatched since the cell's last summary (``dispatch.rooms``): quadratic.
A summary per step is 64 small events per 8,000 placements."""
ENCODING_SHARE: Final = 0.05
"""(c): what the parent spends on the child's records (encoding them, reading the answers),
as a share of the cells' CPU time (measured: about 0.1 s per 64,000 dispatches)."""
KAFKA_KEYS: Final = ("kafka_latency_p50_ms", "kafka_latency_p99_ms", "takeover_p50_s", "takeover_max_s")
"""Measured by :mod:`benchmarks.shards_kafka` (real ``fleetlog run --role`` processes on a broker)."""
SKIPPED_AT_SMOKE: Final = ("at --smoke the Kafka part runs on its own (python -m benchmarks.shards_kafka "
                           "--smoke; tests/test_benchmarks.py::test_shards_kafka)")


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quick", action="store_true", help="64 cells x 250 nodes, 2 seeds (< 2 minutes)")
    parser.add_argument("--repeats", type=int, default=None, help="fleets per scale measure (3; quick 1)")
    parser.add_argument("--seeds", type=int, default=None, help="openb seeds (3; quick 2)")
    parser.add_argument("--traces", default=find_traces(), help="the openb CSV folder")
    parser.add_argument("--no-kafka", action="store_true",
                        help="skip the Kafka part (latency, takeover: real fleetlog run --role processes)")
    add_smoke(parser)
    return parser.parse_args()


# --- fleets and jobs ----------------------------------------------------------------------------


def cell_nodes(cell: str, n: int) -> list[NodeHeartbeat]:
    return [
        NodeHeartbeat(cell=cell, node=f"{cell}-n{i:05d}", cpu_milli=96_000, mem_mib=786_432, gpu_count=8,
                      gpu_model="A100", topology=(f"b{i // 512}", f"r{i // 16}", f"n{i:05d}"))
        for i in range(n)
    ]


def single_gpu_jobs(count: int) -> list[JobSubmitted]:
    group = (TaskGroup(count=1, cpu_milli=4_000, mem_mib=8_192, gpu_count=1, gpu_milli=1_000),)
    return [JobSubmitted(job_id=f"j{i}", tenant=f"t{i % 4}", task_groups=group) for i in range(count)]


def cell_map(cells: int) -> d.CellMap:
    return d.CellMap(tuple((f"c{i:03d}", i) for i in range(cells)))


class Single:
    """One shard over every node: the service loop's step without a log."""

    def __init__(self, policy: Policy, core: CoreConfig | None = None) -> None:
        self.state, self.policy, self.now_ms = State(core), policy, 0

    def step(self, events: Sequence[Event]) -> list[object]:
        fold_lists(self.state, list(events), [self.now_ms] * len(events))
        decisions = decide(self.state, self.policy)
        if decisions:
            batch = DecisionBatch(as_of=self.state.offset, digest=digest(self.state),
                                  decisions=tuple(decisions), policy=self.policy.name)
            fold_fast(self.state, batch, self.now_ms)
        return list(decisions)


# --- scale --------------------------------------------------------------------------------------


def single_rate(cells: int, nodes: int, jobs: int) -> float:
    shard = Single(Policy())
    for c in cell_map(cells).cells:
        shard.step(cell_nodes(c, nodes))
    work = single_gpu_jobs(jobs)
    keep_recovered()  # (as a service does once its state is rebuilt: the fleet is long-lived)
    start, placed = time.perf_counter(), 0
    for k in range(0, jobs, STEP_JOBS):
        placed += sum(isinstance(x, JobPlaced) for x in shard.step(work[k : k + STEP_JOBS]))
    elapsed = time.perf_counter() - start
    gc.unfreeze()
    assert placed == jobs, (placed, jobs)
    return placed / elapsed


class TimedShards(LocalShards):
    """Cell shards stepped here, their CPU seconds counted (the rest of a step: the dispatcher)."""

    def __init__(self, config: FleetConfig) -> None:
        super().__init__(CellShard(p, cells, config) for p, cells in config.partitions().items())
        self.cpu_s = 0.0

    def receive(self) -> list[ShardOut]:
        start = time.process_time()
        try:
            return super().receive()
        finally:
            self.cpu_s += time.process_time() - start


@dataclass
class Split:
    """One run of (b) or (c): placements/s, the digest, and (b) the CPU seconds of the
    dispatcher and of the cell shards."""

    per_s: float
    digest: str
    dispatcher_cpu_s: float = 0.0
    cells_cpu_s: float = 0.0


def parent_share(b: Split, cells: int) -> float:
    """(c): the parent's share of the partitions that evens the two processes' CPU time, from
    (b)'s: the parent runs the dispatcher (D), its share x of the cells (C) and the child's
    encoding; the child the rest: D + xC + eC = (1 - x)C, so x = (C - D - eC) / 2C, at least
    one partition (the parent steps some: the driver's order) and at most half."""
    c, dispatcher = b.cells_cpu_s, b.dispatcher_cpu_s
    x = (c - dispatcher - ENCODING_SHARE * c) / (2 * c) if c > 0 else 0.5
    return min(0.5, max(1 / cells, x))


def split_rate(cells: int, nodes: int, jobs: int, share: float | None = None) -> Split:
    """Placements/s of the dispatcher and ``cells`` shards: in this process (``share`` None:
    the CPU seconds of the dispatcher and the cells counted), or over two processes, this one
    stepping ``share`` of the partitions; and the run's digest."""
    config = FleetConfig(cell_map(cells), keep_decisions=False, summary=SCALE_SUMMARIES, pipeline=True)
    timed = TimedShards(config) if share is None else None
    # (the child loads its kernels first, as a role warms up before it leads: this process did)
    warm = functools.partial(warm_up, config.policy)
    groups = [timed] if timed is not None else split_groups(config, 1, share, warm)
    fleet = ShardedFleet(config, groups)
    try:
        for c in config.cells.cells:
            fleet.to_cell(c, *cell_nodes(c, nodes))
        fleet.step()  # the cells fold their nodes and write their first summaries
        work = single_gpu_jobs(jobs)
        keep_recovered()  # (as the roles do once their states are rebuilt: the fleet is long-lived)
        if timed is not None:
            timed.cpu_s = 0.0
        start, cpu, placed = time.perf_counter(), time.process_time(), 0
        for k in range(0, jobs, STEP_JOBS):
            fleet.submit(*work[k : k + STEP_JOBS])
            placed += fleet.step().placed
        while placed < jobs:
            before = placed
            placed += fleet.step().placed
            moving = fleet.global_in or any(fleet.cell_in.values())
            assert placed > before or moving, f"stuck at {placed} of {jobs} placed"
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        out = Split(placed / elapsed, fleet.digest())
        if timed is not None:
            out.cells_cpu_s, out.dispatcher_cpu_s = timed.cpu_s, cpu - timed.cpu_s
        return out
    finally:
        gc.unfreeze()
        close_all(groups)


def scale(cells: int, nodes: int, jobs: int, single_jobs: int, repeats: int) -> dict[str, Any]:
    singles = [single_rate(cells, nodes, single_jobs) for _ in range(repeats)]
    ones, twos, shares = [], [], []
    for _ in range(repeats):
        one = split_rate(cells, nodes, jobs)
        shares.append(parent_share(one, cells))
        two = split_rate(cells, nodes, jobs, shares[-1])
        if one.digest != two.digest:
            raise SystemExit(f"the split in two processes wrote {two.digest}, in one {one.digest}")
        ones.append(one)
        twos.append(two)
    a = statistics.median(singles)
    b, c = statistics.median(r.per_s for r in ones), statistics.median(r.per_s for r in twos)
    return {
        "scale_cells": cells, "scale_nodes_per_cell": nodes, "scale_jobs": jobs,
        "scale_single_jobs": single_jobs, "scale_step_jobs": STEP_JOBS, "scale_repeats": repeats,
        "scale_pipelined": True, "scale_parent_shares": shares,
        "scale_dispatcher_cpu_s": [r.dispatcher_cpu_s for r in ones],
        "scale_cells_cpu_s": [r.cells_cpu_s for r in ones],
        "single_shard_per_s": a, "split_one_process_per_s": b, "split_two_processes_per_s": c,
        "split_vs_single": b / a, "two_vs_one_process": c / b,
        "single_shard_runs": singles, "split_one_process_runs": [r.per_s for r in ones],
        "split_two_processes_runs": [r.per_s for r in twos],
        "targets_met": {"split_one_process_20k": b >= 20_000, "split_vs_single_2x": b / a >= 2,
                        "two_vs_one_1_6x": c / b >= 1.6},
    }


# --- quality: the openb inflate protocol ---------------------------------------------------------

QUALITY_CELLS: Final = 4
BATCH: Final = 64


def openb(traces: Path, seed: int, ratio: str) -> tuple[list[NodeHeartbeat], list[list[JobSubmitted]], int]:
    """The openb GPU nodes (cell ``c<i % 4>`` by list order), the inflate arrivals of ``seed`` in
    steps of 64, and the fleet's milli-GPUs."""
    cluster = load_cluster(str(traces / "openb_node_list_gpu_node.csv"))
    workload = load_workload(str(traces / "openb_pod_list_default.csv"), cluster, seed)
    jobs = inflate(parse_mode(f"inflate?batch={BATCH}{ratio}"), workload, cluster, seed)
    nodes = [
        NodeHeartbeat(cell=f"c{i % QUALITY_CELLS}", node=n.name, cpu_milli=n.cpu_milli, mem_mib=n.mem_mib,
                      gpu_count=n.gpu_count, gpu_model=n.gpu_model, topology=n.topology)
        for i, n in enumerate(cluster.nodes)
    ]
    steps: list[list[JobSubmitted]] = []
    for job in jobs:
        if not steps or len(steps[-1]) == BATCH:
            steps.append([])
        steps[-1].append(job.event)
    return nodes, steps, cluster.gpu_milli


def gpu_placed(state: State) -> int:
    """Milli-GPUs the running jobs of ``state`` hold."""
    return sum(used[2] for (_, cell), used in state.usage.items() if cell == -1)


def alloc_single(nodes: list[NodeHeartbeat], steps: list[list[JobSubmitted]], gpu_milli: int) -> float:
    shard = Single(policy_named("default", fail_unplaced=True))
    shard.step(nodes)
    for arrivals in steps:
        shard.now_ms += 1
        shard.step(arrivals)
    return 100 * gpu_placed(shard.state) / gpu_milli


def drain(fleet: ShardedFleet, tick: dict[str, NodeHeartbeat], every_ms: int, rounds: int = 40) -> None:
    """After the last arrival: time moves (each cell hears one heartbeat per ``every_ms``: the
    periodic summaries and the hand-backs ride on it) until two rounds in a row move nothing."""
    quiet = 0
    for _ in range(rounds):
        fleet.advance(every_ms)
        for cell, beat in sorted(tick.items()):
            fleet.to_cell(cell, beat)
        step = fleet.step()
        quiet = quiet + 1 if not step.dispatched and not step.placed else 0
        if quiet == 2:
            return


def alloc_split(nodes: list[NodeHeartbeat], steps: list[list[JobSubmitted]], gpu_milli: int) -> float:
    cells = d.CellMap(tuple((f"c{i}", i) for i in range(QUALITY_CELLS)))
    fleet = ShardedFleet(FleetConfig(cells, hold_ms=1, keep_decisions=False))
    for n in nodes:
        fleet.to_cell(n.cell, n)
    fleet.step()
    tick = {c: next(n for n in nodes if n.cell == c) for c in cells.cells}  # a heartbeat moves log time
    for arrivals in steps:
        fleet.advance(1)
        fleet.submit(*arrivals)
        fleet.step()
    drain(fleet, tick, 1)
    states = [s.state for s in fleet.local_shards().values()]
    return 100 * sum(gpu_placed(s) for s in states) / gpu_milli


def quality(traces: Path, seeds: int, ratio: str) -> dict[str, Any]:
    single, split = [], []
    for seed in range(1, seeds + 1):
        nodes, steps, gpu_milli = openb(traces, seed, ratio)
        single.append(alloc_single(nodes, steps, gpu_milli))
        split.append(alloc_split(nodes, steps, gpu_milli))
    a, b = statistics.mean(single), statistics.mean(split)
    return {
        "quality_seeds": seeds, "quality_cells": QUALITY_CELLS,
        "alloc_single_shard": a, "alloc_split": b, "alloc_delta_points": b - a,
        "alloc_single_runs": single, "alloc_split_runs": split,
        "alloc_within_half_point": abs(b - a) <= 0.5,
    }


# --- fairness: four tenants under contention ----------------------------------------------------

SHAPES: Final = {  # tenant -> (GPUs, milli-CPU) of its one-task jobs: each dominant in its own way
    "t0": (1, 4_000), "t1": (4, 16_000), "t2": (8, 24_000), "t3": (1, 48_000),
}


def fairness_jobs(nodes: int) -> list[JobSubmitted]:
    """Each tenant asks for about twice the fleet's GPUs (or CPUs), interleaved."""
    out = []
    for tenant, (gpus, cpu) in sorted(SHAPES.items()):
        asks = 2 * nodes * min(8 // gpus, 96_000 // cpu)
        group = (TaskGroup(count=1, cpu_milli=cpu, mem_mib=8_192 * gpus, gpu_count=gpus, gpu_milli=1_000),)
        out.append([JobSubmitted(job_id=f"{tenant}-{i}", tenant=tenant, task_groups=group)
                    for i in range(asks)])
    longest = max(len(x) for x in out)
    return [x[i] for i in range(longest) for x in out if i < len(x)]


def dominant_shares(states: Sequence[State], nodes: int) -> dict[str, float]:
    """Each tenant's dominant share (% of the fleet's CPU, memory or GPUs, the largest)."""
    total = (96_000 * nodes, 786_432 * nodes, 8_000 * nodes)
    used: dict[str, list[int]] = {t: [0, 0, 0] for t in SHAPES}
    for state in states:
        for (tenant, cell), row in state.usage.items():
            if cell == -1:
                name = state.names["tenant"].names[tenant]
                used[name] = [u + r for u, r in zip(used[name], row, strict=True)]
    return {t: 100 * max(u / n for u, n in zip(used[t], total, strict=True)) for t in sorted(used)}


def fairness(per_cell: int) -> dict[str, Any]:
    cells, nodes = cell_map(QUALITY_CELLS), QUALITY_CELLS * per_cell
    jobs = fairness_jobs(nodes)
    single = Single(Policy())
    for c in cells.cells:
        single.step(cell_nodes(c, per_cell))
    for k in range(0, len(jobs), 1_000):
        single.step(jobs[k : k + 1_000])
    fleet = ShardedFleet(FleetConfig(cells, keep_decisions=False))
    for c in cells.cells:
        fleet.to_cell(c, *cell_nodes(c, per_cell))
    fleet.step()
    for k in range(0, len(jobs), 1_000):
        fleet.submit(*jobs[k : k + 1_000])
        fleet.step()
    ticks = {c: cell_nodes(c, 1)[0] for c in cells.cells}
    drain(fleet, ticks, fleet.config.summary.every_ms)
    a = dominant_shares([single.state], nodes)
    b = dominant_shares([s.state for s in fleet.local_shards().values()], nodes)
    return {
        "fairness_nodes": nodes, "dominant_share_single": a, "dominant_share_split": b,
        "drf_max_delta_points": max(abs(a[t] - b[t]) for t in a),
    }


def timed(part: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    start = time.perf_counter()
    out = part()
    return out | {"seconds": round(time.perf_counter() - start, 1)}


def main() -> None:
    args = parse()
    size = "smoke" if args.smoke else "quick" if args.quick else "full"
    cells, nodes, jobs, single_jobs = {"smoke": (4, 20, 400, 200), "quick": (64, 250, 64_000, 2_000),
                                       "full": (64, 1_000, 128_000, 4_000)}[size]
    repeats = args.repeats or {"smoke": 1, "quick": 1, "full": 3}[size]
    seeds = args.seeds or {"smoke": 1, "quick": 2, "full": 3}[size]
    result: dict[str, Any] = {"benchmark": "shards", "size": size, **machine()}
    scaled = timed(lambda: scale(cells, nodes, jobs, single_jobs, repeats))
    ratio = "&ratio=0.03" if args.smoke else ""
    judged = timed(lambda: quality(Path(args.traces), seeds, ratio))
    fair = timed(lambda: fairness(5 if args.smoke else 25))
    result |= scaled | judged | fair
    result["seconds"] = {"scale": scaled["seconds"], "quality": judged["seconds"],
                         "fairness": fair["seconds"]}
    result["drf_within_2_points"] = fair["drf_max_delta_points"] <= 2
    if args.smoke or args.no_kafka:
        result |= dict.fromkeys(KAFKA_KEYS)
        why = SKIPPED_AT_SMOKE if args.smoke else "--no-kafka"
        result["not_measured"] = dict.fromkeys(KAFKA_KEYS, why)
    else:
        from benchmarks import shards_kafka

        measured = timed(lambda: shards_kafka.run(args.quick))
        result |= {k: measured[k] for k in KAFKA_KEYS}
        result["kafka"] = measured
        result["seconds"]["kafka"] = measured["seconds"]
    emit(result, args.json)


if __name__ == "__main__":
    main()
