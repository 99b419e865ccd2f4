"""``fleetlog status JOB`` for people and for scripts: a job that ended says when, after how long
and with which exit code (read from its own events in the real file log the real scheduling loop
wrote); times are ISO 8601 in text and epoch milliseconds in ``--json``; no Python repr."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from fleetlog.cli import main
from fleetlog.core.policy import Policy
from fleetlog.events import encode, envelope
from fleetlog.events.model import Event, JobCancelled, TaskFailed, TaskFinished, TaskStarted
from fleetlog.log.base import INPUTS, Message
from fleetlog.log.file import FileLogStore
from fleetlog.service.loop import LoopConfig, SchedulerLoop
from tests.core.builders import job, node, quota
from tests.replay.scenario import ClockBox

START = 1_767_225_600_000  # 2026-01-01T00:00:00Z
SECOND = 1000


def at(seconds: int) -> int:
    return START + seconds * SECOND


async def _record(directory: Path, policy: Policy | None = None, extra: tuple[Event, ...] = ()) -> None:
    """Six jobs placed at 0 s (one waits: its tenant has no quota); at 25 s one task finishes, one
    exits 3, one fails with no exit code, two jobs are cancelled; at 40 s the last task of the gang
    finishes (and at 55 s its duplicate report, which must not move the end)."""
    clock = ClockBox()
    store = FileLogStore(directory, clock=clock, fsync="never")
    await store.open()
    loop = SchedulerLoop(store, policy or Policy(), LoopConfig())
    beats = [node("n1"), node("n2")]
    jobs = [job(j) for j in ("train-42", "oom", "cancel-running", "runs")]
    placed = (("gang", 2), ("train-42", 1), ("oom", 1), ("cancel-running", 1), ("runs", 1))
    rounds: list[tuple[int, list[Event]]] = [
        (0, [*beats, quota("t1", 16), quota("t2", 0), job("gang", tasks=2), *jobs,
             job("cancel-waiting", tenant="t2"), *extra]),
        (10, [TaskStarted(job_id=j, task_index=i, node="n1") for j, n in placed for i in range(n)]),
        (25, [*beats, TaskFinished(job_id="gang", task_index=0),
              TaskFinished(job_id="train-42", task_index=0, exit_code=3),
              TaskFailed(job_id="oom", task_index=0, reason="OOM killed"),
              JobCancelled(job_id="cancel-running", reason="user asked"),
              JobCancelled(job_id="cancel-waiting")]),
        (40, [*beats, TaskFinished(job_id="gang", task_index=1),
              TaskFinished(job_id="train-42", task_index=0)]),
        (55, [*beats, TaskFinished(job_id="gang", task_index=1)]),
    ]
    try:
        for seconds, events in rounds:
            clock.now_ms = at(seconds)
            await store.log(INPUTS).append([Message(encode(envelope(e, "test"))) for e in events])
            await loop.step()
    finally:
        await store.close()


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    import asyncio

    directory = tmp_path_factory.mktemp("status") / "log"
    asyncio.run(_record(directory))
    return str(directory)


@pytest.fixture(scope="module")
def rejecting_log(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The same run under a policy that rejects what does not fit now (the FGD paper's protocol),
    with a gang larger than the fleet."""
    import asyncio

    directory = tmp_path_factory.mktemp("status") / "rejecting"
    too_big = job("too-big", tasks=4, gpus=8)
    asyncio.run(_record(directory, Policy(fail_unplaced=True), (too_big,)))
    return str(directory)


def status_json(capsys: pytest.CaptureFixture[str], log_dir: str, job_id: str) -> dict[str, Any]:
    assert main(["status", job_id, "--log", log_dir, "--json"]) == 0
    found: dict[str, Any] = json.loads(capsys.readouterr().out)
    return found


def status_text(capsys: pytest.CaptureFixture[str], log_dir: str, job_id: str) -> dict[str, str]:
    """The text output as {label: value}; every line must be ``label  value``."""
    assert main(["status", job_id, "--log", log_dir]) == 0
    out = capsys.readouterr().out
    assert "[{" not in out
    assert "{'" not in out
    assert "None" not in out
    lines = out.splitlines()
    pairs = [re.split(r"\s{2,}", line, maxsplit=1) for line in lines]
    assert all(len(p) == 2 for p in pairs), lines
    return {p[0]: p[1] for p in pairs}


ENDS = [
    # job, state, ended (s), elapsed (s) or None, exit code or None, how it ended
    ("gang", "succeeded", 40, 40, 0, "every task exited 0"),
    ("train-42", "failed", 25, 25, 3, "task 0 exited 3"),
    ("oom", "failed", 25, 25, None, "task 0 failed: OOM killed"),
    ("cancel-running", "cancelled", 25, 25, None, "cancelled: user asked"),
    ("cancel-waiting", "cancelled", 25, None, None, "cancelled"),
]


