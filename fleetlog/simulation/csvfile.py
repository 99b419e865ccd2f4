"""Reading trace CSV files: every problem is a :class:`TraceError` naming the file and line."""

from __future__ import annotations

import csv
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from fleetlog.simulation.spec import TraceError

MAX_INT = 1 << 53


@dataclass(frozen=True)
class Row:
    """One data row: its physical line number in the file and its values by column."""

    path: Path
    line: int
    values: dict[str, str]

    def error(self, message: str) -> TraceError:
        return TraceError(self.path, self.line, message)

    def text(self, column: str) -> str:
        return self.values.get(column, "").strip()

    def integer(self, column: str, minimum: int = 0, maximum: int = MAX_INT) -> int:
        """Column ``column`` as an integer in ``minimum..maximum`` (a whole float such as ``12.0`` too)."""
        raw = self.text(column)
        try:
            value = int(raw) if raw.lstrip("-").isdigit() else _whole(float(raw))
        except (ValueError, OverflowError):
            raise self.error(f"column {column!r}: {raw!r} is not an integer") from None
        if not minimum <= value <= maximum:
            raise self.error(f"column {column!r}: {value} is outside {minimum}..{maximum}")
        return value

    def number(self, column: str, minimum: float = 0.0) -> float:
        raw = self.text(column)
        try:
            value = float(raw)
        except ValueError:
            raise self.error(f"column {column!r}: {raw!r} is not a number") from None
        if not value >= minimum or value == float("inf"):
            raise self.error(f"column {column!r}: {raw} is outside {minimum:g}..")
        return value

    def optional_number(self, column: str) -> float | None:
        return None if not self.text(column) else self.number(column)


def _whole(value: float) -> int:
    if value != int(value):
        raise ValueError("not whole")
    return int(value)


def read_rows(path: Path, required: Sequence[str]) -> Iterator[Row]:
    """The data rows of the CSV at ``path``, whose header must hold every ``required`` column."""
    try:
        handle = path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise TraceError(path, 0, f"cannot read: {exc.strerror or exc}") from None
    with handle:
        try:
            yield from _rows(path, csv.reader(handle), required)
        except UnicodeDecodeError as exc:
            raise TraceError(path, 0, f"not UTF-8 text: {exc.reason}") from None
        except csv.Error as exc:
            raise TraceError(path, 0, f"not a CSV file: {exc}") from None


def _rows(path: Path, reader: Iterator[list[str]], required: Sequence[str]) -> Iterator[Row]:
    header = next(reader, None)
    if header is None:
        raise TraceError(path, 0, "empty file (expected a header line)")
    header = [h.strip() for h in header]
    missing = [c for c in required if c not in header]
    if missing:
        raise TraceError(path, 1, f"header lacks column {missing[0]!r} (expected {', '.join(required)})")
    line = 1
    for fields in reader:
        line = getattr(reader, "line_num", line + 1)
        if not fields or all(not f.strip() for f in fields):
            continue  # a blank line
        if len(fields) != len(header):
            raise TraceError(path, line, f"{len(fields)} fields, but the header has {len(header)}")
        yield Row(path, line, dict(zip(header, fields, strict=True)))
