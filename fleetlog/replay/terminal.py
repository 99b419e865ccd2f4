"""What the replay commands share at the terminal: the progress bar, and reading a point of a log."""

from __future__ import annotations

import datetime as dt
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from fleetlog.display import console
from fleetlog.replay.source import ReplayError
from fleetlog.replay.state_at import Point


@contextmanager
def progress_bar(what: str, total: int | None) -> Iterator[Callable[[int], None] | None]:
    """A rich progress bar on stderr when it is a terminal; otherwise nothing."""
    if not sys.stderr.isatty():
        yield None
        return
    columns = (TextColumn(what), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console(stderr=True), transient=True) as bar:
        task = bar.add_task(what, total=total)
        yield lambda n: bar.advance(task, n)


def parse_point(text: str) -> Point:
    """An inputs offset (digits), epoch milliseconds (``1700000000000ms``) or an ISO 8601 time
    (``2026-11-30T01:00:00Z``; no zone = UTC)."""
    if re.fullmatch(r"[0-9]+", text):  # (ASCII: \d is any script's digits, fleetlog.numerals)
        return Point(offset=int(text))
    if m := re.fullmatch(r"([0-9]+)ms", text):
        return Point(time_ms=int(m.group(1)))
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    except ValueError:
        raise ReplayError(
            f"{text!r} is neither an offset (digits), epoch milliseconds (e.g. 1700000000000ms) "
            "nor an ISO 8601 time (e.g. 2026-11-30T01:00:00Z)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return Point(time_ms=int(when.timestamp() * 1000))
