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
``target_met_p99``: whether the median and the p99 are).

**Watch** (``GET /v1/watch``, Server-Sent Events).  Each run starts a fresh embedded service
(same settings) and POSTs a fleet of ``jobs / 8`` nodes of 8 GPUs; once it is folded, ``jobs``
jobs of one 1-GPU task (40,000; 20,000 at ``--quick``, 400 at ``--smoke``: every one fits) are
POSTed back to back in arrays of 10,000 (the ingest's bound, encoded beforehand), so that the
loop places them as fast as it can.  The service's throughput is ``jobs`` over the time from the
first POST to the append time (``timestamp_ms``) of the decision record published with the
commit of the last input (``loop.offset == loop.committed ==`` the inputs' end); every job must
be placed once.  Three modes, each run in turn and back (ABC CBA ABC CBA: 4 rounds; 2 at
``--quick``, 1 at ``--smoke``) after one uncounted run of A, and the median of each:

* A, no watcher: ``decisions_per_s_without_watchers``;
* B, ``WATCHERS`` (10) watchers in this process, on the service's event loop:
  ``fleetlog.reader.Reader.watch`` from the decisions log's end before the jobs (``from=<offset>``),
  each counting the decisions of every ``DecisionBatch`` change until it has them all: the suffix
  ``_in_process``.  Their decoding (JSON records of up to 10,000 placements) and their garbage
  run on the scheduler's own loop: a cost no deployment pays, measured to show it;
* C, the same 10 watchers in a child process (``python -c``, its own uvloop): the headline keys,
  without suffix.  A watcher is a client (``fleetlog jobs --watch``, a dashboard, a backend) in a
  process of its own; it shares the machine's two cores with the service, not its event loop.

For C and B: ``decisions_per_s_with_watchers``, ``throughput_ratio_with_watchers`` (C or B over A;
the issue's target is at least 0.9), ``watch_decisions_per_s`` (the decisions all 10 received,
over the time from the first POST until the last of them had all), ``watch_records_per_s`` (one
watcher's records over the same time, the median watcher), ``watch_records`` (records a watcher
received: one per decision step) and ``watch_lag_ms_p50``/``_p99`` (over every record at every
watcher: wall time on receipt minus the record's append time, the same machine's clock).  The
watchers connect before the first POST and read on until the service has stopped: a client that
drops a watch while the server waits on the log keeps its watcher slot, and the service closes its
log before its streams, so each ends with an error that aiohttp logs (``watch_streams_cut_at_stop``
counts them; their tracebacks are dropped).  The watchers' ``aiohttp`` session reads lines of up to
16 MiB (``READ_BUFSIZE``): one record is one ``data:`` line, 0.8 MB for a step of 10,000
placements, and aiohttp's default limit of 512 KiB fails it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import aclosing, asynccontextmanager
from pathlib import Path
from typing import Any, Final

import aiohttp
import msgspec
import structlog
import uvloop

from benchmarks.common import emit, machine, parse
from fleetlog.api.resources import list_jobs
from fleetlog.core.views import jobs_table
from fleetlog.events import JobSubmitted, NodeHeartbeat, TaskGroup, encode, envelope
from fleetlog.log.base import DECISIONS, LogClosedError
from fleetlog.log.location import LogConfig
from fleetlog.reader import Reader
from fleetlog.service.config import Config, ServiceSettings
from fleetlog.service.service import Service

TENANTS: Final = 10
POST_BATCH: Final = 1000
WARM_UP: Final = 3
TARGET_MS: Final = 200.0
WATCHERS: Final = 10
NODE_GPUS: Final = 8
WATCH_JOBS: Final = 40_000
INGEST_MAX: Final = 10_000
"""Events per ``POST /v1/events`` (the ingest's bound)."""
READ_BUFSIZE: Final = 8 << 20
"""The watchers' ``aiohttp`` read buffer: a line (one SSE ``data:`` line is one record, as JSON)
may be twice this.  aiohttp's default (256 KiB, lines up to 512 KiB) fails a record of a few
thousand placements with ``LineTooLong`` (see the README)."""


def _jobs(n: int) -> list[JobSubmitted]:
    group = TaskGroup(count=1, cpu_milli=1000, mem_mib=1024, gpu_count=1, gpu_milli=1000)
    return [JobSubmitted(job_id=f"bench-{i:06d}", tenant=f"t{i % TENANTS}", task_groups=(group,))
            for i in range(n)]


def _body(events: list[Any]) -> bytes:
    return b"[" + b",".join(encode(envelope(e, "bench"), "json") for e in events) + b"]"


async def _until(predicate: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.02) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"benchmarks.api: {what} not reached in {timeout_s:.0f} s")
        await asyncio.sleep(poll_s)


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
        cli = await _cli_tables(url, n, page_rounds(requests))
    table_s = statistics.median(full["jobs_table"])
    p50, p99 = _p50_p99(full["get"])
    return {
        **cli,
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


def page_rounds(requests: int) -> int:
    """Runs of each ``fleetlog jobs`` command: a process each, so fewer than the requests."""
    return 1 if requests <= 3 else 5


async def _cli_tables(url: str, n: int, rounds: int) -> dict[str, Any]:
    """``fleetlog jobs --url URL --limit N`` as a user runs it (a process of its own, stdout
    piped to a file) against the service: its wall time as a table (``cli_jobs_table_10k_s``:
    the issue's target is at most 1 s) and, the baseline, with ``-o json`` (the same read,
    no layout), in turn; medians.  Before, rich laid the table out in 27–34 s."""
    times: dict[str, list[float]] = {"table": [], "json": []}
    for _ in range(rounds):
        for output in ("table", "json"):
            started = time.perf_counter()
            with tempfile.TemporaryFile() as sink:
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "fleetlog.cli", "jobs", "--url", url, "--limit", str(n),
                    "-o", output, stdout=sink, stderr=asyncio.subprocess.PIPE)
                _, err = await proc.communicate()
                times[output].append(time.perf_counter() - started)
                sink.seek(0)
                lines = sink.read().count(b"\n")
            if proc.returncode != 0:
                raise SystemExit(f"benchmarks.api: fleetlog jobs -o {output} failed: {err.decode()[-500:]}")
            if output == "table" and lines != n + 1:  # the header and one line a job, nothing cut
                raise SystemExit(f"benchmarks.api: the jobs table has {lines} lines for {n} jobs")
    table, as_json = statistics.median(times["table"]), statistics.median(times["json"])
    return {"cli_jobs_table_10k_s": round(table, 3), "cli_jobs_json_10k_s": round(as_json, 3),
            "cli_table_vs_json": round(table / as_json, 3), "cli_rounds": rounds,
            "cli_target_met": table <= 1.0}


@asynccontextmanager
async def _serving() -> AsyncIterator[Service]:
    """An embedded service on a fresh file log in a temporary directory, leading; stopped after."""
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
            yield service
        finally:
            service.stop()
            await asyncio.wait_for(task, 60)


async def run(n: int, requests: int) -> dict[str, Any]:
    async with _serving() as service:
        return await _measure(service, n, requests)


# -- watch ----------------------------------------------------------------------------------


class _StreamsCutAtStop(logging.Filter):
    """Drops (and counts) aiohttp's "Error handling request" of a watch stream whose log read
    failed with ``LogClosedError``: the service closes its log store before its HTTP server, so
    every stream still open when it stops ends so (see the README).  Any other error passes."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], LogClosedError):
            self.count += 1
            return False
        return True


def _fleet(nodes: int) -> list[NodeHeartbeat]:
    return [NodeHeartbeat(cell="c1", node=f"n{i:05d}", cpu_milli=128_000, mem_mib=1_048_576,
                          gpu_count=NODE_GPUS, gpu_model="H100",
                          topology=("b0", f"r{i // 32:04d}", f"n{i:05d}")) for i in range(nodes)]


def _small_jobs(n: int) -> list[JobSubmitted]:
    """``n`` jobs of one 1-GPU task: a fleet of ``n / NODE_GPUS`` nodes holds them all."""
    group = TaskGroup(count=1, cpu_milli=1000, mem_mib=4096, gpu_count=1, gpu_milli=1000)
    return [JobSubmitted(job_id=f"w-{i:06d}", tenant=f"t{i % TENANTS}", task_groups=(group,))
            for i in range(n)]


def _bodies(events: list[Any]) -> list[bytes]:
    """``events`` as JSON arrays of at most :data:`INGEST_MAX`, the ingest's bound."""
    return [_body(events[first:first + INGEST_MAX]) for first in range(0, len(events), INGEST_MAX)]


async def _post(url: str, session: aiohttp.ClientSession, body: bytes) -> None:
    async with session.post(url + "/v1/events", data=body, headers={"Content-Type": "application/json"}) as r:
        answer = await r.read()
        if r.status != 200:
            raise SystemExit(f"benchmarks.api: ingest answered {r.status}: {answer[:500]!r}")


async def _watcher(url: str, start: int, expect: int, result: asyncio.Future[dict[str, Any]]) -> None:
    """One watcher (``fleetlog.reader.Reader.watch``) from decisions offset ``start``: once it has
    received ``expect`` decisions, ``result`` holds its counts, the wall time of its last change
    and each record's lag.  It reads on until cancelled, so that its stream ends with the service
    (a watch the client drops while the server waits on the log keeps its slot: see the README)."""
    decisions = records = 0
    lags: list[float] = []
    try:
        async with (aiohttp.ClientSession(read_bufsize=READ_BUFSIZE) as session,
                    Reader(url, session=session) as api, aclosing(api.watch(start=start)) as changes):
            async for change in changes:
                if result.done():
                    continue
                now = time.time()
                lags.append(now * 1000 - change.timestamp_ms)
                records += 1
                if change.type == "DecisionBatch" and change.event is not None:
                    decisions += len(change.event["decisions"])
                if decisions >= expect:
                    result.set_result({"decisions": decisions, "records": records, "last": now,
                                       "lags_ms": lags})
    except Exception as exc:
        if not result.done():
            result.set_exception(exc)
        raise


def _start_watchers(url: str, start: int, expect: int
                    ) -> tuple[list[asyncio.Task[None]], asyncio.Future[list[dict[str, Any]]]]:
    """``WATCHERS`` watcher tasks, and the future of their results (once each has them all)."""
    results = [asyncio.get_running_loop().create_future() for _ in range(WATCHERS)]
    tasks = [asyncio.create_task(_watcher(url, start, expect, r)) for r in results]
    return tasks, asyncio.ensure_future(asyncio.gather(*results))


async def _stop(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _child(url: str, start: int, expect: int) -> None:
    tasks, results = _start_watchers(url, start, expect)
    try:
        print(json.dumps(await results), flush=True)
        await asyncio.gather(*tasks)  # (until the parent, its service stopped, ends this process)
    finally:
        await _stop(tasks)


def child(argv: list[str]) -> None:
    """The out-of-process watchers (``python -c``, see :data:`CHILD`): ``WATCHERS`` of them on their
    own uvloop; one JSON list of their results on stdout once each has every decision."""
    uvloop.run(_child(argv[0], int(argv[1]), int(argv[2])))


CHILD: Final = "import sys; from benchmarks.api import child; child(sys.argv[1:])"


async def _decide_run(mode: str, nodes: int, jobs: int) -> dict[str, Any]:
    """One run on a fresh service: ``nodes`` heartbeats, then (with ``mode``'s watchers attached
    from the decisions log's end: none, in this process, in a child process) ``jobs`` small jobs
    POSTed back to back; the service's decisions/s from the first POST to the append time of the
    decisions that cover the last input, and what the watchers received."""
    tasks: list[asyncio.Task[None]] = []
    process: asyncio.subprocess.Process | None = None
    try:
        async with _serving() as service, aiohttp.ClientSession() as session:
            loop, store = service.loop, service.store
            assert loop is not None
            assert store is not None
            url = f"http://127.0.0.1:{service.http.port}"
            for body in _bodies(_fleet(nodes)):
                await _post(url, session, body)
            await _until(lambda: loop.offset == nodes and loop.committed == nodes, 120, "the fleet folded")
            decisions_log = store.log(DECISIONS)
            start = await decisions_log.end_offset()
            bodies = _bodies(_small_jobs(jobs))
            before = service.metrics.decisions._value.get()
            watching: asyncio.Future[list[dict[str, Any]]] | None = None
            line: asyncio.Future[bytes] | None = None
            if mode == "in_process":
                tasks, watching = _start_watchers(url, start, jobs)
            elif mode == "out_of_process":
                process = await asyncio.create_subprocess_exec(
                    sys.executable, "-c", CHILD, url, str(start), str(jobs), stdout=asyncio.subprocess.PIPE)
                assert process.stdout is not None
                line = asyncio.ensure_future(process.stdout.readline())
            ready = watching or line
            if ready is not None:  # (a child that failed has written its line, empty)
                await _until(lambda: service.watchers.count == WATCHERS or ready.done(), 120,
                             f"{WATCHERS} watchers connected")
            started = time.time()
            for body in bodies:
                await _post(url, session, body)
            end = nodes + jobs
            await _until(lambda: loop.offset == end and loop.committed == end, 600, f"{jobs} jobs decided",
                         poll_s=0.005)
            (last,) = await decisions_log.read(await decisions_log.end_offset() - 1, 1)
            seconds = last.timestamp_ms / 1000 - started
            decided = service.metrics.decisions._value.get() - before
            if decided != jobs:
                raise SystemExit(f"benchmarks.api: {decided} decisions for {jobs} jobs (each is placed)")
            got: list[dict[str, Any]] = []
            if watching is not None:
                got = await asyncio.wait_for(watching, 600)
            if line is not None:
                got = json.loads(await asyncio.wait_for(line, 600) or b"[]")
                if not got:
                    raise SystemExit("benchmarks.api: the watchers' child process failed")
    finally:  # the service has stopped (ending the streams): now the watchers
        await _stop(tasks)
        if process is not None and process.returncode is None:
            process.kill()
            await process.wait()
    return {"decisions_per_s": jobs / seconds, "seconds": seconds, **_received(got, jobs, started)}


def _received(got: list[dict[str, Any]], jobs: int, started: float) -> dict[str, float]:
    """What the watchers received, from ``started`` (wall time of the first POST): all of them
    together, decisions/s until the last one had all; each one's records/s (median); the lag of
    every record at every watcher (p50, p99)."""
    if not got:
        return {}
    if [w["decisions"] for w in got] != [jobs] * WATCHERS:
        raise SystemExit(f"benchmarks.api: watchers received {[w['decisions'] for w in got]} of {jobs}")
    lags = sorted(lag for w in got for lag in w["lags_ms"])
    last_s = max(w["last"] for w in got) - started
    return {"watch_decisions_per_s": sum(w["decisions"] for w in got) / last_s,
            "watch_records_per_s": statistics.median(w["records"] / (w["last"] - started) for w in got),
            "records": statistics.median(w["records"] for w in got),
            "lag_p50_ms": _quantile(lags, 0.5), "lag_p99_ms": _quantile(lags, 0.99)}


def _quantile(ordered: list[float], q: float) -> float:
    """The nearest-rank ``q`` quantile of an ascending list."""
    return float(ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))])


