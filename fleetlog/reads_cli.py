"""``fleetlog jobs | nodes | queues | tenants | cells``: what the scheduler holds now, the way
``kubectl get`` or ``squeue`` shows it.

Each reads the running service's HTTP API (``--url``, or the service a file log's
``service.json`` announces) and otherwise folds the logs to their end (newest snapshot and the
tail, as ``fleetlog replay state-at`` does) and answers with the very same functions
(:mod:`fleetlog.api`): the output is the same either way.  ``-o json`` and ``-o yaml`` print what
the API answers (``/v1/openapi.json`` describes it); tables are for people, full width when piped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

import msgspec

from fleetlog.api.names import JOB_STATES, MAX_LIMIT, NODE_STATUSES
from fleetlog.auth_client import auth_headers, refused_why, tls_for, unreachable_why
from fleetlog.display import cell, describe, human_row, label, plain_table, terminal_width
from fleetlog.numerals import whole
from fleetlog.usage import add_log_options, url_argument

Fetch = Callable[[dict[str, list[str]]], dict[str, Any]]
"""One page of a list for a query (parameters with every value)."""
Locate = Callable[[argparse.Namespace], Any]


class Listing(msgspec.Struct, frozen=True):
    path: str
    help: str
    filters: tuple[tuple[str, str, tuple[str, ...]], ...]
    """(flag and query parameter, help, closed set of values or ())."""
    columns: tuple[str, ...]
    """The table's columns (``-o wide``: every field)."""


LISTINGS: Final = {
    "jobs": Listing(
        "/v1/jobs", "jobs: state, tenant, queue, placement or why they wait",
        (("tenant", "only this tenant's (repeat: any of them)", ()), ("queue", "only this queue's", ()),
         ("state", "only jobs in this state", JOB_STATES),
         ("reason", "only pending jobs with this reason", ()), ("cell", "only jobs placed in this cell", ()),
         ("node", "only jobs with a task placed on this node now", ()),
         ("label", "only jobs with this label, KEY=VALUE (repeat: all of them)", ())),
        ("job_id", "state", "tenant", "queue", "priority", "tasks", "gpu_milli", "node", "cell", "reason",
         "queue_position", "age_ms"),
    ),
    "nodes": Listing(
        "/v1/nodes", "nodes: status, capacity and what is free",
        (("cell", "only this cell's", ()), ("model", "only nodes with this GPU model", ()),
         ("status", "only nodes in this status", NODE_STATUSES)),
        ("node", "cell", "status", "gpu_model", "gpus", "gpu_free_milli", "cpu_free_milli", "mem_free_mib",
         "heard_ago_ms"),
    ),
    "queues": Listing("/v1/queues", "queues: pending, placed and running jobs, pending by reason", (),
                      ("queue", "pending", "placed", "placed_longest_ms", "running", "pending_gpu_milli",
                       "pending_by_reason")),
    "tenants": Listing(
        "/v1/tenants", "tenants: usage, quota, borrowing and DRF share", (),
        ("tenant", "running", "placed", "placed_longest_ms", "pending", "used_gpu_milli", "nominal_gpu_milli",
         "borrowed_gpu_milli", "dominant_share"),
    ),
    "cells": Listing("/v1/cells", "cells: nodes, capacity and GPU allocation by model", (),
                     ("cell", "nodes_up", "nodes_down", "gpus", "gpu_allocated_milli", "by_model")),
}


SORT_KEYS: Final = {"age": "age_ms", "priority": "priority", "gpus": "gpu_milli", "tasks": "tasks",
                    "tenant": "tenant", "queue": "queue", "state": "state", "cell": "cell", "node": "node",
                    "job_id": "job_id", "submitted": "submitted_at_ms"}
"""``jobs --sort-by`` fields, and the item field each sorts by (``node``: the table's NODE)."""

TABLE_ROWS: Final = 1_000
"""Rows a table shows unless ``--limit`` says otherwise (``-o json``/``yaml``: every item)."""


class ReadError(Exception):
    """A refused query or an unreachable ``--url``: one line, exit code 2."""


