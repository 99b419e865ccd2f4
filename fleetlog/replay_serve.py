"""``fleetlog replay serve``: the read API (docs/api.md) of recorded logs, at any point.

Every list (``/v1/jobs``, ``/v1/nodes``, ``/v1/tenants``, ``/v1/queues``, ``/v1/cells``) and
``/v1/jobs/JOB`` takes ``at=OFFSET|TIME`` (an inputs offset, epoch milliseconds ``…ms`` or an ISO
8601 time, as ``replay state-at`` takes them; default: the end of the logs, looked up on each
request) and answers what the live service answered at that point: the same functions over the
state ``replay state-at`` folds (newest snapshot, then the tail).  The answer's
``Fleetlog-Offset`` header names the inputs offset it is at.  The last few states are kept, so
paging through one point folds it once.  Writes (ingest, quotas) and the watch are the live
service's: here they are 404 ``not_served``.

``/v1/history`` (fleetlog.api.history) is served here only: ``fleetlog history``'s records
(:func:`fleetlog.replay.history.account`, one replay of the retained logs to their end) with its
filters, paged.  The records the filters keep are kept for the end offset they were folded to
(one list), so paging through them replays once; a grown log or other filters fold again.

It lives outside :mod:`fleetlog.replay` because it serves HTTP (the service's server), which
replay never imports; replay's ``serve`` subcommand calls :func:`serve_logs`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from collections import OrderedDict
from typing import Final

from fleetlog.api.detail import job_detail
from fleetlog.api.dryrun import dry_run, parse_jobs
from fleetlog.api.history import Finished, HistoryQuery, history_page, history_query
from fleetlog.api.resources import ApiError
from fleetlog.api.routes import LISTS, answer_list, openapi, route_for
from fleetlog.core.policy import Policy, UnknownPolicyError, policy_named
from fleetlog.core.state import State
from fleetlog.log.base import INPUTS
from fleetlog.replay import source as src
from fleetlog.replay.history import Filters, account, log_time_ms
from fleetlog.replay.source import ReplayError, Source
from fleetlog.replay.state_at import Point, resolve, state_at
from fleetlog.replay.terminal import parse_point
from fleetlog.service.auth import is_loopback
from fleetlog.service.config import ServiceSettings
from fleetlog.service.http import BindError, HttpServer, Request, Response, json_response, refusal, unrouted

KEPT: Final = 4
"""States kept for the next requests (by inputs offset)."""
DRY_RUN_MAX_TASKS: Final = ServiceSettings().max_request_tasks
"""Tasks of all the jobs of one dry run: the service's default bound (more: 413 ``too_many_tasks``)."""


