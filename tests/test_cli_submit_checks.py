"""No silent successes from ``fleetlog submit``/``cancel``: a mistyped ``--log`` is an error
(``--create`` starts a log on purpose); a job id submitted again with the same spec appends
nothing and says so, with another spec is refused (exit 1) — on the file log read directly and
through the running service alike; a cancel of an unknown job is refused; ``--file`` takes JSON
lines and arrays; ``replay verify`` with no batch to check is not a pass."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from fleetlog.client import envelope_from_json, message_of
from fleetlog.events import JobCancelled, JobSubmitted
from fleetlog.log.base import INPUTS
from fleetlog.log.file import FileLogStore
from tests.service.test_service import embedded, start
from tests.test_cli_client import logged, run

JOB = {"job_id": "j1", "tenant": "t", "task_groups": [{"count": 2, "cpu_milli": 1000, "mem_mib": 64}]}


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FLEETLOG_LOG_DIR", "FLEETLOG_KAFKA_BOOTSTRAP_SERVERS", "FLEETLOG_LOG_FSYNC"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    """A file log holding ``JOB``, as ``fleetlog submit --file JOB.json --create`` writes it."""
    directory = tmp_path / "log"
    env = envelope_from_json(json.dumps(JOB).encode(), "fleetlog-cli", default_type="JobSubmitted")

    async def write() -> None:
        async with FileLogStore(directory) as store:
            await store.log(INPUTS).append([message_of(env)])

    asyncio.run(write())
    return directory


def test_create_starts_a_new_log(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    job = tmp_path / "job.json"
    job.write_text(json.dumps(JOB))
    code, out, _ = run(capsys, "submit", "--file", str(job), "--log", str(tmp_path / "new"), "--create")
    assert code == 0
    assert "appended at inputs offset 0" in out
    assert [e.key for e in logged(tmp_path / "new")] == ["submit/j1"]


def one_line(err: str) -> str:
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    return err.strip()


@pytest.mark.parametrize("command", [["submit", "j", "--tenant", "t"], ["cancel", "j"]])
def test_a_mistyped_log_directory_is_an_error_not_a_new_log(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: list[str]
) -> None:
    typo = tmp_path / "lgo"
    code, out, err = run(capsys, *command, "--log", str(typo))
    assert (code, out) == (2, "")
    assert one_line(err) == (f"fleetlog {command[0]}: error: no file log at {typo} (expected inputs/ and "
                             "decisions/ directories; --create starts a new one)")
    assert not typo.exists()
    (tmp_path / "not-a-log").mkdir()  # a directory that exists but holds no log: refused too
    assert run(capsys, *command, "--log", str(tmp_path / "not-a-log"))[0] == 2
    assert list((tmp_path / "not-a-log").iterdir()) == []


def test_the_same_spec_again_appends_nothing_and_says_so(
    capsys: pytest.CaptureFixture[str], log_dir: Path, tmp_path: Path
) -> None:
    regrouped = {**JOB, "task_groups": [{"count": 1, "cpu_milli": 1000, "mem_mib": 64, "name": "a"}] * 2}
    path = tmp_path / "again.json"
    path.write_text(json.dumps(regrouped))
    code, out, err = run(capsys, "submit", "--file", str(path), "--log", str(log_dir))
    assert (code, err) == (0, "")
    assert out == (f"JobSubmitted j1 (key submit/j1) submitted already, same spec: nothing appended "
                   f"(the file log at {log_dir})\n")
    code, out, _ = run(capsys, "submit", "--file", str(path), "--log", str(log_dir), "--json")
    assert json.loads(out)["duplicate"] is True
    assert json.loads(out)["offset"] is None
    assert len(logged(log_dir)) == 1


def test_another_spec_under_an_existing_id_is_refused_with_exit_1(
    capsys: pytest.CaptureFixture[str], log_dir: Path
) -> None:
    code, out, err = run(capsys, "submit", "j1", "--tenant", "t", "--tasks", "2", "--mem-mib", "64",
                         "--priority", "7", "--log", str(log_dir))
    assert (code, out) == (1, "")
    assert one_line(err) == ("fleetlog submit: error: job 'j1' already exists with another spec (priority: "
                             "0 -> 7); a job id is submitted once: cancel it and submit under a new id")
    assert len(logged(log_dir)) == 1


def test_cancel_of_an_unknown_job_is_refused_and_a_second_cancel_appends_nothing(
    capsys: pytest.CaptureFixture[str], log_dir: Path
) -> None:
    code, out, err = run(capsys, "cancel", "ghost", "--log", str(log_dir))
    assert (code, out) == (1, "")
    assert one_line(err) == "fleetlog cancel: error: cannot cancel job 'ghost': no such job"
    assert run(capsys, "cancel", "j1", "--log", str(log_dir))[0] == 0
    code, out, _ = run(capsys, "cancel", "j1", "--log", str(log_dir))
    assert code == 0
    assert "JobCancelled j1 (key cancel/j1) cancelled already: nothing appended" in out
    assert [type(e.event) for e in logged(log_dir)] == [JobSubmitted, JobCancelled]


async def test_through_the_running_service_alike(capsys: pytest.CaptureFixture[str], log_dir: Path) -> None:
    service = await start(embedded(log_dir))
    try:
        def cli(*argv: str) -> tuple[int, str, str]:
            return run(capsys, *argv, "--log", str(log_dir))

        code, out, _ = await asyncio.to_thread(cli, "submit", "j2", "--tenant", "t")
        assert code == 0
        assert "appended at inputs offset 1 (the running service at http://127.0.0.1:" in out
        code, out, _ = await asyncio.to_thread(cli, "submit", "j2", "--tenant", "t")
        assert code == 0
        assert "JobSubmitted j2 (key submit/j2) submitted already, same spec: nothing appended" in out
        code, _, err = await asyncio.to_thread(cli, "submit", "j1", "--tenant", "t2")
        assert code == 1
        assert one_line(err).startswith(
            "fleetlog submit: error: the running service at http://127.0.0.1:")
        assert "job id 'j1' is taken by another tenant's job" in err  # (nothing of that job said)
        code, _, err = await asyncio.to_thread(cli, "submit", "j1", "--tenant", "t", "--tasks", "3")
        assert code == 1
        assert "job 'j1' already exists with another spec (tasks: 2x(" in err
        code, _, err = await asyncio.to_thread(cli, "cancel", "ghost")
        assert code == 1
        assert "(HTTP 404): event 0: cannot cancel job 'ghost': no such job" in one_line(err)
        assert service.service.store is not None
        assert await service.service.store.log(INPUTS).end_offset() == 2
    finally:
        await service.stop()


def test_submit_file_takes_json_lines_and_arrays(
    capsys: pytest.CaptureFixture[str], log_dir: Path, tmp_path: Path
) -> None:
    def job(job_id: str) -> dict[str, object]:
        return {**JOB, "job_id": job_id}

    lines = tmp_path / "jobs.jsonl"
    lines.write_text("\n".join(json.dumps(job(f"l{i}")) for i in range(3)) + "\n\n" + json.dumps(JOB) + "\n")
    code, out, _ = run(capsys, "submit", "--file", str(lines), "--log", str(log_dir))
    assert code == 0
    offsets = [line.split(" appended at inputs offset ")[1][:1] for line in out.splitlines()[:3]]
    assert offsets == ["1", "2", "3"]
    assert "JobSubmitted j1 (key submit/j1) submitted already" in out.splitlines()[3]
    array = tmp_path / "jobs.json"
    array.write_text(json.dumps([job("a0"), job("a1")], indent=2))
    code, out, _ = run(capsys, "submit", "--file", str(array), "--log", str(log_dir), "--json")
    assert code == 0
    assert [json.loads(line)["offset"] for line in out.splitlines()] == [4, 5]
    assert [e.event.job_id for e in logged(log_dir)] == ["j1", "l0", "l1", "l2", "a0", "a1"]  # type: ignore[union-attr]


@pytest.mark.parametrize(("text", "says"), [
    ('{"job_id": "x"}\n{"job_id": "y", "tenant": "t"', "{path}: line 1: invalid JobSubmitted"),
    ('{"job_id": "x", "tenant": "t", "task_groups": [{"count": 1, "cpu_milli": 1, "mem_mib": 1}]}\n\n[1\n',
     "{path}: line 3: not valid JSON"),
    ('[{"job_id": "x", "tenant": "t", "task_groups": [{"count": 1, "cpu_milli": 1, "mem_mib": 1}]}, '
     '{"type": "JobCancelled", "job_id": "x"}]', "{path}: item 1 holds a JobCancelled, not a JobSubmitted"),
    ('[{"job_id": "x"},', "{path}: not a valid JSON array"),
    ("[]", "{path} holds no job (an empty JSON array)"),
    ("\n \n", "{path}: not valid JSON"),
])
def test_a_bad_line_or_item_is_named_and_nothing_is_sent(
    capsys: pytest.CaptureFixture[str], log_dir: Path, tmp_path: Path, text: str, says: str
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    code, out, err = run(capsys, "submit", "--file", str(path), "--log", str(log_dir))
    assert (code, out) == (2, "")
    assert says.format(path=path) in one_line(err)
    assert len(logged(log_dir)) == 1


def test_replay_verify_with_no_batch_says_nothing_was_verified(
    capsys: pytest.CaptureFixture[str], log_dir: Path
) -> None:
    code, out, err = run(capsys, "replay", "verify", "--log", str(log_dir))
    assert (code, err) == (3, "")
    assert out == ("NOTHING TO VERIFY: 1 inputs and no decision batch: no scheduler has decided on this log "
                   "yet (`fleetlog run` does)\n")
    code, out, _ = run(capsys, "replay", "verify", "--log", str(log_dir), "--json")
    found = json.loads(out)
    assert (code, found["ok"], found["nothing_to_verify"], found["inputs"]) == (3, False, True, 1)


def test_the_docs_pipe_of_json_lines_into_submit_file_stdin(log_dir: Path) -> None:
    """docs/service.md: ``... | fleetlog submit --file -`` (JSON lines on stdin)."""
    import subprocess
    import sys

    from tests.test_cli_client import ROOT

    assert "done | fleetlog submit --file - --log" in (ROOT / "docs" / "service.md").read_text()
    stdin = "".join(json.dumps({**JOB, "job_id": f"p{i}"}) + "\n" for i in range(3))
    argv = [sys.executable, "-m", "fleetlog.cli", "submit", "--file", "-", "--log", str(log_dir)]
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, cwd=ROOT, timeout=120,
                          check=False)
    assert (done.returncode, done.stderr) == (0, "")
    assert len(done.stdout.splitlines()) == 3
    assert [e.key for e in logged(log_dir)] == ["submit/j1", "submit/p0", "submit/p1", "submit/p2"]


def test_cancel_takes_several_ids_and_selectors_like_scancel(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """``cancel`` took one id: several in one request now, or ``--tenant``/``--queue``/``--state``
    selecting the jobs not ended (read from the logs here, from the service's API when it runs)."""
    log = str(tmp_path / "log")
    for job_id, tenant, queue in (("a1", "a", "q"), ("a2", "a", "q"), ("a3", "a", "batch"), ("b1", "b", "q"),
                                  ("b2", "b", "batch")):
        code, _, err = run(capsys, "submit", job_id, "--tenant", tenant, "--queue", queue, "--log", log,
                           "--create")
        assert code == 0, err
    code, out, err = run(capsys, "cancel", "a1", "b1", "--log", log, "--reason", "two at once")
    assert code == 0, err
    assert out.count("JobCancelled") == 2
    code, out, err = run(capsys, "cancel", "--tenant", "a", "--queue", "q", "--log", log)
    assert code == 0, err
    assert "JobCancelled a2 " in out
    assert out.count("JobCancelled") == 1  # (a1: cancelled already, so not selected)
    code, out, err = run(capsys, "cancel", "b2", "a3", "--tenant", "b", "--log", log)  # ids narrowed
    assert code == 0, err
    assert (out.count("JobCancelled"), "JobCancelled b2 " in out) == (1, True)
    code, out, err = run(capsys, "cancel", "--queue", "q", "--log", log)
    assert (code, out) == (0, "")
    assert "no job matches: nothing cancelled" in err
    code, _, err = run(capsys, "cancel", "--log", log)
    assert code == 2
    assert "name the jobs to cancel" in one_line(err)
    cancels = [e.event for e in logged(tmp_path / "log") if isinstance(e.event, JobCancelled)]
    assert [c.job_id for c in cancels] == ["a1", "b1", "a2", "b2"]
    assert cancels[0].reason == "two at once"