def add_read_commands(sub: Any, usage_error: type[Exception], locate: Locate) -> None:
    for name, listing in LISTINGS.items():
        parser = sub.add_parser(name, help=listing.help, description=f"List {listing.help}. " + (
            "Reads the running service's API (--url, or the one the file log announces), else the logs."))
        for flag, text, values in listing.filters:
            parser.add_argument(f"--{flag}", action="append", default=[], choices=values or None, help=text)
        if listing.path == "/v1/nodes":
            parser.add_argument("name", nargs="?", metavar="NODE", help="one node in detail: resources, "
                                "labels, taints, topology, drain, when last heard from, its jobs and tasks")
        if listing.path == "/v1/jobs":
            parser.add_argument("--sort-by", metavar="FIELD", type=_sort_key, help="sort the jobs by "
                                f"{', '.join(SORT_KEYS)} (-FIELD, as --sort-by=-age: largest first; "
                                "default: submission order)")
        if listing.path in ("/v1/jobs", "/v1/nodes"):
            parser.add_argument("--limit", type=_positive, help=f"at most this many (default: {TABLE_ROWS:,} "
                                "in a table, with a line saying how many more; all with -o json or yaml)")
        parser.add_argument("-o", "--output", choices=("table", "wide", "json", "yaml"), default="table",
                            help="table (default), wide (every field), json or yaml (what the API answers)")
        parser.add_argument("--json", action="store_const", const="json", dest="output", help="-o json")
        parser.add_argument("--url", metavar="URL", type=url_argument, help="the service's address (http[s]://host:port)")
        parser.add_argument("-w", "--watch", action="store_true",
                            help="then each item that changes, until Ctrl-C (needs the running service)")
        add_log_options(parser)
        parser.set_defaults(func=_command(name, listing, usage_error, locate))


def _sort_key(text: str) -> str:
    if text.removeprefix("-") not in SORT_KEYS:
        raise argparse.ArgumentTypeError(f"{text!r}: sort by one of {', '.join(SORT_KEYS)} "
                                         "(-FIELD: descending)")
    return text


def _positive(text: str) -> int:
    number = whole(text)  # (ASCII digits: "١" is not 1)
    if number is None or number < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return number


def _command(name: str, listing: Listing, usage_error: type[Exception], locate: Locate) -> Any:
    def run(args: argparse.Namespace) -> int:
        query = {flag: getattr(args, flag) for flag, _, _ in listing.filters if getattr(args, flag, None)}
        if getattr(args, "name", None):
            return _one_node(args, query, usage_error, locate)
        if hasattr(args, "limit") and args.limit is None and args.output in ("table", "wide"):
            args.limit = TABLE_ROWS  # (a person reads the first rows; scripts take -o json, whole)
        sort_by, show_rows = getattr(args, "sort_by", None), getattr(args, "limit", None)
        if sort_by and args.watch:
            raise usage_error("--sort-by sorts one listing; --watch prints each change as it comes")
        if sort_by:
            args.limit = None  # (sorted over every job, then cut: the oldest of all, not of the first page)
        try:
            if args.watch:
                return _watch(args, listing, query, locate)
            found = _read(args, listing.path, query, locate)
        except ReadError as exc:
            raise usage_error(f"{exc}") from None
        if sort_by:
            found = sorted_items(found, sort_by, show_rows)
        show(name, listing, found, args.output)
        return 0

    return run


def sorted_items(found: dict[str, Any], key: str, limit: int | None) -> dict[str, Any]:
    """``found``'s items sorted by ``key`` (:data:`SORT_KEYS`; ``-KEY``: descending), at most
    ``limit`` of them (``total`` unchanged: the "N more" line says what was cut).  Equal keys keep
    submission order; an item without the field (a pending job's node) comes last either way."""
    field, descending = SORT_KEYS[key.removeprefix("-")], key.startswith("-")

    def value(item: dict[str, Any]) -> Any:
        return node_text(item.get("nodes", [])) if field == "node" else item.get(field)

    present = [item for item in found["items"] if value(item) not in (None, "")]
    absent = [item for item in found["items"] if value(item) in (None, "")]
    items = sorted(present, key=value, reverse=descending) + absent
    cut = {"next_page_token": None} if "next_page_token" in found else {}
    return {**found, **cut, "items": items[:limit] if limit is not None else items}


def node_text(nodes: list[str]) -> str:
    """A job's NODE cell: its one node, or a gang's first and how many others (``n1 +3``)."""
    if not nodes:
        return ""
    return nodes[0] if len(nodes) == 1 else f"{nodes[0]} +{len(nodes) - 1}"


def _one_node(args: argparse.Namespace, query: dict[str, list[str]], usage_error: type[Exception],
              locate: Locate) -> int:
    """``fleetlog nodes NAME``: ``GET /v1/nodes/NAME`` (``--cell``: which cell's), described."""
    path = "/v1/nodes/" + urllib.parse.quote(args.name, safe="")
    if args.watch:
        raise usage_error("--watch follows the list of nodes: not with a NODE name")
    if set(query) - {"cell"} or len(query.get("cell", ())) > 1:
        raise usage_error("with a NODE name, only --cell (once) picks which cell's node")
    try:
        found = _read(args, path, query, locate, whole=True)
    except ReadError as exc:
        raise usage_error(f"{exc}") from None
    if args.output in ("json", "yaml"):
        show("node", LISTINGS["nodes"], found, args.output)
        return 0
    sys.stdout.write("\n".join(describe(node_facts(found))) + "\n")
    return 0


