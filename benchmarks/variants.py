"""Seeded openb variants beyond the published ones (issue 23), written into a directory of the
caller's (a temporary one: never the repository; the traces' terms allow research use only).

A variant is made from ``openb_pod_list_default.csv`` by a spec of one or more axes, ``+``-joined:

* ``cpu=R`` — CPU-only demand: CPU-only pods (drawn with replacement from the trace's own, each
  drawn copy renamed) until their summed CPU request is R% of the GPU pods' (the default trace:
  29%; the published ``cpu300``: 80%; ``cpu=0`` drops them all).  The GPU pods stay as they are.
* ``gpushare=S`` — GPU sharing: whole-GPU one-GPU pods replaced, one by one, by fractional pods
  drawn from the trace's own until fractional pods ask for S% of the total GPU request (the
  default trace: 28.5%; the published ``gpushare80``: 80%); past the one-GPU pods, multi-GPU
  pods too.  The pod count stays as it was, as in the published ``gpushare*`` files.

The authors' ``cpuNNN`` labels match no simple ratio of their files (the traces' README), so the
axis here is its own, stated in the variant's name: ``gen-cpu150`` is ``cpu=150``.  The same
spec and seed give the same bytes.  ``python -m benchmarks.variants --out DIR SPEC...`` writes
them (with the node list beside them, as ``benchmarks.simulate`` reads a variant folder) and prints
each one's measures (``--json``).
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

COLUMNS: Final = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec")
AXES: Final = ("cpu", "gpushare")
MAX_PERCENT: Final = {"cpu": 1000, "gpushare": 100}
NODES: Final = "openb_node_list_gpu_node.csv"


VISIBLE: Final = ("default", "cpu050", "cpu100", "cpu200", "gpushare40", "gpushare60", "gpushare80",
                   "gpuspec10", "gpuspec20", "gpuspec25", "multigpu20", "multigpu30", "multigpu40")
"""The published variants (their FGD and BestFit figures: ``benchmarks.simulate.PUBLISHED``)."""
GENERATED: Final = ("cpu=64", "cpu=80", "cpu=100", "cpu=115", "cpu=150", "gpushare=90", "gpushare=100",
                    "cpu=64+gpushare=90", "cpu=100+gpushare=90", "cpu=150+gpushare=100")
"""The generated variants of issue 23: ``cpu=64..115`` spans the authors' ``cpu250``-``cpu400``
(their ``cpu200``, ``cpu235`` and ``cpu300`` measure 47, 58 and 80 here), past it ``cpu=150``."""
HOLD_OUT_SEED: Final = "fleetlog issue 23 hold-out"


def halves() -> dict[str, tuple[str, ...]]:
    """The hold-out split of issue 23, fixed before any tuning: a seeded shuffle of each list, its
    first half (7 of the visible, 5 of the generated) to choose the policy's rules and constants
    on, the rest reported only at the end, as a check."""
    rng = random.Random(HOLD_OUT_SEED)
    visible, generated = list(VISIBLE), list(GENERATED)
    rng.shuffle(visible)
    rng.shuffle(generated)
    return {"tuning": (*sorted(visible[:7]), *generated[:5]), "check": (*sorted(visible[7:]), *generated[5:])}


def group_of(variant: str) -> str:
    """Which half a variant's row is reported in: ``visible-tuning``, ``visible-check``,
    ``generated-tuning``, ``generated-check`` (:func:`halves`), or ``other`` (a variant of
    neither list: an ad-hoc spec, or a trace without published figures)."""
    for half, names in halves().items():
        for name in names:
            generated = "=" in name
            if (parse_spec(name).name if generated else name) == variant:
                return f"{'generated' if generated else 'visible'}-{half}"
    return "other"


class SpecError(ValueError):
    """A variant spec that names no axis, an unknown one, or a value out of its range."""


@dataclass(frozen=True)
class Spec:
    axes: tuple[tuple[str, int], ...]

    @property
    def name(self) -> str:
        return "gen-" + "-".join(f"{axis}{value:03d}" for axis, value in self.axes)


def parse_spec(text: str) -> Spec:
    axes: dict[str, int] = {}
    for part in text.split("+"):
        axis, eq, value = part.partition("=")
        if axis not in AXES or not eq or not value.isdigit():
            raise SpecError(f"variant {text!r}: {part!r} is not AXIS=PERCENT (AXIS: {', '.join(AXES)})")
        if int(value) > MAX_PERCENT[axis] or axis in axes:
            raise SpecError(f"variant {text!r}: {axis} is 0 to {MAX_PERCENT[axis]}, once")
        axes[axis] = int(value)
    return Spec(tuple(sorted(axes.items())))


def read_pods(path: Path) -> list[dict[str, str]]:
    """A pod list's rows, each with :data:`COLUMNS` (an absent one empty)."""
    with path.open(newline="") as handle:
        return [{c: row.get(c) or "" for c in COLUMNS} for row in csv.DictReader(handle)]


