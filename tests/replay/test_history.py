"""``fleetlog history`` on a log built by hand: every field of every record against the timeline
below, worked out by hand (docs/replay.md, "history"; fleetlog/replay/history.py defines them).

Nodes n1, n2, n3 (cell c1) and n4 (cell c2), 8 GPUs each, beat every round. Decisions are
written by hand too (the fold takes them as recorded), each at the time of the round's inputs.

=====  ======================================================================================
 0 s   every job submitted
 5 s   placed: ok, exit3, gangfail, cancelrun, twice, still, frac, lost, lost2, nostart, noexit;
       reject rejected
10 s   every placed task but nostart's reports started (gangfail's task 2 at 12 s); still resent:
       a duplicate
20 s   ok task 0 exits 0; exit3 exits 3; nostart exits 0 (never reported started); noexit fails
       with no exit code
30 s   gangfail task 1 fails (137, OOM); at 35 s its task 0 exits 2: the gang had already failed
40 s   cancelrun and cancelwait cancelled
45 s   lost3 (2 tasks) placed on n3
50 s   lost3 task 0 starts; n3 reports itself unhealthy: lost, lost2, lost3 requeued (no event
       of theirs says so); then lost2 "exits 0" and lost3 task 1 "starts": the fold ignores both;
       twice preempted (both tasks, one decision batch: one preemption)
55 s   twice, lost, lost2, lost3 placed again (lost3 on n2)
60 s   they start
70 s   ok task 1 exits 0: ok succeeded
80 s   twice preempted again (task 1 only: the whole gang)
85 s   lost, lost2, lost3 finish
90 s   twice placed a third time, in cell c2 (node n4), starts at 95 s
100 s  twice task 0 and frac finish; ok resent after it ended: a duplicate
110 s  twice task 1 finishes
120 s  still runs: not listed
=====  ======================================================================================
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from fleetlog.cli import main
from fleetlog.events import encode, envelope
from fleetlog.events.codec import CONTENT_TYPE_HEADER, MSGPACK
from fleetlog.events.model import (
    DecisionBatch,
    Event,
    JobCancelled,
    JobPlaced,
    JobRejected,
    JobSubmitted,
    TaskFailed,
    TaskFinished,
    TaskPlacement,
    TaskPreempted,
    TaskStarted,
)
from fleetlog.events.parts import encode_step
from fleetlog.log.base import DECISIONS, INPUTS, Message
from fleetlog.log.file import FileLogStore
from fleetlog.replay.history import Filters, account
from fleetlog.replay.source import open_file_source
from tests.core.builders import job, node, quota
from tests.replay.scenario import ClockBox

START = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def at(seconds: float) -> int:
    return START + round(seconds * 1000)


def hours(unit_seconds: float) -> float:
    """GPU-seconds (core-seconds) as hours, as the record rounds them."""
    return round(unit_seconds / 3600, 6)


def _jobs() -> list[JobSubmitted]:
    return [
        msgspec.structs.replace(job("ok", tasks=2, gpus=2, cpu=4000), queue="train"),
        job("exit3"),
        job("gangfail", tenant="t2", tasks=3),
        job("cancelrun", tenant="t2"),
        job("cancelwait", tenant="t2"),
        msgspec.structs.replace(job("twice", tasks=2, gpus=2), queue="batch"),
        job("still", gpus=0),
        job("reject", tenant="t2"),
        job("frac", milli=500, cpu=2000),
        job("lost"),
        job("lost2", tenant="t2"),
        job("lost3", tasks=2),
        job("nostart"),
        job("noexit"),
    ]


def place(job_id: str, cell: str = "c1", *tasks: tuple[str, tuple[int, ...]]) -> JobPlaced:
    return JobPlaced(job_id=job_id, cell=cell,
                     tasks=tuple(TaskPlacement(i, n, gpus) for i, (n, gpus) in enumerate(tasks)))


def started(job_id: str, *tasks: int) -> list[Event]:
    return [TaskStarted(job_id=job_id, task_index=i, node="n") for i in tasks]


def preempt(job_id: str, *tasks: int) -> list[TaskPreempted]:
    return [TaskPreempted(job_id=job_id, task_index=i, by_job_id="vip", cause="priority") for i in tasks]


TWICE = ("n2", (4, 5)), ("n2", (6, 7))
ROUNDS: list[tuple[float, list[Event], list[Any]]] = [
    (0, [quota("t1", 64), quota("t2", 64), *_jobs()], []),
    (5, [], [place("ok", "c1", ("n1", (0, 1)), ("n2", (0, 1))), place("exit3", "c1", ("n1", (2,))),
             place("gangfail", "c1", ("n1", (3,)), ("n1", (4,)), ("n2", (2,))),
             place("cancelrun", "c1", ("n2", (3,))), place("twice", "c1", *TWICE),
             place("still", "c1", ("n1", ())), place("frac", "c1", ("n1", (5,))),
             place("lost", "c1", ("n3", (0,))), place("lost2", "c1", ("n3", (1,))),
             place("nostart", "c1", ("n1", (6,))), place("noexit", "c1", ("n1", (7,))),
             JobRejected(job_id="reject", reason="never_fits", message="needs 9 GPUs on one node")]),
    (10, [*started("ok", 0, 1), *started("exit3", 0), *started("gangfail", 0, 1), *started("cancelrun", 0),
          *started("twice", 0, 1), *started("still", 0), *started("frac", 0), *started("lost", 0),
          *started("lost2", 0), *started("noexit", 0), job("still", gpus=0)], []),
    (12, [*started("gangfail", 2), *started("ok", 0)], []),
    (20, [TaskFinished(job_id="ok", task_index=0),
          TaskFinished(job_id="exit3", task_index=0, exit_code=3),
          TaskFinished(job_id="nostart", task_index=0),
          TaskFailed(job_id="noexit", task_index=0, reason="evicted")], []),
    (30, [TaskFailed(job_id="gangfail", task_index=1, reason="OOM killed", exit_code=137)], []),
    (35, [TaskFinished(job_id="gangfail", task_index=0, exit_code=2)], []),
    (40, [JobCancelled(job_id="cancelrun", reason="user"), JobCancelled(job_id="cancelwait")], []),
    (45, [], [place("lost3", "c1", ("n3", (2,)), ("n3", (3,)))]),
    (50, [*started("lost3", 0), node("n3", healthy=False), TaskFinished(job_id="lost2", task_index=0),
          *started("lost3", 1)], preempt("twice", 0, 1)),
    (55, [], [place("twice", "c1", *TWICE), place("lost", "c1", ("n1", (6,))),
              place("lost2", "c1", ("n1", (7,))), place("lost3", "c1", ("n2", (2,)), ("n2", (3,)))]),
    (60, [*started("twice", 0, 1), *started("lost", 0), *started("lost2", 0), *started("lost3", 0, 1)], []),
    (70, [TaskFinished(job_id="ok", task_index=1)], []),
    (80, [], preempt("twice", 1)),
    (85, [TaskFinished(job_id="lost", task_index=0), TaskFinished(job_id="lost2", task_index=0),
          TaskFinished(job_id="lost3", task_index=0), TaskFinished(job_id="lost3", task_index=1)], []),
    (90, [], [place("twice", "c2", ("n4", (0, 1)), ("n4", (2, 3)))]),
    (95, started("twice", 0, 1), []),
    (100, [TaskFinished(job_id="twice", task_index=0), TaskFinished(job_id="frac", task_index=0),
           job("ok", tasks=2, gpus=2, cpu=4000)], []),
    (110, [TaskFinished(job_id="twice", task_index=1)], []),
    (120, [], []),
]


async def write_log(directory: Path, rounds: list[tuple[float, list[Event], list[Any]]] = ROUNDS) -> None:
    """Each round: the nodes' heartbeats (n3's only while it is healthy, so the round's own
    unhealthy beat is its one), the round's inputs, then its decisions (a batch at the inputs'
    end: folded at the round's time)."""
    clock = ClockBox()
    store = FileLogStore(directory, clock=clock, fsync="never")
    await store.open()
    try:
        for seconds, inputs, decisions in rounds:
            clock.now_ms = at(seconds)
            beats: list[Event] = [node("n1"), node("n2"), node("n4", cell="c2")]
            if not any(isinstance(e, type(beats[0])) and e.node == "n3" for e in inputs):
                beats.append(node("n3"))
            events = [*beats, *inputs]
            await store.log(INPUTS).append([Message(encode(envelope(e, "test"))) for e in events])
            if decisions:
                as_of = await store.log(INPUTS).end_offset()
                batch = DecisionBatch(as_of=as_of, digest="", decisions=tuple(decisions))
                records = encode_step(batch, "test")
                headers = ((CONTENT_TYPE_HEADER, MSGPACK),)
                await store.log(DECISIONS).append([Message(value=v, headers=headers) for v in records])
    finally:
        await store.close()


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("history") / "log"
    asyncio.run(write_log(directory))
    return directory


