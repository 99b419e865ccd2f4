"""The cross-shard invariants of docs/scale-out.md, as code (run after every step in tests):

- a job is pending or running in at most one cell, and that is the cell the dispatcher says
  holds it (``HELD`` there);
- a gang never spans cells: every task of a placed job is on a node of the job's cell.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fleetlog.core import dispatch as d
from fleetlog.core.state import JobState, State
from fleetlog.events import JobCancelled

if TYPE_CHECKING:
    from fleetlog.sharded.driver import ShardedFleet

_LIVE = (int(JobState.PENDING), int(JobState.RUNNING))


class ShardInvariantError(AssertionError):
    """A cross-shard invariant does not hold (a bug in the dispatcher, a shard or the driver)."""


def live_jobs(fleet: ShardedFleet) -> dict[str, list[str]]:
    """Job id -> the cells where it is pending or running (shards stepped in this process)."""
    out: dict[str, list[str]] = {}
    for shard in fleet.local_shards().values():
        state = shard.state
        states = state.jobs.view("state")
        rows = np.flatnonzero(np.isin(states, _LIVE)).tolist()
        names, cells = state.names["job"].names, state.names["cell"].names
        for row in rows:
            cell = state.dispatches.get(row)
            where = cells[cell[0]] if cell is not None else f"partition {shard.partition} (not dispatched)"
            out.setdefault(names[row], []).append(where)
    return out


def check_fleet(fleet: ShardedFleet) -> None:
    """Raise :class:`ShardInvariantError` unless every cross-shard invariant holds."""
    for job_id, cells in sorted(live_jobs(fleet).items()):
        if len(cells) > 1:
            raise ShardInvariantError(f"job {job_id!r} is live in {len(cells)} cells: {sorted(cells)}")
        held = fleet.dispatcher.jobs.get(job_id)
        if held is not None and held.status == d.CANCELLED and _cancel_on_its_way(fleet, job_id, held.cell):
            continue  # (pipelined: the dispatcher's step ran after the cells'; the cell folds it next)
        if held is None or held.status != d.HELD or held.cell != cells[0]:
            said = "unknown" if held is None else f"{held.status} in {held.cell!r}"
            raise ShardInvariantError(
                f"job {job_id!r} is live in cell {cells[0]!r}; the dispatcher says {said}"
            )
    for shard in fleet.local_shards().values():
        _one_cell_per_job(shard.state, shard.partition)


def _cancel_on_its_way(fleet: ShardedFleet, job_id: str, cell: str) -> bool:
    """Whether the dispatcher forwarded a cancel of ``job_id`` that ``cell`` has not folded yet."""
    partition = fleet.config.cells.partition_of(cell)
    waiting = fleet.cell_in.get(partition, []) if partition is not None else []
    return any(isinstance(e, JobCancelled) and e.job_id == job_id for e, _ in waiting)


def _one_cell_per_job(state: State, partition: int) -> None:
    """Every placed task of a job sits on a node of the job's dispatched cell."""
    tc, nc = state.tasks.cols, state.nodes.cols
    names, cells = state.names["job"].names, state.names["cell"].names
    for job, (cell, *_rest) in sorted(state.dispatches.items()):
        if int(state.jobs.cols["state"][job]) != JobState.RUNNING:
            continue
        nodes = [int(tc["node"][t]) for t in state.job_tasks(job)]
        where = sorted({int(nc["cell"][n]) for n in nodes if n >= 0})
        if where != [cell]:
            raise ShardInvariantError(
                f"job {names[job]!r} of partition {partition} (dispatched to {cells[cell]!r}) runs on "
                f"nodes of cells {[cells[c] for c in where]}"
            )
