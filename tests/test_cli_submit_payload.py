"""``fleetlog submit --label/--annotation/--command/--script/--env/--image`` and
``Client.submit(labels=, annotations=, payload=)``: what they append, and one line + exit 2 for
every bad flag (docs/events.md, "Labels, annotations and payload")."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from fleetlog.client import Client, ClientError
from fleetlog.events import JobPayload, JobSubmitted, TaskGroup
from fleetlog.events.model import MAX_PAYLOAD_CHARS
from fleetlog.log.file import FileLogStore
from tests.test_cli_client import logged, run

Capsys = pytest.CaptureFixture[str]
SCRIPT = "#!/bin/bash\nset -euo pipefail\necho \"it's $HOME\" `id` $(date)\r\n"


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FLEETLOG_LOG_DIR", "FLEETLOG_KAFKA_BOOTSTRAP_SERVERS", "FLEETLOG_LOG_FSYNC"):
        monkeypatch.delenv(name, raising=False)


def submitted(log_dir: Path) -> JobSubmitted:
    (env,) = logged(log_dir)
    assert isinstance(env.event, JobSubmitted)
    return env.event


def test_labels_annotations_and_a_command_from_flags(capsys: Capsys, tmp_path: Path) -> None:
    log_dir = tmp_path / "log"
    code, _, err = run(
        capsys, "submit", "train-1", "--tenant", "vision",
        "--label", "team=vision", "--label", "app.kubernetes.io/name=trainer", "--label", "empty=",
        "--annotation", "owner=Ada Lovelace <ada@example.org>", "--annotation", "formula=a=b+c",
        "--command", "python train.py --name 'it'\"'\"'s mine' \"$(rm -rf /)\" --lr=0.1",
        "--env", "A=1", "--env", "GREETING=hello; echo injected", "--env", "EMPTY=",
        "--image", "nvcr.io/nvidia/pytorch:24.01-py3",
        "--log", str(log_dir), "--create",
    )  # fmt: skip
    assert (code, err) == (0, "")
    job = submitted(log_dir)
    assert job.labels == {"team": "vision", "app.kubernetes.io/name": "trainer", "empty": ""}
    assert job.annotations == {"owner": "Ada Lovelace <ada@example.org>", "formula": "a=b+c"}
    assert job.payload == JobPayload(
        command=("python", "train.py", "--name", "it's mine", "$(rm -rf /)", "--lr=0.1"),
        env={"A": "1", "GREETING": "hello; echo injected", "EMPTY": ""},
        image="nvcr.io/nvidia/pytorch:24.01-py3",
    )


def test_a_script_from_a_file_is_kept_to_the_byte(capsys: Capsys, tmp_path: Path) -> None:
    path = tmp_path / "job.sh"
    path.write_bytes(SCRIPT.encode())
    code, _, err = run(capsys, "submit", "s-1", "--tenant", "t", "--script", str(path), "--env", "X=y",
                       "--log", str(tmp_path / "log"), "--create")
    assert (code, err) == (0, "")
    assert submitted(tmp_path / "log").payload == JobPayload(script=SCRIPT, env={"X": "y"})


def test_a_job_without_payload_flags_has_no_payload(capsys: Capsys, tmp_path: Path) -> None:
    assert run(capsys, "submit", "p-1", "--tenant", "t", "--log", str(tmp_path / "log"), "--create")[0] == 0
    job = submitted(tmp_path / "log")
    assert (job.labels, job.annotations, job.payload) == ({}, {}, None)


def bad_flags(tmp_path: Path) -> list[tuple[list[str], str]]:
    def file(name: str, data: bytes) -> str:
        path = tmp_path / name
        path.write_bytes(data)
        return str(path)

    too_big = file("big.sh", b"#!/bin/sh\n" + b"#" * (MAX_PAYLOAD_CHARS * 4))
    long_script = file("long.sh", b"#!/bin/sh\n" + b"#" * MAX_PAYLOAD_CHARS)
    return [
        (["--label", "team"], "--label 'team': KEY=VALUE"),
        (["--label", "=v"], "--label '=v': KEY=VALUE"),
        (["--label", "a=1", "--label", "a=2"], "--label 'a' is given twice"),
        (["--label", "k=two words"], "Expected a printable identifier (no spaces, control, format or "
                                     "bidirectional characters) - at `$.event.labels['k']`"),
        (["--label", "k=" + "v" * 254], "Expected `str` of length <= 253 - at `$.event.labels"),
        ([arg for i in range(65) for arg in ("--label", f"k{i}=v")],
         "Expected `object` of length <= 64 - at `$.event.labels`"),
        (["--annotation", "a b=x"], "at `$.event.annotations['a b']`"),
        (["--annotation", "k=" + "v" * 16_384], "annotations hold at most 16384 characters"),
        (["--annotation", "k=" + "é" * 8_192], "labels and annotations hold at most 16384 bytes"),
        (["--env", "A-B=1"], "env name 'A-B' is not a shell name"),
        (["--env", "A=1", "--env", "A=2"], "--env 'A' is given twice"),
        (["--env", "A=\x00"], "hold no NUL character"),
        (["--command", ""], "--command is empty"),
        (["--command", "python 'unbalanced"], "--command \"python 'unbalanced\": No closing quotation"),
        (["--command", "-rf /"], "is not empty, nor starts with -"),
        (["--command", "true", "--script", long_script], "give either --command or --script, not both"),
        (["--script", str(tmp_path / "missing.sh")], "cannot read"),
        (["--script", file("latin1.sh", b"#!/bin/sh\necho caf\xe9\n")], "not UTF-8 (invalid continuation"),
        (["--script", file("plain.sh", b"echo hi\n")], "a script starts with #! and its interpreter"),
        (["--script", long_script], f"a payload holds at most {MAX_PAYLOAD_CHARS} characters"),
        (["--script", too_big], f"is over {MAX_PAYLOAD_CHARS * 4} bytes, the most submit --script reads"),
        (["--image", "img:1 --privileged"], "at `$.event.payload.image`"),
    ]


def test_bad_payload_flags_are_one_line_and_exit_2(capsys: Capsys, tmp_path: Path) -> None:
    log_dir = tmp_path / "log"
    for flags, says in bad_flags(tmp_path):
        code, out, err = run(capsys, "submit", "j", "--tenant", "t", *flags, "--log", str(log_dir),
                             "--create")
        assert code == 2, flags[:4]
        assert says in err, (flags[:4], err)
        assert err.count("\n") == 1, err
        assert "Traceback" not in err
        assert out == ""
    assert logged(log_dir) == []


@pytest.mark.parametrize(
    "flags", [["--label", "a=b"], ["--env", "A=b"], ["--command", "x"], ["--script", "f"], ["--image", "i"]]
)
def test_payload_flags_and_a_file_do_not_mix(capsys: Capsys, tmp_path: Path,
                                            flags: list[str]) -> None:
    code, _, err = run(capsys, "submit", "--file", str(tmp_path / "j.json"), *flags, "--log", str(tmp_path))
    assert code == 2
    assert "give either --file or JOB_ID with flags, not both" in err


def test_client_submit_takes_labels_annotations_and_a_payload(tmp_path: Path) -> None:
    payload = JobPayload(command=("python", "-c", "print('hi')"), env={"A": "b"})
    group = TaskGroup(count=1, cpu_milli=1000, mem_mib=1024)

    async def submit() -> None:
        async with FileLogStore(tmp_path / "log", fsync="never") as store:
            client = Client(store)
            await client.submit("c-1", "t", [group], labels={"team": "a"}, annotations={"n": "x y"},
                                payload=payload)
            with pytest.raises(ClientError) as caught:
                await client.submit("c-2", "t", [group], labels={"team": "a b"})
            assert caught.value.reason == "invalid_event"
            assert "$.event.labels['team']" in str(caught.value)

    asyncio.run(submit())
    job = submitted(tmp_path / "log")
    assert (job.job_id, job.labels, job.annotations) == ("c-1", {"team": "a"}, {"n": "x y"})
    assert job.payload == payload


def test_a_resubmission_with_another_payload_appends_nothing_on_a_file_log(capsys: Capsys,
                                                                           tmp_path: Path) -> None:
    """``fleetlog submit`` on a file log screens as the service does: the scheduling spec alone
    makes a submission's identity, so another command, label or env is a duplicate."""
    log_dir = tmp_path / "log"
    base = ["submit", "j1", "--tenant", "t", "--log", str(log_dir), "--create"]
    assert run(capsys, *base, "--command", "python a.py", "--label", "v=1")[0] == 0
    code, out, _ = run(capsys, *base, "--command", "python b.py", "--label", "v=2", "--env", "X=1")
    assert code == 0
    assert "submitted already, same spec: nothing appended" in out
    assert submitted(log_dir).payload == JobPayload(command=("python", "a.py"))
    code, _, err = run(capsys, *base, "--command", "python b.py", "--priority", "3")
    assert code == 1
    assert "already exists with another spec (priority: 0 -> 3)" in err
