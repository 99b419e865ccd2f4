"""A small seeded incident: a fleet of GPU nodes in two racks, three tenants, single tasks and
gangs, a high-priority job that preempts, a cancel, a node that fails and comes back, a
malformed record — driven through the real scheduling loop, with the observations a cell would
report (tasks start the round after their placement and finish a few rounds later).

``make_fixtures.py`` records it into the committed logs under ``data/``; the Kafka test records
it on a real broker.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import msgspec

from fleetlog.core.digest import snapshot
from fleetlog.core.policy import Policy
from fleetlog.events import encode, envelope
from fleetlog.events.model import (
    DecisionBatch,
    Event,
    JobCancelled,
    JobPlaced,
    TaskFinished,
    TaskPreempted,
    TaskStarted,
)
from fleetlog.log.base import DECISIONS, INPUTS, LogStore, Message
from fleetlog.log.consumer import decision_batches
from fleetlog.log.snapshots import Snapshot, SnapshotHeader, encode_snapshot
from fleetlog.service.loop import LoopConfig, SchedulerLoop
from tests.core.builders import job, node, quota

ROUND_MS = 5_000
START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
NODES = 6
Tamper = Callable[[int, DecisionBatch], DecisionBatch]


class ClockBox:
    def __init__(self) -> None:
        self.now_ms = START_MS

    def __call__(self) -> int:
        return self.now_ms


class TamperingLoop(SchedulerLoop):
    """Publishes ``tamper(batch number, batch)`` but folds the batch it computed: the log then
    records something the scheduler never decided (a deliberately divergent log)."""

    tamper: Tamper | None = None
    published = 0

    def batch_messages(self, batch: DecisionBatch) -> list[Message]:
        if self.tamper is not None:
            batch = self.tamper(self.published, batch)
        self.published += 1
        return super().batch_messages(batch)


def beats(healthy_except: str = "") -> list[Event]:
    return [node(f"n{i}", rack=f"r{i % 2}", healthy=f"n{i}" != healthy_except) for i in range(NODES)]


def arrivals(rng: random.Random, round_: int) -> list[Event]:
    out: list[Event] = []
    for k in range(rng.choice((1, 2, 3, 4))):
        tasks = rng.choice((1, 1, 2))
        milli = rng.choice((1000, 1000, 500, 250)) if tasks == 1 else 1000
        gpus = 1 if milli < 1000 else rng.choice((1, 2, 4)) if tasks == 1 else 4
        out.append(
            job(
                f"j{round_:02d}{k}",
                tenant=f"t{rng.randrange(3)}",
                tasks=tasks,
                gpus=gpus,
                milli=milli,
                topology="rack" if tasks > 1 else None,
            )
        )
    if round_ == 8:
        out.append(job("urgent", tenant="t2", tasks=4, gpus=8, priority=100))
    return out


async def record(
    store: LogStore,
    clock: ClockBox,
    rounds: int = 24,
    seed: int = 7,
    tamper: Tamper | None = None,
    snapshot_at: int | None = None,
    snapshots: list[bytes] | None = None,
) -> SchedulerLoop:
    """Drive the scenario through ``store``; snapshots (encoded) go to ``snapshots``."""
    rng = random.Random(seed)
    loop = TamperingLoop(store, Policy(), LoopConfig())
    loop.tamper = tamper
    running: dict[str, tuple[int, int]] = {}  # job -> (tasks, round it finishes)
    seen = 0
    for r in range(rounds):
        clock.now_ms = START_MS + r * ROUND_MS
        events: list[Event] = [quota(f"t{t}", 32) for t in range(3)] if r == 0 else []
        events += beats("n3" if 12 <= r < 15 else "") if r % 3 == 0 or 12 <= r <= 15 else []
        events += arrivals(rng, r)
        events += [
            TaskFinished(job_id=j, task_index=i)
            for j, (n, end) in sorted(running.items())
            if end == r
            for i in range(n)
        ]
        running = {j: v for j, v in running.items() if v[1] != r}
        if r == 10:
            events.append(JobCancelled(job_id="j000", reason="user"))
        messages = [Message(encode(envelope(e, "scenario"))) for e in events]
        if r == 5:
            messages.append(Message(b"\xc1 not an event"))
        await store.log(INPUTS).append(messages)
        await loop.step()
        seen = await _observe(store, seen, rng, r, running)
        if snapshot_at == r and snapshots is not None:
            header = SnapshotHeader(loop.offset, loop.decisions_next, loop.policy.name, 0)
            snapshots.append(encode_snapshot(Snapshot(header, snapshot(loop.state))))
    return loop


async def _observe(
    store: LogStore, seen: int, rng: random.Random, r: int, running: dict[str, tuple[int, int]]
) -> int:
    """What the cell reports about new decisions: starts now (in the next append), finishes later."""
    end = await store.log(DECISIONS).end_offset()
    if seen >= end:
        return seen
    records = await store.log(DECISIONS).read(seen, 10_000)
    starts: list[Event] = []
    for _, batch in decision_batches(records):
        for d in batch.decisions:
            if isinstance(d, JobPlaced):
                running[d.job_id] = (len(d.tasks), r + rng.randint(2, 6))
                starts += [
                    TaskStarted(job_id=d.job_id, task_index=t.task_index, node=t.node) for t in d.tasks
                ]
            elif isinstance(d, TaskPreempted):
                running.pop(d.job_id, None)
    if starts:
        await store.log(INPUTS).append([Message(encode(envelope(e, "scenario"))) for e in starts])
    return records[-1].offset + 1


def move_third_placement(number: int, batch: DecisionBatch, found: dict[str, object]) -> DecisionBatch:
    """The tamper of the divergent fixture: the first placement of the third batch that places
    anything goes to another node (``found`` records what was changed)."""
    placed = [i for i, d in enumerate(batch.decisions) if isinstance(d, JobPlaced)]
    if not placed or found.get("done"):
        return batch
    found["seen"] = int(found.get("seen", 0)) + 1  # type: ignore[call-overload]
    if found["seen"] != 3:
        return batch
    index = placed[0]
    first = batch.decisions[index]
    assert isinstance(first, JobPlaced)
    task = first.tasks[0]
    other = next(f"n{i}" for i in range(NODES) if f"n{i}" != task.node and f"n{i}" != "n3")
    moved = msgspec.structs.replace(
        first, tasks=(msgspec.structs.replace(task, node=other), *first.tasks[1:])
    )
    found.update(
        done=True, batch_number=number, index=index, job_id=first.job_id, original=task.node, tampered=other
    )
    return msgspec.structs.replace(
        batch, decisions=(*batch.decisions[:index], moved, *batch.decisions[index + 1 :])
    )