@pytest.mark.parametrize(
    ("job_id", "state", "ended", "elapsed", "code", "how"), ENDS, ids=[e[0] for e in ENDS]
)
def test_a_job_that_ended_says_when_after_how_long_and_how(
    capsys: pytest.CaptureFixture[str], log_dir: str,
    job_id: str, state: str, ended: int, elapsed: int | None, code: int | None, how: str,
) -> None:
    found = status_json(capsys, log_dir, job_id)
    assert found["state"] == state
    assert found["ended_at_ms"] == at(ended)
    assert found["elapsed_ms"] == (None if elapsed is None else elapsed * SECOND)
    assert found["exit_code"] == code
    assert found["end"] == how
    assert found["submitted_at_ms"] == at(0)
    text = status_text(capsys, log_dir, job_id)
    assert text["state"] == state
    assert text["submitted at"] == "2026-01-01T00:00:00Z"
    assert text["ended at"] == f"2026-01-01T00:00:{ended:02d}Z"
    assert text["elapsed"] == ("-" if elapsed is None else f"{elapsed}s")
    assert text["exit code"] == ("-" if code is None else str(code))
    assert text["end"] == how


def test_a_running_job_shows_how_long_it_has_run_by_the_log(
    capsys: pytest.CaptureFixture[str], log_dir: str
) -> None:
    found = status_json(capsys, log_dir, "runs")
    assert found["state"] == "running"
    assert found["placed_at_ms"] == at(0)
    assert found["elapsed_ms"] == 55 * SECOND  # to the log time of the last input
    assert "ended_at_ms" not in found
    text = status_text(capsys, log_dir, "runs")
    assert text["placed at"] == "2026-01-01T00:00:00Z"
    assert text["elapsed"] == "55s"
    assert text["task 0"] == "state started, node n1"


def test_the_status_example_in_docs_service_md_is_a_real_output(
    capsys: pytest.CaptureFixture[str], log_dir: str
) -> None:
    """docs/service.md shows ``fleetlog status`` of a job whose task exited 3: each line shown is a
    line of the real output, in order."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "service.md").read_text()
    section = page.split("## `fleetlog status JOB`", 1)[1]
    shown = section.split("```text\n", 1)[1].split("```", 1)[0].splitlines()
    assert main(["status", "train-42", "--log", log_dir]) == 0
    real = capsys.readouterr().out.splitlines()
    assert shown
    positions = [real.index(line) for line in shown]  # ValueError: a line shown is not printed
    assert positions == sorted(positions)


def test_a_rejected_job_ended_when_it_was_rejected_and_never_ran(
    capsys: pytest.CaptureFixture[str], rejecting_log: str
) -> None:
    found = status_json(capsys, rejecting_log, "too-big")
    assert found["state"] == "rejected"
    assert found["ended_at_ms"] == at(0)
    assert found["elapsed_ms"] is None
    assert found["exit_code"] is None
    assert found["end"].startswith("rejected: unplaceable (")
    assert "placed_at_ms" not in found
    text = status_text(capsys, rejecting_log, "too-big")
    assert (text["ended at"], text["elapsed"], text["exit code"]) == ("2026-01-01T00:00:00Z", "-", "-")


def _escaped_json(event: Event, with_header: bool) -> Message:
    """``event`` as a producer in another language may write it: JSON with every non-ASCII
    character escaped (``"j\\u00e9"``), with or without a content-type header."""
    data = json.dumps(json.loads(encode(envelope(event, "java-producer"), "json")), ensure_ascii=True)
    headers = (("content-type", b"application/json"),) if with_header else ()
    return Message(data.encode(), headers=headers)


@pytest.mark.parametrize("with_header", [True, False], ids=["header", "no-header"])
def test_a_job_whose_id_a_json_producer_escaped_is_found(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, with_header: bool
) -> None:
    """The pre-filter that spares ``status`` a decode of every record must not hide a record
    whose JSON spells the id with escapes; nor may the direct submit's duplicate check."""
    import asyncio

    async def write() -> None:
        clock = ClockBox()
        clock.now_ms = at(0)
        store = FileLogStore(tmp_path / "log", clock=clock, fsync="never")
        await store.open()
        try:
            started = TaskStarted(job_id="jé", task_index=0, node="n1")
            events: list[Event] = [node("n1"), quota("t1", 16), job("jé"), started]
            messages = [_escaped_json(e, with_header) for e in events]
            assert b"\\u00e9" in messages[2].value
            await store.log(INPUTS).append(messages)
            loop = SchedulerLoop(store, Policy(), LoopConfig())
            await loop.step()
            clock.now_ms = at(30)
            finished = TaskFinished(job_id="jé", task_index=0, exit_code=0)
            await store.log(INPUTS).append([_escaped_json(finished, with_header)])
            await loop.step()
        finally:
            await store.close()

    asyncio.run(write())
    found = status_json(capsys, str(tmp_path / "log"), "jé")
    assert found["state"] == "succeeded"
    assert (found["placed_at_ms"], found["ended_at_ms"]) == (at(0), at(30))
    code = main(["submit", "jé", "--tenant", "t2", "--log", str(tmp_path / "log")])
    assert code == 1
    assert "already exists with another spec" in capsys.readouterr().err
