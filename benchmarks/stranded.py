"""Where the GPU goes unused at the end of an inflate run (issue 23's diagnosis): free GPUs on
nodes whose CPU is gone, and whose CPU the CPU-only pods hold, by node size.

``python -m benchmarks.stranded --json [--variants cpu200,gen:cpu=80] [--policies default,best-fit]
[--seed 1]``: for each variant (a published file, or ``gen:SPEC`` of ``benchmarks.variants``) and
policy, one inflate run to 130% (64 arrivals a step), then from the scheduler's final state:
``alloc_pct`` (GPU allocation at the target), ``cpu_used_pct`` (of the GPU nodes' CPU),
``free_gpus``, ``free_gpus_under_2_cores`` (free GPUs on nodes with less than 2 cores free: no
GPU pod of the trace fits there), ``cpu_only_cores`` (what CPU-only pods hold) and, by node GPU
count, ``cpu_only_cores`` and ``free_gpus`` (``by_node_gpus``).  ``--smoke``: 5% of the arrivals.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any, Final

import numpy as np

from benchmarks.common import add_smoke, emit, machine
from benchmarks.simulate import SMOKE_RATIO, find_traces, inflate_run
from benchmarks.variants import generate, parse_spec
from fleetlog.core.state import State
from fleetlog.service.loop import SchedulerLoop

STARVED_CORES: Final = 2
"""Less free CPU than this (in cores) and no pod of the trace that asks for a GPU fits."""


def run(traces: Path, variant: str, policy: str, seed: int, extra: str) -> tuple[State, float]:
    """One inflate run; the scheduler's final state and the allocation at the target."""
    loops: list[SchedulerLoop] = []
    with tempfile.TemporaryDirectory(prefix="fleetlog-stranded-") as tmp:
        folder, name = traces, variant
        if variant.startswith("gen:"):
            spec = parse_spec(variant[4:])
            folder, name = Path(tmp), spec.name
            generate(traces, spec, seed, folder)
        summary = inflate_run(folder, name, policy, seed, f"inflate?batch=64{extra}", made=loops.append)
    return loops[0].state, summary.gpu_alloc_at_target_pct or 0.0


def measures(state: State, alloc_pct: float) -> dict[str, Any]:
    n, c = state.nodes.size, state.nodes.cols
    cpu_free, cpu_alloc = c["cpu_free"][:n].astype(np.int64), c["cpu_alloc"][:n].astype(np.int64)
    counts = c["gpu_count"][:n].astype(np.int64)
    slots = np.arange(c["gpu_free"].shape[1]) < counts[:, None]
    free = (c["gpu_free"][:n].astype(np.int64) * slots).sum(axis=1) / 1000
    t, tc = state.tasks.size, state.tasks.cols
    cpu_only = (tc["node"][:t] >= 0) & (tc["gpus"][:t] == 0)
    held = np.bincount(tc["node"][:t][cpu_only], weights=tc["cpu"][:t][cpu_only], minlength=n) / 1000
    starved = cpu_free < STARVED_CORES * 1000
    return {
        "alloc_pct": round(alloc_pct, 2),
        "cpu_used_pct": round(100 * (1 - cpu_free.sum() / max(1, cpu_alloc.sum())), 1),
        "free_gpus": round(float(free.sum()), 1),
        "free_gpus_under_2_cores": round(float(free[starved].sum()), 1),
        "cpu_only_cores": round(float(held.sum())),
        "by_node_gpus": {str(g): {"nodes": int((counts == g).sum()),
                                  "cpu_only_cores": round(float(held[counts == g].sum())),
                                  "free_gpus": round(float(free[counts == g].sum()), 1)}
                         for g in sorted(set(counts.tolist()))},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--variants", default="cpu200,gen:cpu=80",
                        help="comma-separated (gen:SPEC: generated)")
    parser.add_argument("--policies", default="default,best-fit", help="comma-separated")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--traces", default=find_traces(), help="the openb CSV folder")
    add_smoke(parser)
    args = parser.parse_args()
    traces = Path(args.traces)
    extra = SMOKE_RATIO if args.smoke else ""
    found = {f"{v}@{p}": measures(*run(traces, v, p, args.seed, extra))
             for v in args.variants.split(",") for p in args.policies.split(",")}
    emit({"benchmark": "stranded", **machine(), "seed": args.seed, "runs": found}, args.json)


if __name__ == "__main__":
    main()
