"""The FGD paper's inflate experiment on the openb traces, and placement throughput end to end.

    python -m benchmarks.simulate --json [--quick | --smoke] [--traces PATH] [--seeds N] [--batch N]

- ``allocation``: for openb ``default`` and each variant of issue 4 (and, unless ``--variants``
  names some, issue 23's generated variants of ``benchmarks.variants``: each row says its half,
  visible or generated, tuning or check), the GPU allocation ratio when arrived demand reaches
  130% of the 6,212 GPUs of ``openb_node_list_gpu_node.csv``, mean (and stdev) over seeds
  1..N, for fleetlog ``best-fit``, ``fgd`` (the published FGD rule, scoring against the
  typical pods of the variant's whole trace) and ``default`` (fleetlog's own FGD: the recent
  window's shape mix, a CPU-starvation term), each with ``fail_unplaced``, next to the
  published BestFit and FGD figures (Weng et al., USENIX ATC'23, mean of 10 seeds). Jobs
  arrive one by one in seeded random order; the loop steps every ``--batch`` arrivals
  (decisions are still taken one by one in arrival order; ``default``'s shape mix is what fold
  last took from the window, at set task counts: see ``docs/scheduling.md``). These runs use
  the in-memory log: the decisions do not depend on the store.
- ``throughput``: placement decisions (placed + rejected) per wall second of a whole inflate
  run of openb default through the embedded file log (``fsync=never``), for one step per
  arriving pod (the protocol), 64 per step, and all at once; with the authors' simulator's
  measured 4.7-7.6 pods/s (``PAPER_PODS_PER_S``: the midpoint) as the baseline ratio.
  The 64-per-step row (issue 4's target) is run ``--repeats`` times: the median, every run,
  and each run's process CPU seconds (the machine is shared: compare rates per CPU second).
- ``step_cost``: where one step of the protocol (one pod per step) spends its time, measured
  by wrapping the loop's collaborators (read+decode, fold, decide and its parts, digest,
  publish) and the driver around them; ``step_cost_batch64``: the same by pod at 64 arrivals
  per step, with decide's run kernel (``place_run``: FGD placement of one-task jobs), its
  one-job kernel (``best_node_memo``) and the cell's consume on their own.

Traces are read from ``--traces``, ``$FLEETLOG_TRACES``, ``../shared/traces/alibaba-gpu-v2023-openb/csv``
beside the clone or ``/work/shared/traces/alibaba-gpu-v2023-openb/csv`` — never copied into the
repository. ``--smoke`` (CI): every part on 5% of the arrivals (``ratio=0.05``), default variant,
2 seeds, 2 runs of the 64-per-step row — a test that it runs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.common import add_smoke, emit, machine
from benchmarks.variants import (
    GENERATED,
    Spec,
    SpecError,
    generate,
    group_of,
    measures,
    parse_spec,
    read_pods,
)
from fleetlog.core.policy import policy_named, with_typical_pods
from fleetlog.core.state import CoreConfig
from fleetlog.core.typical import typical_pods_of_jobs
from fleetlog.service.loop import LoopConfig, SchedulerLoop
from fleetlog.simulation import (
    RunConfig,
    RunSummary,
    SchedulerFactory,
    Workload,
    load_cluster,
    load_workload,
    parse_mode,
    run_simulation,
)

OPENB = Path("shared") / "traces" / "alibaba-gpu-v2023-openb" / "csv"
DEFAULT_TRACES = "/work/shared/traces/alibaba-gpu-v2023-openb/csv"
SMOKE_RATIO = "&ratio=0.05"  # --smoke: 5% of the arrivals of every run
POLICIES = ("best-fit", "fgd", "default")  # fgd: the published FGD rule; default: fleetlog's own
PUBLISHED = {  # workload: (BestFit, FGD) GPU allocation % at 130% arrived, mean of 10 seeds (ATC'23)
    "default": (93.08, 95.39),
    "cpu050": (93.79, 95.21),
    "cpu100": (93.44, 95.35),
    "cpu200": (92.40, 95.05),
    "gpushare40": (91.69, 94.15),
    "gpushare60": (89.36, 91.40),
    "gpushare80": (87.01, 89.30),
    "gpuspec10": (93.30, 94.95),
    "gpuspec20": (93.30, 94.84),
    "gpuspec25": (93.23, 94.74),
    "multigpu20": (93.93, 95.65),
    "multigpu30": (94.72, 96.46),
    "multigpu40": (95.23, 96.99),
}
PUBLISHED_OTHERS = {"Random": 87.47, "DotProd": 90.85, "Clustering": 91.88, "Packing": 92.00}  # on default
PAPER_PODS_PER_S = 6.15  # the authors' simulator, measured: 4.7-7.6 pods/s (the midpoint; README)
QUICK_VARIANTS = ("default",)


def find_traces() -> str:
    """``$FLEETLOG_TRACES``, else the openb CSVs beside the clone (``../shared/traces``, as CI
    has them), else the development machine's copy."""
    beside = Path(__file__).resolve().parents[2] / OPENB
    return os.environ.get("FLEETLOG_TRACES") or (str(beside) if beside.is_dir() else DEFAULT_TRACES)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--quick", action="store_true", help="default variant, 2 seeds, short protocol run (<60 s)"
    )
    parser.add_argument(
        "--traces", default=find_traces(), help="the openb CSV folder"
    )
    parser.add_argument("--seeds", type=int, default=None, help="seeds per variant and policy (10; quick: 2)")
    parser.add_argument(
        "--batch", type=int, default=64, help="arrivals per scheduling step in the allocation runs"
    )
    parser.add_argument("--variants", default=None,
                        help="comma-separated variants (default: all of issue 4; none: no published variant)")
    parser.add_argument("--generated", default=None, metavar="SPECS",
                        help="comma-separated generated variants (benchmarks.variants: cpu=150, gpushare=95, "
                             "cpu=120+gpushare=90; all: issue 23's ten; none), one file a seed, made in a "
                             "temporary directory; each row says its half (visible/generated, tuning/check). "
                             "Default: all, unless --variants, --quick or --smoke is given (then none)")
    parser.add_argument("--policies", default=",".join(POLICIES), help="comma-separated policies to compare")
    parser.add_argument("--jobs", type=int, default=1, help="processes for the allocation runs")
    parser.add_argument(
        "--only", choices=("allocation", "throughput"), default=None, help="run one part of the benchmark"
    )
    parser.add_argument("--repeats", type=int, default=None, help="runs of the 64-per-step row (5; quick: 2)")
    add_smoke(parser)
    return parser.parse_args(argv)


