"""``fleetlog replay …``: verify, state-at, explain, what-if, timeline, report, dump.

The same on the embedded file log and on Kafka: the CLI resolves ``--config``/``--log``/``--kafka``
(the service's configuration rules) and hands this module a place — a directory or a
:class:`~fleetlog.log.kafka.KafkaConfig`.  Every bad input is one line and exit code 2; ``verify``
exits with 1 when the log diverges.  Long work shows a progress bar when stderr is a terminal.

This module only declares the arguments (every ``fleetlog`` command builds the parser, so it stays
light); :mod:`fleetlog.replay.handlers` does the work and is imported when a replay command runs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetlog.log.base import INPUTS, LOG_NAMES

if TYPE_CHECKING:
    from fleetlog.log.kafka import KafkaConfig

    Place = Path | KafkaConfig

Locate = Callable[[argparse.Namespace], "Place"]


def add_replay_commands(sub: Any, usage_error: type[Exception], locate: Locate) -> None:
    """Register ``replay`` and its subcommands; problems are raised as ``usage_error`` and the logs
    are found with ``locate`` (the CLI's own configuration rules)."""
    replay = sub.add_parser(
        "replay",
        help="verify, explain and re-run a recorded log (file log or Kafka)",
        description="Replay a recorded log: the incident responder's tools (docs/replay.md).",
    )
    cmds = replay.add_subparsers(dest="replay_command", required=True, parser_class=type(replay))
    for name, help_, extra in _COMMANDS:
        parser = cmds.add_parser(name, help=help_, description=help_)
        _add_place(parser)
        extra(parser)
        parser.add_argument("--json", action="store_true", help="print JSON for scripts")
        parser.set_defaults(func=_runner(name, usage_error, locate))


def _add_place(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="a TOML configuration file (docs/service.md)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--log", metavar="DIR", help="the embedded file log in DIR")
    where.add_argument("--kafka", metavar="HOST:PORT", help="Kafka bootstrap servers")
    add_node_timeout(parser, "fold as the service that wrote the log did: give it the same value")
    add_shard(parser)


def add_shard(parser: argparse.ArgumentParser) -> None:
    """``--shard global|cells-<p>``: one shard of a deployment with a ``[cells]`` map."""
    parser.add_argument(
        "--shard",
        metavar="global|cells-P",
        help="with a [cells] map: read only this shard (the dispatcher's global partition or cell "
        "partition P); without it verify, explain, state-at TIME and status work across the shards",
    )


def add_node_timeout(parser: argparse.ArgumentParser, why: str) -> None:
    """``--node-timeout SECONDS``: ``service.node_timeout_ms`` (FLEETLOG_SERVICE_NODE_TIMEOUT_MS)
    from the command line, for ``fleetlog run`` and every command that folds its log."""
    parser.add_argument(
        "--node-timeout",
        type=node_timeout_ms,
        metavar="SECONDS",
        dest="node_timeout_flag_ms",
        help=f"a node silent this long is down and its jobs requeued (default: the configuration's, "
        f"else 60); {why}",
    )


def node_timeout_ms(text: str) -> int:
    """Seconds (a decimal number) as whole milliseconds, at least 1 ms."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not seconds * 1000 >= 1 or seconds * 1000 > 1 << 53:  # (also refuses nan and inf)
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 0.001 seconds")
    return round(seconds * 1000)


def _runner(name: str, usage_error: type[Exception], locate: Locate) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        place = locate(args)
        from fleetlog.replay import handlers  # noqa: PLC0415 - numba, matplotlib: only when replay runs
        from fleetlog.replay.source import ReplayError  # noqa: PLC0415

        try:
            return asyncio.run(handlers.run(name, place, args))
        except ReplayError as exc:
            raise usage_error(str(exc)) from None
        except BrokenPipeError:  # piped into head or less that quit: not an error
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0

    return run


# --- arguments -----------------------------------------------------------------------------


def _offset(text: str) -> int:
    if not re.fullmatch(r"\d+", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not an offset (a non-negative integer)")
    return int(text)


def _state_at_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "point",
        metavar="OFFSET|TIME",
        help="an inputs offset, epoch ms (1700000000000ms) or an ISO 8601 time",
    )
    p.add_argument("--show", default="nodes,jobs,tenants,queues", help="sections, comma-separated")
    p.add_argument("--all-jobs", action="store_true", help="include finished, cancelled and rejected jobs")
    p.add_argument("--limit", type=_offset, default=50, help="rows per table in the text output")
    p.add_argument("--no-snapshots", action="store_true", help="fold from the start (a baseline)")


def _explain_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", metavar="JOB", help="the job id")
    p.add_argument("--no-why", action="store_true", help="skip ranking the nodes of each placement")


def _what_if_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--policy",
        required=True,
        metavar="NAME|FILE",
        help="a policy spec (fgd, best-fit?preemption=false) or a TOML/JSON file of Policy fields",
    )


def _out_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, metavar="PATH", help="where to write")


def _dump_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--from-log", default=INPUTS, choices=LOG_NAMES, help="which log (default inputs)")
    p.add_argument("--start", type=_offset, default=0, help="first offset (default 0)")
    p.add_argument("--stop", type=_offset, default=None, help="offset to stop before (default: the end)")


def _none(p: argparse.ArgumentParser) -> None:
    return None


def _jobs(text: str) -> int:
    if not re.fullmatch(r"\d+", text) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number of processes, got {text!r}")
    return int(text)


def _verify_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--jobs",
        type=_jobs,
        default=min(4, len(os.sched_getaffinity(0))),
        metavar="N",
        help="verify stretches between snapshots in N processes at once (default: the CPUs, at most 4; "
        "1 = one process). Any divergence is reported by the one-process run",
    )


def _serve_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--http-host", default="127.0.0.1", help="default 127.0.0.1")
    parser.add_argument("--http-port", type=int, default=0, help="default 0: any free port (printed)")
    parser.add_argument("--policy", default="default", metavar="SPEC",
                        help="the policy POST /v1/dry-run decides with: give the service's service.policy "
                        "(default: default)")


_COMMANDS: tuple[tuple[str, str, Callable[[argparse.ArgumentParser], None]], ...] = (
    ("verify", "re-run every decision and compare; exit 1 at the first divergence", _verify_args),
    ("state-at", "the state at an inputs offset or a log time", _state_at_args),
    ("explain", "a job's timeline: pending reasons, placements and why, preemptions", _explain_args),
    ("what-if", "re-run the inputs under another policy and compare", _what_if_args),
    ("timeline", "a Chrome/Perfetto trace JSON of the run (ui.perfetto.dev)", _out_args),
    ("report", "PNG plots and summary.json of the run", _out_args),
    ("dump", "a range of a log as JSON lines", _dump_args),
    ("serve", "the read API (docs/api.md) of the logs at any point: ?at=OFFSET|TIME", _serve_args),
)
