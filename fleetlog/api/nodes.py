"""``GET /v1/nodes/{node}``: one node in detail — what ``GET /v1/nodes`` lists of it (resources,
labels, taints, topology, cordon and drain, when it was last heard from) and the jobs and tasks
placed on it now — the answer of ``fleetlog nodes NAME``.  A pure function of the state, like the
lists: the live service, ``fleetlog replay serve`` and the logs folded answer alike.

What of the node's jobs a reader sees follows :mod:`fleetlog.api.visibility`: the jobs it may see
are listed with their tasks; the others (another tenant's, to a tenant principal) are only counted
(``other_jobs``, ``other_tasks``): that the node is busy is no secret (its free resources say so),
whose work it is and what it is called are.
"""

from __future__ import annotations

from typing import Final

import msgspec
import numpy as np

from fleetlog.api.resources import ApiError, NodeItem, Query, check_params, node_item
from fleetlog.api.visibility import EVERYTHING, Viewer, sees_row
from fleetlog.core.state import State, TaskState

NODE_DETAIL_PARAMS: Final = ("cell",)


class NodeTask(msgspec.Struct, frozen=True):
    task: int
    """Its index in its job."""
    state: str
    """``placed`` or ``started``."""
    gpu_milli: int
    """GPU thousandths it holds on the node, all its GPUs together."""
    cpu_milli: int
    mem_mib: int


class NodeJob(msgspec.Struct, frozen=True):
    job_id: str
    tenant: str
    queue: str
    state: str
    """``placed`` (not every task started) or ``running``, as ``GET /v1/jobs`` says."""
    tasks: list[NodeTask]
    """Its tasks on this node (a gang's others are on other nodes: ``GET /v1/jobs/{job_id}``)."""


class NodeDetail(NodeItem, frozen=True):
    jobs: list[NodeJob] = msgspec.field(default_factory=list)
    """The jobs with a task on it now that the reader may see, in submission order."""
    other_jobs: int = 0
    """Jobs with a task on it that the reader may not see (another tenant's): counted, not named."""
    other_tasks: int = 0
    """Their tasks on it."""


def node_detail(state: State, node: str, query: Query, viewer: Viewer = EVERYTHING) -> NodeDetail:
    """What ``GET /v1/nodes/{node}`` answers (``cell``: which cell's, when several hold a node of
    that name); an :class:`ApiError` 404 for a node the state does not know."""
    check_params(query, NODE_DETAIL_PARAMS)
    row = _node_row(state, node, list(query.get("cell", ())))
    jobs, others = _jobs_on(state, row, viewer)
    item = msgspec.structs.asdict(node_item(state, row))
    return NodeDetail(**item, jobs=jobs, other_jobs=len(others), other_tasks=sum(others.values()))


def _node_row(state: State, node: str, cells: list[str]) -> int:
    names = state.names["node"].names
    rows = [i for i, name in enumerate(names) if name.split("\x00", 1)[1] == node
            and (not cells or name.split("\x00", 1)[0] in cells)]
    if not rows:
        where = f" in cell {', '.join(cells)}" if cells else ""
        raise ApiError(404, "unknown_node", f"no node {node!r}{where}", "cell" if cells else None)
    if len(rows) > 1:
        held = ", ".join(sorted(names[i].split("\x00", 1)[0] for i in rows))
        raise ApiError(400, "ambiguous_node", f"cells {held} each have a node {node!r}: give ?cell=CELL "
                       "(fleetlog nodes NAME --cell CELL)", "cell")
    return rows[0]


def _jobs_on(state: State, row: int, viewer: Viewer) -> tuple[list[NodeJob], dict[int, int]]:
    """The jobs on node ``row`` that ``viewer`` sees, and the tasks of each job it does not."""
    tc, size = state.tasks.cols, state.tasks.size
    tasks = np.flatnonzero(tc["node"][:size] == row)
    by_job: dict[int, list[int]] = {}
    for task, job in zip(tasks.tolist(), tc["job"][:size][tasks].tolist(), strict=True):
        by_job.setdefault(job, []).append(task)
    jobs, others = [], {}
    for job in sorted(by_job):
        if not sees_row(state, viewer, job):
            others[job] = len(by_job[job])
            continue
        jobs.append(_node_job(state, job, by_job[job]))
    return jobs, others


def _node_job(state: State, job: int, tasks: list[int]) -> NodeJob:
    c, tc, names = state.jobs.cols, state.tasks.cols, state.names
    first = state.job_tasks(job).start
    on = [NodeTask(task - first, "started" if int(tc["state"][task]) >= TaskState.STARTED else "placed",
                   int(tc["milli"][task]) * int(tc["gpus"][task]), int(tc["cpu"][task]), int(tc["mem"][task]))
          for task in tasks]
    job_range = state.job_tasks(job)
    started = int(np.count_nonzero(tc["state"][job_range.start:job_range.stop] >= TaskState.STARTED))
    return NodeJob(
        job_id=names["job"].names[job], tenant=names["tenant"].names[int(c["tenant"][job])],
        queue=names["queue"].names[int(c["queue"][job])],
        state="running" if started == len(job_range) else "placed", tasks=on)
