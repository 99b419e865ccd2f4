"""HTTP ingest of ``fleetlog run --log DIR``: requests and events per second through the server.

The service runs as a child process (embedded file log, ``fsync = "never"``, or ``--fsync``: what an
ingest 200 costs when it is on disk, issue 46); this process posts
JSON arrays of node heartbeats (``--events`` per request) from ``--clients`` threads with the
standard library's ``http.client`` (one connection per request, as ``fleetlog submit`` does), and
times ``--requests`` requests per round, and the CPU time the service process spends per request
(from ``/proc``: what a busy shared machine disturbs least).  The median of ``--repeats`` rounds
is reported, with each request's latency (median and p99 over the rounds), and the time
``/healthz`` takes to answer while the load runs (median and max of one probe per 50 ms).
``--smoke`` (CI): 8 requests, one round — a test that it runs.
"""

from __future__ import annotations

import argparse
import http.client
import os
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.common import add_smoke, emit, machine
from fleetlog.events import NodeHeartbeat, encode, envelope
from tests.service.process import ServiceProcess


def _body(round_no: int, request: int, events: int) -> bytes:
    beats = [
        NodeHeartbeat(cell="c1", node=f"n{request % 500}-{i}", cpu_milli=96_000, mem_mib=786_432, gpu_count=8,
                      gpu_model="A100", topology=("b1", f"r{i % 8}", f"n{request % 500}-{i}"))
        for i in range(events)
    ]
    return b"[" + b",".join(encode(envelope(b, f"bench-{round_no}"), "json") for b in beats) + b"]"


def _post(host: str, port: int, body: bytes, latencies: list[float] | None = None) -> int:
    started = time.perf_counter()
    conn = http.client.HTTPConnection(host, port, timeout=60)
    try:
        conn.request("POST", "/v1/events", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()
        if latencies is not None:
            latencies.append(time.perf_counter() - started)


def _health_probe(host: str, port: int, stop: threading.Event, seconds: list[float]) -> None:
    while not stop.is_set():
        started = time.perf_counter()
        conn = http.client.HTTPConnection(host, port, timeout=60)
        try:
            conn.request("GET", "/healthz")
            conn.getresponse().read()
        finally:
            conn.close()
        seconds.append(time.perf_counter() - started)
        stop.wait(0.05)


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (less noisy than wall time on a shared
    machine)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _round(host: str, port: int, args: argparse.Namespace, round_no: int
           ) -> tuple[float, list[float], float]:
    bodies = [_body(round_no, i, args.events) for i in range(args.requests)]
    stop, health = threading.Event(), []
    probe = threading.Thread(target=_health_probe, args=(host, port, stop, health))
    probe.start()
    cpu = _cpu_s(args.pid)
    started = time.perf_counter()
    with ThreadPoolExecutor(args.clients) as pool:
        statuses = list(pool.map(lambda b: _post(host, port, b, args.latencies), bodies))
    elapsed = time.perf_counter() - started
    cpu_ms = (_cpu_s(args.pid) - cpu) * 1000 / args.requests
    stop.set()
    probe.join()
    if set(statuses) != {200}:
        raise SystemExit(f"ingest answered {sorted(set(statuses))}")
    return args.requests / elapsed, health, cpu_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, allow_abbrev=False)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--events", type=int, default=50, help="events per request")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--fsync", choices=("never", "batch", "always"), default="never",
                        help="the log's [log] fsync (default never: the CPU cost alone)")
    add_smoke(parser)
    args = parser.parse_args()
    if args.smoke:
        args.requests, args.repeats = 8, 1
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "fleetlog.toml"
        config.write_text(f'[log]\ndir = "{tmp}/log"\nfsync = "{args.fsync}"\n')
        service = ServiceProcess(Path(tmp) / "service.log", ["--config", str(config)], {}).start()
        try:
            service.address(600)
            service.wait_leading(600)
            host, _, port = service.address().rpartition(":")
            args.pid = service.pid
            args.latencies = []
            _round(host, int(port), args, 0)  # warm-up, not counted
            args.latencies = []
            rounds = [_round(host, int(port), args, r + 1) for r in range(args.repeats)]
        finally:
            service.stop()
    health = [s for _, probes, _ in rounds for s in probes]
    rate = statistics.median(r for r, _, _ in rounds)
    result: dict[str, Any] = {
        "benchmark": "http_ingest", "machine": machine(), "clients": args.clients, "fsync": args.fsync,
        "events_per_request": args.events, "requests_per_s": round(rate, 1),
        "events_per_s": round(rate * args.events, 1),
        "service_cpu_ms_per_request": round(statistics.median(c for _, _, c in rounds), 3),
        "request_ms_median": round(statistics.median(args.latencies) * 1000, 2),
        "request_ms_p99": round(statistics.quantiles(args.latencies, n=100)[98] * 1000, 2),
        "healthz_ms_median": round(statistics.median(health) * 1000, 2),
        "healthz_ms_max": round(max(health) * 1000, 2),
    }
    emit(result, args.json)


if __name__ == "__main__":
    main()