def record(job_id: str, state: str, ended: float, end: str, *, tenant: str = "t1", queue: str = "default",
           tasks: int = 1, placed: float | None = 5, started: float | None = 10, exit_code: int | None = None,
           preemptions: int = 0, requeues: int = 0, gpu_s: float = 0, cpu_s: float = 0,
           cell: str = "c1") -> dict[str, Any]:
    """The record the timeline gives (submitted at 0 s, in ``cell`` once placed)."""
    return {
        "job_id": job_id, "state": state, "tenant": tenant, "queue": queue, "priority": 0, "tasks": tasks,
        "cell": None if placed is None else cell, "submitted_at_ms": at(0),
        "placed_at_ms": None if placed is None else at(placed),
        "started_at_ms": None if started is None else at(started), "ended_at_ms": at(ended),
        "wait_ms": None if placed is None else round(placed * 1000),
        "elapsed_ms": None if placed is None else round((ended - placed) * 1000),
        "exit_code": exit_code, "end": end, "preemptions": preemptions, "requeues": requeues,
        "gpu_hours": hours(gpu_s), "cpu_hours": hours(cpu_s), "partial": False,
    }


EXPECTED = [
    record("reject", "rejected", 5, "rejected: never_fits (needs 9 GPUs on one node)", tenant="t2",
           placed=None, started=None),
    # one GPU and one core from 10 s to 20 s
    record("exit3", "failed", 20, "task 0 exited 3", exit_code=3, gpu_s=10, cpu_s=10),
    # its task never reported started: no start, no hours
    record("nostart", "succeeded", 20, "every task exited 0", started=None, exit_code=0),
    record("noexit", "failed", 20, "task 0 failed: evicted", gpu_s=10, cpu_s=10),
    # three 1-GPU tasks from 10, 10 and 12 s until the gang failed at 30 s (task 0's exit 2 at 35 s: too late)
    record("gangfail", "failed", 30, "task 1 failed: OOM killed", tenant="t2", tasks=3, exit_code=137,
           gpu_s=20 + 20 + 18, cpu_s=58),
    record("cancelrun", "cancelled", 40, "cancelled: user", tenant="t2", gpu_s=30, cpu_s=30),
    record("cancelwait", "cancelled", 40, "cancelled", tenant="t2", placed=None, started=None),
    # 2 GPUs and 4 cores per task: task 0 from 10 to 20 s, task 1 from 10 to 70 s
    record("ok", "succeeded", 70, "every task exited 0", queue="train", tasks=2, exit_code=0,
           gpu_s=2 * 10 + 2 * 60, cpu_s=4 * 10 + 4 * 60),
    # 10 -> 50 s (requeued with n3), 60 -> 85 s
    record("lost", "succeeded", 85, "every task exited 0", exit_code=0, requeues=1, gpu_s=40 + 25, cpu_s=65),
    record("lost2", "succeeded", 85, "every task exited 0", tenant="t2", exit_code=0, requeues=1,
           gpu_s=40 + 25, cpu_s=65),
    # placed at 45 s; task 0 started at 50 s just before the requeue (0 s of it); then 60 -> 85 s, twice
    record("lost3", "succeeded", 85, "every task exited 0", tasks=2, placed=45, started=50, exit_code=0,
           requeues=1, gpu_s=2 * 25, cpu_s=2 * 25),
    # half a GPU and 2 cores from 10 to 100 s
    record("frac", "succeeded", 100, "every task exited 0", exit_code=0, gpu_s=0.5 * 90, cpu_s=2 * 90),
    # 2 tasks x 2 GPUs (1 core): 10 -> 50, 60 -> 80, then task 0 95 -> 100 and task 1 95 -> 110
    record("twice", "succeeded", 110, "every task exited 0", queue="batch", tasks=2, exit_code=0, cell="c2",
           preemptions=2, requeues=2, gpu_s=2 * 2 * 40 + 2 * 2 * 20 + 2 * 5 + 2 * 15,
           cpu_s=2 * 40 + 2 * 20 + 5 + 15),
]


