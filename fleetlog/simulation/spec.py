"""Specs on the command line, and the errors of bad input.

A spec names a built-in kind or a file, optionally followed by parameters in the
grammar of policy specs: ``synthetic?nodes=64&gpus=8`` or ``pods.csv?speed=60``.
Every error says what was wrong and where: :class:`SpecError` names the argument,
:class:`TraceError` the file and line.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path


class SimulationInputError(ValueError):
    """Bad input to a simulation: reported in one line, never with a traceback."""


class SpecError(SimulationInputError):
    """A spec argument that does not parse, or names an unknown kind or parameter."""


class TraceError(SimulationInputError):
    """A malformed trace file: the message names the file and the line (1 = the header,
    0 = the file as a whole: missing, unreadable, empty)."""

    def __init__(self, path: Path | str, line: int, message: str) -> None:
        super().__init__(f"{path}:{line}: {message}" if line > 0 else f"{path}: {message}")
        self.path, self.line, self.reason = Path(path), line, message


@dataclass(frozen=True)
class Spec:
    """A parsed spec: ``kind`` (a built-in name or a path) and its ``key=value`` parameters."""

    kind: str
    params: dict[str, str] = field(default_factory=dict)
    text: str = ""

    def check_known(self, allowed: Iterable[str]) -> None:
        """Refuse parameters outside ``allowed``, naming them and what is accepted."""
        known = sorted(set(allowed))
        unknown = sorted(set(self.params) - set(known))
        if unknown:
            accepted = ", ".join(known) if known else "none"
            raise SpecError(f"{self.text!r}: unknown parameter {unknown[0]!r} (accepted: {accepted})")

    def integer(self, name: str, default: int, minimum: int = 0, maximum: int = 1 << 53) -> int:
        """Parameter ``name`` as an integer in ``minimum..maximum``."""
        raw = self.params.get(name)
        if raw is None:
            return default
        try:
            value = int(raw)
        except ValueError:
            raise SpecError(f"{self.text!r}: {name}={raw!r} is not an integer") from None
        if not minimum <= value <= maximum:
            raise SpecError(f"{self.text!r}: {name}={value} is outside {minimum}..{maximum}")
        return value

    def number(self, name: str, default: float, minimum: float = 0.0, maximum: float = 1e12) -> float:
        """Parameter ``name`` as a finite number in ``minimum..maximum``."""
        raw = self.params.get(name)
        if raw is None:
            return default
        try:
            value = float(raw)
        except ValueError:
            raise SpecError(f"{self.text!r}: {name}={raw!r} is not a number") from None
        if not minimum <= value <= maximum:  # also refuses nan
            raise SpecError(f"{self.text!r}: {name}={raw} is outside {minimum:g}..{maximum:g}")
        return value

    def choice(self, name: str, default: str, choices: Iterable[str]) -> str:
        """Parameter ``name``, one of ``choices``."""
        value = self.params.get(name, default)
        options = sorted(choices)
        if value not in options:
            raise SpecError(f"{self.text!r}: {name}={value!r} is not one of {', '.join(options)}")
        return value

    def text_param(self, name: str, default: str) -> str:
        return self.params.get(name, default)


def parse_spec(text: str) -> Spec:
    """Split ``kind?key=value&key=value``; a repeated or malformed parameter is an error."""
    kind, _, query = text.partition("?")
    if not kind:
        raise SpecError(f"{text!r}: empty spec (expected a name or a path)")
    params: dict[str, str] = {}
    for part in filter(None, query.split("&")):
        key, eq, value = part.partition("=")
        if not eq or not key or not value:
            raise SpecError(f"{text!r}: {part!r} is not key=value")
        if key in params:
            raise SpecError(f"{text!r}: parameter {key!r} given twice")
        params[key] = value
    return Spec(kind, params, text)


def looks_like_path(kind: str) -> bool:
    """A spec kind that names a file rather than a built-in generator."""
    return "/" in kind or kind.endswith(".csv") or Path(kind).is_file()
