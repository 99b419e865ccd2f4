"""The read API (``fleetlog.api``) over real HTTP: listing 10,000 queued jobs.

An embedded service (file log, ``fsync = "never"``) runs in this process on uvloop, as
``fleetlog run`` does.  ``jobs`` jobs (10,000; 200 at ``--smoke``) of one 1-GPU task, spread
over 10 tenants, are POSTed to ``/v1/events`` (JSON arrays of 1,000) into a fleet of no nodes,
so every one stays pending (the ingest's never-fits check, 422, judges a job against the nodes
it knows: with none it accepts).  Once the service has folded and committed them all, one
``aiohttp.ClientSession`` (one keep-alive connection) times request after request, from sending
it to the answer read whole and decoded with the standard library's ``json.loads`` (what a
generic client does):

* ``list_10k_p50_ms`` / ``list_10k_p99_ms``: ``GET /v1/jobs?state=pending&limit=10000``, every
  job in one page; ``list_10k_bytes`` its body;
* ``list_page_1k_p50_ms``: ``GET /v1/jobs`` (the default limit, 1,000: the first page);
* ``filtered_tenant_p50_ms``: ``GET /v1/jobs?tenant=t3`` (a tenant's tenth of the jobs).

Each is warmed up (3 requests, not counted), then timed ``requests`` times (200; 50 at
``--quick``, 3 at ``--smoke``).  The baseline, in the same process on the service's live state,
one call after each timed 10k request (in turn, so that the shared machine's drifting load falls
on both alike): ``jobs_table_10k_ms``, the median of ``fleetlog.core.views.jobs_table(state)``
(the jobs table of ``fleetlog replay state-at``: the same rows as Python dicts, no HTTP, no
JSON), and ``list_vs_jobs_table`` = ``list_10k_p50_ms`` / ``jobs_table_10k_ms``.  Where the time of a list
goes: ``list_jobs_10k_ms`` (``fleetlog.api.resources.list_jobs`` plus ``msgspec`` encoding, what
the route does, in-process, timed the same way) and ``client_decode_10k_ms`` (the client's
``json.loads``); the rest is HTTP.  Client and service share one process and one event loop,
as they would not in use: the client's decode time is counted in the latency, and not
overlapped with the service's work.

Target (the issue): 10,000 queued jobs listed in under 200 ms (``target_met_p50``,
``target_met_p99``: whether the median and the p99 are).  The issue's
``watch_decisions_per_s`` and ``throughput_ratio_with_watchers`` wait for the watch endpoint,
which does not exist yet: they are not measured, and not printed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

import aiohttp
import msgspec
import structlog
import uvloop

from benchmarks.common import emit, machine, parse
from fleetlog.api.resources import list_jobs
from fleetlog.core.views import jobs_table
from fleetlog.events import JobSubmitted, TaskGroup, encode, envelope
from fleetlog.log.location import LogConfig
from fleetlog.service.config import Config, ServiceSettings
from fleetlog.service.service import Service

TENANTS: Final = 10
POST_BATCH: Final = 1000
WARM_UP: Final = 3
TARGET_MS: Final = 200.0


def _jobs(n: int) -> list[JobSubmitted]:
    group = TaskGroup(count=1, cpu_milli=1000, mem_mib=1024, gpu_count=1, gpu_milli=1000)
    return [JobSubmitted(job_id=f"bench-{i:06d}", tenant=f"t{i % TENANTS}", task_groups=(group,))
            for i in range(n)]


def _body(events: list[JobSubmitted]) -> bytes:
    return b"[" + b",".join(encode(envelope(e, "bench"), "json") for e in events) + b"]"


async def _until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"benchmarks.api: {what} not reached in {timeout_s:.0f} s")
        await asyncio.sleep(0.02)


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def _p50_p99(seconds: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(seconds, n=100, method="inclusive")
    return _ms(q[49]), _ms(q[98])


async def _timed(
    session: aiohttp.ClientSession, url: str, params: dict[str, str], requests: int,
    between: Mapping[str, Callable[[], object]] | None = None,
) -> tuple[dict[str, list[float]], Any]:
    """``requests`` GETs after the warm-up, each followed by one call of each of ``between`` (in
    turn with the requests, so that a shared machine's drifting load falls on both alike): the wall
    times in seconds of the requests (``"get"``), of their client decode (``"decode"``) and of each
    of ``between``; and the last answer, decoded, with its size in bytes under ``"bytes"``."""
    samples: dict[str, list[float]] = {"get": [], "decode": [], **{name: [] for name in between or {}}}
    answer: Any = None
    for i in range(WARM_UP + requests):
        started = time.perf_counter()
        async with session.get(url, params=params) as response:
            body = await response.read()
            status = response.status
        read = time.perf_counter()
        answer = json.loads(body)
        done = time.perf_counter()
        if status != 200:
            raise SystemExit(f"benchmarks.api: GET {url} {params} answered {status}: {answer}")
        if i >= WARM_UP:
            samples["get"].append(done - started)
            samples["decode"].append(done - read)
        for name, work in (between or {}).items():
            started = time.perf_counter()
            work()
            if i >= WARM_UP:
                samples[name].append(time.perf_counter() - started)
    answer["bytes"] = len(body)
    return samples, answer


async def _submit(url: str, session: aiohttp.ClientSession, jobs: list[JobSubmitted]) -> None:
    for first in range(0, len(jobs), POST_BATCH):
        body = _body(jobs[first:first + POST_BATCH])
        async with session.post(url + "/v1/events", data=body,
                                headers={"Content-Type": "application/json"}) as response:
            answer = await response.read()
            if response.status != 200:
                raise SystemExit(f"benchmarks.api: ingest answered {response.status}: {answer[:500]!r}")


async def _measure(service: Service, n: int, requests: int) -> dict[str, Any]:
    loop = service.loop
    assert loop is not None
    url = f"http://127.0.0.1:{service.http.port}"
    async with aiohttp.ClientSession() as session:
        await _submit(url, session, _jobs(n))
        await _until(lambda: loop.offset == n and loop.committed == n, 600, f"{n} jobs folded and committed")
        state = loop.state
        if len(jobs_table(state)) != n:
            raise SystemExit("benchmarks.api: jobs_table does not list every job")
        query = {"state": ["pending"], "limit": [str(n)]}
        in_process = {"jobs_table": lambda: jobs_table(state),
                      "list_jobs": lambda: msgspec.json.encode(list_jobs(state, query))}
        full, page = await _timed(session, url + "/v1/jobs", {"state": "pending", "limit": str(n)}, requests,
                                  in_process)
        if (len(page["items"]), page["total"], page["next_page_token"]) != (n, n, None):
            raise SystemExit(f"benchmarks.api: the full list has {len(page['items'])} of {n} jobs")
        size = page["bytes"]
        first, page = await _timed(session, url + "/v1/jobs", {}, requests)
        if len(page["items"]) != min(n, 1000):
            raise SystemExit(f"benchmarks.api: the first page has {len(page['items'])} jobs")
        tenant, page = await _timed(session, url + "/v1/jobs", {"tenant": "t3"}, requests)
        if page["total"] != n // TENANTS or {j["tenant"] for j in page["items"]} != {"t3"}:
            raise SystemExit(f"benchmarks.api: tenant t3 has {page['total']} jobs, not {n // TENANTS}")
    table_s = statistics.median(full["jobs_table"])
    p50, p99 = _p50_p99(full["get"])
    return {
        "list_10k_p50_ms": p50,
        "list_10k_p99_ms": p99,
        "list_10k_max_ms": _ms(max(full["get"])),
        "list_10k_bytes": size,
        "list_page_1k_p50_ms": _p50_p99(first["get"])[0],
        "filtered_tenant_p50_ms": _p50_p99(tenant["get"])[0],
        "filtered_tenant_jobs": n // TENANTS,
        "jobs_table_10k_ms": _ms(table_s),
        "list_vs_jobs_table": round(p50 / (table_s * 1000), 3),
        "list_jobs_10k_ms": _ms(statistics.median(full["list_jobs"])),
        "client_decode_10k_ms": _ms(statistics.median(full["decode"])),
        "target_ms": TARGET_MS,
        "target_met_p50": p50 < TARGET_MS,
        "target_met_p99": p99 < TARGET_MS,
    }


async def run(n: int, requests: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        config = Config(log=LogConfig(dir=str(Path(tmp) / "log"), fsync="never"),
                        service=ServiceSettings(http_port=0, idle_wait_ms=20))
        service = Service(config)
        task = asyncio.create_task(service.run())
        try:
            await _until(lambda: service.loop is not None or task.done(), 120, "the service leading")
            if task.done():
                task.result()
                raise SystemExit("benchmarks.api: the service stopped before it led")
            return await _measure(service, n, requests)
        finally:
            service.stop()
            await asyncio.wait_for(task, 60)


def main() -> None:
    args = parse(__doc__ or "")
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr),
                        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    n, requests = (200, 3) if args.smoke else (10_000, 50) if args.quick else (10_000, 200)
    size = "smoke" if args.smoke else "quick" if args.quick else "full"
    started = time.perf_counter()
    measured = uvloop.run(run(n, requests))
    result: dict[str, Any] = {
        "benchmark": "api", "size": size, "machine": machine(), "jobs": n, "tenants": TENANTS,
        "requests": requests, **measured, "wall_s": round(time.perf_counter() - started, 1),
    }
    emit(result, args.json)


if __name__ == "__main__":
    main()
