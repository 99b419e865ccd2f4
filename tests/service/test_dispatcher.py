"""The global dispatcher's service loop (fleetlog/service/dispatcher.py) over the real file log and
a real Kafka broker: dispatches reach the chosen cells' partitions with the step record and the
consumed offset in one transaction, refusals are dead-lettered with their code, a crash at any
point recovers to exactly what an uncrashed dispatcher writes, and replay verifies every step."""

from __future__ import annotations

import asyncio
import functools
import gc
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from fleetlog.core import dispatch_log
from fleetlog.core.dispatch import CellMap
from fleetlog.core.dispatch_log import decode_record
from fleetlog.events import (
    JobCancelled,
    JobDispatched,
    JobReturned,
    JobSubmitted,
    QuotaSet,
    Resources,
    TaskGroup,
    decode,
    encode,
    envelope,
)
from fleetlog.events.codec import MAX_EVENT_BYTES
from fleetlog.events.model import MAX_TASK_GROUPS, MAX_TASKS_PER_JOB, Event
from fleetlog.log.base import DEAD_LETTERS, DECISIONS, INPUTS, LogStore, Message, Shard
from fleetlog.log.consumer import REASON_HEADER, SOURCE_HEADER
from fleetlog.log.file import FileLogStore
from fleetlog.log.kafka import FencedError
from fleetlog.log.snapshots import DirectorySnapshots, Snapshot, SnapshotHeader, encode_snapshot
from fleetlog.replay.dispatcher import DispatchDivergenceError, verify_dispatcher
from fleetlog.service import dispatcher as service_dispatcher
from fleetlog.service.dispatcher import DispatcherConfig, DispatcherLoop
from tests.core.builders import node
from tests.core.test_dispatch import gpu_job, summary

ROOT = Path(__file__).resolve().parents[2]
MAP = CellMap((("c000", 0), ("c001", 1), ("c002", 1)))
"""Two cells share partition 1: a dispatch goes by the map, not by the cell's name."""
PARTITIONS = 2
MakeStore = Callable[[Shard], LogStore]
Records = tuple[
    int, tuple[dispatch_log.Sent, ...], tuple[dispatch_log.Forwarded, ...], tuple[dispatch_log.Waiting, ...]
]
"""A step record as the tests compare it: (as_of, dispatched, cancels, waiting); log times differ."""
MonkeyPatch = pytest.MonkeyPatch
Makers = tuple[str, Callable[[str], Callable[[], MakeStore]]]

ROUNDS: list[list[Event]] = [
    [summary("c000", 1, nodes=2, partition=0), summary("c001", 1, nodes=2, partition=1),
     summary("c002", 1, nodes=1, partition=1),
     gpu_job("j0", gpus=8, cells=("c000", "c001")), gpu_job("j1", gpus=8, cells=("c002",)),
     gpu_job("gang", tasks=2, gpus=8, cells=("c001", "c002")), gpu_job("j2", gpus=1)],
    [JobReturned(job_id="j0", cell="c000", attempt=1, reason="gang_does_not_fit_topology", as_of=3),
     JobCancelled(job_id="j1")],
    [summary("c001", 2, nodes=3, partition=1, dispatched_seq=1)],
    [gpu_job("j3", gpus=2, cells=("c000",)), summary("c000", 2, nodes=2, partition=0, dispatched_seq=2)],
]
"""Round 0: four jobs to three cells (the gang whole, to the one cell with two free nodes);
round 1: c000 hands j0 back (no other cell has room: it waits) and j1 is cancelled (forwarded to
c002's partition); round 2: a newer summary of c001 shows room: j0 goes there, attempt 2."""
EXPECTED = [
    (0, "JobDispatched", "j0", "c000", 1), (0, "JobDispatched", "j2", "c000", 1),
    (0, "JobDispatched", "j3", "c000", 1),
    (1, "JobDispatched", "j1", "c002", 1), (1, "JobDispatched", "gang", "c001", 1),
    (1, "JobCancelled", "j1", "", 0), (1, "JobDispatched", "j0", "c001", 2),
]
"""Per partition, in log order."""


def msg(event: Event) -> Message:
    return Message(encode(envelope(event, "test")))


