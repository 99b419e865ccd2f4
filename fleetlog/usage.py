"""The argument parser of every fleetlog command line (``fleetlog``, its subcommands and the
backends' ``python -m`` entry points).

Two rules that argparse does not follow by default:

* **No prefix matching.**  ``--ten`` is an unknown flag, not ``--tenant``: an abbreviation that
  works today would silently change meaning when a new flag shares its prefix (kubectl and
  Slurm's commands match whole flags only).
* **A usage error is one line on stderr and exit code 2**, naming the (sub)command it belongs
  to and that command's usage: ``fleetlog submit: error: unrecognized arguments: --ten (usage:
  fleetlog submit [-h] ...)``.  An unknown flag of a subcommand is the subcommand's error, not
  the top-level command's.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Iterator, Sequence
from typing import Any, Final, NoReturn

EXIT_USAGE: Final = 2


class Parser(argparse.ArgumentParser):
    """:class:`argparse.ArgumentParser` with ``allow_abbrev=False`` and one-line usage errors
    (also the class of every subparser it creates)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def add_subparsers(self, **kwargs: Any) -> Any:
        kwargs.setdefault("parser_class", type(self))
        return super().add_subparsers(**kwargs)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        """As argparse's, but an argument nobody knows is this parser's error: a subcommand
        reports its own unknown flags (argparse would hand them up to the top-level parser)."""
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}{self._did_you_mean(extras)}")
        return parsed, extras

    def _did_you_mean(self, extras: list[str]) -> str:
        """`` (did you mean --tenant?)`` for the first unknown flag close to one of this command's
        (never a guess taken: a prefix is still no flag)."""
        flags = [o for a in self._actions for o in a.option_strings if o.startswith("--")]
        for extra in extras:
            if extra.startswith("--"):
                found = difflib.get_close_matches(extra.split("=", 1)[0], flags, n=1, cutoff=0.6)
                if found:
                    return f" (did you mean {found[0]}?)"
        return ""

    def error(self, message: str) -> NoReturn:
        usage = " ".join(self.format_usage().split())
        self.exit(EXIT_USAGE, f"{self.prog}: error: {' '.join(message.split())} ({usage})\n")


def url_argument(text: str) -> str:
    """A ``--url``: ``http[s]://host:port``, or ``host:port`` as a user types it (``http://`` is
    meant, as curl takes it); anything else is a usage error naming what is expected."""
    url = text.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    scheme, _, rest = url.partition("://")
    host, _, port = rest.partition("/")[0].rpartition(":")
    if scheme.lower() not in ("http", "https") or not host or not (port.isascii() and port.isdigit()):
        raise argparse.ArgumentTypeError(f"{text!r} is not the service's address: http[s]://HOST:PORT or "
                                         "HOST:PORT")
    return url


def add_log_options(parser: argparse.ArgumentParser) -> None:
    """Where the log is, the same three flags on every command that opens one (``run``,
    ``status``, ``submit``, ``cancel``): defined here so both CLI modules import it one way."""
    parser.add_argument("--config", metavar="FILE", help="a TOML configuration file (docs/service.md)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--log", metavar="DIR", help="the embedded file log in DIR")
    where.add_argument("--kafka", metavar="HOST:PORT", help="Kafka bootstrap servers")


def add_logging_options(parser: argparse.ArgumentParser, log_format: str = "console",
                        level: str = "warning") -> None:
    """``--log-format json|console`` and ``--log-level``, on every command and backend: their
    defaults are what the command printed before the flags existed (JSON lines for the service,
    human lines elsewhere).  :func:`fleetlog.logsetup.configure_logging` applies them."""
    parser.add_argument("--log-format", default=log_format, choices=("json", "console"),
                        help=f"log lines on stderr: JSON objects or human lines (default: {log_format})")
    parser.add_argument("--log-level", default=level, choices=("debug", "info", "warning", "error"),
                        help=f"the least severe log line shown (default: {level})")


def walk(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """``parser`` and every subparser below it, depth first (for tests that must cover each
    subcommand, including ones added later)."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for sub in action.choices.values():
                if id(sub) not in seen:  # aliases map several names to one parser
                    seen.add(id(sub))
                    yield from walk(sub)


def one_line(message: str) -> str:
    """``message`` with its line breaks folded into spaces (for one-line errors)."""
    return " ".join(message.split())


def print_error(prog: str, message: str) -> None:
    """``prog: error: message`` as one line on stderr."""
    print(f"{prog}: error: {one_line(message)}", file=sys.stderr)