def node_facts(node: dict[str, Any]) -> dict[str, Any]:
    """A node's detail for people: labels, taints and topology as ``kubectl`` writes them, a line
    per job (its tasks on the node), and how many jobs of others it holds."""
    facts = {k: v for k, v in _readable(node).items() if k not in ("jobs", "other_jobs", "other_tasks")}
    jobs = [{"job": j["job_id"], "tenant": j["tenant"], "queue": j["queue"], "state": j["state"],
             "tasks": ", ".join(f"{t['task']} {t['state']} {cell('gpu_milli', t['gpu_milli'])} GPUs"
                                for t in j["tasks"])} for j in node.get("jobs", [])]
    facts["jobs"] = f"{len(jobs)}" + (f" (and {node['other_jobs']} of other tenants, {node['other_tasks']} "
                                      "task(s))" if node.get("other_jobs") else "")
    return {**facts, "on_it": jobs} if jobs else facts


def _readable(row: dict[str, Any]) -> dict[str, Any]:
    """A row for a table: a job's nodes as its NODE cell, a node's labels, taints and topology
    as ``kubectl`` writes them (``key=value``, ``key=value:Effect``)."""
    out = dict(row)
    if "nodes" in out or "job_id" in out:
        out["node"] = node_text(out.pop("nodes", []))
    if isinstance(out.get("labels"), dict):
        out["labels"] = ",".join(f"{k}={v}" for k, v in out["labels"].items())
    if isinstance(out.get("taints"), list):
        out["taints"] = ",".join(f"{t['key']}={t['value']}:{t['effect']}" for t in out["taints"])
    if isinstance(out.get("topology"), dict):
        out["topology"] = "/".join(out["topology"].values())
    return out


def _read(args: argparse.Namespace, path: str, query: dict[str, list[str]], locate: Locate,
          whole: bool = False) -> dict[str, Any]:
    """The list at ``path`` (every page, at most ``--limit``), or with ``whole`` the one object
    there (``/v1/nodes/NAME``), from the service or else the logs."""
    limit = getattr(args, "limit", None)
    gather: Callable[[Fetch], dict[str, Any]] = (lambda fetch: fetch(query)) if whole else (
        lambda fetch: collect(fetch, query, limit))
    place = None if args.url else locate(args)
    url = args.url or _announced(place)
    if url is not None:
        return gather(_http(url.rstrip("/") + path))
    if args.topology is not None:
        raise ReadError("with a [cells] map the state is split across shards: read the running "
                        "service's API (--url)")
    from fleetlog.replay import handlers
    from fleetlog.replay.source import ReplayError

    args.read_list = gather
    args.list_path = path
    assert place is not None
    try:
        asyncio.run(handlers.run("list", place, args))
    except ReplayError as exc:
        raise ReadError(str(exc)) from None
    found: dict[str, Any] = args.listed
    return found


def _watch(args: argparse.Namespace, listing: Listing, query: dict[str, list[str]], locate: Locate) -> int:
    """``--watch`` (fleetlog.reads_watch): the list, then each item that changes, one line each."""
    from fleetlog.reads_watch import ReaderError, follow, line

    if args.output == "yaml":
        raise ReadError("--watch prints a line per change: -o table, wide or json")
    url = args.url or _announced(locate(args))
    if url is None:
        raise ReadError("--watch follows the running service: give --url, or the --log a service holds")
    fetch = _http(url.rstrip("/") + listing.path)
    found = collect(fetch, query, getattr(args, "limit", None))
    as_json = args.output == "json"
    rows = [flat(item) if as_json else _readable(flat(item)) for item in found["items"]]
    columns = list(rows[0]) if rows and args.output == "wide" else list(listing.columns)
    widths = {c: max([len(_header(c))] + [len(next(iter(human_row({c: r.get(c)}).values()))) for r in rows])
              for c in columns}
    if not as_json:
        print("  ".join(_header(c).ljust(widths[c]) for c in columns).rstrip())
    for row in rows:
        print(line(row, columns, widths, as_json), flush=True)

    def emit(items: list[dict[str, Any]]) -> None:
        for item in items:
            row = flat(item) if as_json else _readable(flat(item))
            print(line(row, columns, widths, as_json), flush=True)

    try:
        asyncio.run(follow(url, lambda: collect(fetch, query, getattr(args, "limit", None)), found, emit))
    except ReaderError as exc:
        raise ReadError(str(exc)) from None
    return 0


_SHORT: Final = {"queue_position": "POS"}
"""Headers shorter than their field's name."""