def selection(args: argparse.Namespace) -> tuple[list[str], list[Spec]]:
    """The published variants and the generated ones a run reports. Named alone, neither names the
    other's: ``--variants`` alone runs no generated variant, ``--generated`` alone every
    published one. Neither named, both halves of issue 23 (issue 4's variants and
    ``benchmarks.variants.GENERATED``); ``--quick``/``--smoke``: openb default only.
    Raises ``SpecError`` on a spec ``benchmarks.variants`` cannot read."""
    small = args.quick or args.smoke
    variants = args.variants.split(",") if args.variants else list(QUICK_VARIANTS if small else PUBLISHED)
    named = args.generated if args.generated is not None else "none" if small or args.variants else "all"
    specs = GENERATED if named == "all" else () if named == "none" else tuple(named.split(","))
    return ([] if variants == ["none"] else variants), [parse_spec(text) for text in specs if text]


def typical_pods_of(workload: Workload) -> tuple[tuple[int, int, int, int], ...]:
    """The published FGD rule's typical pods of the whole workload (its trace, before any
    inflation, as the authors' simulator takes them): over every task of every job."""
    return typical_pods_of_jobs(job.event for job in workload.jobs)


def scheduler(
    policy: str, workload: Workload | None = None, seed: int = 0, core: CoreConfig | None = None
) -> SchedulerFactory:
    """The policy of the inflate protocol (``fail_unplaced``); the published FGD rule gets the
    typical pods of ``workload`` (the whole trace, fixed for the run), as the authors' simulator,
    and the run's seed for its ties (unless the spec sets ``tie_seed``). ``core``: the fold's
    settings (default: ``CoreConfig()``)."""
    chosen = policy_named(policy, fail_unplaced=True)
    if chosen.scoring == "fgd-published" and "tie_seed=" not in policy:
        chosen = policy_named(policy, fail_unplaced=True, tie_seed=seed)
    if chosen.scoring == "fgd-published" and not chosen.typical_pods and workload is not None:
        chosen = with_typical_pods(chosen, typical_pods_of(workload))
    return lambda store: SchedulerLoop(store, chosen, LoopConfig(), core)


