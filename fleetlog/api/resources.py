"""The read-only resources of the HTTP API (``/v1/jobs``, ``/v1/nodes``, ``/v1/tenants``,
``/v1/queues``, ``/v1/cells``) over one :class:`~fleetlog.core.state.State`: pure functions of
the state and a query, shared by the live service and by anything that folds the logs.

Lists are filtered with column masks (no row is turned into an object before it is selected) and
paged by an opaque token: the row to go on from.  Rows are only ever appended, so paging through
a changing state neither skips nor repeats a job that was there when the first page was read.
A filter may be repeated (``state=pending&state=running``: either); an unknown parameter, a
value outside a closed set and a bad ``limit`` or ``page_token`` are :class:`ApiError` 400s
naming the parameter.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

import msgspec
import numpy as np

from fleetlog.api.errors import ApiError
from fleetlog.api.names import DEFAULT_LIMIT, JOB_STATES, MAX_LIMIT, NODE_STATUSES
from fleetlog.api.visibility import EVERYTHING, Viewer, job_mask
from fleetlog.core.authorize import roles_by_principal
from fleetlog.core.constraints import NO_ATTRS
from fleetlog.core.observations import Observation
from fleetlog.core.order import dominant_share, fleet_capacity, waiting_order
from fleetlog.core.shares import SCALE
from fleetlog.core.state import JobMeta, JobState, NodeStatus, State, TaskState
from fleetlog.core.views import pending_reason
from fleetlog.numerals import whole

__all__ = ["DEFAULT_LIMIT", "JOB_STATES", "MAX_LIMIT", "NODE_STATUSES", "ApiError"]  # (re-exported)

Query = Mapping[str, Sequence[str]]
"""A request's query parameters, each with every value it was given."""



# --- what the API answers (its OpenAPI schemas come from these) ----------------------------


class JobItem(msgspec.Struct, frozen=True, omit_defaults=True):
    job_id: str
    state: str
    tenant: str
    queue: str
    priority: int
    tasks: int
    tasks_started: int
    gpu_milli: int
    """GPU thousandths the job asks for, all tasks together."""
    cell: str
    """Where it was placed (``""``: not placed)."""
    submitted_at_ms: int
    placed_at_ms: int | None
    reason: str
    """A pending job's reason code (``docs/scheduling.md``); ``""`` for others."""
    queue_position: int | None
    """A pending job's place (from 1) among its queue's pending jobs in the order decide
    considers them (``docs/api.md``: priority, DRF turns as the shares are now, FIFO);
    ``None`` for others."""
    age_ms: int
    """Log time since its submission: the state's ``now_ms`` minus ``submitted_at_ms``."""
    labels: dict[str, str] = {}
    """Its submission's labels (left out when it has none)."""
    annotations: dict[str, str] = {}
    """Its submission's annotations (left out when it has none)."""
    nodes: list[str] = []
    """The nodes its tasks are placed on now, each once, in task order (left out: none)."""


class JobPage(msgspec.Struct, frozen=True):
    items: list[JobItem]
    total: int
    """How many jobs match the filters (all pages)."""
    next_page_token: str | None


class NodeItem(msgspec.Struct, frozen=True):
    node: str
    cell: str
    status: str
    gpu_model: str
    gpus: int
    gpu_free_milli: int
    cpu_milli: int
    cpu_free_milli: int
    mem_mib: int
    mem_free_mib: int
    last_heartbeat_ms: int
    heard_ago_ms: int
    """How long before the state's log time (its newest input's, ``now_ms``) the node was last heard
    from: a node silent past ``service.node_timeout_ms`` goes down at the next sweep."""
    cordoned: bool = False
    """No new task is placed on it: the backend cordoned it, or an operator drained it."""
    drained: str | None = None
    """An operator's drain (``fleetlog node drain``): its reason (``""``: none given); ``None``: not
    drained."""
    ignored_observations: list[Observation] = []
    """The latest task reports naming a node of this name that the fold did not apply as written
    (``fleetlog.core.observations``: a broken node agent), and why."""
    labels: dict[str, str] = {}
    """Its labels, as its last heartbeat gave them."""
    taints: list[Taint] = []
    """Its taints, in its last heartbeat's order."""
    topology: dict[str, str] = {}
    """Its place by level (``block``, ``rack``, ``host``; a level it does not name is left out)."""


