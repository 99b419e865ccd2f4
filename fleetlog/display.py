"""How every command shows things to people: one way to make a console, and one way to write a log
time or a duration.

Tables and text are for people; ``--json`` is for scripts and keeps epoch milliseconds.  In text,
a log time is ISO 8601 in UTC (``2026-01-01T00:00:40Z``, milliseconds only when there are some):
absolute, because logs are read long after they were written (an "ago" would be relative to the
reader's clock, not to the log), and the same on every machine.  A duration reads like kubectl's
ages: ``15s``, ``0.25s``, ``4m05s``, ``1h02m03s``, ``2d03h04m05s``.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Mapping
from typing import Any, Final

from rich.console import Console
from rich.table import Table

WIDE: Final = 100_000
"""Columns of a console that is not a terminal: a table piped to a file keeps every column whole
(rich would otherwise cut it to 80 columns, or to the width of a terminal on another stream)."""

TIME_KEYS: Final = frozenset({"at_ms", "last_heartbeat_ms", "log_time_ms", "oldest_ms", "taken_ms", "time_ms",
                               "timestamp_ms"})
"""Keys that hold a log time (so do those ending in ``_at_ms``); other ``*_ms`` are durations.  The one
rule every table and ``describe`` follow; ``tests/test_display.py`` classifies every ``*_ms`` field
of every struct in the package, so a new one cannot be shown the wrong way unnoticed."""


def console(stderr: bool = False) -> Console:
    """A rich console on stdout (or stderr): the terminal's width on a terminal; otherwise as wide
    as the content (``COLUMNS`` in the environment still wins), and no colours or cursor moves."""
    found = Console(stderr=stderr)
    if found.is_terminal or "COLUMNS" in os.environ:
        return found
    return Console(stderr=stderr, width=WIDE, soft_wrap=True)


def log_time(ms: int) -> str:
    """``ms`` (epoch milliseconds) as ISO 8601 UTC, e.g. ``2026-01-01T00:00:40.250Z``."""
    when = dt.datetime.fromtimestamp(ms // 1000, dt.UTC)
    fraction = f".{ms % 1000:03d}" if ms % 1000 else ""
    return f"{when:%Y-%m-%dT%H:%M:%S}{fraction}Z"


def duration(ms: int) -> str:
    """``ms`` milliseconds the way kubectl shows ages: ``0.25s``, ``15s``, ``4m05s``, ``1h02m03s``."""
    if ms < 0:
        return "-" + duration(-ms)
    if ms < 60_000:
        return f"{ms / 1000:g}s"
    seconds = ms // 1000
    days, rest = divmod(seconds, 86_400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h{minutes:02d}m{seconds:02d}s"
    if hours:
        return f"{hours}h{minutes:02d}m{seconds:02d}s"
    return f"{minutes}m{seconds:02d}s"


def is_time(key: str) -> bool:
    """Whether ``key`` (a ``*_ms`` key) holds an epoch time rather than a duration (:data:`TIME_KEYS`)."""
    return key.endswith("_at_ms") or key in TIME_KEYS


def label(key: str) -> str:
    """The column or line label of ``key`` in text: ``submitted_at_ms`` -> ``submitted_at``, and
    resources in the units people count (:func:`_unit`): ``gpu_free_milli`` -> ``gpus_free``,
    ``cpu_free_milli`` -> ``cores_free``, ``mem_free_mib`` -> ``mem_free_gib``."""
    if key.endswith("_ms"):
        return key.removesuffix("_ms")
    unit = _unit(key)
    return unit[0] if unit is not None else key


def _unit(key: str) -> tuple[str, int] | None:
    """(label, divisor) of a resource key kept in milli-units or MiB (the API's and the log's
    integers: exact), shown in GPUs, cores and GiB in text; ``None``: not a resource key."""
    if key.endswith("_mib"):
        return key.removesuffix("_mib") + "_gib", 1024
    if not key.endswith("_milli"):
        return None
    base = key.removesuffix("_milli")
    for resource, plural in (("gpu", "gpus"), ("cpu", "cores")):
        words = base.split("_")
        if resource in words:
            return "_".join(plural if w == resource else w for w in words), 1000
    return None


def cell(key: str, value: Any) -> str:
    """``value`` of ``key`` as text: log times and durations for people, resources in GPUs, cores
    and GiB (``2750`` GPU milli is ``2.75``), ``None`` as ``-``."""
    if value is None:
        return "-"
    if isinstance(value, int) and not isinstance(value, bool) and key.endswith("_ms"):
        return log_time(value) if is_time(key) else duration(value)
    unit = _unit(key)
    if unit is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{round(value / unit[1], 3):g}"
    if isinstance(value, (list, tuple)):
        return "; ".join(cell(key, v) for v in value) or "-"
    if isinstance(value, Mapping):
        return _pairs(value) or "-"
    return str(value)


def human_row(row: Mapping[str, Any]) -> dict[str, str]:
    """A table row for people: labels without ``_ms``, times and durations readable."""
    return {label(key): cell(key, value) for key, value in row.items()}


def describe(facts: Mapping[str, Any]) -> list[str]:
    """``facts`` (one object, as ``--json`` prints it) as aligned ``label  value`` lines, the way
    ``kubectl describe`` reads: times and durations readable, a list of objects one line each
    (``task 0  state finished, node n2``), a nested object as ``key value`` pairs."""
    rows: list[tuple[str, str]] = []
    for key, value in facts.items():
        if isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
            rows += [_item(item) for item in value]
        else:
            rows.append((label(key).replace("_", " "), cell(key, value)))
    width = max((len(name) for name, _ in rows), default=0)
    return [f"{name:<{width}}  {text}".rstrip() for name, text in rows]


def _item(item: Mapping[str, Any]) -> tuple[str, str]:
    """A list element: its first field names the line, the others follow."""
    (first, name), *rest = item.items() if item else [("-", "")]
    return f"{label(first)} {cell(first, name)}", _pairs(dict(rest))


def _pairs(value: Mapping[str, Any]) -> str:
    return ", ".join(f"{label(k).replace('_', ' ')} {cell(k, v)}" for k, v in value.items() if v is not None)

def print_sections(screen: Console, out: dict[str, Any], sections: tuple[str, ...], limit: int) -> None:
    """One table per section of ``out`` (its rows made human), at most ``limit`` rows each."""
    for name in sections:
        rows = [human_row(row) for row in out[name]]
        table = Table(title=f"{name} ({len(rows):,})")
        for column in rows[0] if rows else ():
            table.add_column(column)
        for row in rows[:limit]:
            table.add_row(*row.values())
        screen.print(table)
        if len(rows) > limit:
            screen.print(f"… {len(rows) - limit:,} more {name} (--limit N, or --json for all)")


MIN_COLUMN: Final = 6
"""The narrowest a column is cut to when a table must fit a terminal."""


def plain_table(headers: list[str], rows: list[list[str]], width: int | None) -> list[str]:
    """Lines of a table laid out by hand: columns two spaces apart, each as wide as its widest
    cell; ``width`` (a terminal's) cuts the widest columns with ``…`` until the table fits
    (``None``: never cut — piped to a file or a program).  rich's layout took 27–34 s for 10,000
    rows (it measures every cell many times); this is one pass over the cells."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    if width is not None:
        _fit(widths, width)
    out = ["  ".join(_cut(h, w).ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    out.extend("  ".join(_cut(c, w).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
               for row in rows)
    return out


def _fit(widths: list[int], width: int) -> None:
    """Narrow the widest columns (never below :data:`MIN_COLUMN`) until the row fits ``width``."""
    while sum(widths) + 2 * (len(widths) - 1) > width:
        widest = max(range(len(widths)), key=widths.__getitem__)
        if widths[widest] <= MIN_COLUMN:
            return
        widths[widest] -= 1


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def terminal_width() -> int | None:
    """The width a table must fit: ``COLUMNS`` when set, the terminal's on a terminal, else
    ``None`` (piped: as wide as the content), as :func:`console` decides for rich."""
    found = console()
    return None if found.width >= WIDE else found.width