def inflate_run(
    traces: Path, variant: str, policy: str, seed: int, mode: str, log_dir: Path | None = None,
    made: Callable[[SchedulerLoop], None] | None = None, core: CoreConfig | None = None,
) -> RunSummary:
    """One run of ``variant`` (a generated one, ``gen-…``: its file for ``seed``); ``made`` is
    given the scheduling loop the run makes (to read its state after the run); ``core``: the
    fold's settings."""
    cluster = load_cluster(str(traces / "openb_node_list_gpu_node.csv"))
    name = f"{variant}-s{seed}" if variant.startswith("gen-") else variant  # (generated: one file a seed)
    workload = load_workload(str(traces / f"openb_pod_list_{name}.csv"), cluster, seed)
    config = RunConfig(cluster, workload, parse_mode(mode), seed, policy, log_dir)
    make = scheduler(policy, workload, seed, core)

    def made_here(store: Any) -> SchedulerLoop:
        loop = make(store)
        if made is not None:
            made(loop)
        return loop

    return asyncio.run(run_simulation(config, made_here))


def _ratio(job: tuple[Path, str, str, int, int, str]) -> float:
    traces, variant, policy, seed, batch, extra = job
    run = inflate_run(traces, variant, policy, seed, f"inflate?batch={batch}{extra}")
    at_target = run.gpu_alloc_at_target_pct
    assert at_target is not None  # an inflate run always has one
    return at_target


def allocation(
    traces: Path, variants: list[str], policies: list[str], seeds: int, batch: int, jobs: int, extra: str = ""
) -> dict[str, Any]:
    """Mean GPU allocation at 130% per variant and policy, next to the published figures
    (``extra``: more mode parameters, as ``--smoke``'s ratio)."""
    runs = [(traces, v, p, s, batch, extra) for v in variants for p in policies for s in range(1, seeds + 1)]
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as pool:
            ratios = list(pool.map(_ratio, runs))
    else:
        ratios = [_ratio(run) for run in runs]
    by_run = dict(zip([(v, p, s) for _, v, p, s, _, _ in runs], ratios, strict=True))
    out: dict[str, Any] = {}
    for variant in variants:
        row: dict[str, Any] = {}
        for policy in policies:
            got = [by_run[variant, policy, seed] for seed in range(1, seeds + 1)]
            row[policy] = {
                "mean": round(statistics.fmean(got), 2),
                "stdev": round(statistics.stdev(got), 2) if len(got) > 1 else 0.0,
                "min": round(min(got), 2),
                "median": round(statistics.median(got), 2),
                "max": round(max(got), 2),
                "runs": [round(x, 2) for x in got],
            }
        if variant in PUBLISHED:
            best_fit, fgd = PUBLISHED[variant]
            row["published"] = {"BestFit": best_fit, "FGD": fgd}
            for policy in ("default", "fgd"):
                if policy in row:
                    row[f"{policy}_minus_published_fgd"] = round(row[policy]["mean"] - fgd, 2)
        for other in ("best-fit", "fgd"):
            if "default" in row and other in row:
                row[f"default_minus_{other.replace('-', '_')}"] = round(
                    row["default"]["mean"] - row[other]["mean"], 2)
        row["group"] = group_of(variant)
        out[variant] = row
    return out


def groups(rows: dict[str, Any]) -> dict[str, Any]:
    """Issue 23's targets per half (``benchmarks.variants.group_of``): each group's variants,
    default's lead over best-fit (least and mean), over ``fgd`` (least, and on how many
    variants it is >= 0) and, where published, over the published FGD (the same two)."""
    out: dict[str, Any] = {}
    for name in sorted({row["group"] for row in rows.values()}):
        members = {v: row for v, row in rows.items() if row["group"] == name}
        summary: dict[str, Any] = {"variants": sorted(members)}
        leads = [row["default_minus_best_fit"] for row in members.values() if "default_minus_best_fit" in row]
        if leads:
            summary["default_minus_best_fit_min"] = min(leads)
            summary["default_minus_best_fit_mean"] = round(statistics.fmean(leads), 2)
        against = [row["default_minus_fgd"] for row in members.values() if "default_minus_fgd" in row]
        if against:
            summary["default_minus_fgd_min"] = min(against)
            summary["default_at_or_over_fgd"] = f"{sum(x >= 0 for x in against)}/{len(against)}"
        over = [row["default_minus_published_fgd"] for row in members.values()
                if "default_minus_published_fgd" in row]
        if over:
            summary["default_minus_published_fgd_min"] = min(over)
            summary["default_at_or_over_published_fgd"] = f"{sum(x >= 0 for x in over)}/{len(over)}"
        out[name] = summary
    return out