class Fleet:
    """The global partition's store and every cell partition's store over one log."""

    def __init__(self, make: MakeStore, partitions: int = PARTITIONS) -> None:
        self.make, self.partitions = make, partitions
        self.cells: dict[int, LogStore] = {}
        self.glob: LogStore = make(Shard.GLOBAL)

    async def __aenter__(self) -> Fleet:
        self.cells = {p: self.make(Shard.cell(p)) for p in range(self.partitions)}
        for store in self.cells.values():  # the cells' stores first: the outbox writes into them
            await store.open()
        await self.glob.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.glob.close()
        for store in self.cells.values():
            await store.close()

    async def cell_events(self) -> list[tuple[int, str, str, str, int, int, int]]:
        """Every event of every cell partition: (partition, type, job, cell, attempt, seq, as_of)."""
        out = []
        for p, store in self.cells.items():
            for value in await _read_all(store, INPUTS):
                e = decode(value).event
                if isinstance(e, JobDispatched):
                    out.append((p, "JobDispatched", e.job.job_id, e.cell, e.attempt, e.seq, e.as_of))
                elif isinstance(e, QuotaSet):
                    out.append((p, "QuotaSet", e.tenant, e.cell, 0, 0, 0))
                else:
                    assert isinstance(e, JobCancelled)
                    out.append((p, "JobCancelled", e.job_id, "", 0, 0, 0))
        return out

    async def records(self) -> list[Records]:
        """The step records (digest aside: log times differ between runs)."""
        out = []
        for value in await _read_all(self.glob, DECISIONS):
            r = decode_record(value)
            out.append((r.as_of, r.dispatched, r.cancels, r.waiting))
        return out


async def _read_all(store: LogStore, name: str) -> list[bytes]:
    log = store.log(name)
    out: list[bytes] = []
    offset, end = 0, await log.end_offset()
    while offset < end:
        batch = await log.read(offset, max_records=1000, timeout_ms=2000)
        if not batch:
            break
        out.extend(r.value for r in batch)
        offset = batch[-1].offset + 1
    return out


def _kafka_maker(bootstrap: str, prefix: str) -> Callable[[], MakeStore]:
    from fleetlog.log.kafka import KafkaConfig, KafkaLogStore

    config = KafkaConfig(bootstrap_servers=bootstrap, topic_prefix=prefix, shards=PARTITIONS)
    return lambda: functools.partial(KafkaLogStore, config)


def file_maker(directory: Path) -> Callable[[], MakeStore]:
    """A new process's view of the log each time (a new registry of stores)."""
    return lambda: FileLogStore(directory).for_shard


@pytest.fixture(params=["file", pytest.param("kafka", marks=pytest.mark.kafka)])
def makers(request: pytest.FixtureRequest, tmp_path: Path) -> Makers:
    """(kind, name -> a maker of one log's stores): several logs per test, each its own."""
    if request.param == "file":
        return "file", lambda name: file_maker(tmp_path / name)
    bootstrap: str = request.getfixturevalue("kafka_bootstrap")
    run = uuid.uuid4().hex[:8]
    return "kafka", lambda name: _kafka_maker(bootstrap, f"dl-{run}-{name}")


async def drive(
    fleet: Fleet, rounds: Sequence[Sequence[Event]], config: DispatcherConfig | None = None
) -> DispatcherLoop:
    loop = DispatcherLoop(fleet.glob, MAP, config)
    await loop.recover()
    for round_ in rounds:
        await fleet.glob.log(INPUTS).append([msg(e) for e in round_])
        await loop.step(timeout_ms=2000)
    return loop


# --- dispatching through the logs ------------------------------------------------------------------


async def test_dispatches_returns_and_cancels_reach_the_holding_cells_partition(makers: Makers) -> None:
    _, maker = makers
    async with Fleet(maker("run")()) as fleet:
        loop = await drive(fleet, ROUNDS)
        events = await fleet.cell_events()
        assert [e[:5] for e in events] == EXPECTED
        gang = [e for e in events if e[2] == "gang"]
        assert len(gang) == 1  # one dispatch names one cell: a gang never spans cells
        records = await fleet.records()
        assert [r[0] for r in records] == [7, 9, 10, 12]  # every step that decided, with its as_of
        assert records[1][3][0].code == "no_cell_has_room"  # j0 waits with its reason
        assert await fleet.glob.committed_offset(loop.config.group) == loop.offset == 12
        report = await verify_dispatcher(fleet.glob, MAP)
        assert (report.divergence, report.steps, report.inputs) == (None, 4, 12)
        assert report.digest == dispatch_log.state_digest(loop.state)