def _header(column: str) -> str:
    return _SHORT.get(column) or label(column).upper()


def _announced(place: Any) -> str | None:
    """The service a file log's ``service.json`` announces, while its process lives."""
    if not isinstance(place, Path):
        return None
    from fleetlog.log.discovery import announced

    found = announced(place)
    return None if found is None else found.url


def _http(url: str) -> Fetch:
    def fetch(query: dict[str, list[str]]) -> dict[str, Any]:
        where = url + ("?" + urllib.parse.urlencode(query, doseq=True) if query else "")
        return call_api(where, url)

    return fetch


def call_api(where: str, url: str, body: bytes | None = None, verb: str = "read") -> dict[str, Any]:
    """The JSON answer of the API at ``where`` (``body``: POSTed as JSON), with the token and (for
    ``https://``) the TLS files the environment names; a refusal or an unreachable ``url`` is a
    :class:`ReadError` of one line."""
    headers = {"content-type": "application/json", **auth_headers()} if body is not None else auth_headers()
    try:
        with urllib.request.urlopen(urllib.request.Request(where, data=body, headers=headers),
                                    timeout=30, context=tls_for(where)) as answer:
            found: dict[str, Any] = json.loads(answer.read())
            return found
    except urllib.error.HTTPError as exc:
        raise ReadError(f"{url} answered {exc.code}: {refused_why(exc.code, _message(exc.read()))}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ReadError(f"cannot {verb} {url}: {unreachable_why(url, getattr(exc, 'reason', exc))}") from None


def _message(body: bytes) -> str:
    try:
        return str(json.loads(body)["message"])
    except (ValueError, KeyError, TypeError):
        return body[:200].decode(errors="replace")


def collect(fetch: Fetch, query: Mapping[str, list[str]], limit: int | None = None) -> dict[str, Any]:
    """Every page of a list (at most ``limit`` items), as one answer of the API's shape:
    ``total`` and ``next_page_token`` kept for a paged list (the token set when ``limit`` cut it)."""
    items: list[Any] = []
    token: str | None = None
    while True:
        ask = dict(query)
        if token is not None:
            ask["page_token"] = [token]
        if limit is not None:
            ask["limit"] = [str(min(MAX_LIMIT, limit - len(items)))]
        page = fetch(ask)
        items += page["items"]
        if "next_page_token" not in page:  # (one page, whole: /v1/policy's source and reason too)
            return {**page, "items": items}
        token = page["next_page_token"]
        if token is None or (limit is not None and len(items) >= limit):
            return {"items": items, "total": page["total"], "next_page_token": token}


def show(name: str, listing: Listing, found: dict[str, Any], output: str) -> None:
    if output == "json":
        print(json.dumps(found))
        return
    if output == "yaml":
        sys.stdout.write(msgspec.yaml.encode(found).decode())
        return
    rows = [_readable(flat(item)) for item in found["items"]]
    columns = list(rows[0]) if rows and output == "wide" else list(listing.columns)
    cells = [list(human_row({c: row.get(c) for c in columns}).values()) for row in rows]
    lines = plain_table([_header(c) for c in columns], cells, terminal_width())
    total = found.get("total")
    if total is not None and total > len(rows):
        lines.append(f"({len(rows):,} of {total:,} {name} shown, {total - len(rows):,} more: --limit N shows "
                     "more, -o json all)")
    sys.stdout.write("\n".join(lines) + "\n")


def flat(item: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested objects of one item as columns: ``used.gpu_milli`` -> ``used_gpu_milli``, except a
    map keyed by names (``by_model``, ``pending_by_reason``), shown whole."""
    out: dict[str, Any] = {}
    for key, value in item.items():
        if isinstance(value, Mapping) and key in ("used", "nominal", "borrowing_limit", "borrowed"):
            out |= flat(value, f"{prefix}{key}_")
        elif value is None and key in ("nominal", "borrowing_limit"):
            out |= {f"{prefix}{key}_{r}": None for r in ("cpu_milli", "mem_mib", "gpu_milli")}
        else:
            out[prefix + key] = value
    return out


def attach_replay_serve(sub: Any) -> None:
    """Give ``fleetlog replay serve`` (registered by fleetlog.replay.command) its HTTP server,
    imported only when it runs (fleetlog.replay_serve; replay itself imports no server)."""
    replay = sub.choices["replay"]
    for action in replay._actions:
        if isinstance(action, argparse._SubParsersAction) and "serve" in action.choices:
            action.choices["serve"].set_defaults(serve=_serve_logs)


async def _serve_logs(args: argparse.Namespace, source: Any) -> int:
    from fleetlog.replay_serve import serve_logs

    return await serve_logs(args, source)
