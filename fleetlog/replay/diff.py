"""What differs between two states, row by row: jobs, nodes and tenants as the views show them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from fleetlog.core.digest import restore, snapshot
from fleetlog.core.fold import fold_decision
from fleetlog.core.state import State
from fleetlog.core.views import jobs_table, nodes_table, tenants_table
from fleetlog.events.model import Decision

MAX_ROWS = 50
Row = dict[str, Any]
_TABLES: tuple[tuple[str, Callable[[State], list[Row]], tuple[str, ...]], ...] = (
    ("job", jobs_table, ("job_id",)),
    ("node", nodes_table, ("cell", "node")),
    ("tenant", tenants_table, ("tenant",)),
)


class Difference(msgspec.Struct, frozen=True):
    """One row that differs: ``recorded``/``replayed`` hold only the fields that differ."""

    kind: str
    key: str
    recorded: dict[str, Any]
    replayed: dict[str, Any]


def copy_state(state: State) -> State:
    return restore(snapshot(state))


def after(state: State, decisions: tuple[Decision, ...]) -> State:
    """A copy of ``state`` with ``decisions`` folded (``state`` is unchanged)."""
    out = copy_state(state)
    for decision in decisions:
        fold_decision(out, decision)
    return out


def diff_states(recorded: State, replayed: State, limit: int = MAX_ROWS) -> list[Difference]:
    """The rows of jobs, nodes and tenants that differ (a row missing on one side is empty)."""
    out: list[Difference] = []
    for kind, table, key in _TABLES:
        left = {_key(row, key): row for row in table(recorded)}
        right = {_key(row, key): row for row in table(replayed)}
        for name in sorted(left.keys() | right.keys()):
            a, b = left.get(name, {}), right.get(name, {})
            changed = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
            if changed:
                out.append(
                    Difference(kind, name, {k: a.get(k) for k in changed}, {k: b.get(k) for k in changed})
                )
            if len(out) >= limit:
                return out
    return out


def _key(row: Row, key: tuple[str, ...]) -> str:
    return "/".join(str(row[k]) for k in key)