def generated_allocation(
    traces: Path, specs: list[Spec], policies: list[str], seeds: int, batch: int, jobs: int, extra: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """:func:`allocation` on generated variants (benchmarks.variants), each seed's run on a file of
    its own made with that seed, in a temporary directory; and each variant's measures (seed 1)."""
    with tempfile.TemporaryDirectory(prefix="fleetlog-variants-") as tmp:
        made = {spec.name: [generate(traces, spec, seed, Path(tmp)) for seed in range(1, seeds + 1)]
                for spec in specs}
        measured = {name: measures(read_pods(files[0])) for name, files in made.items()}
        return measured, allocation(Path(tmp), list(made), policies, seeds, batch, jobs, extra)


def throughput(traces: Path, quick: bool, repeats: int, extra: str = "") -> dict[str, Any]:
    """Placement decisions per wall second through the file log, by arrivals per step (and, all
    at once, with the cheaper best-fit score: the cost of FGD's scoring kernel)."""
    protocol = "inflate?batch=1" + (extra or ("&ratio=0.2" if quick else ""))
    cases = [
        ("protocol_batch1", "default", protocol, 1),
        ("batch64", "default", "inflate?batch=64" + extra, repeats),
        ("all_at_once", "default", "inflate?batch=1000000" + extra, 1),
        ("all_at_once_best_fit", "best-fit", "inflate?batch=1000000" + extra, 1),
    ]
    out: dict[str, Any] = {}
    for name, policy, mode, runs in cases:
        timed = [timed_run(traces, policy, mode) for _ in range(runs)]
        rates = [run.decisions_per_s for run, _ in timed]
        run = timed[0][0]
        rate = statistics.median(rates)
        out[name] = {
            "policy": run.policy,
            "mode": run.mode,
            "decisions_per_s": rate,
            "x_paper": round(rate / PAPER_PODS_PER_S, 1),
            "pods": run.jobs,
            "steps": run.steps,
            "wall_s": statistics.median(r.wall_s for r, _ in timed),
        }
        if runs > 1:
            out[name]["runs_decisions_per_s"] = rates
            out[name]["runs_cpu_s"] = [cpu for _, cpu in timed]
            out[name]["decisions_per_cpu_s"] = round(statistics.median(r.jobs / cpu for r, cpu in timed), 1)
            out[name]["load_average"] = [round(x, 2) for x in os.getloadavg()]
    return out


def timed_run(traces: Path, policy: str, mode: str) -> tuple[RunSummary, float]:
    """One inflate run of openb default through the file log, and the process CPU seconds of
    its simulation (the workload is loaded, and the log directory made, outside the count)."""
    from fleetlog.simulation import driver

    run_cpu: list[float] = []
    original = driver.Simulation.run

    async def counted(self: driver.Simulation, *args: Any, **kwargs: Any) -> Any:
        start = time.process_time()
        try:
            return await original(self, *args, **kwargs)
        finally:
            run_cpu.append(time.process_time() - start)

    driver.Simulation.run = counted  # type: ignore[method-assign]
    try:
        with tempfile.TemporaryDirectory(prefix="fleetlog-bench-") as tmp:
            run = inflate_run(traces, "default", policy, 1, mode, Path(tmp) / "log")
    finally:
        driver.Simulation.run = original  # type: ignore[method-assign]
    return run, round(run_cpu[0], 3)


class Timer:
    """Accumulated seconds and calls of wrapped functions, by label."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def add(self, label: str, seconds: float) -> None:
        self.seconds[label] = self.seconds.get(label, 0.0) + seconds
        self.calls[label] = self.calls.get(label, 0) + 1

    def wrap(self, label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(label, time.perf_counter() - start)

        return timed

    def wrap_async(self, label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        async def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return await fn(*args, **kwargs)
            finally:
                self.add(label, time.perf_counter() - start)

        return timed


@contextmanager
def patched(timer: Timer) -> Iterator[None]:
    """Wrap the loop's collaborators (module attributes, restored afterwards)."""
    from fleetlog.backends.simulated import backend
    from fleetlog.core import decide as decide_mod
    from fleetlog.core import kernels
    from fleetlog.core import scratch as scratch_mod
    from fleetlog.log import consumer
    from fleetlog.log.file import FileLogStore
    from fleetlog.service import loop as loop_mod
    from fleetlog.simulation import driver

    targets = [
        (loop_mod, "fold_many", "fold inputs"),
        (loop_mod, "decide", "decide (total)"),
        (loop_mod, "digest", "state digest"),
        (loop_mod, "fold_fast", "fold decision batch"),
        (loop_mod, "encode", "encode decision batch"),
        (scratch_mod, "shape_matrix", "decide: FGD shape matrix"),
        (decide_mod, "Scratch", "decide: Scratch() incl. shape matrix"),
        (decide_mod, "schedule_job", "decide: place the job"),
        (driver, "message_of", "driver: encode arrival"),
        (backend.SimulatedCell, "apply", "cell: apply decisions"),
        (kernels, "best_node_memo", "decide: FGD kernel best_node_memo"),
        (kernels, "place_run", "decide: kernel place_run"),
    ]
    async_targets = [
        (backend.SimulatedCell, "consume", "cell: consume (read, decode, apply)"),
        (consumer.EventConsumer, "poll", "read + decode inputs"),
        (FileLogStore, "append_transactional", "publish batch + commit (file log)"),
    ]
    saved = [
        (obj, name, getattr(obj, name)) for obj, name, _ in targets + async_targets if hasattr(obj, name)
    ]
    for obj, name, label in targets:
        if hasattr(obj, name):
            setattr(obj, name, timer.wrap(label, getattr(obj, name)))
    for obj, name, label in async_targets:
        setattr(obj, name, timer.wrap_async(label, getattr(obj, name)))
    try:
        yield
    finally:
        for obj, name, original in saved:
            setattr(obj, name, original)


def step_cost(traces: Path, quick: bool, extra: str = "") -> dict[str, Any]:
    """Milliseconds per step of the protocol (one pod per step), by part, and their share of the run."""
    mode = "inflate?batch=1" + (extra or ("&ratio=0.2" if quick else ""))
    run, timer = profiled_run(traces, mode)
    per_step = {
        label: round(s * 1000 / run.steps, 3)
        for label, s in sorted(timer.seconds.items(), key=lambda kv: -kv[1])
    }
    share = {label: round(s / run.wall_s * 100, 1) for label, s in timer.seconds.items()}
    return {
        "mode": run.mode,
        "steps": run.steps,
        "wall_s": run.wall_s,
        "ms_per_step_total": round(run.wall_s * 1000 / run.steps, 3),
        "ms_per_step": per_step,
        "percent_of_wall": share,
    }


def pod_cost(traces: Path, extra: str = "") -> dict[str, Any]:
    """Microseconds per pod at 64 arrivals per step (issue 4's target: 50 us per pod), by part."""
    run, timer = profiled_run(traces, "inflate?batch=64" + extra)
    ranked = sorted(timer.seconds.items(), key=lambda kv: -kv[1])
    per_pod = {label: round(s * 1e6 / run.jobs, 1) for label, s in ranked}
    calls = {label: timer.calls[label] for label in per_pod}
    return {
        "mode": run.mode,
        "pods": run.jobs,
        "steps": run.steps,
        "wall_s": run.wall_s,
        "us_per_pod_total": round(run.wall_s * 1e6 / run.jobs, 1),
        "us_per_pod": per_pod,
        "calls": calls,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def profiled_run(traces: Path, mode: str) -> tuple[RunSummary, Timer]:
    timer = Timer()
    with tempfile.TemporaryDirectory(prefix="fleetlog-bench-") as tmp, patched(timer):
        run = inflate_run(traces, "default", "default", 1, mode, Path(tmp) / "log")
    return run, timer


def main() -> None:
    args = parse()
    traces = Path(args.traces)
    if not (traces / "openb_node_list_gpu_node.csv").is_file():
        raise SystemExit(f"no openb traces in {traces}: pass --traces PATH or set FLEETLOG_TRACES")
    seeds = args.seeds or (2 if args.quick or args.smoke else 10)
    small = args.quick or args.smoke
    try:
        variants, generated = selection(args)
    except SpecError as exc:
        raise SystemExit(f"--generated: {exc}") from None
    extra = SMOKE_RATIO if args.smoke else ""
    inflate_run(traces, "default", "fgd", 1, "inflate?batch=64&ratio=0.05")  # load every kernel: steps of 64
    result: dict[str, Any] = {
        "benchmark": "simulate",
        "quick": args.quick,
        "smoke": args.smoke,
        **machine(),
        "traces": str(traces),
        "seeds": seeds,
        "batch": args.batch,
    }
    if args.only in (None, "allocation"):
        policies = args.policies.split(",")
        result["allocation"] = allocation(traces, variants, policies, seeds, args.batch, args.jobs, extra)
        if generated:
            made, rows = generated_allocation(traces, generated, policies, seeds, args.batch, args.jobs,
                                              extra)
            result["generated"], result["allocation"] = made, result["allocation"] | rows
        result["groups"] = groups(result["allocation"])
        result["published_others_on_default"] = PUBLISHED_OTHERS
    if args.only in (None, "throughput"):
        repeats = args.repeats or (2 if small else 5)  # (smoke: 2 runs, so the per-run keys appear)
        result["throughput"] = throughput(traces, args.quick, repeats, extra)
        result["step_cost"] = step_cost(traces, args.quick, extra)
        result["step_cost_batch64"] = pod_cost(traces, extra)
    if args.json:
        emit(result, True)
    else:
        show(result)


def show(result: dict[str, Any]) -> None:
    """A readable table for a terminal."""
    if "allocation" in result:
        show_allocation(result)
    if "throughput" in result:
        show_throughput(result)


def show_allocation(result: dict[str, Any]) -> None:
    print(f"inflate to 130% on openb ({result['seeds']} seeds, {result['batch']} arrivals per step): "
          "mean ±stdev over the seeds")
    rows = result["allocation"]
    policies = [p for p, v in next(iter(rows.values())).items() if p != "published" and isinstance(v, dict)]
    lead = "default_minus_fgd" if "fgd" in policies and "default" in policies else None
    print(f"{'half':17} {'variant':23} " + " ".join(f"{p:>14}" for p in policies)
          + (f" {'default-fgd':>11}" if lead else "") + f" | {'BestFit*':>8} {'FGD*':>8}")
    for variant, row in rows.items():
        ours = " ".join(f"{row[p]['mean']:8.2f} ±{row[p]['stdev']:4.2f}" for p in policies)
        ahead = f" {row[lead]:+11.2f}" if lead else ""
        published = row.get("published")
        theirs = f"{published['BestFit']:8.2f} {published['FGD']:8.2f}" if published else f"{'-':>8} {'-':>8}"
        print(f"{row['group']:17} {variant:23} {ours}{ahead} | {theirs}")
    print("* published (Weng et al., ATC'23)")


def show_throughput(result: dict[str, Any]) -> None:
    for name, t in result["throughput"].items():
        print(
            f"throughput {name:16} {t['decisions_per_s']:>10,.0f} decisions/s  ({t['x_paper']}x the paper's "
            f"simulator; {t['pods']} pods, {t['steps']} steps, {t['wall_s']:.1f} s)"
        )
    cost = result["step_cost"]
    print(f"one step of the protocol: {cost['ms_per_step_total']:.3f} ms")
    for label, ms in cost["ms_per_step"].items():
        print(f"  {label:36} {ms:8.3f} ms  {cost['percent_of_wall'][label]:5.1f}%")
    pods = result["step_cost_batch64"]
    print(f"one pod at 64 per step: {pods['us_per_pod_total']:.1f} us")
    for label, us in pods["us_per_pod"].items():
        print(f"  {label:36} {us:8.1f} us  ({pods['calls'][label]} calls)")


if __name__ == "__main__":
    main()
