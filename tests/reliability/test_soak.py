"""Soak: ``fleetlog run`` SIGKILLed 20 times at random moments while producers keep writing.

The service runs as a real child process on the embedded file log, with a node timeout of a few
seconds; three producer processes (heartbeats of a 16-node fleet, gang and single submissions,
a backend reporting tasks started and finished) write through the real client all along — to
the service over HTTP while it leads, straight into the file log under its writer lock while it
is down.  One of the outages lasts well over twice the node timeout.  Afterwards:

* every submission the client acknowledged is in the log and decided; no two batches share an
  ``as_of``; no job is placed again while it runs on a node that heartbeat all along;
* ``replay verify`` is clean, and every batch's digest — and the final snapshot's — equals
  folding the whole log one event at a time;
* every restart led within :data:`LEAD_BOUND_S` of starting to wait for the log, and never
  reported an input offset past the log's end.

Seeded: ``FLEETLOG_SOAK_SEED`` picks the kill moments, the outage and the producers' choices
(a fresh seed otherwise); every failure message names it.  Timing is real, so a seed makes a
run alike, not identical.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from fleetlog.core.digest import digest
from fleetlog.core.state import CoreConfig
from fleetlog.log.base import INPUTS
from fleetlog.log.file import FileLogStore
from fleetlog.log.snapshots import DirectorySnapshots
from fleetlog.replay.verify import verify
from fleetlog.service.snapshots import restored
from tests.reliability.soak import Logs, check_decisions, fold_reference, silent_between
from tests.service.process import REPO, ServiceProcess

KILLS = 20
NODE_TIMEOUT_MS = 5_000
"""Heartbeats every 1.25 s: a CI run of four sessions on two cores starved the producers for 4 s
(with 3 s, every node timed out once in the fold, and no job ran across the long outage)."""
LONG_OUTAGE_S = 2.5 * NODE_TIMEOUT_MS / 1000
LEAD_BOUND_S = 3.0
"""How long a restarted service may take from its ``service_started`` line to leading: getting the
writer lock from producers that append back to back (docs/logs.md promises one append), then
recovering a log of about 10,000 events from a snapshot at most 3 s old."""
BULK = (3, 8)
"""Two bulk producers append back to back from before kill 3 to after kill 8."""
DOOMED = (14, 15)
"""Nodes that fall silent half-way: their gangs are requeued, and placed again, legitimately."""


@dataclass
class Run:
    """What the test saw while it ran: the seed, lead times, violations found on the way."""

    seed: int
    directory: Path
    lead_s: list[float] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    outage: tuple[float, float] = (0.0, 0.0)
    """Wall-clock ms (the file log's clock) of the long outage's start and end."""

    def fail(self, problems: list[str]) -> None:
        if problems:
            listed = "\n  - ".join(problems)
            pytest.fail(f"soak seed {self.seed} (rerun: FLEETLOG_SOAK_SEED={self.seed}); logs in "
                        f"{self.directory}:\n  - {listed}", pytrace=False)


def service_env() -> dict[str, str]:
    return {
        "FLEETLOG_SERVICE_NODE_TIMEOUT_MS": str(NODE_TIMEOUT_MS),
        "FLEETLOG_SERVICE_SNAPSHOT_EVERY_EVENTS": "3000",
        "FLEETLOG_SERVICE_SNAPSHOT_EVERY_S": "3",
        "FLEETLOG_SERVICE_IDLE_WAIT_MS": "50",
    }


STARTED: list[ServiceProcess] = []
PRODUCERS: list[subprocess.Popen[bytes]] = []


@pytest.fixture(autouse=True)
def _nothing_outlives_the_test() -> Iterator[None]:
    yield
    while STARTED:
        STARTED.pop().kill_if_running()
    while PRODUCERS:
        proc = PRODUCERS.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def start_service(run: Run, n: int) -> ServiceProcess:
    process = ServiceProcess(run.directory.parent / f"service-{n:02d}.log", ["--log", str(run.directory)],
                             service_env()).start()
    STARTED.append(process)
    return process


@dataclass
class Producer:
    name: str
    proc: subprocess.Popen[bytes]
    stop: Path
    """It stops once this file exists."""


def start_producer(run: Run, name: str, role: str, *extra: str) -> Producer:
    """Start producer ``name`` (a child process; its output goes to ``producer-<name>.log``)."""
    stop = run.directory.parent / f"stop-{name}"
    args = [sys.executable, "-m", "tests.reliability.producers", role, "--log", str(run.directory),
            "--seed", str(run.seed), "--stop", str(stop), *extra]
    with (run.directory.parent / f"producer-{name}.log").open("ab") as log:
        proc = subprocess.Popen(args, cwd=REPO, stdout=log, stderr=log)
    PRODUCERS.append(proc)
    return Producer(name, proc, stop)


async def inputs_end(directory: Path) -> int:
    store = FileLogStore(directory, read_only=True)
    await store.open()
    try:
        return await store.log(INPUTS).end_offset()
    finally:
        await store.close()


def started_at(service: ServiceProcess, timeout_s: float = 120) -> float:
    """When the process finished warming up and began to wait for the log (monotonic)."""
    service.address(timeout_s)
    return time.monotonic()


async def restart(run: Run, n: int, standby: ServiceProcess | None = None) -> ServiceProcess | None:
    """Wait for ``standby`` (or a new service ``n``) to lead; a violation (and ``None``) if it
    does not lead in time."""
    service = standby or start_service(run, n)
    began = await asyncio.to_thread(started_at, service)
    try:
        health = await asyncio.to_thread(service.wait_leading, LEAD_BOUND_S)
    except AssertionError:
        last = service.lines()[-1:] or [{}]
        run.violations.append(f"restart {n} did not lead within {LEAD_BOUND_S}s of service_started "
                              f"(last said: {last[0].get('event')} {last[0].get('reason', '')})")
        return None
    run.lead_s.append(time.monotonic() - began)
    end = await inputs_end(run.directory)
    if (health["inputs_offset"] or 0) > end:
        run.violations.append(f"restart {n} leads at inputs offset {health['inputs_offset']}, past the "
                              f"log's end {end}")
    return service


def start_bulk(run: Run, i: int) -> Producer:
    """A bulk producer: tiny jobs, one per append, back to back (a busy producer)."""
    acks = str(run.directory.parent / f"acks-bulk{i}.jsonl")
    return start_producer(run, f"bulk{i}", "jobs", "--period", "0", "--per-frame", "1", "--tiny",
                          "--prefix", f"bulk{i}-", "--out", acks)


async def kill_at_random(run: Run, rng: random.Random, first: ServiceProcess) -> int:
    """Kill the service ``KILLS`` times at random moments (while it waits for the log, recovers,
    or leads); the next one is a warm stand-by already waiting for the log, or starts after the
    kill.  A bulk producer appends back to back around kills 3 to 6; after kill ``long_one`` the
    service stays down ``LONG_OUTAGE_S`` or more.  The number of kills."""
    long_one = rng.randrange(BULK[1] + 2, KILLS - 1)
    kills, current, leading, bulk = 0, first, True, list[Producer]()
    for n in range(1, KILLS + 1):
        if n == BULK[0]:
            bulk = [start_bulk(run, i) for i in range(2)]
        warm = n != long_one and n < KILLS and rng.random() < 0.6
        standby = start_service(run, n) if warm else None  # it warms up while ``current`` runs
        await asyncio.sleep(rng.uniform(0.2, 1.5) if leading else rng.uniform(0, 1.0))
        if standby is not None:
            await asyncio.to_thread(started_at, standby)
        current.kill9()
        kills += 1
        if n == BULK[1]:
            await asyncio.to_thread(stop_producers, run, bulk)
        if n == long_one:
            down = time.time() * 1000
            await asyncio.sleep(LONG_OUTAGE_S + rng.uniform(0, 1))
            run.outage = (down, time.time() * 1000)
        elif standby is None:
            await asyncio.sleep(rng.uniform(0, 0.5))
        if n == KILLS:
            break  # the caller starts the last one
        current, leading = await next_service(run, n, rng, standby)
    return kills


async def next_service(run: Run, n: int, rng: random.Random,
                       standby: ServiceProcess | None) -> tuple[ServiceProcess, bool]:
    """The service after kill ``n``, and whether it was seen leading; a third are not waited for
    (the next kill finds them waiting for the log or recovering)."""
    if rng.random() < 0.3:
        service = standby or start_service(run, n)
        await asyncio.to_thread(started_at, service)
        return service, False
    found = await restart(run, n, standby)
    return (found, True) if found is not None else (STARTED[-1], False)


def stop_producers(run: Run, producers: list[Producer]) -> None:
    """Tell each producer to stop, and wait for it to finish its last send."""
    for producer in producers:
        producer.stop.touch()
    for producer in producers:
        try:
            code = producer.proc.wait(60)
        except subprocess.TimeoutExpired:
            producer.proc.kill()
            code = -9
        if code != 0:
            run.violations.append(f"producer {producer.name} exited {code}: see producer-{producer.name}.log")


async def wait_caught_up(service: ServiceProcess, directory: Path, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        end = await inputs_end(directory)
        health = await asyncio.to_thread(service.health)
        if health and health["status"] == "leading" and health["inputs_offset"] == end:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"the final service did not fold the whole log in {timeout_s}s")


def acknowledged(run: Run) -> set[str]:
    paths = run.directory.parent.glob("acks-*.jsonl")
    return {json.loads(line)["job"] for path in paths for line in path.read_text().splitlines() if line}


async def analyse(run: Run) -> list[str]:
    """Every check on the logs; the list of what was violated."""
    core = CoreConfig(node_timeout_ms=NODE_TIMEOUT_MS)
    store = FileLogStore(run.directory, read_only=True)
    await store.open()
    try:
        logs = await Logs.read(store)
        report = await verify(store, core=core)
    finally:
        await store.close()
    problems = list(run.violations)
    if logs.undecodable:
        problems.append(f"{logs.undecodable} input records do not decode")
    if not report.ok:
        problems.append(f"replay verify diverged: {report.divergence}")
    acked = acknowledged(run)
    problems += check_decisions(logs, acked, NODE_TIMEOUT_MS)
    silences = logs.silences(NODE_TIMEOUT_MS)
    outage = (int(run.outage[0]), int(run.outage[1]))
    steady = [n for n, spans in silences.items() if not silent_between(spans, *outage)]
    ref = fold_reference(logs, core, int(run.outage[1]))
    problems += ref.violations
    newest = (await DirectorySnapshots(run.directory / "snapshots").candidates())[0]
    final = restored(newest[1](), newest[0])
    end = logs.inputs[-1].offset + 1 if logs.inputs else 0
    if final.header.inputs_offset != end or digest(final.state) != digest(ref.state):
        problems.append(f"the final snapshot (inputs {final.header.inputs_offset} of {end}) "
                        "differs from folding the whole log one event at a time")
    leads = sorted(round(t, 2) for t in run.lead_s)
    print(f"soak seed {run.seed}: {len(acked)} submissions acknowledged, {len(logs.inputs)} inputs, "
          f"{len(logs.batches)} batches, {len(steady)} nodes steady across the long outage and "
          f"{ref.running_at_mark} jobs running after it, lead times (s) {leads}")
    if len(acked) < 500 or len(steady) < 12 or ref.running_at_mark < 3:
        problems.append(f"the soak tested too little: {len(acked)} submissions acknowledged (want 500), "
                        f"{len(steady)} nodes heartbeat across the long outage (want 12), "
                        f"{ref.running_at_mark} jobs running after it (want 3)")
    return problems


@pytest.mark.slow
@pytest.mark.timeout(900)  # 99 s alone; over 480 s in a CI run of four sessions on two cores
async def test_soak_kill_9_across_an_outage_longer_than_the_node_timeout(tmp_path: Path) -> None:
    seed = int(os.environ.get("FLEETLOG_SOAK_SEED") or random.SystemRandom().randrange(1 << 32))
    print(f"soak seed {seed}")
    run = Run(seed, tmp_path / "log")
    rng = random.Random(seed)
    first = start_service(run, 0)
    await asyncio.to_thread(first.address, 600)  # numba compiles the kernels on a cold cache
    await asyncio.to_thread(first.wait_leading, 60)
    producers = [
        start_producer(run, "nodes", "nodes", "--period", str(NODE_TIMEOUT_MS / 4000),
                       "--doomed", *map(str, DOOMED), "--doom-after", "40"),
        start_producer(run, "jobs", "jobs", "--period", "0.1", "--per-frame", "3",
                       "--out", str(tmp_path / "acks-jobs.jsonl")),
        start_producer(run, "backend", "backend"),
    ]
    await asyncio.sleep(3)
    kills = await kill_at_random(run, rng, first)
    final = await restart(run, KILLS + 1)
    if final is None:
        final = start_service(run, KILLS + 2)
        await asyncio.to_thread(final.wait_leading, 180)
    await asyncio.sleep(2)
    await asyncio.to_thread(stop_producers, run, producers)
    await wait_caught_up(final, run.directory)
    assert final.stop() == 0, final.tail()
    assert kills == KILLS
    run.fail(await analyse(run))