def read_default(traces: Path) -> list[dict[str, str]]:
    return read_pods(traces / "openb_pod_list_default.csv")


def measures(pods: list[dict[str, str]]) -> dict[str, Any]:
    """What the axes set: CPU-only CPU over GPU pods' CPU, fractional GPU over all GPU asked (%)."""
    gpu = [p for p in pods if int(p["num_gpu"]) > 0]
    cpu_only = sum(int(p["cpu_milli"]) for p in pods if int(p["num_gpu"]) == 0)
    asked = [int(p["num_gpu"]) * int(p["gpu_milli"]) for p in gpu]
    shared = sum(a for a, p in zip(asked, gpu, strict=True) if int(p["gpu_milli"]) < 1000)
    return {"pods": len(pods), "cpu_only_pods": len(pods) - len(gpu),
            "cpu_pct": round(100 * cpu_only / max(1, sum(int(p["cpu_milli"]) for p in gpu)), 1),
            "gpushare_pct": round(100 * shared / max(1, sum(asked)), 1)}


def _cpu(pods: list[dict[str, str]], percent: int, rng: random.Random) -> list[dict[str, str]]:
    gpu = [p for p in pods if int(p["num_gpu"]) > 0]
    pool = [p for p in pods if int(p["num_gpu"]) == 0]
    want = percent * sum(int(p["cpu_milli"]) for p in gpu) / 100
    out, have = list(gpu), 0
    while have < want:
        drawn = dict(rng.choice(pool))
        drawn["name"] = f"{drawn['name']}-c{len(out) - len(gpu)}"
        out.append(drawn)
        have += int(drawn["cpu_milli"])
    return out


def _gpushare(pods: list[dict[str, str]], percent: int, rng: random.Random) -> list[dict[str, str]]:
    out = [dict(p) for p in pods]
    fractional = [p for p in pods if 0 < int(p["gpu_milli"]) < 1000]
    whole = [i for i, p in enumerate(out) if int(p["num_gpu"]) > 0 and int(p["gpu_milli"]) == 1000]
    rng.shuffle(whole)
    whole.sort(key=lambda i: int(out[i]["num_gpu"]) > 1)  # one-GPU pods first
    share = sum(int(p["gpu_milli"]) for p in fractional)
    total = sum(int(p["num_gpu"]) * int(p["gpu_milli"]) for p in out)
    for i in whole:
        if share >= percent * total / 100:
            break
        drawn = rng.choice(fractional)
        total += int(drawn["gpu_milli"]) - int(out[i]["num_gpu"]) * 1000
        share += int(drawn["gpu_milli"])
        out[i] = {**drawn, "name": f"{out[i]['name']}-s"}
    return out


def generate(traces: Path, spec: Spec, seed: int, out: Path) -> Path:
    """Write ``spec``'s variant for ``seed`` into ``out`` (with the node list); its path."""
    rng = random.Random(f"{spec.name}/{seed}")
    pods = read_default(traces)
    values = dict(spec.axes)
    if "gpushare" in values:  # first: the GPU pods it draws change their CPU, which cpu= measures
        pods = _gpushare(pods, values["gpushare"], rng)
    if "cpu" in values:
        pods = _cpu(pods, values["cpu"], rng)
    out.mkdir(parents=True, exist_ok=True)
    if not (out / NODES).exists():
        shutil.copyfile(traces / NODES, out / NODES)
    path = out / f"openb_pod_list_{spec.name}-s{seed}.csv"
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(pods)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("specs", nargs="+", metavar="SPEC",
                        help="e.g. cpu=150, gpushare=95, cpu=120+gpushare=90")
    parser.add_argument("--out", required=True, type=Path, help="the directory to write into")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="one JSON object")
    parser.add_argument("--traces", type=Path, default=None, help="the openb CSV folder")
    args = parser.parse_args(argv)
    from benchmarks.simulate import find_traces

    traces = args.traces or Path(find_traces())
    try:
        specs = [parse_spec(text) for text in args.specs]
    except SpecError as exc:
        parser.error(str(exc))
    if not (traces / "openb_pod_list_default.csv").is_file():
        parser.error(f"no openb traces in {traces}: pass --traces PATH or set FLEETLOG_TRACES")
    found = {}
    for spec in specs:
        path = generate(traces, spec, args.seed, args.out)
        found[spec.name] = {"file": str(path), **measures(read_pods(path))}
    print(json.dumps({"benchmark": "variants", "seed": args.seed, "variants": found}) if args.json
          else "\n".join(f"{name}: {m}" for name, m in found.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
