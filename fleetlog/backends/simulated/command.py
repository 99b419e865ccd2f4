"""``fleetlog simulate``: load the inputs, run each seed with a progress bar, print and save the result.

The scheduler is built by the caller (``fleetlog.cli``), which owns the policy and the
service loop; everything here only reads specs and files, runs, and reports.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from fleetlog.backends.simulated.cluster import Cluster, load_cluster
from fleetlog.backends.simulated.driver import SchedulerFactory
from fleetlog.backends.simulated.modes import Mode
from fleetlog.backends.simulated.report import MEAN_FIELDS, RunSummary, aggregate, write_report
from fleetlog.backends.simulated.runner import Measurer, RunConfig, clear_log_dir, run_simulation
from fleetlog.backends.simulated.spec import SimulationInputError
from fleetlog.backends.simulated.workload import load_workload
from fleetlog.display import console
from fleetlog.log.base import LogError
from fleetlog.measures import ROWS as SHARED_ROWS
from fleetlog.measures import fmt_count, fmt_pct


@dataclass(frozen=True)
class Options:
    """The command's arguments, parsed."""

    cluster: str
    workload: str
    mode: Mode
    seed: int
    seeds: int
    log: Path
    report: Path
    as_json: bool


def simulate(
    options: Options, policy: str, make_scheduler: SchedulerFactory, measure: Measurer | None = None
) -> list[RunSummary]:
    """Run every seed (a progress bar on a terminal unless ``--json``), each measured by
    ``measure`` on its log; write the report; print."""
    cluster = load_cluster(options.cluster)
    configs = [config_for(options, cluster, seed, policy) for seed in seed_list(options)]  # bad input: here
    try:
        clear_log_dir(options.log)
        with bar(console(stderr=True), options.as_json) as progress:
            runs = [
                asyncio.run(run_simulation(c, make_scheduler, tracker(progress, c.seed), measure))
                for c in configs
            ]
        written = write_report(options.report, runs)
    except OSError as exc:  # an unwritable --log or --report: one line, not a traceback
        raise SimulationInputError(f"{exc.filename or exc}: {exc.strerror or 'cannot write'}") from None
    except LogError as exc:  # e.g. another process holds the log directory
        raise SimulationInputError(str(exc)) from None
    if options.as_json:
        print(json.dumps(aggregate(runs)))
    else:
        print_summary(console(), runs, [options.log, *written])
    return runs


def seed_list(options: Options) -> list[int]:
    return [options.seed + i for i in range(options.seeds)]


def config_for(options: Options, cluster: Cluster, seed: int, policy: str) -> RunConfig:
    """One seed's run: its workload (a generator is seeded too) and its log directory."""
    log_dir = options.log if options.seeds == 1 else options.log / f"seed-{seed}"
    workload = load_workload(options.workload, cluster, seed)
    return RunConfig(cluster, workload, options.mode, seed, policy, log_dir)


def bar(console: Console, quiet: bool) -> Progress:
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("jobs"),
        TimeElapsedColumn(),
    )
    return Progress(*columns, console=console, transient=True, disable=quiet or not console.is_terminal)


def tracker(progress: Progress, seed: int) -> Callable[[int, int, int], None]:
    """A progress callback that redraws at most every half percent of the arrivals."""
    task = progress.add_task(f"seed {seed}", total=None)
    shown = [-1]

    def update(arrived: int, total: int, now_ms: int) -> None:
        if arrived - shown[0] >= max(1, total // 200) or arrived == total:
            shown[0] = arrived
            progress.update(
                task,
                completed=arrived,
                total=total,
                description=f"seed {seed} · virtual {now_ms / 3_600_000:.2f} h",
            )

    return update


def print_summary(console: Console, runs: Sequence[RunSummary], paths: Sequence[Path]) -> None:
    """The summary table: one column per seed, and the mean when there are several."""
    first = runs[0]
    table = Table(
        title=f"fleetlog simulate — {first.mode} — policy {first.policy}",
        caption=f"{first.workload} on {first.cluster} ({first.nodes:,} nodes, {first.gpus:,} GPUs)",
    )
    table.add_column("")
    for r in runs:
        table.add_column(f"seed {r.seed}", justify="right")
    mean = aggregate(runs) if len(runs) > 1 else None
    if mean is not None:
        table.add_column("mean", justify="right")
    for label, key, fmt in ROWS:
        if all(getattr(r, key) is None for r in runs):
            continue  # not measured in this mode (the inflate target in replay), or at all
        cells = [fmt(getattr(r, key)) for r in runs]
        averaged = [fmt(mean[key]) if key in MEAN_FIELDS else "-"] if mean is not None else []
        table.add_row(label, *cells, *averaged)
    console.print(table)
    for path in paths:
        console.print(f"wrote {path}")


ROWS: list[tuple[str, str, Callable[[object], str]]] = [
    *SHARED_ROWS,  # the measures replay report shows too: the same labels, units and numbers
    ("simulation: GPU allocation at the inflate target (%)", "gpu_alloc_at_target_pct", fmt_pct),
    ("simulation: GPU allocation at the end (%)", "gpu_alloc_final_pct", fmt_pct),
    ("simulation: failed (rejected)", "failed", fmt_count),
    ("simulation: pending at the end", "pending", fmt_count),
    ("simulation: running at the end", "running", fmt_count),
    ("simulation: finished", "done", fmt_count),
    ("simulation: gangs lost with a failed node", "lost", fmt_count),
    ("simulation: node failures", "node_failures", fmt_count),
    ("events (inputs + decisions)", "events", fmt_count),
    ("placement decisions/s (wall)", "decisions_per_s", lambda v: f"{float(v):,.0f}"),  # type: ignore[arg-type]
    ("virtual time (s)", "virtual_s", lambda v: f"{float(v):,.0f}"),  # type: ignore[arg-type]
    ("wall time (s)", "wall_s", lambda v: f"{float(v):.2f}"),  # type: ignore[arg-type]
]