async def test_every_refusal_is_dead_lettered_with_its_code_and_the_rest_is_folded(makers: Makers) -> None:
    _, maker = makers
    bad_round: list[Message] = [
        msg(summary("c000", 1, nodes=1, partition=0)),
        msg(summary("zzz", 1, partition=0)),
        msg(summary("c001", 1, partition=0)),
        msg(summary("c000", 1, nodes=5, partition=0)),
        msg(JobReturned(job_id="ghost", cell="c000", attempt=1, reason="x", as_of=0)),
        msg(gpu_job("ok", gpus=8)),
        msg(JobReturned(job_id="ok", cell="c000", attempt=3, reason="x", as_of=0)),
        msg(node("n1", gpus=8)),  # a heartbeat belongs in its cell's partition
        Message(b"\xc1 not an event"),
    ]
    async with Fleet(maker("refuse")()) as fleet:
        loop = DispatcherLoop(fleet.glob, MAP)
        await loop.recover()
        await fleet.glob.log(INPUTS).append(bad_round)
        result = await loop.step(timeout_ms=2000)
        assert (result.inputs, result.dead_lettered, result.dispatched) == (9, 7, 1)
        assert [e[:5] for e in await fleet.cell_events()] == [(0, "JobDispatched", "ok", "c000", 1)]
        parked = await fleet.glob.log(DEAD_LETTERS).read(0, 100, timeout_ms=2000)
        why = sorted((r.header(SOURCE_HEADER), r.header(REASON_HEADER)) for r in parked)
        assert why == [(b"inputs@1", b"unknown_cell"), (b"inputs@2", b"wrong_partition"),
                       (b"inputs@3", b"stale_summary"), (b"inputs@4", b"unknown_job"),
                       (b"inputs@6", b"stale_return"), (b"inputs@7", b"invalid_event"),
                       (b"inputs@8", b"undecodable")]
        heartbeat = next(r for r in parked if r.header(SOURCE_HEADER) == b"inputs@7")
        said = heartbeat.header("fleetlog-dead-letter-error") or b""
        assert b"NodeHeartbeat is not an input of this shard's log" in said
        assert await fleet.glob.committed_offset(loop.config.group) == 9
        assert (await verify_dispatcher(fleet.glob, MAP)).divergence is None


def test_the_dispatcher_runs_over_the_global_partition_only(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="global partition"):
        DispatcherLoop(FileLogStore(tmp_path), MAP)


# --- crashes: the union of what was written is an uncrashed run's -------------------------------------


_CHILD = """
import asyncio, sys
from tests.service.test_dispatcher import child
asyncio.run(child(*sys.argv[1:]))
"""


async def child(kind: str, where: str, kill_at: str, when: str) -> None:
    """Run ROUNDS and SIGKILL this process at the ``kill_at``-th commit (``when``: before or after
    it; file: the ``kill_at``-th commit frame, the global's or a cell's)."""
    calls = [0]

    def counted(original: Callable[..., object]) -> Callable[..., object]:
        def call(*args: object, **kwargs: object) -> object:
            calls[0] += 1
            if calls[0] == int(kill_at) and when == "before":
                os.kill(os.getpid(), signal.SIGKILL)
            return original(*args, **kwargs)
        return call

    if kind == "file":
        FileLogStore._commit_frame = counted(FileLogStore._commit_frame)  # type: ignore[method-assign,assignment]
        make = file_maker(Path(where))()
    else:
        from aiokafka import AIOKafkaProducer

        original = AIOKafkaProducer.commit_transaction

        async def commit(self: AIOKafkaProducer) -> None:
            calls[0] += 1
            if calls[0] == int(kill_at) and when == "before":
                os.kill(os.getpid(), signal.SIGKILL)
            await original(self)
            if calls[0] == int(kill_at):
                os.kill(os.getpid(), signal.SIGKILL)

        AIOKafkaProducer.commit_transaction = commit
        bootstrap, prefix = where.split("|")
        make = _kafka_maker(bootstrap, prefix)()
    async with Fleet(make) as fleet:
        await drive(fleet, ROUNDS)


