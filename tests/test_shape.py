"""The shape of the code, locked in (issue 16): no import cycle in ``fleetlog/``, and no function
longer than :data:`MAX_FUNCTION_LINES` lines — a longer one is a step that wants its own function."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "fleetlog"
MAX_FUNCTION_LINES = 70


def long_functions(source: str, name: str) -> list[str]:
    """``file:line name (N lines)`` of every function in ``source`` over the limit, counted
    from its ``def`` (decorators excluded) to its last line."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                found.append(f"{name}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_in_fleetlog_is_over_70_lines() -> None:
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 50
    found = [f for p in files for f in long_functions(p.read_text(), str(p.relative_to(PACKAGE.parent)))]
    assert found == []


def test_the_checker_counts_from_def_to_the_last_line() -> None:
    body = "\n".join(f"    x = {i}" for i in range(MAX_FUNCTION_LINES - 1))
    at_limit = f"@decorated\ndef f():\n{body}\n"
    assert long_functions(at_limit, "m.py") == []
    over = at_limit + "    return x\n"
    assert long_functions(over, "m.py") == [f"m.py:2 f ({MAX_FUNCTION_LINES + 1} lines)"]
    assert long_functions("async def g():\n" + body + "\n    return 1\n", "m.py") == [
        f"m.py:1 g ({MAX_FUNCTION_LINES + 1} lines)"]


def test_no_import_cycle_anywhere_in_fleetlog() -> None:
    """Imports go one way across the whole package, lazy and TYPE_CHECKING imports included: a
    cycle is two modules that can only be understood, tested and moved together (the core's
    own layering is tests/core/test_layers.py)."""
    import grimp

    from tests.core.test_layers import cycles

    graph = grimp.build_graph("fleetlog", cache_dir=None)
    modules = set(graph.modules)
    assert len(modules) > 50
    assert cycles({m: graph.find_modules_directly_imported_by(m) & modules for m in sorted(modules)}) == []
