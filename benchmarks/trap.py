"""Hostile mixes for the shape mix (issue 23): GPUs left idle when CPU-hungry 1-GPU tasks come in bursts.

One cell of 25 nodes (C cores, G GPUs each) receives about twice its GPUs in one step, round
after round: ``a`` 1-GPU 4-core tasks, one G/2-GPU 16-core task, one 1-GPU task of X cores, and
every other round one G-GPU 24-core task (``bursts``; ``even``: no G/2-GPU task, the G-GPU one
every round; ``cpu-bound``: ``bursts`` and 8-core CPU-only tasks, C/G cores of them for each GPU
asked, so CPU runs out before the GPUs do); then one ``decide`` places what fits. X = C/2 is the
trap of a shape mix keyed by CPU alone (docs/scheduling.md, "The shape mix"): a node that took
one such task keeps a room of C/2 cores that a second one fills, leaving G-2 GPUs without CPU.

    python -m benchmarks.trap --json                 # the grid: 3 x 3 x 2 x 4 x 3 cells, 5 rules
    python -m benchmarks.trap --weights 0,1,2,3      # default at several mean-view weights

Per rule (``default`` at each mean-view weight: 0 is the CPU view alone, and a CPU-bound
window leaves the mean view out whatever it weighs; ``first-rule``, ``default`` with
``CoreConfig.cpu_bound_weights`` off (CPU-bound windows scored against both views at their
counts, as d932362); ``two-views``, ``default`` with ``CoreConfig.cpu_bound_rule`` off;
``best-fit``; ``fgd``, the published rule with typical pods by exact CPU as its authors take
them), the idle GPUs of each cell in % of its GPUs (``idle_pct``), the worst cell and the mean.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
from typing import Any, Final

from benchmarks.common import add_smoke, emit, machine
from benchmarks.shards import Single
from fleetlog.core import scratch
from fleetlog.core.policy import Policy, policy_named, with_typical_pods
from fleetlog.core.state import CoreConfig
from fleetlog.core.typical import typical_pods_of_jobs
from fleetlog.events import JobSubmitted, NodeHeartbeat, TaskGroup
from fleetlog.events.model import Event

NODES: Final = 25
CORES: Final = (64, 96, 128)
GPUS: Final = (4, 8)
HUNGRY: Final = ((1, 4), (1, 3), (1, 2), (2, 3))  # X as a fraction of a node's cores
LIGHT: Final = (1, 4, 8)
MIXES: Final = ("bursts", "even", "cpu-bound")
CPU_ONLY_MILLI: Final = 8_000


def nodes(n: int, cores: int, gpus: int) -> list[NodeHeartbeat]:
    return [
        NodeHeartbeat(cell="c0", node=f"n{i:03d}", cpu_milli=cores * 1000, mem_mib=786_432, gpu_count=gpus,
                      gpu_model="A100", topology=("b0", f"r{i // 16}", f"n{i:03d}"))
        for i in range(n)
    ]


def arrivals(
    n: int, gpus: int, hungry_milli: int, light: int, mix: str, cores: int = 96
) -> list[JobSubmitted]:
    """About twice the cell's GPUs, in rounds (see the module's doc): ``bursts`` as there,
    ``even`` without the G/2-GPU task and with the G-GPU one every round (with one light task a
    round: the shapes of the scale-out fairness run's three tenants, in one step on 25 nodes),
    ``cpu-bound`` as ``bursts`` with ``cores``/G cores of CPU-only tasks a GPU, first in each round."""
    out: list[JobSubmitted] = []
    ids = itertools.count()

    def one(tenant: str, count: int, cpu: int) -> JobSubmitted:
        milli = 1000 if count else 0
        group = TaskGroup(count=1, cpu_milli=cpu, mem_mib=1024, gpu_count=count, gpu_milli=milli)
        return JobSubmitted(job_id=f"{tenant}-{next(ids)}", tenant=tenant, task_groups=(group,))

    even = mix == "even"
    per_round = light + 1 + gpus if even else light + gpus // 2 + 1 + gpus / 2
    cpu_only = -(-int(per_round * cores * 1000 / gpus) // CPU_ONLY_MILLI) if mix == "cpu-bound" else 0
    for r in range(int(2 * n * gpus / per_round) + 1):
        out += [one("cpu", 0, CPU_ONLY_MILLI) for _ in range(cpu_only)]
        out += [one("light", 1, 4_000) for _ in range(light)]
        if not even:
            out.append(one("half", gpus // 2, 16_000))
        out.append(one("hungry", 1, hungry_milli))
        if even or r % 2 == 0:
            out.append(one("whole", gpus, 24_000))
    return out


def idle_pct(policy: Policy, events: list[Event], gpus: int, core: CoreConfig | None = None) -> float:
    shard = Single(policy, core)  # (one fold of every event, one decide, its batch folded)
    shard.step(events)
    state = shard.state
    free = state.nodes.cols["gpu_free"][: state.nodes.size, :gpus]
    return round(100 * float((free > 0).sum()) / (state.nodes.size * gpus), 2)


Rule = tuple[Policy, int | None, CoreConfig | None]  # (policy, mean-view weight, fold settings)


def rules(weights: list[int], jobs: list[JobSubmitted]) -> dict[str, Rule]:
    out: dict[str, Rule] = {f"default@{w}": (Policy(), w, None) for w in weights}
    out["first-rule"] = (Policy(), None, CoreConfig(cpu_bound_weights=False))
    out["two-views"] = (Policy(), None, CoreConfig(cpu_bound_rule=False))
    out["best-fit"] = (policy_named("best-fit"), None, None)
    out["fgd"] = (with_typical_pods(policy_named("fgd"), typical_pods_of_jobs(jobs)), None, None)
    return out


def run(smoke: bool, weights: list[int]) -> dict[str, Any]:
    grid = [("bursts", 4, 96, 8, (1, 2)), ("cpu-bound", 4, 96, 8, (1, 2))] if smoke else [
        (mix, light, cores, gpus, frac)
        for mix in MIXES for cores in CORES for gpus in GPUS for frac in HUNGRY for light in LIGHT
    ]
    n = 5 if smoke else NODES
    kept = scratch.MEAN_VIEW_WEIGHT
    found: dict[str, dict[str, float]] = {}
    try:
        for mix, light, cores, gpus, (num, den) in grid:
            hungry = cores * 1000 * num // den
            jobs = arrivals(n, gpus, hungry, light, mix, cores)
            events: list[Event] = [*nodes(n, cores, gpus), *jobs]
            cell = f"{mix}/{cores}c{gpus}g/x{num}/{den}/a{light}"
            for name, (policy, weight, core) in rules(weights, jobs).items():
                scratch.MEAN_VIEW_WEIGHT = kept if weight is None else weight
                found.setdefault(name, {})[cell] = idle_pct(policy, events, gpus, core)
    finally:
        scratch.MEAN_VIEW_WEIGHT = kept
    return {name: summary(cells) for name, cells in found.items()}


def summary(cells: dict[str, float]) -> dict[str, Any]:
    values = list(cells.values())
    return {"idle_pct": cells, "worst_pct": max(values), "mean_pct": round(statistics.mean(values), 3),
            "cells_over_2pct": sum(v > 2 for v in values)}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.trap", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--weights", default=str(scratch.MEAN_VIEW_WEIGHT),
                        help="mean-view weights of default to run, comma-separated (0: the CPU view alone)")
    add_smoke(parser)
    args = parser.parse_args()
    try:
        weights = [int(w) for w in args.weights.split(",")]
    except ValueError:
        parser.error(f"--weights: integers separated by commas, not {args.weights!r}")
    if any(w < 0 for w in weights):
        parser.error("--weights: no negative weight")
    result: dict[str, Any] = {"benchmark": "trap", "size": "smoke" if args.smoke else "full", **machine()}
    result["rules"] = run(args.smoke, weights)
    emit(result, args.json)


if __name__ == "__main__":
    main()
