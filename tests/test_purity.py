"""The core and the vocabulary are pure: a machine says so.

``core/`` and ``events/`` may not read a clock, a random source, the environment,
identities (uuid) or use asyncio or logging.  import-linter checks the package
boundaries (see pyproject.toml); this test checks the standard library.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "fleetlog"
PURE = ("core", "events")
BANNED_MODULES = {
    "time",
    "datetime",
    "random",
    "secrets",
    "uuid",
    "os",
    "asyncio",
    "logging",
    "threading",
    "socket",
    "subprocess",
    "sys",
}
BANNED_CALLS = {"hash", "id", "input", "open", "print"}
# Reviewed exceptions, (file, call) -> why it cannot change a result.
ALLOWED = {
    ("fleetlog/core/fold_batch.py", "id"): (
        "fold_lists recognises the very heartbeat objects beat_cache holds (kept alive there, so "
        "their ids stay theirs); a miss takes the ordinary path, and tests/core/test_fold_batch.py "
        "shows both give the same state"
    ),
    ("fleetlog/core/state.py", "id"): (
        "Derived.remember_beat/forget_beat key steady_ids by the ids of the heartbeat objects "
        "beat_cache holds (see fleetlog/core/fold_batch.py); derived, never digested"
    ),
}


def pure_files() -> list[Path]:
    return sorted(p for folder in PURE for p in (PACKAGE / folder).rglob("*.py"))


def violations(source: str, name: str) -> list[str]:
    tree = ast.parse(source, filename=name)
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if a.name.split(".")[0] in BANNED_MODULES]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in BANNED_MODULES:
            found.append(f"from {node.module} import ...")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in BANNED_CALLS
            and (name, node.func.id) not in ALLOWED
        ):
            found.append(f"call {node.func.id}()")
    return [f"{name}: {v}" for v in found]


def test_there_are_pure_files_to_check() -> None:
    assert any(p.parent.name == "events" for p in pure_files())


@pytest.mark.parametrize("path", pure_files(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_clock_random_env_or_io_in_pure_packages(path: Path) -> None:
    assert violations(path.read_text(), str(path.relative_to(PACKAGE.parent))) == []


def test_the_checker_catches_a_violation() -> None:
    found = violations("import time\nfrom os import environ\nx = hash('a')\n", "probe.py")
    assert found == ["probe.py: import time", "probe.py: from os import ...", "probe.py: call hash()"]
    assert violations("x = id(y)\n", "fleetlog/core/decide.py") == ["fleetlog/core/decide.py: call id()"]
    assert violations("x = id(y)\n", "fleetlog/core/fold_batch.py") == []  # a reviewed exception
    assert violations("x = id(y)\n", "fleetlog/core/fold.py") == ["fleetlog/core/fold.py: call id()"]