class Taint(msgspec.Struct, frozen=True):
    key: str
    value: str
    effect: str


class NodePage(msgspec.Struct, frozen=True):
    items: list[NodeItem]
    total: int
    next_page_token: str | None


class Resources(msgspec.Struct, frozen=True):
    cpu_milli: int
    mem_mib: int
    gpu_milli: int


class TenantItem(msgspec.Struct, frozen=True):
    tenant: str
    running: int
    """Its jobs placed and with every task started (``GET /v1/jobs``' ``running``)."""
    pending: int
    used: Resources
    nominal: Resources | None
    """Its fleet-wide quota (``None``: none set)."""
    borrowing_limit: Resources | None
    borrowed: Resources
    """What it uses past its nominal quota (zero without one)."""
    cohort: str
    weight_milli: int
    dominant_share: float
    """Its weighted dominant share (DRF): of its nominal quota if it has one, else of the fleet."""
    placed: int = 0
    """Its jobs placed (they hold their resources) but not every task started yet."""
    placed_longest_ms: int | None = None
    """How long the longest-placed of those has waited to start: the state's ``now_ms`` minus its
    ``placed_at_ms`` (``None``: none placed and not started)."""


class QueueItem(msgspec.Struct, frozen=True):
    queue: str
    pending: int
    running: int
    pending_gpu_milli: int
    pending_by_reason: dict[str, int]
    placed: int = 0
    """As a tenant's: placed, not every task started (``running``: every task started)."""
    placed_longest_ms: int | None = None


class ModelAllocation(msgspec.Struct, frozen=True):
    gpus: int
    allocated_milli: int


class CellItem(msgspec.Struct, frozen=True):
    cell: str
    nodes_up: int
    nodes_down: int
    gpus: int
    """GPUs on the cell's up nodes."""
    gpu_allocated_milli: int
    cpu_milli: int
    cpu_allocated_milli: int
    by_model: dict[str, ModelAllocation]


class TenantList(msgspec.Struct, frozen=True):
    items: list[TenantItem]


class QueueList(msgspec.Struct, frozen=True):
    items: list[QueueItem]


class CellList(msgspec.Struct, frozen=True):
    items: list[CellItem]


class PolicyItem(msgspec.Struct, frozen=True, omit_defaults=True):
    principal: str
    roles: list[str]
    """Sorted; a principal granted twice holds both grants' roles."""
    max_priority: dict[str, int] = {}
    """Tenant -> the highest priority its jobs may have from this principal (its grants'
    ``max_priority``, docs/service.md "Authorization"); a tenant left out: any."""


class PolicyList(msgspec.Struct, frozen=True):
    """The API's authorization policy in force (docs/service.md, "The policy in the log")."""

    items: list[PolicyItem]
    """By principal."""
    source: str
    """``log``: the newest ``PolicySet`` folded; ``file``: ``auth.policy_file`` (the live service,
    while the log holds no ``PolicySet``); ``none``: neither (without a policy file every
    authenticated principal holds every role)."""
    reason: str = ""
    """The ``PolicySet``'s."""


# --- queries -------------------------------------------------------------------------------


def check_params(query: Query, allowed: Sequence[str]) -> None:
    for name in sorted(query):
        if name not in allowed:
            takes = ", ".join(allowed) or "no parameters"
            raise ApiError(400, "unknown_parameter", f"unknown query parameter {name!r}; this takes {takes}",
                           name)


def one_of(query: Query, name: str, allowed: Sequence[str]) -> list[str]:
    values = list(query.get(name, ()))
    for value in values:
        if value not in allowed:
            raise ApiError(400, "invalid_value", f"{name}={value!r}: use one of {', '.join(allowed)}", name)
    return values


def paging(query: Query) -> tuple[int, int]:
    """(first row, limit) from ``page_token`` and ``limit``."""
    limit, start = _single(query, "limit"), _single(query, "page_token")
    count = DEFAULT_LIMIT if limit is None else whole(limit, 7) or 0
    if not 1 <= count <= MAX_LIMIT:
        raise ApiError(400, "invalid_value", f"limit={limit!r}: an integer from 1 to {MAX_LIMIT}", "limit")
    if start is None:
        return 0, count
    row = whole(start, 12)
    if row is None:
        raise ApiError(400, "invalid_value", f"page_token={start!r} is not a token this API gave",
                       "page_token")
    return row, count