class LogApi:
    """The read routes over the states of ``source``."""

    def __init__(self, source: Source, policy: Policy | None = None, sharded: bool = False) -> None:
        self.source, self.policy = source, policy or policy_named("default")
        self.sharded = sharded
        """One shard of a deployment with a ``[cells]`` map: no history (``fleetlog history``'s refusal)."""
        self.states: OrderedDict[int, State] = OrderedDict()
        self.history: tuple[tuple[int, Filters], list[Finished]] | None = None
        """(inputs end offset, filters) -> the records they keep: the last history folded."""
        self._lock = asyncio.Lock()  # one fold at a time: a second request for it waits, then reuses it

    async def state(self, at: list[str]) -> tuple[int, State]:
        if len(at) > 1:
            raise ApiError(400, "invalid_value", f"at given {len(at)} times: give it once", "at")
        try:
            end = Point(offset=await src.end_offset(self.source.store, INPUTS))
            point = parse_point(at[0]) if at else end
            offset = await resolve(self.source, point)
        except ReplayError as exc:
            raise ApiError(400, "invalid_value", f"at={at[0]!r}: {exc}", "at") from None
        async with self._lock:
            if offset not in self.states:
                self.states[offset] = (await state_at(self.source, Point(offset=offset))).state
                while len(self.states) > KEPT:
                    self.states.popitem(last=False)
            self.states.move_to_end(offset)
            return offset, self.states[offset]

    async def records(self, query: HistoryQuery) -> tuple[int, list[Finished]]:
        """(the inputs end offset, every record ``query``'s filters keep up to it), in the order
        the jobs ended: folded once per end offset and filters."""
        filters = Filters(query.tenants, query.queues, query.states, query.since_ms, query.until_ms)
        async with self._lock:
            end = await src.end_offset(self.source.store, INPUTS)
            if self.history is None or self.history[0] != (end, filters):
                found: list[Finished] = []
                await account(self.source, found.append, filters, stop=end)
                self.history = (end, filters), found
            return end, self.history[1]

    async def answer_history(self, request: Request) -> Response:
        """``GET /v1/history``: a page of ``fleetlog history``'s records."""
        if self.sharded:
            return refusal(404, "not_served", "GET /v1/history reads a single-shard log, as `fleetlog "
                           "history` does: this deployment has a [cells] map, whose jobs' events are split "
                           "across the dispatcher's and the cells' partitions (not supported yet)")
        try:
            query = history_query(request.query, _log_time_ms)
            end, found = await self.records(query)
        except ApiError as exc:
            return refusal(exc.status, exc.code, exc.message, exc.field)
        page = history_page(found, query.start, query.limit)
        return json_response(200, page, {"Fleetlog-Offset": str(end)})

    async def handle(self, request: Request) -> Response:
        route, found, elsewhere = route_for(request.method, request.raw_path or request.path)
        if route is None:
            return unrouted(request, elsewhere)
        if route.path == "/v1/openapi.json":
            return json_response(200, openapi())
        if route.path == "/v1/history":
            return await self.answer_history(request)
        if route.path not in LISTS and route.path not in SERVED:
            return refusal(404, "not_served", f"{route.method} {route.path} is the live service's: replay "
                           "serve answers the reads of recorded logs")
        query = dict(request.query)
        try:
            offset, state = await self.state(query.pop("at", []))
            headers = {"Fleetlog-Offset": str(offset)}
            if route.path in LISTS:
                return json_response(200, answer_list(state, route.path, query), headers)
            if route.path == "/v1/nodes/{node}":  # (answered as the lists are: its path as sent)
                node = answer_list(state, request.raw_path or request.path, query)
                return json_response(200, node, headers)
            if route.path == "/v1/dry-run":
                jobs = parse_jobs(request.body, max_tasks=DRY_RUN_MAX_TASKS)  # (bounded as the service's)
                return json_response(200, dry_run(state, self.policy, jobs), headers)
        except ApiError as exc:
            return refusal(exc.status, exc.code, exc.message, exc.field)
        status = job_detail(state, found["job_id"])
        if status is None:
            return refusal(404, "unknown_job", f"no job {found['job_id']!r} at inputs offset {offset}")
        return json_response(200, status, headers)


def _log_time_ms(text: str) -> int:
    """``fleetlog history --since``'s parser, its refusal a :class:`ValueError` (for the API)."""
    try:
        return log_time_ms(text)
    except ReplayError as exc:
        raise ValueError(str(exc)) from None


SERVED: Final = ("/v1/jobs/{job_id}", "/v1/nodes/{node}", "/v1/dry-run")
"""What replay serve answers besides the lists and history."""


async def serve_logs(args: argparse.Namespace, source: Source) -> int:
    """Serve until SIGINT or SIGTERM (exit 0); the address on stdout (``--json``: one object)."""
    try:
        policy = policy_named(getattr(args, "policy", None) or "default")
    except UnknownPolicyError as exc:
        raise ReplayError(f"--policy: {str(exc).strip(chr(34) + chr(39))}") from None
    if not is_loopback(args.http_host):  # no tokens here: a public bind would serve the logs to anyone
        raise ReplayError(f"--http-host {args.http_host}: replay serve has no authentication and listens on "
                          "loopback only (127.0.0.1, ::1, localhost); share it through an authenticating "
                          "proxy")
    api = LogApi(source, policy, sharded=getattr(args, "topology", None) is not None)
    server = HttpServer(api.handle, args.http_host, args.http_port)
    try:
        await server.start()
    except BindError as exc:  # a busy or unusable --http-port: one line, exit 2 (as fleetlog run)
        raise ReplayError(f"{exc} (--http-port)") from None
    where = f"http://{args.http_host}:{server.port}"
    if args.json:
        print(json.dumps({"serving": where, "logs": source.where}), flush=True)
    else:
        print(f"serving the read API of {source.where} at {where} (?at=OFFSET|TIME; Ctrl-C stops)",
              flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        await server.stop()
    print("stopped", file=sys.stderr)
    return 0
