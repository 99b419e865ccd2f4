"""The ``fleetlog`` command.

Usage errors exit with code 2 and a one-line message; ``--json`` prints one JSON
object for scripts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import msgspec

from fleetlog.auth_client import TokenError
from fleetlog.log.logdir import UntrustedError
from fleetlog.usage import EXIT_USAGE, Parser, add_log_options, add_logging_options, print_error, walk

__all__ = ["EXIT_INTERRUPTED", "EXIT_USAGE", "UsageError", "build_parser", "main"]
EXIT_FAILURE = 1
EXIT_INTERRUPTED = 130
"""Ctrl-C: 128 + SIGINT, what shells report for a command a SIGINT ended."""
EXIT_BROKEN_PIPE = 141
"""Its reader went away (``| head``): 128 + SIGPIPE, as shells report for a command SIGPIPE ended."""
DEMO_LOG = ".fleetlog/demo"
SIMULATE_LOG = ".fleetlog/simulate/log"
SIMULATE_REPORT = ".fleetlog/simulate/report"


class UsageError(Exception):
    """A bad argument or input file: reported in one line, exit code 2."""


def _version() -> str:
    """The installed distribution's version (``pyproject.toml``'s, once installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fleetlog")
    except PackageNotFoundError:  # a source tree on PYTHONPATH that was never installed
        return "unknown (not installed)"


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive integer")
    return value


def cmd_schema(args: argparse.Namespace) -> int:
    from fleetlog.events.schema import json_schema

    print(json.dumps(json_schema(), indent=None if args.compact else 2, sort_keys=False))
    return 0


def _replaces(given: str | None, default: str, force: bool) -> tuple[Path, bool]:
    """The directory a command writes (``given``, else ``default``), and whether what an earlier
    run left there may be replaced: with ``--force``, or in the default directory, which is
    fleetlog's own scratch space (a rerun of the quick start replaces its previous run)."""
    path = Path(given if given is not None else default)
    return path, force or path.resolve() == Path(default).resolve()


def cmd_demo(args: argparse.Namespace) -> int:
    from fleetlog.demo import run_demo
    from fleetlog.log.logdir import LogDirError

    log_dir, replace = _replaces(args.log, DEMO_LOG, args.force)
    try:
        result = asyncio.run(
            run_demo(log_dir, seed=args.seed, nodes=args.nodes, job_count=args.jobs, replace=replace)
        )
    except LogDirError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:  # an unwritable --log: one line, not a traceback
        raise UsageError(f"--log {log_dir}: {exc.strerror or exc}") from None
    if args.json:
        print(json.dumps(msgspec.to_builtins(result)))
    else:
        _print_demo(result)
    return 0


def _print_demo(result: Any) -> None:
    from rich.table import Table

    from fleetlog.display import console

    table = Table(title=f"fleetlog demo — file log at {result.log_dir} (seed {result.seed})")
    table.add_column("what")
    table.add_column("count", justify="right")
    for name, count in result.events_read.items():
        table.add_row(f"event {name}", f"{count:,}")
    for reason, count in result.dead_letters.items():
        table.add_row(f"dead letter: {reason}", f"{count:,}")
    table.add_row("GPUs in fleet / requested", f"{result.gpus_in_fleet:,} / {result.gpus_requested:,}")
    table.add_row("append events/s", f"{result.write_events_per_s:,.0f}")
    table.add_row("read+decode events/s", f"{result.read_events_per_s:,.0f}")
    console().print(table)


