"""``fleetlog history``: accounting of finished jobs, from the logs (Slurm's ``sacct``).

One record per job that succeeded, failed, was cancelled or rejected — submission, first
placement and start, end, wait, elapsed, exit code, preemptions and requeues, GPU- and
CPU-hours — in the order the jobs ended, from one replay of the retained logs
(:mod:`fleetlog.replay.history` defines every field).  ``-o json`` (one object, ``{"items":
[...]}``, an item a line) and ``-o yaml`` are written as the replay goes, so a log of millions of
jobs is never held in memory; a table collects its rows first.  A deployment with a ``[cells]``
map is refused (one line): its jobs' stories are split across the dispatcher's and the cells'
partitions.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable
from typing import Any, Final, TextIO

import msgspec

from fleetlog.usage import add_log_options

COLUMNS: Final = ("job_id", "state", "tenant", "queue", "ended_at_ms", "wait_ms", "elapsed_ms", "exit_code",
                  "preemptions", "gpu_hours")
"""The table's columns (``-o wide``: every field)."""
SHARDED: Final = ("history reads a single-shard log; this configuration has a [cells] map, whose jobs' "
                  "events are split across the dispatcher's and the cells' partitions (not supported yet)")


def add_history_command(
    sub: Any, usage_error: type[Exception], locate: Callable[[argparse.Namespace], Any]
) -> None:
    """Register ``fleetlog history``."""
    from fleetlog.replay.command import add_node_timeout
    from fleetlog.replay.history import ENDED

    parser = sub.add_parser(
        "history", help="accounting of finished jobs, from the logs (like sacct)",
        description="One record per finished job (succeeded, failed, cancelled, rejected): submission, "
        "first placement and start, end, wait, elapsed, exit code, preemptions, GPU- and CPU-hours, in "
        "the order the jobs ended, from one replay of the logs (docs/replay.md, \"history\").")
    for name in ("tenant", "queue"):
        parser.add_argument(f"--{name}", action="append", default=[],
                            help=f"only this {name}'s jobs (repeat: any of them)")
    parser.add_argument("--state", action="append", default=[], choices=ENDED,
                        help="only jobs that ended in this state (repeat: any of them)")
    parser.add_argument("--since", type=log_time_ms, metavar="TIME",
                        help="only jobs that ended at or after TIME (ISO 8601, or epoch ms: 1700000000000ms)")
    parser.add_argument("--until", type=log_time_ms, metavar="TIME", help="only jobs that ended before TIME")
    parser.add_argument("--limit", type=_positive,
                        help="at most this many: the first to end (default: all)")
    parser.add_argument("-o", "--output", choices=("table", "wide", "json", "yaml"), default="table",
                        help="table (default), wide (every field), json or yaml")
    parser.add_argument("--json", action="store_const", const="json", dest="output", help="-o json")
    add_log_options(parser)
    add_node_timeout(parser, "fold as the service that wrote the log did: give it the same value")
    parser.set_defaults(func=_command(usage_error, locate))


def log_time_ms(text: str) -> int:
    """A log time: ISO 8601 (no zone: UTC) or epoch milliseconds with ``ms``; not an offset."""
    from fleetlog.replay.source import ReplayError
    from fleetlog.replay.terminal import parse_point

    try:
        point = parse_point(text)
    except ReplayError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if point.time_ms is None:
        raise argparse.ArgumentTypeError(f"{text!r} is an offset; history takes a log time: epoch "
                                         "milliseconds (1700000000000ms) or ISO 8601 (2026-11-30T01:00:00Z)")
    return point.time_ms


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def _command(usage_error: type[Exception], locate: Callable[[argparse.Namespace], Any]) -> Any:
    def run(args: argparse.Namespace) -> int:
        from fleetlog.replay import handlers
        from fleetlog.replay.history import Filters
        from fleetlog.replay.source import ReplayError

        place = locate(args)
        if args.topology is not None:
            raise usage_error(SHARDED)
        args.history_filters = Filters(frozenset(args.tenant), frozenset(args.queue), frozenset(args.state),
                                       args.since, args.until)
        printer = Printer(args.output, sys.stdout)
        args.history_emit = printer.add
        # a bar on stderr while records stream to the same terminal would tear: records show progress
        args.history_progress = printer.collects or not printer.out.isatty()
        try:
            asyncio.run(handlers.run("history", place, args))
        except ReplayError as exc:
            raise usage_error(str(exc)) from None
        printer.close()
        return 0

    return run


class Printer:
    """Where the records go: ``json`` and ``yaml`` written one by one as they come, a table
    (``table``, ``wide``) collected and printed at the end."""

    def __init__(self, output: str, out: TextIO) -> None:
        self.output, self.out, self.count = output, out, 0
        self.collects = output in ("table", "wide")
        self.rows: list[dict[str, Any]] = []

    def add(self, record: Any) -> None:
        if self.collects:
            self.rows.append(msgspec.to_builtins(record))
        elif self.output == "json":
            head = "," if self.count else '{"items": ['
            self.out.write(head + "\n" + msgspec.json.encode(record).decode())
        else:
            self.out.write(("" if self.count else "items:\n") + msgspec.yaml.encode([record]).decode())
        self.count += 1

    def close(self) -> None:
        if self.output == "json":
            self.out.write("\n]}\n" if self.count else '{"items": []}\n')
        elif self.output == "yaml" and not self.count:
            self.out.write("items: []\n")
        elif self.collects:
            from fleetlog.reads_cli import Listing, show

            listing = Listing("", "finished jobs", (), COLUMNS)
            show("finished jobs", listing, {"items": self.rows}, self.output)
        self.out.flush()
