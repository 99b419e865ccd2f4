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
import re
import sys
import time
from collections.abc import Callable
from typing import Any, Final, TextIO

import msgspec

from fleetlog.numerals import whole
from fleetlog.usage import add_log_options

COLUMNS: Final = ("job_id", "state", "tenant", "queue", "ended_at_ms", "wait_ms", "elapsed_ms", "exit_code",
                  "preemptions", "gpu_hours")
"""The table's columns (``-o wide``: every field)."""
AUDIT_COLUMNS: Final = ("offset", "at_ms", "principal", "type", "job_id", "tenant", "cell", "node", "parked")
"""The columns of ``--audit`` (``-o wide``: every field)."""
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
    parser.add_argument("--since", type=_time_arg(log_time_ms), metavar="TIME",
                        help="only jobs that ended at or after TIME (ISO 8601, epoch ms: 1700000000000ms, "
                        "or ago: 90s, 30m, 1h, 2d)")
    parser.add_argument("--until", type=_time_arg(log_time_ms), metavar="TIME",
                        help="only jobs that ended before TIME (as --since)")
    audit = parser.add_argument_group("the audit trail (--audit)")
    audit.add_argument("--audit", action="store_true",
                       help="who did what when instead: one entry per submission, cancel, quota change, "
                       "drain or node removal, with the principal that appended it (docs/service.md)")
    audit.add_argument("--principal", action="append", default=[],
                       help="only this principal's entries (- for none; repeat: any of them)")
    audit.add_argument("--type", action="append", default=[], metavar="EVENT",
                       help="only this event type (JobSubmitted, QuotaSet…; repeat: any of them)")
    audit.add_argument("--all", action="store_true", dest="every",
                       help="the backends' observations too (heartbeats, task reports)")
    parser.add_argument("--limit", type=_positive,
                        help="at most this many: the first to end (default: all)")
    parser.add_argument("-o", "--output", choices=("table", "wide", "json", "yaml"), default="table",
                        help="table (default), wide (every field), json or yaml")
    parser.add_argument("--json", action="store_const", const="json", dest="output", help="-o json")
    add_log_options(parser)
    add_node_timeout(parser, "fold as the service that wrote the log did: give it the same value")
    parser.set_defaults(func=_command(usage_error, locate))


def log_time_ms(text: str) -> int:
    """A log time: ISO 8601 (no zone: UTC) or epoch milliseconds with ``ms``; not an offset
    (:func:`fleetlog.replay.history.log_time_ms`, which ``GET /v1/history`` parses with too)."""
    from fleetlog.replay.history import log_time_ms as parse
    from fleetlog.replay.source import ReplayError

    try:
        return parse(text)
    except ReplayError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive(text: str) -> int:
    number = whole(text)  # (ASCII digits: "١" is not 1)
    if number is None or number < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return number


def _command(usage_error: type[Exception], locate: Callable[[argparse.Namespace], Any]) -> Any:
    def run(args: argparse.Namespace) -> int:
        from fleetlog.replay import handlers
        from fleetlog.replay.audit import AuditFilters
        from fleetlog.replay.history import Filters
        from fleetlog.replay.source import ReplayError

        place = locate(args)
        if args.topology is not None:
            raise usage_error(SHARDED)
        _check_audit(args, usage_error)
        args.history_filters = Filters(frozenset(args.tenant), frozenset(args.queue), frozenset(args.state),
                                       args.since, args.until)
        args.audit_filters = AuditFilters(frozenset(args.principal), frozenset(args.type), args.since,
                                          args.until, args.every)
        printer = Printer(args.output, sys.stdout, AUDIT_COLUMNS if args.audit else COLUMNS)
        args.history_emit = printer.add
        # a bar on stderr while records stream to the same terminal would tear: records show progress
        args.history_progress = printer.collects or not printer.out.isatty()
        try:
            asyncio.run(handlers.run("audit" if args.audit else "history", place, args))
        except ReplayError as exc:
            raise usage_error(str(exc)) from None
        printer.close()
        return 0

    return run


AGO: Final = re.compile(r"(\d+(?:\.\d+)?)(s|m|h|d|w)")
AGO_MS: Final = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}


def _time_arg(absolute: Callable[[str], int]) -> Callable[[str], int]:
    """A ``--since``/``--until`` value: a duration ago as ``journalctl`` and ``kubectl logs`` take
    one (``1h``: an hour before now, this machine's clock; log times are append times), else an
    absolute time as ``absolute`` reads it; a bad one is a usage error naming every form."""

    def parse(text: str) -> int:
        found = AGO.fullmatch(text.strip())
        if found:
            return int(time.time() * 1000) - round(float(found.group(1)) * AGO_MS[found.group(2)])
        try:
            return absolute(text)
        except Exception as exc:  # (argparse turns it into one usage line)
            raise argparse.ArgumentTypeError(f"{exc}; or a duration ago: 90s, 30m, 1h, 2d, 1w") from None

    parse.__name__ = "time"
    return parse


def _check_audit(args: argparse.Namespace, usage_error: type[Exception]) -> None:
    """``--audit`` lists entries, not jobs: the job filters do not apply, and the entry filters
    need it."""
    if args.audit:
        given = [f"--{name}" for name in ("tenant", "queue", "state") if getattr(args, name)]
        if given:
            raise usage_error(f"{', '.join(given)} filter finished jobs, not the audit trail: with --audit "
                              "use --principal, --type, --since, --until")
    else:
        given = [flag for flag, value in (("--principal", args.principal), ("--type", args.type),
                                          ("--all", args.every)) if value]
        if given:
            raise usage_error(f"{', '.join(given)} filter the audit trail: add --audit")


class Printer:
    """Where the records go: ``json`` and ``yaml`` written one by one as they come, a table
    (``table``, ``wide``) collected and printed at the end."""

    def __init__(self, output: str, out: TextIO, columns: tuple[str, ...] = COLUMNS) -> None:
        self.output, self.out, self.count, self.columns = output, out, 0, columns
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

            what = "finished jobs" if self.columns == COLUMNS else "audit entries"
            listing = Listing("", what, (), self.columns)
            show(what, listing, {"items": self.rows}, self.output)
        self.out.flush()