MODES: Final = ("none", "in_process", "out_of_process")


async def run_watch(nodes: int, jobs: int, rounds: int, warm_up: bool) -> dict[str, Any]:
    """``rounds`` rounds of the three modes, in turn and back (ABC CBA ABC...), each run on a fresh
    service; the medians per mode."""
    cut = _StreamsCutAtStop()
    logging.getLogger("fleetlog.http").addFilter(cut)  # (the service's aiohttp server logger)
    if warm_up:
        await _decide_run("none", nodes, jobs)
    order = [m for r in range(rounds) for m in (MODES if r % 2 == 0 else MODES[::-1])]
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    for mode in order:
        runs[mode].append(await _decide_run(mode, nodes, jobs))

    def med(mode: str, key: str) -> float:
        return float(statistics.median(r[key] for r in runs[mode]))

    alone = med("none", "decisions_per_s")
    out: dict[str, Any] = {"watchers": WATCHERS, "watch_nodes": nodes, "watch_jobs": jobs,
                           "watch_rounds": rounds, "decisions_per_s_without_watchers": round(alone)}
    for mode, suffix in (("out_of_process", ""), ("in_process", "_in_process")):
        out |= {
            f"watch_decisions_per_s{suffix}": round(med(mode, "watch_decisions_per_s")),
            f"watch_records_per_s{suffix}": round(med(mode, "watch_records_per_s"), 2),
            f"watch_records{suffix}": med(mode, "records"),
            f"watch_lag_ms_p50{suffix}": round(med(mode, "lag_p50_ms"), 1),
            f"watch_lag_ms_p99{suffix}": round(med(mode, "lag_p99_ms"), 1),
            f"decisions_per_s_with_watchers{suffix}": round(med(mode, "decisions_per_s")),
            f"throughput_ratio_with_watchers{suffix}": round(med(mode, "decisions_per_s") / alone, 3),
        }
    out["watch_streams_cut_at_stop"] = cut.count
    out["watch_runs"] = {m: [{k: round(v, 3) for k, v in r.items()} for r in runs[m]] for m in MODES}
    out["watch_order"] = "".join("ABC"[MODES.index(m)] for m in order)
    return out


def main() -> None:
    args = parse(__doc__ or "")
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr),
                        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    n, requests = (200, 3) if args.smoke else (10_000, 50) if args.quick else (10_000, 200)
    jobs, rounds = (400, 1) if args.smoke else (WATCH_JOBS // 2, 2) if args.quick else (WATCH_JOBS, 4)
    size = "smoke" if args.smoke else "quick" if args.quick else "full"
    started = time.perf_counter()
    measured = uvloop.run(run(n, requests))
    watched = uvloop.run(run_watch(jobs // NODE_GPUS, jobs, rounds, warm_up=not args.smoke))
    result: dict[str, Any] = {
        "benchmark": "api", "size": size, "machine": machine(), "jobs": n, "tenants": TENANTS,
        "requests": requests, **measured, **watched, "wall_s": round(time.perf_counter() - started, 1),
    }
    emit(result, args.json)


if __name__ == "__main__":
    main()