def _run_child(*args: str) -> int:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", _CHILD, *args], env=env, capture_output=True,
                          timeout=120, check=False, cwd=ROOT)
    assert done.returncode in (0, -signal.SIGKILL), done.stderr.decode()[-3000:]
    return done.returncode


async def all_or_nothing(fleet: Fleet, want_events: list[tuple[int, str, str, str, int, int, int]],
                         want_records: list[Records]) -> None:
    """What a reader sees right after the crash: whole steps of the uncrashed run, no part of one
    (the cells hold exactly what the visible step records sent, in the reference's order)."""
    records = await fleet.records()
    assert records == want_records[: len(records)]
    sent = {(s.job_id, s.cell, s.attempt) for r in records for s in r[1]}
    events = await fleet.cell_events()
    assert {(e[2], e[3], e[4]) for e in events if e[1] == "JobDispatched"} == sent
    for p in range(PARTITIONS):
        mine = [e for e in events if e[0] == p]
        assert mine == [e for e in want_events if e[0] == p][: len(mine)]


async def finish(fleet: Fleet) -> DispatcherLoop:
    """A new process after the crash: recover, finish the round the crash interrupted, go on."""
    loop = DispatcherLoop(fleet.glob, MAP)
    await loop.recover()
    end, bounds = await fleet.glob.log(INPUTS).end_offset(), [0]
    for round_ in ROUNDS:
        bounds.append(bounds[-1] + len(round_))
    assert end in bounds
    if loop.offset < end:
        await loop.step(timeout_ms=2000)
    await drive_more(fleet, loop, ROUNDS[bounds.index(end):])
    return loop


async def drive_more(fleet: Fleet, loop: DispatcherLoop, rounds: Sequence[Sequence[Event]]) -> None:
    for round_ in rounds:
        await fleet.glob.log(INPUTS).append([msg(e) for e in round_])
        await loop.step(timeout_ms=2000)


CRASHES = [
    ("file", "1", "before"),  # before the first step's commit frame: nothing anywhere
    ("file", "2", "before"),  # after the commit frame, before any cell's: the outbox redoes both
    ("file", "3", "before"),  # after cell 0's frame: cell 1's is redone, cell 0's not twice
    ("file", "5", "before"),  # the second step (the forwarded cancel), after its commit frame
    pytest.param("kafka", "2", "before", marks=pytest.mark.kafka),  # the second step's transaction open
    pytest.param("kafka", "1", "after", marks=pytest.mark.kafka),  # the first committed, not yet seen
]


