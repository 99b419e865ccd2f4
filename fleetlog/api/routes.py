"""Every route of the HTTP API, in one table: the service dispatches by it and
``/v1/openapi.json`` describes it (:func:`openapi`), so the description cannot drift from what is
served (a test compares the service's handlers with this table).

Errors have one shape everywhere: ``{"code", "message", "field"}`` (:class:`Error`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final
from urllib.parse import unquote

import msgspec

from fleetlog.api.detail import JobDetail
from fleetlog.api.dryrun import DryRun
from fleetlog.api.history import ENDED, HISTORY_PARAMS, HistoryPage
from fleetlog.api.nodes import NodeDetail, node_detail
from fleetlog.api.resources import (
    DEFAULT_LIMIT,
    JOB_PARAMS,
    JOB_STATES,
    MAX_LIMIT,
    NODE_PARAMS,
    NODE_STATUSES,
    ApiError,
    CellList,
    JobPage,
    NodePage,
    PolicyList,
    Query,
    QueueList,
    TenantList,
    list_cells,
    list_jobs,
    list_nodes,
    list_policy,
    list_queues,
    list_tenants,
)
from fleetlog.api.visibility import EVERYTHING, Viewer
from fleetlog.core.state import State

API_VERSION: Final = "1"


class Error(msgspec.Struct, frozen=True):
    """What every refusal answers."""

    code: str
    """Machine-readable: ``invalid_value``, ``unknown_parameter``, ``not_found``, ``standby``…"""
    message: str
    field: str | None = None
    """The query parameter or body field at fault, if one is."""


class Param(msgspec.Struct, frozen=True):
    name: str
    description: str
    values: tuple[str, ...] = ()
    """A closed set of values (empty: any string)."""
    integer: bool = False
    repeated: bool = True


class Route(msgspec.Struct, frozen=True):
    method: str
    path: str
    """A template: ``{name}`` stands for one path segment."""
    summary: str
    response: Any = None
    """The 200 answer's type (``None``: a free-form JSON object)."""
    params: tuple[Param, ...] = ()
    content_type: str = "application/json"


ListFn = Callable[[State, Query], msgspec.Struct]

_DESCRIBED: Final = {
    "tenant": "only this tenant's", "queue": "only this queue's", "state": "only those in this state",
    "reason": "only pending jobs with this reason code", "cell": "only this cell's",
    "node": "only jobs with a task placed on this node now (by its name, in any cell)",
    "label": "only jobs with this label, as KEY=VALUE (repeated: every one of them)",
    "model": "only nodes with this GPU model", "status": "only nodes in this status",
    "limit": f"at most this many items (1 to {MAX_LIMIT}, default {DEFAULT_LIMIT})",
    "page_token": "the next_page_token of the previous page",
}
_CLOSED: Final = {"state": JOB_STATES, "status": NODE_STATUSES}
_HISTORY: Final = {
    "tenant": "only this tenant's jobs", "queue": "only this queue's jobs",
    "state": "only jobs that ended in this state",
    "since": "only jobs that ended at or after this log time: ISO 8601 (no zone: UTC) or epoch "
             "milliseconds with ms (1700000000000ms), as fleetlog history --since takes it",
    "until": "only jobs that ended before this log time (as since)",
}


def _params(names: tuple[str, ...], described: Mapping[str, str] = _DESCRIBED,
            closed: Mapping[str, tuple[str, ...]] = _CLOSED) -> tuple[Param, ...]:
    """The query parameters a list takes (the list's own tuple of names is the authority)."""
    single = ("limit", "page_token", "since", "until")
    return tuple(Param(name, described.get(name) or _DESCRIBED[name], closed.get(name, ()), name == "limit",
                       name not in single)
                 for name in names)


_JOB_PARAMS, _NODE_PARAMS = _params(JOB_PARAMS), _params(NODE_PARAMS)
_HISTORY_PARAMS: Final = _params(HISTORY_PARAMS, _HISTORY, {"state": ENDED})

LISTS: Final[Mapping[str, tuple[ListFn, Any, tuple[Param, ...], str]]] = {
    "/v1/jobs": (list_jobs, JobPage, _JOB_PARAMS, "Jobs in submission order, filtered and paged"),
    "/v1/nodes": (list_nodes, NodePage, _NODE_PARAMS, "Nodes in first-seen order, filtered and paged"),
    "/v1/tenants": (list_tenants, TenantList, (), "Each tenant: jobs, usage, quota, borrowing, DRF share"),
    "/v1/queues": (list_queues, QueueList, (), "Each queue: pending and running jobs, pending by reason"),
    "/v1/cells": (list_cells, CellList, (), "Each cell: nodes, capacity, GPU allocation by model"),
    "/v1/policy": (list_policy, PolicyList, (), "The authorization policy in force: each principal's roles, "
                   "and where it comes from (the log's newest PolicySet, or auth.policy_file)"),
}
"""The read-only lists: each a pure function of the state and the query."""

