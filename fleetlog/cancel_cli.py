"""``fleetlog cancel``: cancel jobs by id, several at once, or by selector, as Slurm's ``scancel``
does (``scancel --user``, ``--partition``, ``--state``).

``fleetlog cancel J1 J2`` appends one ``JobCancelled`` per id, in one request (all or none: the
service refuses the whole request when one id is unknown).  ``--tenant``, ``--queue`` and
``--state`` (each repeatable: any of its values) select the jobs the scheduler holds that have not
ended — from the running service's API, else folded from the logs, as ``fleetlog jobs`` lists
them — and cancel each; with ids as well, they only narrow the ids.  A selector matching nothing
says so and exits 0 (``scancel`` too); nothing is cancelled without an id or a selector.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any, Final

from fleetlog.client import ClientError, keyed
from fleetlog.client_cli import CommandLineError, _add_common, _reporting, _send
from fleetlog.events.model import JobCancelled
from fleetlog.reads_cli import ReadError, _read
from fleetlog.usage import url_argument

LIVE_STATES: Final = ("pending", "placed", "running")
"""What a selector picks from: the jobs that have not ended (a cancel of an ended one is refused)."""
SELECTORS: Final = ("tenant", "queue", "state")

Locate = Callable[[argparse.Namespace], Any]


def add_cancel_command(sub: Any, usage_error: type[Exception], locate: Locate) -> None:
    cancel = sub.add_parser("cancel", help="cancel jobs, pending or running: by id or by selector",
                            description=__doc__.split("\n\n")[1].replace("``", "`") if __doc__ else None)
    cancel.add_argument("job_ids", nargs="*", metavar="JOB_ID", help="the jobs (several: one request)")
    cancel.add_argument("--tenant", action="append", default=[], help="only this tenant's (repeat: any)")
    cancel.add_argument("--queue", action="append", default=[], help="only this queue's (repeat: any)")
    cancel.add_argument("--state", action="append", default=[], choices=LIVE_STATES,
                        help="only jobs in this state (repeat: any; default: every state not ended)")
    cancel.add_argument("--reason", default="", help="why (kept in the log)")
    cancel.add_argument("--url", metavar="URL", type=url_argument,
                        help="the service's address, where the selectors read the jobs (default: the one "
                        "the file log announces, else the logs)")
    _add_common(cancel)
    cancel.set_defaults(func=_reporting(_command(locate), usage_error))


def _command(locate: Locate) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        selected = any(getattr(args, s) for s in SELECTORS)
        if not args.job_ids and not selected:
            raise CommandLineError("name the jobs to cancel: JOB_ID..., or --tenant, --queue or --state")
        ids = _selected(args, locate) if selected else list(dict.fromkeys(args.job_ids))
        if not ids:
            print("no job matches: nothing cancelled", file=sys.stderr)
            return 0
        try:
            envelopes = [keyed(JobCancelled(job_id=j, reason=args.reason), args.producer_id) for j in ids]
        except ClientError as exc:
            raise CommandLineError(f"invalid cancel: {exc}") from None
        return _send(args, envelopes)

    return run


def _selected(args: argparse.Namespace, locate: Locate) -> list[str]:
    """The ids of the jobs the selectors pick (narrowed to ``job_ids`` when any are given)."""
    query = {"state": args.state or list(LIVE_STATES), **{s: getattr(args, s) for s in ("tenant", "queue")
                                                        if getattr(args, s)}}
    args.limit, args.output = None, "json"
    try:
        found = _read(args, "/v1/jobs", query, locate)
    except ReadError as exc:
        raise CommandLineError(str(exc)) from None
    picked = [str(item["job_id"]) for item in found["items"]]
    if args.job_ids:
        wanted = set(args.job_ids)
        picked = [j for j in picked if j in wanted]
    return picked
