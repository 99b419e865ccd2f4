"""Two revisions' benchmarks, alternated in one run: did a change make anything slower?

    python -m benchmarks.compare --before REV --after REV [--rounds N] [--bench core,simulate,replay]
                                 [--smoke] [--shape] [--no-warmup] [--json]

Each revision is checked out into a temporary detached git worktree (``benchmarks.worktree``:
removed afterwards, also on an error or Ctrl-C), and each selected benchmark runs there as
``python -m benchmarks.<name> --json <size>`` in a fresh process with ``PYTHONPATH`` set to that
tree: the before revision is measured by its own ``benchmarks/`` code, the after one by its own.

**Order.** Per round and benchmark the two revisions run back to back, in the order ABBA
(round 1 before then after, round 2 after then before, ...): on a shared machine the load drifts,
and with ABAB the after run would always come second, so a steady drift would count for or
against it; with ABBA it cancels over each pair of rounds.

**Numba.** A fresh tree has no numba cache: the first process compiles its kernels (a minute or
two). A warm-up round (each benchmark once at ``--smoke`` in each tree, discarded) fills each
tree's own cache first, so every timed round loads the kernels from it; the benchmarks also warm
their kernels up in-process before they time anything. (A tree with the working copy's exact
``fleetlog/`` sources starts from a copy of its numba cache: ``benchmarks.worktree``.)

**Report.** Every number a benchmark prints (nested keys flattened to ``a.b.c``; lists and text
left out of the table, kept in ``--json``'s ``runs``), per key: the median of the rounds before
and after, the ratio after/before, and a verdict where the key says which way is better (rates:
higher; seconds, milliseconds, bytes: lower): ``better``/``worse`` only when the two sides' rounds
do not overlap at all and the medians differ by more than 5%, else ``~`` (within the noise of
this run: with 3 rounds a side, pure noise keeps the sides apart 1 time in 10). ``--shape`` adds the module
tree, the import cycles and the replay fixtures' digests of both trees (``benchmarks.shape``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import machine
from benchmarks.simulate import find_traces
from benchmarks.worktree import UsageError, checkouts, resolve, tree_env

EXIT_USAGE = 2
TIMEOUT_S = 1800  # one benchmark process; far above any default size

SIZES: dict[str, tuple[str, ...]] = {
    # one to three minutes per round for both revisions together, on 2 shared vCPUs (--quick
    # sizes run 6-35 s and were too noisy to read a ratio from)
    "core": (),  # the full run: 1k, 10k and 100k nodes
    "simulate": ("--variants", "default", "--seeds", "2"),  # full throughput; allocation as --quick
    "replay": (),  # 1,000,000 events
}
SMOKE = ("--smoke",)
NOISE = 0.05  # a verdict needs the medians this far apart (a fraction of before)
SIDES = ("before", "after")


@dataclass
class Run:
    """One benchmark process: what ran, when, and what it printed (or why it failed)."""

    benchmark: str
    side: str
    round: int  # 0: the discarded warm-up
    seconds: float
    load_average: float
    result: dict[str, Any] | None
    error: str | None = None


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.compare",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("--before", required=True, help="the revision to compare against (any git rev)")
    parser.add_argument("--after", required=True, help="the revision measured")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds, each runs both revisions")
    parser.add_argument("--bench", default=",".join(SIZES), help=f"comma-separated of {', '.join(SIZES)}")
    parser.add_argument("--smoke", action="store_true", help="each benchmark's --smoke size: a test run")
    parser.add_argument("--no-warmup", action="store_true", help="skip the discarded warm-up round")
    parser.add_argument("--shape", action="store_true", help="also the module tree, cycles and fixtures")
    parser.add_argument("--json", action="store_true", help="one JSON object for scripts")
    args = parser.parse_args(argv)
    args.benches = [b for b in args.bench.split(",") if b]
    unknown = sorted(set(args.benches) - set(SIZES))
    if unknown or args.rounds < 1:
        what = f"unknown benchmark {unknown[0]!r} (known: {', '.join(SIZES)})" if unknown else "--rounds < 1"
        parser.exit(EXIT_USAGE, f"{parser.prog}: error: {what}\n")
    return args


def run_one(tree: Path, name: str, size: tuple[str, ...], env: dict[str, str]) -> tuple[dict[str, Any], str]:
    """``python -m benchmarks.<name> --json <size>`` in ``tree``: its JSON object (the last line
    of its output that is one) and the tail of its stderr. A failure raises ``RuntimeError``."""
    argv = [sys.executable, "-m", f"benchmarks.{name}", "--json", *size]
    with subprocess.Popen(
        argv, cwd=tree, env=tree_env(tree, env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as child:
        try:
            out, err = child.communicate(timeout=TIMEOUT_S)
        except BaseException as stopped:  # timeout, Ctrl-C, SIGTERM: the child dies before its tree
            child.kill()
            child.communicate()
            if isinstance(stopped, subprocess.TimeoutExpired):
                raise RuntimeError(f"benchmarks.{name} ran over {TIMEOUT_S} s") from None
            raise
    objects = [line for line in out.splitlines() if line.startswith("{")]
    if child.returncode != 0 or not objects:
        last = (err.strip().splitlines() or [f"exit code {child.returncode}"])[-1]
        raise RuntimeError(f"benchmarks.{name} exited {child.returncode}: {last}")
    try:
        return json.loads(objects[-1]), err[-2000:]
    except json.JSONDecodeError as bad:
        raise RuntimeError(f"benchmarks.{name} printed no JSON object: {bad}") from None


def timed(tree: Path, name: str, side: str, round_: int, size: tuple[str, ...], env: dict[str, str]) -> Run:
    load = os.getloadavg()[0]
    started = time.perf_counter()
    try:
        result, _ = run_one(tree, name, size, env)
        error = None
    except RuntimeError as failed:
        result, error = None, str(failed)
    return Run(name, side, round_, round(time.perf_counter() - started, 1), load, result, error)


def order(round_: int) -> tuple[int, int]:
    """ABBA: round 1 before-after, round 2 after-before, and so on."""
    return (0, 1) if round_ % 2 else (1, 0)


def run_all(trees: list[Path], args: argparse.Namespace, progress: bool) -> list[Run]:
    """The warm-up round (unless ``--no-warmup``), then ``--rounds`` timed rounds, alternated."""
    env = {"FLEETLOG_TRACES": find_traces()}
    size = SMOKE if args.smoke else None
    plan = [] if args.no_warmup else [(0, name, side) for name in args.benches for side in (0, 1)]
    for round_ in range(1, args.rounds + 1):
        plan += [(round_, name, side) for name in args.benches for side in order(round_)]
    runs = []
    for round_, name, side in plan:
        run = timed(
            trees[side], name, SIDES[side], round_, size or (SMOKE if round_ == 0 else SIZES[name]), env
        )
        runs.append(run)
        if progress:
            state = run.error or "ok"
            print(
                f"round {round_ or 'warm-up'} {name:8} {SIDES[side]:6} {run.seconds:7.1f} s "
                f"(load {run.load_average:.1f}) {state}",
                file=sys.stderr,
                flush=True,
            )
    return runs


def flatten(value: Any, prefix: str = "") -> dict[str, float]:
    """The numbers in a benchmark's JSON, nested keys joined with dots (bools, text and lists
    are not measures)."""
    if isinstance(value, dict):
        out: dict[str, float] = {}
        for key, inner in value.items():
            out |= flatten(inner, f"{prefix}{key}.")
        return out
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return {prefix.removesuffix("."): float(value)}
    return {}


def better(key: str) -> str | None:
    """Which way ``key`` improves, from its name: ``higher`` (rates, speed-ups), ``lower``
    (seconds, milliseconds, microseconds, bytes), or None (sizes and counts)."""
    last = key.rsplit(".", 1)[-1]
    parts = key.split(".")
    if "per_s" in last or "per_cpu_s" in last or last.endswith(("speedup", "x_paper")) or "_vs_" in last:
        return "higher"
    timing = ("ms_per_step", "us_per_pod", "percent_of_wall")
    if any(p in timing for p in parts[:-1]) or last.startswith(("ms_per", "us_per")):
        return "lower" if "percent_of_wall" not in parts else None
    if last.endswith(("_s", "_ms", "_us")) or "bytes" in last:
        return "lower"
    return None


def verdict(key: str, before: list[float], after: list[float]) -> str:
    """``better``/``worse`` when the rounds of the two sides do not overlap, the medians differ
    by more than :data:`NOISE` and the key says which way is better; ``same`` when every round
    gave one value; else ``~``. (With 3 rounds a side, pure noise leaves the sides apart 1 time
    in 10: over a hundred keys, the margin keeps those few from reading as verdicts.)"""
    if set(before) == set(after) and len(set(before)) == 1:
        return "same"
    way = better(key)
    overlap = max(before) >= min(after) and max(after) >= min(before)
    b, a = statistics.median(before), statistics.median(after)
    small = abs(a - b) <= NOISE * abs(b)
    if way is None or overlap or small:
        return "~"
    up = min(after) > max(before)
    return "better" if up == (way == "higher") else "worse"


def summarise(runs: list[Run], name: str) -> dict[str, dict[str, Any]]:
    """Per key of benchmark ``name``: the rounds of each side, their medians, ratio, verdict."""
    values: dict[str, dict[str, list[float]]] = {}
    for run in runs:
        if run.benchmark == name and run.round > 0 and run.result is not None:
            for key, value in flatten(run.result).items():
                values.setdefault(key, {"before": [], "after": []})[run.side].append(value)
    out = {}
    for key, sides in sorted(values.items()):
        b, a = sides["before"], sides["after"]
        row: dict[str, Any] = {"before_runs": b, "after_runs": a, "better": better(key)}
        row["before"] = statistics.median(b) if b else None
        row["after"] = statistics.median(a) if a else None
        both = b and a and row["before"] != 0
        row["ratio"] = row["after"] / row["before"] if both else None
        row["verdict"] = verdict(key, b, a) if b and a else ("only before" if b else "only after")
        out[key] = row
    return out


def report(args: argparse.Namespace, commits: list[str], runs: list[Run]) -> dict[str, Any]:
    return {
        "benchmark": "compare",
        "before": {"rev": args.before, "commit": commits[0]},
        "after": {"rev": args.after, "commit": commits[1]},
        "rounds": args.rounds,
        "order": "ABBA: before-after, then after-before, alternating by round",
        "warmup": not args.no_warmup,
        "smoke": args.smoke,
        "sizes": {name: list(SMOKE if args.smoke else SIZES[name]) for name in args.benches},
        "machine": machine(),
        "results": {name: summarise(runs, name) for name in args.benches},
        "failures": [
            f"{r.benchmark} {r.side} round {r.round}: {r.error}" for r in runs if r.error and r.round > 0
        ],
        # a warm-up that fails (an old revision without --smoke, say) only costs the cache warming
        "warmup_failures": [f"{r.benchmark} {r.side}: {r.error}" for r in runs if r.error and not r.round],
        "runs": [vars(r) for r in runs],
    }


def number(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.4g}"


def show(result: dict[str, Any]) -> None:
    """The comparison as tables for people (one per benchmark)."""
    from rich.table import Table

    from fleetlog.display import console

    out = console()
    b, a = result["before"], result["after"]
    out.print(
        f"before {b['rev']} ({b['commit'][:10]})  after {a['rev']} ({a['commit'][:10]})  "
        f"{result['rounds']} rounds, {result['order']}"
    )
    for name, rows in result["results"].items():
        size = " ".join(result["sizes"][name]) or "(full size)"
        table = Table(title=f"{name} {size}", title_justify="left")
        for column in ("key", "before", "after", "after/before", "verdict", "rounds before", "rounds after"):
            table.add_column(column, justify="left" if column in ("key", "verdict") else "right")
        for key, row in rows.items():
            ratio = "-" if row["ratio"] is None else f"{row['ratio']:.3f}"
            table.add_row(
                key,
                number(row["before"]),
                number(row["after"]),
                ratio,
                row["verdict"],
                " ".join(number(v) for v in row["before_runs"]),
                " ".join(number(v) for v in row["after_runs"]),
            )
        out.print(table)
    for failure in result["failures"]:
        out.print(f"FAILED: {failure}")
    for failure in result.get("warmup_failures", []):
        out.print(f"warm-up failed (not counted): {failure}")
    if "shape" in result:
        from benchmarks.shape import show as show_shape

        show_shape(result["shape"])


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        commits = [resolve(args.before), resolve(args.after)]
        with checkouts(args.before, args.after) as trees:
            runs = run_all(trees, args, progress=True)  # on stderr: a long run shows where it is
            result = report(args, commits, runs)
            if args.shape:
                from benchmarks.shape import shape

                result["shape"] = shape(trees[0], trees[1])
    except UsageError as bad:
        print(f"python -m benchmarks.compare: error: {bad}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("python -m benchmarks.compare: interrupted (worktrees removed)", file=sys.stderr)
        return 130
    except RuntimeError as failed:  # git, or the shape report's import graph
        print(f"python -m benchmarks.compare: {failed}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result))
    else:
        show(result)
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