def _single(query: Query, name: str) -> str | None:
    values = query.get(name, ())
    if len(values) > 1:
        raise ApiError(400, "invalid_value", f"{name} given {len(values)} times: give it once", name)
    return values[0] if values else None


def _ids(state: State, table: str, names: Sequence[str]) -> list[int]:
    """The ids of ``names`` in the state's name table (a name never seen matches nothing: it has
    no id, and -1 must not match the rows whose column says "none", a job placed nowhere)."""
    found = (state.names[table].get(name) for name in names)
    return [i for i in found if i >= 0]


def _page(mask: np.ndarray, start: int, limit: int) -> tuple[np.ndarray, int, str | None]:
    """The rows of ``mask`` from ``start``, at most ``limit``; the total; the next token."""
    rows = np.flatnonzero(mask)
    first = int(np.searchsorted(rows, start))
    chosen = rows[first:first + limit]
    more = first + limit < rows.size
    return chosen, int(rows.size), str(int(chosen[-1]) + 1) if more else None


# --- jobs ----------------------------------------------------------------------------------

JOB_PARAMS: Final = ("tenant", "queue", "state", "reason", "cell", "node", "label", "limit", "page_token")


def started_counts(state: State) -> np.ndarray:
    """Per job row, how many of its tasks a backend has seen start (or end)."""
    n, cols = state.jobs.size, state.jobs.cols
    seen = state.tasks.cols["state"][: state.tasks.size] >= TaskState.STARTED
    sums = np.concatenate(([0], np.cumsum(seen, dtype=np.int64)))
    first, count = cols["first_task"][:n].astype(np.int64), cols["ntasks"][:n].astype(np.int64)
    first = np.clip(first, 0, sums.size - 1)
    started: np.ndarray = sums[np.clip(first + count, 0, sums.size - 1)] - sums[first]
    return started


def list_jobs(state: State, query: Query, viewer: Viewer = EVERYTHING) -> JobPage:
    """``GET /v1/jobs``: the jobs ``viewer`` may see (:mod:`fleetlog.api.visibility`; ``total``
    counts only those), filtered and paged."""
    check_params(query, JOB_PARAMS)
    phases = one_of(query, "state", JOB_STATES)
    start, limit = paging(query)
    n, c = state.jobs.size, state.jobs.cols
    status = c["state"][:n]
    started = started_counts(state)
    mask = status != JobState.RETIRED
    visible = job_mask(state, viewer)
    if visible is not None:
        mask &= visible
    for column, table in (("tenant", "tenant"), ("queue", "queue"), ("cell", "cell")):
        if column in query:
            mask &= np.isin(c[column][:n], _ids(state, table, query[column]))
    if phases:
        mask &= _phase_mask(status, started, c["ntasks"][:n], phases)
    if "label" in query:
        mask &= _labelled(state, query["label"])
    if "node" in query:
        mask &= _on_nodes(state, query["node"])
    if "reason" in query:
        wanted = set(query["reason"])
        pending = np.flatnonzero(mask & (status == JobState.PENDING))
        keep = [row for row in pending.tolist() if pending_reason(state, row)[0] in wanted]
        mask = np.zeros(n, np.bool_)
        mask[keep] = True
    rows, total, token = _page(mask, start, limit)
    return JobPage(_job_items(state, rows, started[rows], queue_positions(state)), total, token)


def queue_positions(state: State) -> np.ndarray:
    """Per job row, its ``queue_position`` (0: not pending): where it comes among its queue's
    pending jobs in :func:`~fleetlog.core.order.waiting_order` (one sort for them all)."""
    positions = np.zeros(state.jobs.size, np.int64)
    order = waiting_order(state)
    if order.size == 0:
        return positions
    queues = state.jobs.cols["queue"][order]
    by_queue = np.argsort(queues, kind="stable")  # (stable: each queue's jobs keep decide's order)
    grouped = queues[by_queue]
    starts = np.flatnonzero(np.concatenate(([True], grouped[1:] != grouped[:-1])))
    first = np.repeat(starts, np.diff(np.append(starts, grouped.size)))
    positions[order[by_queue]] = np.arange(grouped.size) - first + 1
    return positions


