"""The soak test's producers: child processes that write through the real client.

``python -m tests.reliability.producers ROLE --log DIR --seed N --out FILE --stop FILE``

* ``nodes``: a fleet's heartbeats, one frame for every node each period; the ``--doomed`` nodes
  fall silent at ``--doom-after`` seconds (their gangs are requeued legitimately).
* ``jobs``: gang and single-task submissions at a steady rate; every one the client
  acknowledged is written to ``--out`` as a JSON line ``{"job": id, "offset": n}``.
* ``backend``: tails the decisions log (read-only) as a backend would, and reports each placed
  task started, then finished 0.5–2 s later (one single-task job in 10: 20–40 s later, so that
  some still run when the soak's long outage, 12.5–13.5 s, ends).

Each send opens the client anew (:meth:`Client.connect`), as a short-lived producer does: it goes
to the running service over HTTP, or, when ``service.json`` names a dead process, appends to the
file log directly under its writer lock.  A refused or failed send is retried with the same
events (a resent submission is a counted duplicate in the fold), until ``--stop`` appears.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import os
import random
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from fleetlog.client import Client, ClientError
from fleetlog.events.model import (
    DecisionBatch,
    InputEvent,
    JobPlaced,
    JobSubmitted,
    NodeHeartbeat,
    TaskFinished,
    TaskGroup,
    TaskStarted,
)
from fleetlog.log.base import DECISIONS, LogError
from fleetlog.log.consumer import decision_batches
from fleetlog.log.file import FileLogStore
from fleetlog.service.config import Config, load_config

CELL = "soak"
NODES = 16
GPUS = 8


def node_beat(i: int) -> NodeHeartbeat:
    """Node ``i``'s heartbeat: the same bytes every time (a steady node)."""
    return NodeHeartbeat(cell=CELL, node=f"n{i:02d}", cpu_milli=64_000, mem_mib=262_144, gpu_count=GPUS,
                         gpu_model="A100", topology=("b0", f"r{i // 4}", f"n{i:02d}"))


def a_job(rng: random.Random, job_id: str, tiny: bool = False) -> JobSubmitted:
    """A gang of whole-GPU tasks in one rack (a tenth), or one small task (GPU, half a GPU, CPU);
    ``tiny``: a tenth of a core (bulk work that fits anywhere)."""
    if tiny:
        group = TaskGroup(count=1, cpu_milli=100, mem_mib=64)
        return JobSubmitted(job_id=job_id, tenant="bulk", task_groups=(group,))
    if rng.random() < 0.1:
        group = TaskGroup(count=rng.randint(2, 3), cpu_milli=8_000, mem_mib=32_768, gpu_count=GPUS,
                          gpu_milli=1000)
        return JobSubmitted(job_id=job_id, tenant=rng.choice(["a", "b"]), task_groups=(group,),
                            required_topology="rack", priority=rng.choice([0, 0, 0, 50]))
    gpus, milli = rng.choice([(1, 1000), (1, 500), (0, 0)])
    group = TaskGroup(count=1, cpu_milli=2_000, mem_mib=8_192, gpu_count=gpus, gpu_milli=milli)
    return JobSubmitted(job_id=job_id, tenant=rng.choice(["a", "b", "c"]), task_groups=(group,),
                        priority=rng.choice([0, 0, 10]))


class Sender:
    """Sends a frame of events until some attempt is acknowledged (or ``stop`` appears)."""

    def __init__(self, config: Config, producer_id: str, rng: random.Random, stop: Path) -> None:
        self.config, self.producer_id, self.rng, self.stop = config, producer_id, rng, stop
        self.failures: Counter[str] = Counter()

    async def send(self, events: Sequence[InputEvent]) -> int | None:
        """The first offset once acknowledged; ``None`` if told to stop before that."""
        while True:
            try:
                async with await Client.connect(self.config, self.producer_id) as client:
                    return await client.send(events)
            except ClientError as exc:
                self.failures[exc.reason] += 1
            if self.stop.exists():
                return None
            await asyncio.sleep(self.rng.uniform(0.001, 0.01))  # an eager client: contention at its worst


