"""``fleetlog simulate``: load the inputs, run each seed with a progress bar, print and save the result.

The scheduler is built by the caller (``fleetlog.cli``), which owns the policy and the
service loop; everything here only reads specs and files, runs, and reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import msgspec
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from fleetlog.backends.simulated.cluster import Cluster
from fleetlog.display import console
from fleetlog.log.base import LogError
from fleetlog.log.logdir import check_overwrite, prepare_log_dir
from fleetlog.measures import ROWS as SHARED_ROWS
from fleetlog.measures import fmt_count, fmt_pct
from fleetlog.simulation.clusters import load_cluster
from fleetlog.simulation.driver import SchedulerFactory, Stop
from fleetlog.simulation.modes import Mode
from fleetlog.simulation.report import MEAN_FIELDS, RunSummary, aggregate, write_report
from fleetlog.simulation.runner import Measurer, RunConfig, is_seed_dir, run_simulation
from fleetlog.simulation.spec import SimulationInputError
from fleetlog.simulation.workload import load_workload


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
    replace_log: bool = False
    """An earlier fleetlog log in ``log`` may be replaced (``--force``, or the default directory)."""
    replace_report: bool = False
    """An earlier report in ``report`` may be replaced (``--force``, or the default directory)."""


def simulate(
    options: Options,
    policy: str,
    make_scheduler: SchedulerFactory,
    measure: Measurer | None = None,
    warm_up: Callable[[], float] = lambda: 0.0,
) -> list[RunSummary]:
    """Run every seed (a progress bar on a terminal unless ``--json``), each measured by
    ``measure`` on its log; write the report; print.  ``warm_up`` compiles the kernels before
    the first run and returns the seconds it took.  Ctrl-C ends the run at the next turn: the
    log is folded to its end and the report written from what was simulated (``interrupted``)."""
    cluster = load_cluster(options.cluster)
    configs = [config_for(options, cluster, seed, policy) for seed in seed_list(options)]  # bad input: here
    try:
        prepare_outputs(options)
        compile_s = warm_up()
        with interruptible() as stop:
            runs = run_all(configs, make_scheduler, measure, stop, options.as_json)
            runs[0] = msgspec.structs.replace(runs[0], compile_s=round(compile_s, 3))
            written = write_report(options.report, runs)
    except OSError as exc:  # an unwritable --log or --report: one line, not a traceback
        raise SimulationInputError(f"{exc.filename or exc}: {exc.strerror or 'cannot write'}") from None
    except LogError as exc:  # e.g. another process holds the log directory, or it is not ours
        raise SimulationInputError(str(exc)) from None
    if options.as_json:
        print(json.dumps(aggregate(runs)))
    else:
        print_summary(console(), runs, [options.log, *written])
    return runs


def prepare_outputs(options: Options) -> None:
    """Refuse (or, when allowed, clear) an earlier log and report before anything is written."""
    prepare_log_dir(options.log, replace=options.replace_log, nested=is_seed_dir)
    report = {options.report / "summary.json": is_report, options.report / "plot.png": has_report}
    check_overwrite(report, replace=options.replace_report, flag="--report")


def is_report(path: Path) -> bool:
    """A ``summary.json`` fleetlog simulate wrote: a JSON object of ``summary`` and ``runs``."""
    try:
        body = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return False
    return isinstance(body, dict) and body.keys() == {"summary", "runs"}


def has_report(path: Path) -> bool:
    """A ``plot.png`` beside a ``summary.json`` of fleetlog's."""
    return is_report(path.with_name("summary.json"))


def run_all(
    configs: Sequence[RunConfig], make_scheduler: SchedulerFactory, measure: Measurer | None, stop: Stop,
    quiet: bool,
) -> list[RunSummary]:
    """Each seed in turn, with a progress bar; after a stopped run, no further seed."""
    runs: list[RunSummary] = []
    with bar(console(stderr=True), quiet) as progress:
        for c in configs:
            run = run_simulation(c, make_scheduler, tracker(progress, c.seed), stop, measure)
            runs.append(asyncio.run(run))
            if runs[-1].interrupted:
                break
    return runs


@contextlib.contextmanager
def interruptible() -> Iterator[Stop]:
    """While inside, the first SIGINT (Ctrl-C) only asks the run to stop at its next turn, so
    the log stays whole and the report is written; a second one interrupts at once."""
    asked = [False]

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        if asked[0]:
            raise KeyboardInterrupt
        asked[0] = True

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield lambda: asked[0]
    finally:
        signal.signal(signal.SIGINT, previous)


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
    stopped = " — interrupted: what was simulated until Ctrl-C" if runs[-1].interrupted else ""
    table = Table(
        title=f"fleetlog simulate — {first.mode} — policy {first.policy}{stopped}",
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
    ("kernel compile before the run (s)", "compile_s", lambda v: f"{float(v):.2f}"),  # type: ignore[arg-type]
]