def _on_nodes(state: State, nodes: Sequence[str]) -> np.ndarray:
    """The rows of jobs with a task placed on one of ``nodes`` now (by node name, in any cell)."""
    wanted = set(nodes)
    ids = [i for i, name in enumerate(state.names["node"].names) if name.split("\x00", 1)[1] in wanted]
    tc, size = state.tasks.cols, state.tasks.size
    on = np.isin(tc["node"][:size], ids) if ids else np.zeros(size, np.bool_)
    mask = np.zeros(state.jobs.size, np.bool_)
    mask[tc["job"][:size][on]] = True
    return mask


def job_nodes(state: State, row: int) -> list[str]:
    """The nodes job ``row``'s tasks are placed on now, each once, in task order."""
    tasks = state.job_tasks(row)
    nodes = state.tasks.cols["node"][tasks.start:tasks.stop].tolist()
    return [state.node_name(node) for node in dict.fromkeys(nodes) if node >= 0]


def _labelled(state: State, given: Sequence[str]) -> np.ndarray:
    """The rows whose job has every label of ``given`` (``key=value`` each)."""
    wanted = []
    for value in given:
        key, equals, label = value.partition("=")
        if not key or not equals:
            raise ApiError(400, "invalid_value", f"label={value!r}: give KEY=VALUE (a label and its value)",
                           "label")
        wanted.append((key, label))
    mask = np.zeros(state.jobs.size, np.bool_)
    rows = [row for row, (labels, _) in state.job_meta.items() if all(labels.get(k) == v for k, v in wanted)]
    mask[rows] = True
    return mask


def _phase_mask(status: np.ndarray, started: np.ndarray, ntasks: np.ndarray, phases: list[str]) -> np.ndarray:
    mask = np.zeros(status.size, np.bool_)
    for phase in phases:
        if phase in ("placed", "running"):
            all_started = started == ntasks
            mask |= (status == JobState.RUNNING) & (all_started if phase == "running" else ~all_started)
        else:
            mask |= status == JobState[phase.upper()]
    return mask


_STATE_NAMES: Final = {int(s): s.name.lower() for s in JobState}


def _job_items(state: State, rows: np.ndarray, started: np.ndarray, positions: np.ndarray) -> list[JobItem]:
    """The items of job ``rows``: each column read once for them all (10,000 rows in a few ms)."""
    c, names = state.jobs.cols, state.names
    job_names, tenants = names["job"].names, names["tenant"].names
    queues, cells = names["queue"].names, names["cell"].names
    columns = ("state", "tenant", "queue", "priority", "ntasks", "req_gpu", "cell", "submitted_at",
               "placed_at_ms")
    values = zip(rows.tolist(), started.tolist(), positions[rows].tolist(),
                 *(c[name][rows].tolist() for name in columns), strict=True)
    items: list[JobItem] = []
    for row, up, position, status, tenant, queue, priority, ntasks, gpu, cell, submitted, placed in values:
        pending = status == JobState.PENDING
        phase = _STATE_NAMES[status]
        if status == JobState.RUNNING:  # (views.job_phase: placed until every task started)
            phase = "running" if up == ntasks else "placed"
        item = JobItem(
            job_id=job_names[row], state=phase, tenant=tenants[tenant], queue=queues[queue],
            priority=priority, tasks=ntasks, tasks_started=up, gpu_milli=gpu,
            cell=cells[cell] if cell >= 0 else "", submitted_at_ms=submitted,
            placed_at_ms=placed if placed >= 0 and not pending else None,
            reason=pending_reason(state, row)[0] if pending else "",
            queue_position=position or None, age_ms=max(0, state.now_ms - submitted),
            nodes=job_nodes(state, row) if status == JobState.RUNNING else [],
        )
        items.append(item if row not in state.job_meta else _with_meta(item, state.job_meta[row]))
    return items


def _with_meta(item: JobItem, meta: JobMeta) -> JobItem:
    """``item`` with its job's labels and annotations (a job without any: the item leaves them out)."""
    return msgspec.structs.replace(item, labels=meta[0], annotations=meta[1])


# --- nodes ---------------------------------------------------------------------------------

NODE_PARAMS: Final = ("cell", "model", "status", "limit", "page_token")


def list_nodes(state: State, query: Query) -> NodePage:
    check_params(query, NODE_PARAMS)
    statuses = one_of(query, "status", NODE_STATUSES)
    start, limit = paging(query)
    n, c = state.nodes.size, state.nodes.cols
    mask = np.ones(n, np.bool_)
    if "cell" in query:
        mask &= np.isin(c["cell"][:n], _ids(state, "cell", query["cell"]))
    if "model" in query:
        mask &= np.isin(c["model"][:n], _ids(state, "model", query["model"]))
    if statuses:
        mask &= np.isin(c["status"][:n], [NodeStatus[s.upper()] for s in statuses])
    rows, total, token = _page(mask, start, limit)
    return NodePage([node_item(state, int(row)) for row in rows], total, token)