@pytest.mark.parametrize(("kind", "kill_at", "when"), CRASHES)
async def test_a_crash_anywhere_writes_what_an_uncrashed_run_writes(
    kind: str, kill_at: str, when: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    reference = file_maker(tmp_path / "reference")  # offsets and decisions do not depend on the log
    if kind == "file":
        crashed, where = file_maker(tmp_path / "crashed"), str(tmp_path / "crashed")
    else:
        bootstrap: str = request.getfixturevalue("kafka_bootstrap")
        run = uuid.uuid4().hex[:8]
        crashed, where = _kafka_maker(bootstrap, f"crash-{run}"), f"{bootstrap}|crash-{run}"
    async with Fleet(reference()) as fleet:
        await drive(fleet, ROUNDS)
        want_events, want_records = await fleet.cell_events(), await fleet.records()
    assert _run_child(kind, where, kill_at, when) == -signal.SIGKILL
    async with Fleet(crashed()) as fleet:
        await fleet.glob.recover()  # the file log's outbox; Kafka: nothing to finish
        await all_or_nothing(fleet, want_events, want_records)
        loop = await finish(fleet)
        got_events = await fleet.cell_events()
        assert got_events == want_events  # no JobDispatched twice (same job and attempt), none missing
        assert len({(e[2], e[4], e[1]) for e in got_events}) == len(got_events)
        assert await fleet.records() == want_records
        assert (await verify_dispatcher(fleet.glob, MAP)).divergence is None
        assert await fleet.glob.committed_offset(loop.config.group) == loop.offset


async def test_an_aborted_step_recovers_before_the_next(tmp_path: Path, monkeypatch: MonkeyPatch) -> None:
    """A transaction that fails after dispatch() changed the state: the next step rebuilds it."""
    async with Fleet(file_maker(tmp_path / "log")()) as fleet:
        loop = DispatcherLoop(fleet.glob, MAP)
        await loop.recover()
        await fleet.glob.log(INPUTS).append([msg(e) for e in ROUNDS[0]])
        real = type(fleet.glob).append_transactional_many

        async def failing(*args: object, **kwargs: object) -> object:
            raise OSError("disk full")

        monkeypatch.setattr(type(fleet.glob), "append_transactional_many", failing)
        with pytest.raises(OSError, match="disk full"):
            await loop.step()
        monkeypatch.setattr(type(fleet.glob), "append_transactional_many", real)
        await loop.step()
        await drive_more(fleet, loop, ROUNDS[1:])
        assert [e[:5] for e in await fleet.cell_events()] == EXPECTED


# --- verify ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tamper", ["dispatched", "digest"])
async def test_verify_names_a_tampered_step(tamper: str, tmp_path: Path, monkeypatch: MonkeyPatch) -> None:
    real, calls = dispatch_log.record_of, [0]

    def tampered(*args: object) -> dispatch_log.StepRecord:
        record = real(*args)  # type: ignore[arg-type]
        calls[0] += 1
        if calls[0] != 3:
            return record
        if tamper == "digest":
            return dispatch_log.StepRecord(record.as_of, "0" * 32, record.dispatched)
        sent = record.dispatched[0]
        moved = (dispatch_log.Sent(sent.job_id, "c002", 1, 1),)
        return dispatch_log.StepRecord(record.as_of, record.digest, moved)

    async with Fleet(file_maker(tmp_path / "log")()) as fleet:
        monkeypatch.setattr(service_dispatcher, "record_of", tampered)
        await drive(fleet, ROUNDS)
        report = await verify_dispatcher(fleet.glob, MAP)
        assert report.steps == 2
        assert report.divergence is not None
        assert (report.divergence.decisions_offset, report.divergence.as_of) == (2, 10)
        assert report.divergence.what.startswith(f"{tamper} differ")
        with pytest.raises(DispatchDivergenceError, match=r"decisions@2 \(global as_of 10\)"):
            await DispatcherLoop(fleet.glob, MAP).recover()


# --- limits ------------------------------------------------------------------------------------------


def largest_job() -> JobSubmitted:
    """A submission at every bound of the event: the longest names, the most cells, groups and
    GPU models, the most tasks."""
    long = "x" * 240
    models = ("A100", *(f"{long}-{m:04}" for m in range(63)))
    group = TaskGroup(count=MAX_TASKS_PER_JOB // MAX_TASK_GROUPS, cpu_milli=1, mem_mib=1, gpu_count=1,
                      gpu_milli=1000, gpu_models=models, name="g" * 253)
    cells = ("c000", *(f"{long}-{c:05}" for c in range(1023)))
    return JobSubmitted(job_id="j" * 253, tenant="t" * 253, queue="q" * 253, priority=1_000_000,
                        task_groups=(group,) * MAX_TASK_GROUPS, allowed_cells=cells,
                        expected_duration_ms=1 << 53)


async def test_a_dispatch_of_the_largest_submission_fits_a_record(tmp_path: Path) -> None:
    job = largest_job()
    submitted = encode(envelope(job, "p" * 253, "k" * 253))
    sent = JobDispatched(job=job, cell="c" * 253, attempt=1 << 20, seq=(1 << 63) - 1, as_of=(1 << 63) - 1)
    value = encode(envelope(sent, "p" * 253, "k" * 253))
    assert len(submitted) < len(value) < MAX_EVENT_BYTES  # about 1.3 MB of a 4 MiB record
    assert decode(value).event == sent
    big = summary("c000", 1, nodes=2000, partition=0)
    async with Fleet(file_maker(tmp_path / "log")()) as fleet:
        await drive(fleet, [[big, job]])
        (record,) = await _read_all(fleet.cells[0], INPUTS)
        got = decode(record).event
        assert isinstance(got, JobDispatched)
        assert (got.job, got.cell) == (job, "c000")


async def test_many_cells_each_job_once_in_its_cells_partition(tmp_path: Path) -> None:
    cells = CellMap(tuple((f"c{i:03}", i % 8) for i in range(64)))
    events: list[Event] = [summary(c, 1, nodes=2, partition=p) for c, p in cells.partitions]
    events += [gpu_job(f"j{c}-{k}", gpus=1, cells=(c,)) for c, _ in cells.partitions for k in range(10)]
    async with Fleet(file_maker(tmp_path / "log")(), partitions=8) as fleet:
        loop = DispatcherLoop(fleet.glob, cells)
        await loop.recover()
        await fleet.glob.log(INPUTS).append([msg(e) for e in events])
        assert (await loop.step()).dispatched == 640
        got = await fleet.cell_events()
        names = cells.cells
        assert sorted((e[2], e[3]) for e in got) == sorted((f"j{c}-{k}", c) for c in names for k in range(10))
        assert all(e[0] == cells.partition_of(e[3]) for e in got)
        assert sorted((e[3], e[5]) for e in got) == sorted((c, s) for c in names for s in range(1, 11))


async def test_a_summary_flood_is_folded_in_one_step_and_its_resends_parked(tmp_path: Path) -> None:
    flood: list[Event] = []
    for seq in range(1, 5001):
        flood += [summary(c, seq, nodes=1 + seq % 3, partition=p) for c, p in MAP.partitions]
    flood += [summary("c000", 17, partition=0)] * 100  # resends: stale
    flood.append(gpu_job("after", gpus=8, tasks=3))  # needs the newest summary of some cell
    async with Fleet(file_maker(tmp_path / "log")()) as fleet:
        loop = DispatcherLoop(fleet.glob, MAP, DispatcherConfig(max_batch=100_000))
        await loop.recover()
        await fleet.glob.log(INPUTS).append([msg(e) for e in flood])
        result = await loop.step()
        assert (result.inputs, result.dead_lettered, result.dispatched) == (len(flood), 100, 1)
        assert {c: s.seq for c, s in loop.state.summaries.items()} == dict.fromkeys(MAP.cells, 5000)
        assert (await verify_dispatcher(fleet.glob, MAP)).divergence is None


async def test_a_step_larger_than_a_record_is_split_and_recovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    small = functools.partial(dispatch_log.encode_record, limit=300)
    monkeypatch.setattr(service_dispatcher, "encode_record", small)
    jobs: list[Event] = [gpu_job(f"job-{i:03}", gpus=1) for i in range(40)]
    async with Fleet(file_maker(tmp_path / "log")()) as fleet:
        await drive(fleet, [[summary("c000", 1, nodes=8, partition=0), *jobs]])
        parts = [decode_record(v) for v in await _read_all(fleet.glob, DECISIONS)]
        assert len(parts) > 5
        assert [p.part for p in parts] == list(range(len(parts)))
        assert sum(len(p.dispatched) for p in parts) == 40
        loop = DispatcherLoop(fleet.glob, MAP)
        await loop.recover()  # every part joined and the step reproduced
        assert loop.state.jobs["job-039"].status == "held"
        assert (await verify_dispatcher(fleet.glob, MAP)).steps == 1


def test_a_record_split_in_parts_joins_to_the_whole() -> None:
    sent = tuple(dispatch_log.Sent(f"j{i}", "c000", 1, i + 1) for i in range(50))
    waiting = tuple(dispatch_log.Waiting(f"w{i}", "no_cell_has_room", "m" * 40) for i in range(20))
    record = dispatch_log.StepRecord(3, "d" * 32, sent, (dispatch_log.Forwarded("c001", "x"),), waiting)
    parts = [decode_record(v) for v in dispatch_log.encode_record(record, limit=400)]
    assert len(parts) > 3
    assert dispatch_log.join_parts(parts) == record
    assert [decode_record(v) for v in dispatch_log.encode_record(record)] == [record]
    with pytest.raises(dispatch_log.StepRecordError, match="do not line up"):
        dispatch_log.join_parts(parts[1:])
    with pytest.raises(dispatch_log.StepRecordError, match="not a dispatcher step record"):
        decode_record(encode(envelope(gpu_job("j"), "p")))


def test_the_digest_is_the_same_in_another_process() -> None:
    code = ("from tests.service.test_dispatcher import digest_of_rounds; print(digest_of_rounds())")
    here = digest_of_rounds()
    for seed in ("1", "987"):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, check=True, cwd=ROOT)
        assert out.stdout.decode().strip() == here