async def run_nodes(args: argparse.Namespace, sender: Sender) -> None:
    doomed = set(args.doomed)
    started = time.monotonic()
    while not sender.stop.exists():
        silent = time.monotonic() - started >= args.doom_after
        beats = [node_beat(i) for i in range(NODES) if not (silent and i in doomed)]
        await sender.send(beats)
        await asyncio.sleep(args.period)


async def run_jobs(args: argparse.Namespace, sender: Sender) -> None:
    rng = random.Random(args.seed)
    n = 0
    with Path(args.out).open("a", buffering=1) as out:
        while not sender.stop.exists():
            jobs = [a_job(rng, f"{args.prefix}{n + k:05d}", args.tiny) for k in range(args.per_frame)]
            n += args.per_frame
            first = await sender.send(jobs)
            if first is not None:  # acknowledged: from here on the job must not be lost
                out.writelines(json.dumps({"job": j.job_id, "offset": first + k}) + "\n"
                               for k, j in enumerate(jobs))
            if args.period:
                await asyncio.sleep(args.period)


class Backend:
    """Turns placements read from the decisions log into TaskStarted now and TaskFinished later."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.due: list[tuple[float, int, InputEvent]] = []  # (when, tie-break, event)
        self.seq = 0

    def placed(self, decision: JobPlaced, now: float) -> None:
        long_run = self.rng.random() < 0.1 and len(decision.tasks) == 1
        runs_for = self.rng.uniform(20, 40) if long_run else self.rng.uniform(0.5, 2.0)
        for task in decision.tasks:
            self.later(now, TaskStarted(job_id=decision.job_id, task_index=task.task_index, node=task.node))
            self.later(now + runs_for, TaskFinished(job_id=decision.job_id, task_index=task.task_index))

    def later(self, when: float, event: InputEvent) -> None:
        self.seq += 1
        heapq.heappush(self.due, (when, self.seq, event))

    def take_due(self, now: float) -> list[InputEvent]:
        out = []
        while self.due and self.due[0][0] <= now:
            out.append(heapq.heappop(self.due)[2])
        return out


async def run_backend(args: argparse.Namespace, sender: Sender) -> None:
    backend = Backend(random.Random(args.seed))
    store = FileLogStore(args.log, read_only=True)
    await store.open()
    at = 0
    try:
        while not sender.stop.exists():
            try:
                records = await store.log(DECISIONS).read(at, 1000, timeout_ms=100)
            except LogError as exc:  # a torn tail the writer has not cut yet: read again
                sender.failures[f"read: {exc}"[:80]] += 1
                await asyncio.sleep(0.1)
                continue
            now = time.monotonic()
            for offset, batch in decision_batches(records):
                assert isinstance(batch, DecisionBatch)
                for decision in batch.decisions:
                    if isinstance(decision, JobPlaced):
                        backend.placed(decision, now)
                at = offset + 1
            due = backend.take_due(now)
            if due:
                await sender.send(due)
    finally:
        await store.close()


ROLES = {"nodes": run_nodes, "jobs": run_jobs, "backend": run_backend}


def parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="soak-producer", allow_abbrev=False)
    p.add_argument("role", choices=sorted(ROLES))
    p.add_argument("--log", required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--stop", required=True, help="stop once this file exists")
    p.add_argument("--out", default=os.devnull)
    p.add_argument("--period", type=float, default=0.1)
    p.add_argument("--per-frame", type=int, default=4)
    p.add_argument("--prefix", default="j")
    p.add_argument("--tiny", action="store_true", help="bulk jobs of a tenth of a core")
    p.add_argument("--doomed", type=int, nargs="*", default=[])
    p.add_argument("--doom-after", type=float, default=float("inf"))
    return p.parse_args(argv)


def main(argv: Sequence[str]) -> int:
    args = parse(argv)
    config = load_config(None, os.environ, log_dir=args.log)
    sender = Sender(config, f"soak-{args.role}-{args.prefix}", random.Random(args.seed + 1), Path(args.stop))
    asyncio.run(ROLES[args.role](args, sender))
    print(json.dumps({"role": args.role, "failures": dict(sender.failures)}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
