"""``fleetlog top`` (tenants, queues and cells on one screen, live) and ``fleetlog completion``
(a bash or zsh completion script made from this very parser).

``top`` reads the running service's API (``--url``, or the service a file log's ``service.json``
announces), as ``fleetlog tenants|queues|cells`` do; without one it folds the logs once and shows
that one frame.  ``--once``, or an output that is not a terminal, prints one frame and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from fleetlog.usage import add_log_options, url_argument, walk

Locate = Callable[[argparse.Namespace], Any]
DEFAULT_INTERVAL_S: Final = 2.0
SHELLS: Final = {
    "bash": "Print a bash completion script. Save it as ~/.local/share/bash-completion/completions/fleetlog "
            "(the bash-completion package loads it when needed), or source the saved file from ~/.bashrc; "
            "again after an upgrade.",
    "zsh": "Print a zsh completion script. Save it as _fleetlog in a directory of $fpath before compinit "
           "runs (~/.zfunc/_fleetlog, with fpath=(~/.zfunc $fpath) in ~/.zshrc); again after an upgrade.",
}
DIRECTORY_METAVARS: Final = frozenset({"DIR"})
FILE_METAVARS: Final = frozenset({"FILE", "PATH", "PATH|SPEC", "NAME|FILE", "JOB.json", "EVENTS.json"})
"""Arguments whose values the completion scripts complete as directories or files (by the
metavar every command gives them)."""


def add_ops_commands(
    sub: Any, usage_error: type[Exception], locate: Locate, parser: Callable[[], argparse.ArgumentParser],
) -> None:
    """Register ``fleetlog top`` and ``fleetlog completion``; ``parser`` builds the whole
    ``fleetlog`` parser (what a completion script is made from)."""
    top = sub.add_parser(
        "top", help="a live view of tenants, queues and cells (GPU use, quotas, why jobs wait)",
        description="Per tenant the GPUs used against the nominal quota, borrowed GPUs, pending jobs "
        "and DRF share; per queue pending and running jobs and pending jobs by reason; per cell the GPU "
        "allocation by model and the nodes up and down. Reads the running service's API (--url, or the "
        "one the file log announces) every --interval seconds until Ctrl-C; without a service, folds "
        "the logs once and shows that one frame.")
    top.add_argument("--interval", type=_interval, default=DEFAULT_INTERVAL_S, metavar="SECONDS",
                     help=f"seconds between refreshes (default: {DEFAULT_INTERVAL_S:g})")
    top.add_argument("--once", action="store_true",
                     help="print one frame and exit (what it does when the output is not a terminal)")
    top.add_argument("--url", metavar="URL", type=url_argument, help="the service's address (http[s]://host:port)")
    add_log_options(top)
    top.set_defaults(func=_top(usage_error, locate))
    completion = sub.add_parser(
        "completion", help="print a bash or zsh completion script for fleetlog",
        description="Print a shell completion script for every fleetlog command, flag and choice.")
    shells = completion.add_subparsers(dest="shell", required=True)
    for shell, how in SHELLS.items():
        one = shells.add_parser(shell, help=f"the {shell} script", description=how)
        one.set_defaults(func=_completion(shell, parser))


def _interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0.1 <= value <= 3600:  # (also refuses nan and inf)
        raise argparse.ArgumentTypeError(f"{text!r}: give 0.1 to 3600 seconds")
    return value


# --- top ------------------------------------------------------------------------------------


def _top(usage_error: type[Exception], locate: Locate) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        from fleetlog import top
        from fleetlog.display import console
        from fleetlog.reads_cli import _announced

        screen = console()
        once = args.once or not screen.is_terminal
        place = None if args.url else locate(args)
        url = args.url or _announced(place)
        if url is None:  # no service: the logs, folded once
            where = f"the logs in {place}" if isinstance(place, Path) else "the Kafka logs"
            top.show(screen, top.frame_of(where, _folded(args, place, usage_error)))
            if not once:
                why = ("no running service announced itself in the log" if isinstance(place, Path)
                       else "a Kafka log does not say where its service is")
                print(f"fleetlog top: one frame folded from the logs: {why} (give its --url for a live view)",
                      file=sys.stderr)
        elif once:
            top.run_once(url, screen, usage_error)
        else:
            top.run_live(url, args.interval, screen, usage_error)
        return 0

    return run


def _folded(args: argparse.Namespace, place: Any, usage_error: type[Exception]) -> dict[str, Any]:
    """The API's answers to ``top``'s lists for the state at the end of the logs, folded once
    (``fleetlog replay``'s ``list`` handler: newest snapshot and the tail), by path."""
    from fleetlog.reads_cli import collect
    from fleetlog.replay import handlers
    from fleetlog.replay.source import ReplayError
    from fleetlog.top import LISTS

    if args.topology is not None:
        raise usage_error("with a [cells] map the state is split across shards: read the running "
                          "service's API (--url)")
    answers: dict[str, Any] = {}

    def read_all(fetch: Callable[[dict[str, list[str]]], dict[str, Any]]) -> dict[str, Any]:
        for path in LISTS:  # (the handler's fetch lists args.list_path as it is at each call)
            args.list_path = path
            answers[path] = collect(fetch, {})
        return answers

    args.read_list, args.list_path = read_all, LISTS[0]
    try:
        asyncio.run(handlers.run("list", place, args))
    except ReplayError as exc:
        raise usage_error(str(exc)) from None
    return answers


# --- completion -----------------------------------------------------------------------------


def _completion(
    shell: str, parser: Callable[[], argparse.ArgumentParser]
) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        sys.stdout.write(completion_script(shell, parser()))
        return 0

    return run


def completion_script(shell: str, parser: argparse.ArgumentParser) -> str:
    """``shell``'s completion script for ``parser`` (shtab: subcommands, flags and their choices,
    directories for ``DIR`` and files for ``FILE``-like values)."""
    import shtab

    for command in walk(parser):
        for action in command._actions:
            if action.metavar in DIRECTORY_METAVARS:
                action.complete = shtab.DIRECTORY  # type: ignore[attr-defined]
            elif action.metavar in FILE_METAVARS:
                action.complete = shtab.FILE  # type: ignore[attr-defined]
    return shtab.complete(parser, shell=shell)