ROUTES: Final[tuple[Route, ...]] = (
    *(Route("GET", path, summary, answer, params) for path, (_, answer, params, summary) in LISTS.items()),
    Route("GET", "/v1/jobs/{job_id}", "One job: its state, tasks and nodes, queue position, labels and "
          "annotations, or why it waits; with its story (docs/api.md)", JobDetail),
    Route("GET", "/v1/nodes/{node}", "One node: resources, labels, taints, topology, cordon and drain, when "
          "it was last heard from, and the jobs and tasks on it (another tenant's only counted: docs/api.md)",
          NodeDetail, (Param("cell", "the node's cell, when several cells have a node of this name",
                             repeated=False),)),
    Route("GET", "/v1/history", "Accounting of finished jobs (fleetlog history: submission, wait, elapsed, "
          "exit code, preemptions, GPU-hours), in the order they ended, filtered and paged; answered by "
          "fleetlog replay serve, not the live service (docs/api.md)", HistoryPage, _HISTORY_PARAMS),
    Route("GET", "/v1/watch", "The decisions (or inputs) log as Server-Sent Events from an offset; "
          "resumable with Last-Event-ID (docs/api.md)", params=(
              Param("from", "an offset, start or end (default: end)", repeated=False),
              Param("log", "decisions (default) or inputs", ("decisions", "inputs"), repeated=False)),
          content_type="text/event-stream"),
    Route("POST", "/v1/events", "Ingest: one event or a JSON array of them (docs/producers.md)"),
    Route("POST", "/v1/dry-run", "Would these jobs be placed now, where, and if not why: the body is a "
          "JobSubmitted (or envelope) or a JSON array of them; nothing is appended (docs/api.md)", DryRun),
    Route("PUT", "/v1/quotas/{tenant}", "Set a tenant's quota: the body is a QuotaSet without type and "
          "tenant (nominal, cell, cohort, borrowing_limit, weight_milli); appended as a QuotaSet"),
    Route("GET", "/v1/openapi.json", "This description"),
    Route("GET", "/healthz", "Alive: leading, standby, retrying or stalled"),
    Route("GET", "/readyz", "Ready: 200 while leading, 503 otherwise"),
    Route("GET", "/metrics", "Prometheus metrics", content_type="text/plain"),
)


def match(template: str, path: str) -> dict[str, str] | None:
    """The ``{name}`` segments of ``path`` (as sent: percent-encoded), decoded, if it fits
    ``template``, else ``None``."""
    want, got = template.split("/"), path.split("/")
    if len(want) != len(got):
        return None
    found = {}
    for w, g in zip(want, got, strict=True):
        if w.startswith("{") and w.endswith("}"):
            if not g:
                return None
            found[w[1:-1]] = unquote(g)
        elif w != unquote(g):
            return None
    return found


def route_for(method: str, path: str) -> tuple[Route | None, dict[str, str], bool]:
    """(the route, its path parameters, whether the path exists with another method), for a
    ``path`` as sent (percent-encoded)."""
    other = False
    for route in ROUTES:
        found = match(route.path, path)
        if found is None:
            continue
        if route.method == method:
            return route, found, False
        other = True
    return None, {}, other


def answer_list(state: State, path: str, query: Query, viewer: Viewer = EVERYTHING) -> msgspec.Struct:
    """The list at ``path`` (one of :data:`LISTS`, or a node's ``/v1/nodes/NODE`` as sent:
    percent-encoded) as ``viewer`` may see it (only ``/v1/jobs``
    lists jobs; the others are aggregates every reader sees: :mod:`fleetlog.api.visibility`); an
    :class:`ApiError` for a bad query."""
    if path == "/v1/jobs":
        return list_jobs(state, query, viewer)
    if path in LISTS:
        return LISTS[path][0](state, query)
    found = match("/v1/nodes/{node}", path)
    if found is None:
        raise ApiError(404, "not_found", f"no list at {path}")
    return node_detail(state, found["node"], query, viewer)


def openapi() -> dict[str, Any]:
    """The OpenAPI 3.1 description of :data:`ROUTES`."""
    types = [Error, *(r.response for r in ROUTES if r.response is not None)]
    _, components = msgspec.json.schema_components(types, ref_template="#/components/schemas/{name}")
    paths: dict[str, dict[str, Any]] = {}
    for route in ROUTES:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route)
    return {
        "openapi": "3.1.0",
        "info": {"title": "fleetlog", "version": API_VERSION,
                 "description": "The fleetlog scheduler's HTTP API (docs/api.md)."},
        "paths": paths,
        "components": {"schemas": components, "securitySchemes": {"bearer": {
            "type": "http", "scheme": "bearer",
            "description": "When [auth] tokens_file is set (docs/service.md, Authentication)"}}},
        "security": [{"bearer": []}],
    }


def _operation(route: Route) -> dict[str, Any]:
    ok: dict[str, Any] = (
        {"$ref": f"#/components/schemas/{route.response.__name__}"} if route.response is not None
        else {"type": "object"} if route.content_type == "application/json" else {"type": "string"}
    )
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    parameters = [_parameter(p) for p in route.params]
    parameters += [{"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
                   for name in match(route.path, route.path) or {}]
    exempt: dict[str, Any] = {"security": []} if route.path in ("/healthz", "/readyz") else {}  # no token
    return {
        **exempt,
        "summary": route.summary,
        "operationId": route.method.lower() + "".join(c if c.isalnum() else "_" for c in route.path),
        "parameters": parameters,
        "responses": {
            "200": {"description": "OK", "content": {route.content_type: {"schema": ok}}},
            "400": {"description": "A bad query parameter or body, named in `field`", "content": error},
            "401": {"description": "No, unknown, expired or revoked bearer token (`unauthenticated`)",
                    "content": error},
            "404": {"description": "No such resource", "content": error},
            "503": {"description": "This process is not leading (standby)", "content": error},
        },
    }


def _parameter(param: Param) -> dict[str, Any]:
    one: dict[str, Any] = {"type": "integer"} if param.integer else {"type": "string"}
    if param.values:
        one["enum"] = list(param.values)
    schema = {"type": "array", "items": one} if param.repeated else one
    return {"name": param.name, "in": "query", "required": False, "description": param.description,
            "schema": schema, **({"explode": True} if param.repeated else {})}
