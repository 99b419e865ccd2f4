"""The loop over the real file log: what it decides and the state it recovers do not depend on
how many inputs one step folds (``LoopConfig.max_batch``), even across a backlog longer than
the node timeout."""

from __future__ import annotations

from pathlib import Path

from fleetlog.core.digest import digest
from fleetlog.core.policy import Policy
from fleetlog.core.state import JobState
from fleetlog.events import Event, JobPlaced, TaskPreempted, encode, envelope
from fleetlog.log.base import DECISIONS, INPUTS, Message
from fleetlog.log.consumer import decision_batches
from fleetlog.log.file import FileLogStore
from fleetlog.replay.verify import verify
from fleetlog.service.loop import LoopConfig, SchedulerLoop
from tests.core.builders import job, node

FLEET = [node(f"h{i}", rack=f"r{i % 4}") for i in range(32)]
GANGS = [job(f"gang{i}", tasks=2, gpus=8, topology="rack") for i in range(16)]


def msg(event: Event) -> Message:
    return Message(encode(envelope(event, "producer")))


async def _write_outage(store: FileLogStore, clock: list[int]) -> SchedulerLoop:
    """A fleet runs 16 gangs; then the scheduler is away while producers write 90 s of log
    time (60 s is the node timeout): every second 40 submissions, then every node's steady
    heartbeat. The scheduler comes back and folds that backlog in one step."""
    loop = SchedulerLoop(store, Policy(), LoopConfig(max_batch=20_000, check_invariants=True))
    inputs = store.log(INPUTS)
    clock[0] = 1_000
    await inputs.append([msg(e) for e in (*FLEET, *GANGS)])
    await loop.step()
    for second in range(90):
        clock[0] = 2_000 + 1_000 * second
        await inputs.append([msg(job(f"s{second}-{k}", gpus=0, cpu=100)) for k in range(40)])
        await inputs.append([msg(e) for e in FLEET])
    result = await loop.step()
    assert result.inputs == 90 * (40 + len(FLEET))  # (one step)
    return loop


async def test_a_backlog_past_the_node_timeout_in_one_step_re_places_nothing(tmp_path: Path) -> None:
    clock = [0]
    store = FileLogStore(tmp_path / "log", clock=lambda: clock[0], fsync="never")
    await store.open()
    try:
        loop = await _write_outage(store, clock)
        batches = [b for _, b in decision_batches(await store.log(DECISIONS).read(0, 1_000))]
        placed = [d.job_id for b in batches for d in b.decisions if isinstance(d, JobPlaced)]
        assert sorted(p for p in placed if p.startswith("gang")) == sorted(g.job_id for g in GANGS)  # once
        assert not [d for b in batches for d in b.decisions if isinstance(d, TaskPreempted)]
        assert (loop.state.jobs.view("state")[: len(GANGS)] == JobState.RUNNING).all()
        assert (loop.state.nodes.view("status") == 1).all()
        report = await verify(store)
        assert report.ok, report.divergence
    finally:
        await store.close()


async def test_recovery_with_any_max_batch_reaches_the_digest_of_the_run(tmp_path: Path) -> None:
    clock = [0]
    store = FileLogStore(tmp_path / "log", clock=lambda: clock[0], fsync="never")
    await store.open()
    try:
        run = await _write_outage(store, clock)
        for max_batch in (1, 7, 10_000):
            again = SchedulerLoop(store, Policy(), LoopConfig(max_batch=max_batch))
            await again.recover()
            assert again.offset == run.offset
            assert digest(again.state) == digest(run.state), f"max_batch={max_batch}"
    finally:
        await store.close()