def cmd_simulate(args: argparse.Namespace) -> int:
    """Simulated cells on a virtual clock drive the real scheduling loop over the file log
    (with ``--cells``: the dispatcher and cell shards in one process, :func:`simulate_cells`)."""
    if any(getattr(args, k) is not None for k in ("cells", "shards", "jobs", "nodes_per_cell")):
        return simulate_cells(args)
    from fleetlog.core.policy import UnknownPolicyError, policy_named
    from fleetlog.kernel_warmup import warm_kernels
    from fleetlog.log.base import LogStore
    from fleetlog.replay.summary import measure_store
    from fleetlog.service.loop import LoopConfig, SchedulerLoop
    from fleetlog.service.warmup import warm_up
    from fleetlog.simulation.command import Options, simulate
    from fleetlog.simulation.modes import parse_mode
    from fleetlog.simulation.spec import SimulationInputError

    log_dir, replace_log = _replaces(args.log, SIMULATE_LOG, args.force)
    report_dir, replace_report = _replaces(args.report, SIMULATE_REPORT, args.force)
    try:
        mode = parse_mode(args.mode)
        # inflate is the FGD paper's protocol: a job that does not fit on arrival is rejected
        policy = policy_named(args.policy, **({"fail_unplaced": True} if mode.name == "inflate" else {}))
        policy = _typical(policy, args.cluster, args.workload, args.seed)
        options = Options(args.cluster, args.workload, mode, args.seed, args.seeds, log_dir, report_dir,
                          args.json, replace_log, replace_report)

        def scheduler(store: LogStore) -> SchedulerLoop:
            return SchedulerLoop(store, policy, LoopConfig(check_invariants=args.check_invariants))

        def warm() -> float:  # before the runs, so the compile is not in their wall time
            return warm_kernels(lambda: warm_up(policy))[0]

        runs = simulate(options, policy.name, scheduler, measure_store, warm)
    except UnknownPolicyError as exc:
        raise UsageError(f"--policy: {exc}") from None
    except SimulationInputError as exc:
        raise UsageError(str(exc)) from None
    if runs[-1].interrupted:
        print("fleetlog simulate: interrupted; the log and the report hold what was simulated until then",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0


SHARDED_ONLY = {"cluster": "synthetic", "workload": "synthetic", "mode": "replay", "policy": "default",
                "seeds": 1, "log": None, "report": None, "check_invariants": False}
"""Options of the single-shard simulation that ``--cells`` does not take (at their defaults)."""


def _typical(policy: Any, cluster: str, workload: str, seed: int) -> Any:
    """Policy ``fgd`` (the published FGD rule) against the typical pods of the whole workload
    (its first seed's, fixed for the run), as ``benchmarks.simulate`` runs it."""
    from fleetlog.core.policy import with_typical_pods
    from fleetlog.core.typical import typical_pods_of_jobs
    from fleetlog.simulation import load_cluster, load_workload

    if policy.scoring != "fgd-published" or policy.typical_pods:
        return policy
    jobs = load_workload(workload, load_cluster(cluster), seed).jobs
    return with_typical_pods(policy, typical_pods_of_jobs(job.event for job in jobs))


def simulate_cells(args: argparse.Namespace) -> int:
    """``simulate --cells N --shards K``: the global layer in one process (no log, no server)."""
    from fleetlog.sharded.world import WorldSpec
    from fleetlog.simulate_cells import CellsUsageError, run_cells

    if args.cells is None:
        given = [f"--{k.replace('_', '-')}" for k in ("shards", "jobs", "nodes_per_cell") if getattr(args, k)]
        raise UsageError(f"{', '.join(given)} only with --cells N (the sharded simulation)")
    given = [f"--{k.replace('_', '-')}" for k, v in SHARDED_ONLY.items() if getattr(args, k) != v]
    if given:
        raise UsageError(f"{', '.join(given)}: not with --cells (the sharded simulation runs its own "
                         "synthetic cells in memory, with the default policy and no log)")
    spec = WorldSpec(cells=args.cells, shards=args.shards if args.shards is not None else args.cells,
                     nodes=20 if args.nodes_per_cell is None else args.nodes_per_cell,
                     jobs=2_000 if args.jobs is None else args.jobs, seed=args.seed)
    try:
        run_cells(spec, args.json)
    except CellsUsageError as exc:
        raise UsageError(str(exc)) from None
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """The scheduler service over Kafka or the embedded file log, until SIGTERM/SIGINT."""
    from fleetlog.service.command import CommandError, check_role, configure, run_service
    from fleetlog.service.http import BindError

    try:
        config = configure(args.config, args.log, args.kafka, policy=args.policy, http_port=args.http_port,
                           node_timeout_ms=args.node_timeout_flag_ms, role=args.role)
        check_role(config, create=args.create)
    except CommandError as exc:
        raise UsageError(str(exc)) from None
    try:
        run_service(config)
    except BindError as exc:  # leading without HTTP would strand producers: say so and exit
        print_error("fleetlog run", str(exc))
        return EXIT_USAGE  # the address given (--http-port, service.http_*) cannot be served: as replay serve
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """A job's state, read from the logs (newest snapshot + tail) the way replay reads them."""
    from fleetlog.replay import handlers
    from fleetlog.replay.source import ReplayError

    place = _replay_place(args)
    try:
        return asyncio.run(handlers.run("status", place, args))
    except ReplayError as exc:
        raise UsageError(str(exc)) from None


def cmd_log_prune(args: argparse.Namespace) -> int:
    """``fleetlog log prune``: delete the file log's history before the newest snapshot at or
    before a point (:mod:`fleetlog.replay.prune`)."""
    from fleetlog.replay.prune import prune
    from fleetlog.replay.source import ReplayError
    from fleetlog.replay.terminal import parse_point
    from fleetlog.service.command import CommandError, configure

    try:
        config = configure(args.config, args.log, args.kafka)
        if config.kafka is not None:
            raise UsageError("a Kafka log is pruned by its brokers: set kafka.retention_ms (and "
                             "retention_bytes) on the inputs and decisions topics (docs/retention.md)")
        if config.cells:
            raise UsageError("log prune works on a single-shard file log; this configuration has a "
                             "[cells] map (not supported yet)")
        report = asyncio.run(prune(Path(str(config.log.dir)), parse_point(args.before), args.dry_run))
    except (CommandError, ReplayError) as exc:
        raise UsageError(str(exc)) from None
    if args.json:
        print(json.dumps(report))
        return 0
    verb = "would delete" if args.dry_run else "deleted"
    print(f"kept from snapshot {report['snapshot']}")
    for log in ("inputs", "decisions"):
        r = report[log]
        print(f"{log}: {verb} {r['segments_deleted']} segments ({r['records_deleted']:,} records, "
              f"{r['bytes_deleted']:,} bytes); the log starts at offset {r['start']}")
    for note in report["notes"]:
        print(f"note: {note}", file=sys.stderr)
    return 0


def _add_log_commands(sub: Any) -> None:
    log = sub.add_parser("log", help="maintain the embedded file log (prune old history)")
    cmds = log.add_subparsers(dest="log_command", required=True)
    prune = cmds.add_parser("prune", help="delete history older than the newest snapshot before a point",
                            description="Delete whole segments of the inputs and decisions logs that the "
                            "newest valid snapshot at or before POINT covers; never past it, never while "
                            "a service holds the log. Replay then starts from that snapshot.")
    prune.add_argument("--before", required=True, metavar="POINT",
                       help="an inputs offset, epoch milliseconds (1700000000000ms) or an ISO 8601 time")
    add_log_options(prune)
    prune.add_argument("--dry-run", action="store_true", help="say what would be deleted; delete nothing")
    prune.add_argument("--json", action="store_true", help="print one JSON object")
    prune.set_defaults(func=cmd_log_prune)


def _add_service_commands(sub: Any) -> None:
    from fleetlog.replay.command import add_node_timeout

    run = sub.add_parser("run", help="the scheduler service (Kafka or the embedded file log)",
                         description="Consume inputs, decide, publish decisions exactly once; snapshots, "
                         "fail-over, metrics on http://HOST:PORT/metrics. Settings: --config FILE and "
                         "FLEETLOG_<TABLE>_<KEY> variables (docs/service.md).")
    add_log_options(run)
    run.add_argument("--policy", metavar="NAME", help="a policy spec (default: the config's, or default)")
    run.add_argument("--http-port", type=int, metavar="PORT", help="metrics/health/ingest port (0: any)")
    run.add_argument("--role", choices=("all", "dispatch", "cell"),
                     help="all (one shard over the fleet, the default), dispatch or cell: the global "
                     "dispatcher or the cell shards of the [cells] map (docs/scale-out.md)")
    run.add_argument("--create", action="store_true",
                     help="start a new file log in an empty or new --log DIR (else DIR must hold one)")
    add_logging_options(run, "json", "info")  # the service's lines are JSON objects for collectors
    add_node_timeout(run, "producers must send heartbeats more often (docs/service.md)")
    run.set_defaults(func=cmd_run)
    status = sub.add_parser("status", help="a job's state, read from the logs")
    status.add_argument("job", metavar="JOB", help="the job id")
    add_log_options(status)
    add_node_timeout(status, "fold as the service that wrote the log did: give it the same value")
    status.add_argument("--json", action="store_true", help="print one JSON object")
    status.set_defaults(func=cmd_status)


def _add_module_commands(sub: Any) -> None:
    """The commands each module of its own registers: producers, replay, the reads of the API,
    accounting, ``top`` and shell completion."""
    from fleetlog.client_cli import add_client_commands

    add_client_commands(sub, UsageError)
    from fleetlog.cancel_cli import add_cancel_command

    add_cancel_command(sub, UsageError, _replay_place)
    from fleetlog.replay.command import add_replay_commands

    add_replay_commands(sub, UsageError, _replay_place)
    from fleetlog.reads_cli import add_read_commands, attach_replay_serve

    attach_replay_serve(sub)
    add_read_commands(sub, UsageError, _replay_place)
    from fleetlog.history_cli import add_history_command

    add_history_command(sub, UsageError, _replay_place)
    from fleetlog.admin_cli import add_admin_commands

    add_admin_commands(sub, UsageError, _replay_place)
    from fleetlog.ops_cli import add_ops_commands

    add_ops_commands(sub, UsageError, _replay_place, build_parser)
    from fleetlog.auth_cli import add_auth_commands

    add_auth_commands(sub, UsageError)
    from fleetlog.agent_cli import add_agent_command

    add_agent_command(sub, UsageError)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="fleetlog", description="An event-sourced scheduler for ML and batch fleets.")
    parser.add_argument("--version", action="version", version=f"fleetlog {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    schema = sub.add_parser("schema", help="print the JSON Schema of every event")
    schema.add_argument("--compact", action="store_true", help="one line instead of indented JSON")
    schema.set_defaults(func=cmd_schema)
    demo = sub.add_parser("demo", help="round-trip a seeded synthetic fleet through the embedded file log")
    demo.add_argument("--log", metavar="DIR", help=f"a new or empty log directory (default: {DEMO_LOG}, "
                      "replaced on each run)")
    demo.add_argument("--force", action="store_true",
                      help="replace a fleetlog log already in --log (never a directory holding other files)")
    demo.add_argument("--seed", type=int, default=1)
    demo.add_argument("--nodes", type=_positive, default=1024)
    demo.add_argument("--jobs", type=_positive, default=50_000)
    demo.add_argument("--json", action="store_true", help="print one JSON object")
    demo.set_defaults(func=cmd_demo)
    sim = sub.add_parser(
        "simulate",
        help="simulated cells on a virtual clock drive the real scheduling loop",
        description="Simulated cells on a virtual clock drive the real scheduling loop over the embedded "
        "file log. Specs take parameters like policies: NAME?key=value&...",
    )
    sim.add_argument("--cluster", default="synthetic", metavar="PATH|SPEC",
                     help="an openb node-list CSV, 'openb', or synthetic[?nodes=N|shapes=24x8xA100,8x4xT4"
                          "&mtbf_h=H&mttr_s=S&heartbeat_s=S&start_delay_s=S] (default: synthetic)")
    sim.add_argument("--workload", default="synthetic", metavar="PATH|SPEC",
                     help="an openb pod-list CSV, 'openb[:VARIANT]', or synthetic[?jobs=N&load=F&tenants=N"
                          "&prod=F&gang=F&frac=F&cpu=F&durations=builtin|philly|PATH] (default: synthetic)")
    sim.add_argument("--mode", default="replay", metavar="inflate|replay",
                     help="inflate[?ratio=1.3&order=shuffle|file&batch=N] (the FGD paper's protocol) or "
                          "replay[?speed=S&drain_h=H&tick_ms=T] (trace times, with departures; default)")
    sim.add_argument("--policy", default="default", metavar="NAME", help="default, fgd or best-fit[?...]")
    sim.add_argument("--seed", type=int, default=1)
    sim.add_argument("--seeds", type=_positive, default=1, help="run N seeds: seed, seed+1, ...")
    sim.add_argument("--log", metavar="DIR",
                     help=f"a new or empty log directory (default: {SIMULATE_LOG}, replaced on each run)")
    sim.add_argument("--report", metavar="DIR",
                     help=f"for summary.json and plot.png (default: {SIMULATE_REPORT}, replaced on each run)")
    sim.add_argument("--force", action="store_true", help="replace a fleetlog log and report already in "
                     "--log and --report (never a directory holding other files)")
    sim.add_argument("--json", action="store_true", help="print one JSON object")
    sim.add_argument("--check-invariants", action="store_true", help="check the invariants after every fold")
    sim.add_argument("--cells", type=int, metavar="N", help="the global layer instead: N synthetic cells "
                     "under the dispatcher, in one process with no log (docs/scale-out.md)")
    sim.add_argument("--shards", type=int, metavar="K", help="with --cells: K cell shards (partitions), "
                     "cell i in shard i mod K (default: one per cell)")
    sim.add_argument("--nodes-per-cell", type=int, metavar="N",
                     help="with --cells: 8-GPU nodes per cell (20)")
    sim.add_argument("--jobs", type=int, metavar="N", help="with --cells: jobs of 4 tenants (2000)")
    sim.set_defaults(func=cmd_simulate)
    _add_service_commands(sub)
    _add_log_commands(sub)
    _add_module_commands(sub)
    for command in walk(parser):  # every command: its own defaults, or human lines from warnings up
        if command.get_default("func") is not None and "--log-format" not in command._option_string_actions:
            add_logging_options(command)
    return parser


def _replay_place(args: argparse.Namespace) -> Any:
    """Where ``fleetlog replay`` reads: a file-log directory or a Kafka configuration."""
    from fleetlog.service.command import CommandError, configure

    try:
        config = configure(args.config, args.log, args.kafka)
    except CommandError as exc:
        raise UsageError(str(exc)) from None
    flag = getattr(args, "node_timeout_flag_ms", None)  # fold as the service that wrote the log did
    args.core = config.service.core(**({} if flag is None else {"node_timeout_ms": flag}))
    args.topology = _topology(config, args.core)
    return config.kafka if config.kafka is not None else Path(str(config.log.dir))


def _topology(config: Any, core: Any) -> Any:
    """The shards of a deployment with a [cells] map (``None`` without one), and how to check a
    cell partition's outputs (the service's ``check_outputs``: replay may not import the service)."""
    if not config.cells:
        return None
    from fleetlog.core.cellshard import SummaryRule
    from fleetlog.replay.shards import Topology

    s = config.service
    rule = SummaryRule(every_ms=s.summary_every_ms, material_milli=s.summary_material_milli)
    return Topology(config.cell_map, s.cell_hold_ms, s.producer_id, rule, _cell_outputs, base=core)


async def _cell_outputs(topology: Any, store: Any, glob: Any, partition: int) -> dict[str, Any]:
    """What the global partition holds from cell partition ``partition`` against what its own log
    gives again (a fresh cell loop recovered from the start, read-only)."""
    from fleetlog.core.policy import Policy
    from fleetlog.log.base import Shard
    from fleetlog.service.cellshard import CellShardLoop, check_outputs
    from fleetlog.service.loop import LoopConfig

    loop, core = LoopConfig(producer_id=topology.producer_id), topology.core(Shard.cell(partition))
    fresh = CellShardLoop(store, Policy(), partition, topology.cells, loop, core, topology.rule)
    found = await check_outputs(fresh, glob)
    return {"ok": found.ok, **msgspec.to_builtins(found)}


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """SIGINT raises at once, wherever the command is.  (Not Python's own handler: ``asyncio.run``
    replaces that one with a cancel that waits for the next ``await`` that suspends, which a
    command busy folding or writing a file log may not reach before it ends.)"""
    raise KeyboardInterrupt


def _typed_command(argv: Sequence[str]) -> str:
    """The command as typed (``fleetlog replay state-at``), before the arguments are parsed: what
    Ctrl-C during start-up (imports on a busy machine can take seconds) names."""
    words = ["fleetlog"]
    for word in argv[:2]:
        if word.startswith("-") or (len(words) == 2 and words[1] != "replay"):
            break
        words.append(word)
    return " ".join(words)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command.  Ctrl-C anywhere: one line on stderr and exit code 130, no traceback
    (``fleetlog run`` stops cleanly on it instead, and ``simulate`` writes what it has)."""
    prog, where = "fleetlog", _typed_command(sys.argv[1:] if argv is None else argv)
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, _interrupt) if main_thread else None
    try:
        args = build_parser().parse_args(argv)
        prog = f"fleetlog {args.command}"
        where = " ".join([prog, *([args.replay_command] if getattr(args, "replay_command", None) else [])])
        from fleetlog.logsetup import configure_logging

        configure_logging(args.log_format, args.log_level)
        func: Callable[[argparse.Namespace], int] = args.func
        return func(args)
    except (UsageError, TokenError) as exc:  # TokenError: FLEETLOG_TOKEN_FILE, FLEETLOG_CA_FILE...
        print_error(prog, str(exc))
        return EXIT_USAGE
    except UntrustedError as exc:  # a log directory or service.json others may write (issue 46)
        print_error(prog, str(exc))
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{where}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `fleetlog jobs | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (no error at exit's flush)
        return EXIT_BROKEN_PIPE
    finally:
        if main_thread:
            signal.signal(signal.SIGINT, previous)


def run() -> None:
    """The ``fleetlog`` program: :func:`main`, then exit with its code.  After Ctrl-C the process
    ends at once (``os._exit``), its output flushed: an import that Ctrl-C cut short can leave the
    interpreter to end by SIGINT while it shuts down (seen when numba's import was interrupted in
    a busy CI run: the one line printed, then exit status -2 instead of 130)."""
    code = main()
    if code == EXIT_INTERRUPTED:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    run()
