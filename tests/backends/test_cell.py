"""The simulated cell through the logs alone: decision batches in, observations out."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from fleetlog.backends.simulated import CellBehaviour, Cluster, NodeSpec, SimulatedCell, Timers
from fleetlog.backends.simulated.clock import VirtualClock
from fleetlog.events import (
    DecisionBatch,
    JobPlaced,
    JobRejected,
    JobSubmitted,
    NodeHeartbeat,
    TaskFinished,
    TaskGroup,
    TaskPlacement,
    TaskPreempted,
    TaskStarted,
    encode,
    envelope,
)
from fleetlog.events.model import Decision
from fleetlog.log.base import DECISIONS, INPUTS, Message
from fleetlog.log.memory import MemoryLogStore
from fleetlog.simulation.metrics import JobStatus, Recorder
from tests.backends.helpers import inputs

HEARTBEAT_MS = 10_000
MAX_DELAY_MS = 500
DURATION_MS = 60_000


@dataclass
class Bench:
    """A cell on a memory log, with the clock and timers a driver would own."""

    clock: VirtualClock
    timers: Timers
    store: MemoryLogStore
    cell: SimulatedCell
    recorder: Recorder

    async def decide(self, *decisions: Decision) -> None:
        """Publish a decision batch as the scheduler would, and let the cell consume it."""
        await self.decide_in_parts(decisions)

    async def decide_in_parts(self, *parts: tuple[Decision, ...]) -> None:
        """Publish one step split over ``len(parts)`` records (one transaction), and consume it."""
        as_of = await self.store.log(INPUTS).end_offset()
        batches = [
            DecisionBatch(as_of=as_of, digest="-", decisions=part, part=i, parts=len(parts))
            for i, part in enumerate(parts)
        ]
        messages = [Message(encode(envelope(batch, "test"))) for batch in batches]
        await self.store.append_transactional(DECISIONS, messages, group="g", consumed=as_of)
        await self.cell.consume(self.store)

    async def run_until(self, until_ms: int) -> None:
        """Fire every timer due up to ``until_ms``, appending what it emits (as the driver does)."""
        while (at := self.timers.next_time()) is not None and at <= until_ms:
            emitted = self.timers.fire_next()
            if emitted.messages:
                await self.store.log(INPUTS).append(emitted.messages)
        self.clock.advance(max(self.clock.now_ms, until_ms))

    def submit(self, job_id: str, gpus: int = 2, duration_ms: int | None = DURATION_MS) -> None:
        job = JobSubmitted(
            job_id=job_id,
            tenant="t",
            task_groups=(TaskGroup(count=1, cpu_milli=1000, mem_mib=1024, gpu_count=gpus, gpu_milli=1000),),
        )
        self.cell.register(job, duration_ms)
        self.recorder.arrived(job_id, gpus * 1000, self.clock.now_ms)


def cluster(mtbf_ms: int = 0) -> Cluster:
    nodes = tuple(NodeSpec(f"n{i}", 16_000, 65_536, 2, "T4", ("b", "r", f"n{i}")) for i in range(2))
    return Cluster("c", nodes, CellBehaviour(HEARTBEAT_MS, MAX_DELAY_MS, mtbf_ms, 600_000))


@pytest.fixture
async def bench() -> AsyncIterator[Bench]:
    made = await make_bench(cluster())
    yield made
    await made.store.close()


async def make_bench(c: Cluster, seed: int = 7) -> Bench:
    clock = VirtualClock()
    store = MemoryLogStore(clock=clock)
    await store.open()
    timers = Timers(clock)
    recorder = Recorder(c.gpu_milli)
    bench = Bench(clock, timers, store, SimulatedCell(c, timers, seed, recorder), recorder)
    await store.log(INPUTS).append(bench.cell.start().messages)
    return bench


def placed(job_id: str, node: str = "n0", gpus: tuple[int, ...] = (0, 1)) -> JobPlaced:
    return JobPlaced(job_id=job_id, cell="c", tasks=(TaskPlacement(0, node, gpus),))


async def test_a_placement_starts_after_a_seeded_delay_and_finishes_after_its_duration(bench: Bench) -> None:
    bench.submit("j")
    await bench.decide(placed("j"))
    assert bench.cell.allocated_milli == 2000
    await bench.run_until(DURATION_MS + MAX_DELAY_MS + 1)
    events = await inputs(bench.store)
    started = [(t, e) for t, e in events if isinstance(e, TaskStarted)]
    finished = [(t, e) for t, e in events if isinstance(e, TaskFinished)]
    assert [e for _, e in started] == [TaskStarted(job_id="j", task_index=0, node="n0")]
    assert 0 <= started[0][0] <= MAX_DELAY_MS
    assert [(t, e) for t, e in finished] == [
        (started[0][0] + DURATION_MS, TaskFinished(job_id="j", task_index=0))
    ]
    assert bench.cell.allocated_milli == 0
    assert bench.recorder.counts[JobStatus.DONE] == 1


async def test_every_live_node_heartbeats_on_the_period(bench: Bench) -> None:
    await bench.run_until(3 * HEARTBEAT_MS)
    beats = [(t, e.node) for t, e in await inputs(bench.store) if isinstance(e, NodeHeartbeat)]
    assert beats == [
        (t, n) for t in (0, HEARTBEAT_MS, 2 * HEARTBEAT_MS, 3 * HEARTBEAT_MS) for n in ("n0", "n1")
    ]


async def test_a_preempted_gang_stops_and_never_reports_finishing(bench: Bench) -> None:
    bench.submit("j")
    await bench.decide(placed("j"))
    await bench.run_until(1_000)
    await bench.decide(TaskPreempted(job_id="j", task_index=0, by_job_id="vip", cause="priority"))
    await bench.run_until(3 * DURATION_MS)
    assert not [e for _, e in await inputs(bench.store) if isinstance(e, TaskFinished)]
    assert (bench.cell.allocated_milli, bench.recorder.preemptions) == (0, 1)
    assert bench.recorder.counts[JobStatus.PENDING] == 1


async def test_placing_a_job_again_replaces_its_previous_incarnation(bench: Bench) -> None:
    bench.submit("j")
    await bench.decide(placed("j", "n0"))
    await bench.decide(placed("j", "n1"))
    await bench.run_until(3 * DURATION_MS)
    events = await inputs(bench.store)
    assert [e.node for _, e in events if isinstance(e, TaskStarted)] == ["n1"]
    assert len([e for _, e in events if isinstance(e, TaskFinished)]) == 1
    assert bench.cell.allocated_milli == 0


async def test_a_rejection_is_recorded_and_holds_nothing(bench: Bench) -> None:
    bench.submit("big", gpus=8)
    await bench.decide(JobRejected(job_id="big", reason="unplaceable"))
    assert bench.recorder.counts[JobStatus.REJECTED] == 1
    assert bench.recorder.curve == [(8000, 0)]


async def test_a_failed_node_reports_unhealthy_loses_its_gangs_and_recovers(bench: Bench) -> None:
    bench.submit("j")
    await bench.decide(placed("j", "n0"))
    await bench.run_until(5_000)
    bench.timers.at(5_000, lambda now: bench.cell.fail("n0"))
    await bench.run_until(5 * HEARTBEAT_MS)  # the repair takes at least one heartbeat period
    events = await inputs(bench.store)
    unhealthy = [(t, e.node) for t, e in events if isinstance(e, NodeHeartbeat) and not e.healthy]
    assert unhealthy == [(5_000, "n0")]
    assert not [e for _, e in events if isinstance(e, TaskFinished)]
    assert (bench.recorder.lost, bench.recorder.node_failures, bench.cell.allocated_milli) == (1, 1, 0)
    await bench.run_until(3_600_000)
    beats = [
        (t, e.healthy)
        for t, e in await inputs(bench.store)
        if isinstance(e, NodeHeartbeat) and e.node == "n0"
    ]
    back = next(i for i, (t, _) in enumerate(beats) if t > 5_000)
    assert beats[back][1]
    assert beats[back][0] - 5_000 >= HEARTBEAT_MS
    assert bench.recorder.node_recoveries == 1


async def test_a_placement_on_a_node_the_cell_knows_is_down_does_not_start(bench: Bench) -> None:
    bench.timers.at(0, lambda now: bench.cell.fail("n1"))
    await bench.run_until(0)
    bench.submit("j")
    await bench.decide(placed("j", "n1"))
    await bench.run_until(2 * DURATION_MS)
    assert not [e for _, e in await inputs(bench.store) if isinstance(e, TaskStarted)]
    assert (
        bench.recorder.counts[JobStatus.PENDING] == 1
    )  # the scheduler requeues it when it folds the failure


async def test_seeded_failures_happen_at_the_same_virtual_times_for_a_seed() -> None:
    async def failure_times(seed: int) -> list[int]:
        b = await make_bench(cluster(mtbf_ms=3_600_000), seed)
        await b.run_until(24 * 3_600_000)
        return [t for t, e in await inputs(b.store) if isinstance(e, NodeHeartbeat) and not e.healthy]

    first = await failure_times(3)
    assert first
    assert first == await failure_times(3)
    assert first != await failure_times(4)


async def test_a_step_split_over_records_has_the_effects_of_the_whole_step() -> None:
    """Placements, a preemption and a placement again, in one step: split over three records
    they start, stop and report exactly what the one-record step does."""
    decisions = (
        placed("a", "n0"),
        TaskPreempted(job_id="a", task_index=0, by_job_id="b", cause="priority"),
        placed("b", "n0"),
        placed("c", "n1"),
    )
    whole, split = await make_bench(cluster()), await make_bench(cluster())
    try:
        for bench in (whole, split):
            for job_id in "abc":
                bench.submit(job_id)
        await whole.decide(*decisions)
        await split.decide_in_parts(decisions[:1], decisions[1:3], decisions[3:])
        assert split.cell.decisions_seen == whole.cell.decisions_seen == 4
        for bench in (whole, split):
            await bench.run_until(DURATION_MS + MAX_DELAY_MS + 1)
        assert await inputs(split.store) == await inputs(whole.store)
        assert split.recorder.counts == whole.recorder.counts
        assert split.recorder.counts[JobStatus.DONE] == 2
    finally:
        await whole.store.close()
        await split.store.close()