def node_item(state: State, row: int) -> NodeItem:
    c, names = state.nodes.cols, state.names
    count, model = int(c["gpu_count"][row]), int(c["model"][row])
    labels, taints, topology = _node_attrs(state, row)
    return NodeItem(
        node=state.node_name(row),
        cell=names["cell"].names[int(c["cell"][row])],
        status=NodeStatus(int(c["status"][row])).name.lower(),
        gpu_model=names["model"].names[model] if model >= 0 else "",
        gpus=count,
        gpu_free_milli=int(c["gpu_free"][row, :count].sum()),
        cpu_milli=int(c["cpu_alloc"][row]),
        cpu_free_milli=int(c["cpu_free"][row]),
        mem_mib=int(c["mem_alloc"][row]),
        mem_free_mib=int(c["mem_free"][row]),
        last_heartbeat_ms=int(c["last_heartbeat_ms"][row]),
        heard_ago_ms=max(0, state.now_ms - int(c["last_heartbeat_ms"][row])),
        cordoned=state.node_attrs.get(row, NO_ATTRS)[2],
        drained=state.drained[row][0] if row in state.drained else None,
        ignored_observations=list(state.observations.by_node.get(state.node_name(row), ())),
        labels=labels, taints=taints, topology=topology,
    )


def _node_attrs(state: State, row: int) -> tuple[dict[str, str], list[Taint], dict[str, str]]:
    """A node's labels, taints and topology (its place by level: the last step of its path)."""
    labels, taints, _ = state.node_attrs.get(row, NO_ATTRS)
    c, topo = state.nodes.cols, state.names["topo"].names
    levels, above = {}, ""
    for level in ("block", "rack", "host"):  # (each level's name is its path: "b1", "b1/r1", ...)
        if int(c[level][row]) >= 0:
            path = topo[int(c[level][row])].split("\x00", 1)[1]
            levels[level], above = path[len(above) + 1:] if above else path, path
    return dict(labels), [Taint(*taint) for taint in taints], levels


# --- tenants, queues, cells ----------------------------------------------------------------


