"""``fleetlog replay serve``: the read API (docs/api.md) of recorded logs, at any point.

Every list (``/v1/jobs``, ``/v1/nodes``, ``/v1/tenants``, ``/v1/queues``, ``/v1/cells``) and
``/v1/jobs/JOB`` takes ``at=OFFSET|TIME`` (an inputs offset, epoch milliseconds ``…ms`` or an ISO
8601 time, as ``replay state-at`` takes them; default: the end of the logs, looked up on each
request) and answers what the live service answered at that point: the same functions over the
state ``replay state-at`` folds (newest snapshot, then the tail).  The answer's
``Fleetlog-Offset`` header names the inputs offset it is at.  The last few states are kept, so
paging through one point folds it once.  Writes (ingest, quotas) and the watch are the live
service's: here they are 404 ``not_served``.

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
from fleetlog.api.resources import ApiError
from fleetlog.api.routes import LISTS, answer_list, openapi, route_for
from fleetlog.core.policy import Policy, UnknownPolicyError, policy_named
from fleetlog.core.state import State
from fleetlog.log.base import INPUTS
from fleetlog.replay import source as src
from fleetlog.replay.source import ReplayError, Source
from fleetlog.replay.state_at import Point, resolve, state_at
from fleetlog.replay.terminal import parse_point
from fleetlog.service.auth import is_loopback
from fleetlog.service.http import HttpServer, Request, Response, json_response, refusal, unrouted

KEPT: Final = 4
"""States kept for the next requests (by inputs offset)."""


class LogApi:
    """The read routes over the states of ``source``."""

    def __init__(self, source: Source, policy: Policy | None = None) -> None:
        self.source, self.policy = source, policy or policy_named("default")
        self.states: OrderedDict[int, State] = OrderedDict()
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

    async def handle(self, request: Request) -> Response:
        route, found, elsewhere = route_for(request.method, request.raw_path or request.path)
        if route is None:
            return unrouted(request, elsewhere)
        if route.path == "/v1/openapi.json":
            return json_response(200, openapi())
        if route.path not in LISTS and route.path not in ("/v1/jobs/{job_id}", "/v1/dry-run"):
            return refusal(404, "not_served", f"{route.method} {route.path} is the live service's: replay "
                           "serve answers the reads of recorded logs")
        query = dict(request.query)
        try:
            offset, state = await self.state(query.pop("at", []))
            headers = {"Fleetlog-Offset": str(offset)}
            if route.path in LISTS:
                return json_response(200, answer_list(state, route.path, query), headers)
            if route.path == "/v1/dry-run":
                return json_response(200, dry_run(state, self.policy, parse_jobs(request.body)), headers)
        except ApiError as exc:
            return refusal(exc.status, exc.code, exc.message, exc.field)
        status = job_detail(state, found["job_id"])
        if status is None:
            return refusal(404, "unknown_job", f"no job {found['job_id']!r} at inputs offset {offset}")
        return json_response(200, status, headers)


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
    api = LogApi(source, policy)
    server = HttpServer(api.handle, args.http_host, args.http_port)
    await server.start()
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