def history(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["history", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def listed(capsys: pytest.CaptureFixture[str], log: Path, *argv: str) -> list[dict[str, Any]]:
    code, out, err = history(capsys, "--log", str(log), "-o", "json", *argv)
    assert (code, err) == (0, ""), err
    items: list[dict[str, Any]] = json.loads(out)["items"]
    return items


def test_every_field_of_every_finished_job(capsys: pytest.CaptureFixture[str], log_dir: Path) -> None:
    found = listed(capsys, log_dir)
    assert [r["job_id"] for r in found] == [r["job_id"] for r in EXPECTED]  # in the order they ended
    for got, want in zip(found, EXPECTED, strict=True):
        assert got == want, got["job_id"]


def test_wait_plus_elapsed_is_the_turnaround(capsys: pytest.CaptureFixture[str], log_dir: Path) -> None:
    for r in listed(capsys, log_dir):
        if r["placed_at_ms"] is not None:
            assert r["wait_ms"] + r["elapsed_ms"] == r["ended_at_ms"] - r["submitted_at_ms"]


async def test_the_fold_agrees_at_every_step(log_dir: Path) -> None:
    """The check mode compares the jobs held pending and running with the fold's after every
    part of the inputs and every batch."""
    source = await open_file_source(log_dir)
    try:
        out: list[Any] = []
        outcome = await account(source, out.append, check=True)
    finally:
        await source.close()
    assert (outcome.listed, outcome.ended, outcome.in_progress, outcome.stopped_early) == (13, 13, 1, False)


def test_status_says_the_same_of_each_job(capsys: pytest.CaptureFixture[str], log_dir: Path) -> None:
    """``fleetlog status`` (its own walk over each job's events) gives the same state, end and
    exit code, and the same end time for the jobs an input ended — but for a job its node's loss
    requeued: status cannot see that requeue (no event of the job says so) and takes lost2's
    ignored exit at 50 s for its end; history asks the fold."""
    for r in listed(capsys, log_dir):
        assert main(["status", r["job_id"], "--log", str(log_dir), "--json"]) == 0
        status = json.loads(capsys.readouterr().out)
        assert (status["state"], status["exit_code"], status["end"]) == (r["state"], r["exit_code"], r["end"])
        if r["state"] != "rejected" and r["requeues"] == r["preemptions"]:
            assert status["ended_at_ms"] == r["ended_at_ms"]  # (a rejection: its record's append time)


def filtered(rows: list[dict[str, Any]], **keep: Any) -> list[str]:
    return [r["job_id"] for r in rows if all(r[k] in v for k, v in keep.items())]


@pytest.mark.parametrize(
    ("argv", "keep"),
    [
        (["--tenant", "t2"], {"tenant": {"t2"}}),
        (["--tenant", "t2", "--tenant", "t1"], {"tenant": {"t1", "t2"}}),
        (["--queue", "train", "--queue", "batch"], {"queue": {"train", "batch"}}),
        (["--state", "failed"], {"state": {"failed"}}),
        (["--state", "cancelled", "--state", "rejected", "--tenant", "t2"],
         {"state": {"cancelled", "rejected"}, "tenant": {"t2"}}),
        (["--since", "2026-01-01T00:00:40Z"], {"ended_at_ms": range(at(40), at(1000))}),
        (["--since", f"{at(40)}ms", "--until", "2026-01-01T00:01:25"],
         {"ended_at_ms": range(at(40), at(85))}),
        (["--until", f"{at(40) + 1}ms"], {"ended_at_ms": range(at(40) + 1)}),
        (["--tenant", "nobody"], {"tenant": set()}),
    ],
)
def test_filters(
    capsys: pytest.CaptureFixture[str], log_dir: Path, argv: list[str], keep: dict[str, Any]
) -> None:
    everything = listed(capsys, log_dir)
    assert [r["job_id"] for r in listed(capsys, log_dir, *argv)] == filtered(everything, **keep)


def test_limit_keeps_the_first_to_end(capsys: pytest.CaptureFixture[str], log_dir: Path) -> None:
    assert [r["job_id"] for r in listed(capsys, log_dir, "--limit", "3")] == ["reject", "exit3", "nostart"]
    assert [r["job_id"] for r in listed(capsys, log_dir, "--tenant", "t2", "--limit", "2")] == [
        "reject", "gangfail"]


async def test_limit_and_until_stop_the_replay_early(log_dir: Path) -> None:
    source = await open_file_source(log_dir)
    try:
        out: list[Any] = []
        first = await account(source, out.append, limit=2)
        until = await account(source, out.append, Filters(until_ms=at(30)))
        everything = await account(source, out.append)
    finally:
        await source.close()
    assert (first.listed, first.stopped_early) == (2, True)
    assert (until.listed, until.stopped_early) == (4, True)  # reject, exit3, nostart, noexit: not gangfail
    assert first.ended < everything.ended
    assert until.ended < everything.ended
    assert not everything.stopped_early


def test_yaml_and_the_table_say_what_json_says(capsys: pytest.CaptureFixture[str], log_dir: Path) -> None:
    import yaml

    items = listed(capsys, log_dir)
    code, out, _ = history(capsys, "--log", str(log_dir), "-o", "yaml")
    assert code == 0
    assert yaml.safe_load(out) == {"items": items}
    code, out, _ = history(capsys, "--log", str(log_dir))
    lines = out.splitlines()
    assert lines[0].split() == ["JOB_ID", "STATE", "TENANT", "QUEUE", "ENDED_AT", "WAIT", "ELAPSED",
                                "EXIT_CODE", "PREEMPTIONS", "GPU_HOURS"]
    assert [line.split()[0] for line in lines[1:]] == [r["job_id"] for r in items]
    twice = lines[-1].split()
    assert twice == ["twice", "succeeded", "t1", "batch", "2026-01-01T00:01:50Z", "5s", "1m45s", "0", "2",
                     str(hours(2 * 2 * 40 + 2 * 2 * 20 + 2 * 5 + 2 * 15))]
    code, out, _ = history(capsys, "--log", str(log_dir), "-o", "wide")
    assert out.splitlines()[0].split()[:3] == ["JOB_ID", "STATE", "TENANT"]
    assert "REQUEUES" in out.splitlines()[0]
    assert "PARTIAL" in out.splitlines()[0]


def test_nothing_listed_is_still_one_object(capsys: pytest.CaptureFixture[str], log_dir: Path) -> None:
    code, out, _ = history(capsys, "--log", str(log_dir), "--tenant", "nobody", "-o", "json")
    assert (code, json.loads(out)) == (0, {"items": []})
    code, out, _ = history(capsys, "--log", str(log_dir), "--tenant", "nobody", "-o", "yaml")
    assert (code, out) == (0, "items: []\n")


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--since", "1234"], "is an offset; history takes a log time"),
        (["--until", "yesterday"], "is neither an offset"),
        (["--state", "running"], "invalid choice: 'running'"),
        (["--limit", "0"], "is not a positive integer"),
    ],
)
def test_bad_values_are_one_line(capsys: pytest.CaptureFixture[str], log_dir: Path, argv: list[str],
                                 says: str) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["history", "--log", str(log_dir), *argv])
    out, err = capsys.readouterr()
    assert (exc.value.code, out) == (2, "")
    assert err.startswith("fleetlog history: error: argument")
    assert says in err
    assert len(err.splitlines()) == 1


def test_no_log_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = history(capsys, "--log", str(tmp_path / "none"), "-o", "json")
    assert (code, out) == (2, "")
    assert err.startswith("fleetlog history: error: no file log at")
    assert len(err.splitlines()) == 1


def test_a_deployment_with_a_cells_map_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = tmp_path / "fleetlog.toml"
    config.write_text(f'[log]\ndir = "{tmp_path / "log"}"\n\n[cells]\ncell-a = 0\ncell-b = 1\n')
    code, out, err = history(capsys, "--config", str(config))
    assert (code, out) == (2, "")
    assert err == ("fleetlog history: error: history reads a single-shard log; this configuration has a "
                   "[cells] map, whose jobs' events are split across the dispatcher's and the cells' "
                   "partitions (not supported yet)\n")