def phase_counts(state: State, column: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per id of ``column`` (``tenant`` or ``queue``): its jobs ``placed`` (holding their
    resources, not every task started), ``running`` (every task started) — the words of ``GET
    /v1/jobs``, so that no count calls a job that never started "running" — and how long the
    longest-placed of the first has waited to start in log time (-1: none)."""
    n, c = state.jobs.size, state.jobs.cols
    size, ids = len(state.names[column].names), c[column][:n]
    held = c["state"][:n] == JobState.RUNNING
    placed = held & (started_counts(state) < c["ntasks"][:n])
    oldest = np.full(size, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(oldest, ids[placed], c["placed_at_ms"][:n][placed])
    waited = np.where(oldest == np.iinfo(np.int64).max, -1, np.maximum(0, state.now_ms - oldest))
    return (np.bincount(ids[placed], minlength=size), np.bincount(ids[held & ~placed], minlength=size),
            waited)


def _longest(waited: np.ndarray, i: int) -> int | None:
    return int(waited[i]) if waited[i] >= 0 else None


def list_tenants(state: State, query: Query) -> TenantList:
    check_params(query, ())
    n, c = state.jobs.size, state.jobs.cols
    tenant_col, status = c["tenant"][:n], c["state"][:n]
    placed, running, waited = phase_counts(state, "tenant")
    pending = np.bincount(tenant_col[status == JobState.PENDING], minlength=len(state.names["tenant"].names))
    fleet = fleet_capacity(state)
    items = []
    for tid, tenant in enumerate(state.names["tenant"].names):
        used = state.usage.get((tid, -1), [0, 0, 0])
        quota = state.quotas.get((tid, -1))
        nominal = quota.nominal if quota is not None else None
        limit = quota.borrowing_limit if quota is not None else None
        items.append(TenantItem(
            tenant=tenant,
            running=int(running[tid]),
            pending=int(pending[tid]),
            used=Resources(*map(int, used)),
            nominal=Resources(*nominal) if nominal is not None else None,
            borrowing_limit=Resources(*limit) if limit is not None else None,
            borrowed=Resources(*(max(0, int(u) - b) for u, b in zip(used, nominal or (0, 0, 0), strict=True)))
            if nominal is not None else Resources(0, 0, 0),
            cohort=quota.cohort if quota is not None else "",
            weight_milli=quota.weight_milli if quota is not None else 1000,
            dominant_share=dominant_share(state, state.usage, tid, fleet) / SCALE,
            placed=int(placed[tid]),
            placed_longest_ms=_longest(waited, tid),
        ))
    return TenantList(items)


def list_queues(state: State, query: Query) -> QueueList:
    check_params(query, ())
    n, c = state.jobs.size, state.jobs.cols
    queue_col, status, gpu = c["queue"][:n], c["state"][:n], c["req_gpu"][:n]
    reasons: dict[int, dict[str, int]] = {}
    placed, running, waited = phase_counts(state, "queue")
    for row in np.flatnonzero(status == JobState.PENDING).tolist():
        by = reasons.setdefault(int(queue_col[row]), {})
        reason = pending_reason(state, row)[0]
        by[reason] = by.get(reason, 0) + 1
    items = []
    for qid, queue in enumerate(state.names["queue"].names):
        pending = (queue_col == qid) & (status == JobState.PENDING)
        items.append(QueueItem(
            queue=queue,
            pending=int(np.count_nonzero(pending)),
            running=int(running[qid]),
            pending_gpu_milli=int(gpu[pending].sum()),
            pending_by_reason=dict(sorted(reasons.get(qid, {}).items())),
            placed=int(placed[qid]),
            placed_longest_ms=_longest(waited, qid),
        ))
    return QueueList(items)


def list_policy(state: State, query: Query) -> PolicyList:
    """The newest ``PolicySet`` the state folded (``source`` ``none`` before any)."""
    check_params(query, ())
    if state.policy is None:
        return PolicyList([], "none")
    ceilings = {p: dict(r.ceilings) for p, r in roles_by_principal(state.policy.grants).items()}
    return policy_list([(g.principal, g.roles) for g in state.policy.grants], "log", state.policy.reason,
                       ceilings)


def policy_list(grants: Sequence[tuple[str, Sequence[str]]], source: str, reason: str = "",
                ceilings: Mapping[str, dict[str, int]] | None = None) -> PolicyList:
    """The policy by principal; ``ceilings``: each principal's priority ceilings by tenant."""
    found: dict[str, set[str]] = {}
    for principal, roles in grants:
        found.setdefault(principal, set()).update(roles)
    tops = ceilings or {}
    items = [PolicyItem(p, sorted(found[p]), tops.get(p, {})) for p in sorted(found)]
    return PolicyList(items, source, reason)


def list_cells(state: State, query: Query) -> CellList:
    check_params(query, ())
    n, c = state.nodes.size, state.nodes.cols
    cell_col, status, models = c["cell"][:n], c["status"][:n], c["model"][:n]
    counts = c["gpu_count"][:n].astype(np.int64)
    slots = np.arange(c["gpu_free"].shape[1]) < counts[:, None]  # (a slot past a node's count is no GPU)
    free = (c["gpu_free"][:n].astype(np.int64) * slots).sum(axis=1)
    allocated = counts * 1000 - free
    items = []
    for cid, cell in enumerate(state.names["cell"].names):
        mine = cell_col == cid
        up = mine & (status == NodeStatus.UP)
        by_model = {}
        for model in sorted(set(models[up].tolist())):
            if model < 0:
                continue
            of = up & (models == model)
            by_model[state.names["model"].names[model]] = ModelAllocation(
                int(counts[of].sum()), int(allocated[of].sum()))
        items.append(CellItem(
            cell=cell,
            nodes_up=int(np.count_nonzero(up)),
            nodes_down=int(np.count_nonzero(mine & (status == NodeStatus.DOWN))),
            gpus=int(counts[up].sum()),
            gpu_allocated_milli=int(allocated[up].sum()),
            cpu_milli=int(c["cpu_alloc"][:n][up].sum()),
            cpu_allocated_milli=int((c["cpu_alloc"][:n][up] - c["cpu_free"][:n][up]).sum()),
            by_model=dict(sorted(by_model.items())),
        ))
    return CellList(items)