def digest_of_rounds() -> str:
    from fleetlog.core.dispatch import DispatchState, dispatch, fold

    state, digests = DispatchState(MAP), []
    for round_ in ROUNDS:
        for event in round_:
            fold(state, event, 5)
        dispatch(state)
        digests.append(dispatch_log.state_digest(state))
    return ",".join(digests)


async def test_a_run_stops_when_asked_commits_and_snapshots(tmp_path: Path) -> None:
    snaps = DirectorySnapshots(tmp_path / "snapshots")
    async with Fleet(file_maker(tmp_path / "log")()) as fleet:
        loop = DispatcherLoop(fleet.glob, MAP, DispatcherConfig(commit_every=1000), snaps)
        await loop.recover()
        stop = asyncio.Event()
        task = asyncio.create_task(loop.run(stop, timeout_ms=20))
        await fleet.glob.log(INPUTS).append([msg(summary("c000", 1, partition=0))])  # decides nothing
        for _ in range(200):
            await asyncio.sleep(0.01)
            if loop.offset == 1:
                break
        stop.set()
        await task
        assert await fleet.glob.committed_offset(loop.config.group) == 1
        (newest, _), = await snaps.candidates()
        assert newest.endswith(f"snapshot-{1:020d}.bin")



def test_a_record_key_never_passes_the_envelope_bound() -> None:
    assert service_dispatcher.record_key("dispatch", "j1", 3) == "dispatch/j1/3"
    assert service_dispatcher.record_key("cancel", "j1") == "cancel/j1"
    long_a, long_b = "a" * 253, "a" * 252 + "b"
    keys = {service_dispatcher.record_key("dispatch", j, 1 << 20) for j in (long_a, long_b)}
    assert len(keys) == 2
    assert all(len(k) <= 253 for k in keys)


