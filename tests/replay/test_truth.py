"""``status``, ``replay explain`` and ``replay dump`` tell the truth about one recorded run (the
real scheduling loop over a real file log, 3 s node timeout): a job whose node went silent is
requeued with a "node lost" step, then preempted by a higher-priority job, then resubmitted
behind the service's back (a duplicate the fold ignores)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from fleetlog.cli import main
from fleetlog.core.policy import Policy
from fleetlog.core.state import CoreConfig
from fleetlog.events import Event, encode, envelope
from fleetlog.log.base import INPUTS, Message
from fleetlog.log.file import FileLogStore
from fleetlog.service.loop import LoopConfig, SchedulerLoop
from tests.core.builders import job, node


async def _record(directory: Path, parked: bool = False) -> None:
    """Second 0: n1, n2, j1 (placed on n1). Seconds 1-5: n1 beats once more, then only n2 (and,
    ``parked``, a record that does not decode, which the loop parks, after second 2): n1 is
    lost at second 5 (silent 4 s), j1 placed again on n2. Second 6: ``high`` preempts j1.
    Second 7: j1 submitted again, another spec (appended directly: no service to refuse it)."""
    clock = [1_000]
    store = FileLogStore(directory, clock=lambda: clock[0], fsync="never")
    await store.open()
    try:
        loop = SchedulerLoop(store, Policy(), LoopConfig(), CoreConfig(node_timeout_ms=3_000))

        async def at(second: int, *events: Event) -> None:
            clock[0] = 1_000 + 1_000 * second
            await store.log(INPUTS).append([Message(encode(envelope(e, "t"))) for e in events])
            await loop.step()

        await at(0, node("n1"), node("n2", rack="r2"), job("j1", gpus=8))
        await at(1, node("n1"), node("n2", rack="r2"))
        await at(2, node("n2", rack="r2"))
        if parked:  # the dead letter at offset 6 is in the log but never folded
            await store.log(INPUTS).append([Message(b"\x00 not an event")])
        for second in range(3, 6):
            await at(second, node("n2", rack="r2"))
        await at(6, job("high", gpus=8, priority=10), node("n2", rack="r2"))
        await at(7, job("j1", gpus=1))
    finally:
        await store.close()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("truth") / "log"
    asyncio.run(_record(directory))
    return directory


@pytest.fixture(scope="module")
def recorded_parked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("truth-parked") / "log"
    asyncio.run(_record(directory, parked=True))
    return directory


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    code = main(list(argv))
    out = capsys.readouterr()
    assert code == 0, out.err
    return out.out


@pytest.mark.parametrize("parked", [False, True])
def test_explain_shows_the_node_lost_step_between_the_two_placements(
    recorded: Path, recorded_parked: Path, parked: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    log = recorded_parked if parked else recorded
    out = _run(capsys, "replay", "explain", "j1", "--log", str(log), "--node-timeout", "3", "--json")
    steps = json.loads(out)["steps"]
    whats = [s["what"] for s in steps]
    assert whats[:4] == ["submitted", "placed", "node lost", "placed"], whats
    lost = steps[2]
    assert lost["detail"] == "node n1 lost (no heartbeat for 4 s); the job was requeued"
    assert (lost["log"], lost["time_ms"]) == ("inputs", 6_000)
    # the heartbeat of second 5 found n1 silent: offset 8 (0-2, 3-4, 5, 6, 7, 8), not one early (7);
    # with the parked record at 6, offset 9, not short by it
    assert lost["offset"] == (9 if parked else 8), steps
    assert "n1" in steps[1]["detail"]
    assert "n2" in steps[3]["detail"]


def test_explain_and_status_say_who_preempted_the_job_and_from_which_batch(
    recorded: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    steps = json.loads(_run(capsys, "replay", "explain", "j1", "--log", str(recorded), "--node-timeout", "3",
                            "--json", "--no-why"))["steps"]
    (preempted,) = [s for s in steps if s["what"] == "preempted"]
    assert preempted["detail"].startswith("task 0 by high (priority)")
    status = json.loads(_run(capsys, "status", "j1", "--log", str(recorded), "--node-timeout", "3", "--json"))
    assert status["state"] == "pending"
    requeued = status["requeued"]
    assert (requeued["cause"], requeued["by_job_id"]) == ("preempted", "high")
    assert requeued["preempt_cause"] == "priority"
    batches = [json.loads(line) for line in _run(capsys, "replay", "dump", "--log", str(recorded),
                                                  "--from-log", "decisions").splitlines()]
    (batch,) = [b for b in batches if preempted["offset"] == b["offset"]]
    assert requeued["inputs_offset"] == batch["event"]["as_of"], "the batch that preempted it"
    assert "placed_at_ms" not in status
    text = _run(capsys, "status", "j1", "--log", str(recorded), "--node-timeout", "3")
    (line,) = [x for x in text.splitlines() if x.startswith("requeued")]
    assert "cause preempted, requeued at 1970-01-01T00:00:07Z" in line
    assert "message preempted by job high (priority), by job id high" in line


def test_a_resubmission_that_reached_the_log_is_marked_duplicate_ignored(
    recorded: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    steps = json.loads(_run(capsys, "replay", "explain", "j1", "--log", str(recorded), "--node-timeout", "3",
                            "--json", "--no-why"))["steps"]
    submitted = [s for s in steps if s["what"].startswith("submitted")]
    assert [s["what"] for s in submitted] == ["submitted", "submitted (duplicate, ignored)"]
    assert submitted[1]["detail"].endswith(
        "; the job was first submitted at inputs@2: the scheduler ignores this one"
    )
    assert "1 GPU" in submitted[1]["detail"]
    assert "8 GPU" in submitted[0]["detail"]
    lines = [json.loads(line) for line in _run(capsys, "replay", "dump", "--log", str(recorded)).splitlines()]
    jobs = [x for x in lines if x["event"]["type"] == "JobSubmitted" and x["event"]["job_id"] == "j1"]
    assert [x["offset"] for x in jobs] == [2, submitted[1]["offset"]]
    assert "note" not in jobs[0]
    assert jobs[1]["note"] == "duplicate, ignored: job 'j1' was first submitted at inputs offset 2"
    assert all("note" not in x for x in lines if x not in jobs), "nothing else is marked"
    late = [json.loads(line) for line in _run(capsys, "replay", "dump", "--log", str(recorded), "--start",
                                               str(jobs[1]["offset"]), "--node-timeout", "3").splitlines()]
    assert late[0]["note"] == jobs[1]["note"], "a dump starting past the first submission still knows it"


def test_replay_with_the_service_node_timeout_flag_verifies_and_without_diverges(
    recorded: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", "verify", "--log", str(recorded), "--node-timeout", "3"]) == 0, capsys.readouterr()
    capsys.readouterr()
    assert main(["replay", "verify", "--log", str(recorded)]) == 1, "the default 60 s must not verify it"
    assert "replay with its --node-timeout SECONDS" in capsys.readouterr().out
    assert main(["replay", "verify", "--log", str(recorded), "--node-timeout", "3.5"]) == 1


@pytest.mark.parametrize("command", ["history", "status j1"])
def test_folding_with_another_node_timeout_is_one_line_naming_the_setting(
    recorded: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """The log was written with a 3 s node timeout; read with the default (60 s) the fold meets a
    placement of a job that is not pending: a traceback before, one line naming the setting now."""
    code = main([*command.split(), "--log", str(recorded)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    (line,) = [x for x in err.splitlines() if x.strip() and not x.startswith(("note:", "warning:"))]
    assert "do not fold with these settings" in line
    assert "--node-timeout" in line
