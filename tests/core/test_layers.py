"""The core's modules import one another in one direction (docs/scheduling.md, "Decide, step by
step"): no import cycle inside ``fleetlog.core``, decide's steps layered, and order and quota
usable without placement (for a caller such as a global dispatcher)."""

from __future__ import annotations

import grimp

CORE = "fleetlog.core"
PLACEMENT = ("scratch", "fitting", "explain", "place", "preempt", "reserve", "decide", "kernels")
# decide's modules from the bottom up: each may import only those before it
STEPS = ("scratch", "fitting", "explain", "place", "preempt", "reserve", "decide")


def core_imports() -> dict[str, set[str]]:
    """Each core module's direct imports of other core modules (TYPE_CHECKING ones included:
    they tie modules together just the same)."""
    graph = grimp.build_graph("fleetlog", cache_dir=None)
    modules = set(graph.find_descendants(CORE))
    return {m: graph.find_modules_directly_imported_by(m) & modules for m in sorted(modules)}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (or a module importing
    itself), by Tarjan's algorithm: each is an import cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in edges.get(v, ()):
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_cycle_finder_finds_a_cycle() -> None:
    """The check can fail: a two-module cycle and a self-import are found, a chain is not."""
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert cycles({"a": {"a"}}) == [["a"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_import_cycle_inside_the_core() -> None:
    assert cycles(core_imports()) == []


def test_decide_steps_import_downwards_only() -> None:
    edges = core_imports()
    for at, step in enumerate(STEPS):
        above = {f"{CORE}.{s}" for s in STEPS[at + 1 :]}
        assert not edges[f"{CORE}.{step}"] & above, f"{step} imports a later step"


def test_order_and_quota_import_no_placement() -> None:
    """Everything order and quota import, directly or not, is free of placement code."""
    graph = grimp.build_graph("fleetlog", cache_dir=None)
    forbidden = {f"{CORE}.{m}" for m in PLACEMENT}
    for module in ("order", "quota"):
        reached = graph.find_upstream_modules(f"{CORE}.{module}")
        assert not reached & forbidden, f"{module} reaches {sorted(reached & forbidden)}"