@pytest.mark.kafka
async def test_a_zombie_dispatcher_is_fenced_and_stops(kafka_bootstrap: str) -> None:
    """A second owner of the global shard (same transactional id) fences the first: its next
    transaction fails with FencedError, it stops, and nothing it decided after is visible."""
    make = _kafka_maker(kafka_bootstrap, f"zombie-{uuid.uuid4().hex[:8]}")
    async with Fleet(make()) as first, Fleet(make()) as second:
        zombie = await drive(first, ROUNDS[:1])
        await first.glob.log(INPUTS).append([msg(e) for e in ROUNDS[1]])
        owner = DispatcherLoop(second.glob, MAP)
        await owner.recover()
        await owner.step(timeout_ms=2000)  # the new owner's transaction fences the zombie
        await first.glob.log(INPUTS).append([msg(e) for e in ROUNDS[2]])
        with pytest.raises(FencedError):
            await zombie.step(timeout_ms=2000)
        assert zombie.fenced
        with pytest.raises(FencedError, match="fenced"):
            await zombie.step()
        await owner.step(timeout_ms=2000)
        assert [e[:5] for e in await second.cell_events()] == [e for e in EXPECTED if e[2] != "j3"]
        assert (await verify_dispatcher(second.glob, MAP)).divergence is None
    # aiokafka leaves the fenced batches' futures unretrieved: their "never retrieved" report at
    # collection must come now, not inside a later import (CPython 3.11's ast.parse then fails)
    gc.collect()


# --- cell quotas ---------------------------------------------------------------------------------------


def cell_quota(cell: str, tenant: str = "t") -> QuotaSet:
    return QuotaSet(tenant=tenant, cell=cell, nominal=Resources(cpu_milli=1000, mem_mib=1024, gpu_milli=8000))


