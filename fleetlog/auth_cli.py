"""``fleetlog auth token``: a new bearer token and the tokens-file entry that accepts it."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from typing import Any

from fleetlog.service.auth import entry_toml, new_token


def add_auth_commands(sub: Any, usage_error: type[Exception]) -> None:
    """Register ``auth token`` on the ``fleetlog`` subparsers."""
    auth = sub.add_parser("auth", help="authentication of the HTTP API (bearer tokens)")
    cmds = auth.add_subparsers(dest="auth_command", required=True)
    token = cmds.add_parser("token", help="print a new random token and its tokens-file entry", description=(
        "Print a new random token on stdout and, on stderr, the [[token]] entry (its SHA-256, never the "
        "token) to paste into the file [auth] tokens_file names; the service re-reads it within a second."))
    token.add_argument("--principal", required=True, help="who the token speaks for, e.g. tenant:a")
    token.add_argument("--expires", metavar="TIME", help="when it stops working, e.g. 2027-01-01T00:00:00Z")
    token.add_argument("--json", action="store_true", help="one JSON object {token, entry} on stdout")

    def run(args: argparse.Namespace) -> int:
        return cmd_auth_token(args, usage_error)

    token.set_defaults(func=run)


def cmd_auth_token(args: argparse.Namespace, usage_error: type[Exception]) -> int:
    if args.expires is not None:
        try:
            when = dt.datetime.fromisoformat(args.expires)
        except ValueError:
            raise usage_error(f"--expires {args.expires!r}: not a time like 2027-01-01T00:00:00Z") from None
        if when.tzinfo is None:
            raise usage_error(f"--expires {args.expires!r}: give a time zone, e.g. 2027-01-01T00:00:00Z")
    if not args.principal.strip():
        raise usage_error("--principal is empty")
    token = new_token()
    entry = entry_toml(args.principal, token, args.expires)
    if args.json:
        print(json.dumps({"token": token, "entry": entry}))
    else:
        print(token)
        print(entry, end="", file=sys.stderr)
    return 0
