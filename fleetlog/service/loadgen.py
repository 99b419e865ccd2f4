"""A seeded synthetic input stream for load tests and benchmarks of the service.

A fleet of GPU nodes in racks that heartbeat in turn, and tenants that submit jobs (single
tasks and small gangs) and cancel old ones, so capacity keeps turning over without a
backend.  Open loop: nothing here reads decisions.  Same seed, same events.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import msgspec

from fleetlog.events.codec import encode, envelope
from fleetlog.events.model import Event, JobCancelled, JobSubmitted, NodeHeartbeat, TaskGroup
from fleetlog.log.base import Message

PRODUCER = "fleetlog-loadgen"


class Load(msgspec.Struct, frozen=True, kw_only=True):
    nodes: int = 1000
    gpus_per_node: int = 8
    nodes_per_rack: int = 32
    tenants: int = 8
    submit_share: float = 0.1
    """Of every event, the share that submits a job; as many cancel an old one."""
    keep_jobs: int = 5000
    """A job is cancelled once this many newer jobs were submitted."""
    seed: int = 1
    prefix: str = "job"


def heartbeat(load: Load, i: int) -> NodeHeartbeat:
    return NodeHeartbeat(
        cell="cell-a", node=f"node-{i:05d}", cpu_milli=128_000, mem_mib=1_048_576,
        gpu_count=load.gpus_per_node, gpu_model="A100",
        topology=("block-0", f"rack-{i // load.nodes_per_rack:04d}", f"node-{i:05d}"),
    )


def job(load: Load, rng: random.Random, n: int) -> JobSubmitted:
    tasks = rng.choice((1, 1, 1, 2, 4))
    gpus = rng.choice((1, 2, 4, 8)) if tasks == 1 else 8
    return JobSubmitted(
        job_id=f"{load.prefix}-{n:08d}",
        tenant=f"tenant-{rng.randrange(load.tenants)}",
        priority=rng.choice((0, 0, 0, 10)),
        task_groups=(TaskGroup(count=tasks, cpu_milli=4000 * gpus, mem_mib=32_768 * gpus,
                               gpu_count=gpus, gpu_milli=1000),),
    )


def events(load: Load) -> Iterator[Event]:
    """The fleet's first heartbeats, then an endless mix of heartbeats, submissions, cancels."""
    rng = random.Random(f"fleetlog-loadgen/{load.seed}")
    for i in range(load.nodes):
        yield heartbeat(load, i)
    beat = submitted = 0
    while True:
        if rng.random() < load.submit_share:
            yield job(load, rng, submitted)
            submitted += 1
            if submitted > load.keep_jobs:
                old = submitted - load.keep_jobs - 1
                yield JobCancelled(job_id=f"{load.prefix}-{old:08d}", reason="load")
        else:
            yield heartbeat(load, beat % load.nodes)
            beat += 1


def batches(load: Load, size: int) -> Iterator[list[Message]]:
    """:func:`events` encoded, ``size`` per list."""
    out: list[Message] = []
    for event in events(load):
        out.append(Message(encode(envelope(event, PRODUCER))))
        if len(out) == size:
            yield out
            out = []