async def test_a_cell_quota_goes_to_its_cells_partition_an_unknown_cells_is_parked(tmp_path: Path) -> None:
    async with Fleet(file_maker(tmp_path / "log")()) as fleet:
        loop = DispatcherLoop(fleet.glob, MAP)
        await loop.recover()
        fleet_wide = QuotaSet(tenant="t", nominal=Resources(cpu_milli=1, mem_mib=1, gpu_milli=1))
        quotas = (cell_quota("c002"), cell_quota("nowhere"), fleet_wide)
        await fleet.glob.log(INPUTS).append([msg(e) for e in quotas])
        result = await loop.step()
        assert (result.quotas, result.dead_lettered, result.published) == (1, 1, True)
        assert [e[:4] for e in await fleet.cell_events()] == [(1, "QuotaSet", "t", "c002")]
        (parked,) = await fleet.glob.log(DEAD_LETTERS).read(0, 10)
        assert parked.header(REASON_HEADER) == b"unknown_cell"
        assert await _read_all(fleet.glob, DECISIONS) == []  # dispatch() decided nothing: no step record
        assert await fleet.glob.committed_offset(loop.config.group) == 3
        again = DispatcherLoop(fleet.glob, MAP)
        await again.recover()
        assert dispatch_log.state_digest(again.state) == dispatch_log.state_digest(loop.state)


# --- snapshots -----------------------------------------------------------------------------------------


async def test_recovery_from_a_snapshot_is_the_full_replays_and_a_bad_one_is_skipped(tmp_path: Path) -> None:
    snaps = DirectorySnapshots(tmp_path / "snapshots")
    async with Fleet(file_maker(tmp_path / "log")()) as fleet:
        loop = DispatcherLoop(fleet.glob, MAP, snapshots=snaps)
        await loop.recover()
        await drive_more(fleet, loop, ROUNDS[:2])
        good = await loop.snapshot()
        await drive_more(fleet, loop, ROUNDS[2:])
        want = (dispatch_log.state_digest(loop.state), loop.offset, loop.decisions_next)
        full = DispatcherLoop(fleet.glob, MAP)
        await full.recover()
        assert full.restored_from is None
        assert (dispatch_log.state_digest(full.state), full.offset, full.decisions_next) == want
        fast = DispatcherLoop(fleet.glob, MAP, snapshots=snaps)
        await fast.recover()
        assert fast.restored_from == good
        assert (dispatch_log.state_digest(fast.state), fast.offset, fast.decisions_next) == want
        # a newer snapshot whose state does not line up with the log (summaries lost): the tail's
        # first step diverges from it, so recovery goes back to the good one
        wrong = dispatch_log.restore_state(dispatch_log.snapshot_state(full.state))
        wrong.summaries.clear()
        wrong.offset = 10
        header = SnapshotHeader(inputs_offset=10, decisions_offset=2, policy="dispatch", taken_ms=0)
        await snaps.save(encode_snapshot(Snapshot(header, dispatch_log.snapshot_state(wrong))))
        (tmp_path / "snapshots" / f"snapshot-{99:020d}.bin").write_bytes(b"FLSNAP1\n torn")
        again = DispatcherLoop(fleet.glob, MAP, snapshots=snaps)
        await again.recover()
        assert again.restored_from == good
        assert dispatch_log.state_digest(again.state) == want[0]


def test_a_damaged_snapshot_state_is_refused() -> None:
    from fleetlog.core.dispatch import DispatchState, fold

    state = DispatchState(MAP)
    for event in ROUNDS[0]:
        fold(state, event, 5)
    data = dispatch_log.snapshot_state(state)
    assert dispatch_log.restore_state(data) == state
    with pytest.raises(dispatch_log.DispatchSnapshotError, match="not a dispatcher snapshot"):
        dispatch_log.restore_state(data[:-5])
    forged = data.replace(b"gang", b"gane")
    with pytest.raises(dispatch_log.DispatchSnapshotError, match="digest"):
        dispatch_log.restore_state(forged)


async def test_a_loop_that_was_not_recovered_recovers_before_its_first_step(tmp_path: Path) -> None:
    async with Fleet(file_maker(tmp_path / "log")()) as fleet:
        await drive(fleet, ROUNDS[:2])
        loop = DispatcherLoop(fleet.glob, MAP)  # no recover(): a restart must not dispatch again
        await drive_more(fleet, loop, ROUNDS[2:])
        assert [e[:5] for e in await fleet.cell_events()] == EXPECTED
