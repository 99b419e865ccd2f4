"""``fleetlog submit`` and ``fleetlog cancel``: what they append, and one line + exit 2 for every
kind of bad input."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest

from fleetlog.cli import main
from fleetlog.events import Envelope, JobCancelled, JobSubmitted, TaskGroup, decode, encode, envelope
from fleetlog.events.codec import CONTENT_TYPE_HEADER, BadEventError
from fleetlog.events.codec import JSON as CONTENT_TYPE_JSON
from fleetlog.log.base import INPUTS
from fleetlog.log.file import FileLogStore
from fleetlog.log.kafka import KafkaConfig, KafkaLogStore
from tests.kafka_broker import free_port
from tests.service.ingest_server import SERVICE_FILE, IngestService

ROOT = Path(__file__).resolve().parents[1]
JOB_JSON = {
    "job_id": "file-1",
    "tenant": "vision",
    "queue": "gpu",
    "task_groups": [{"count": 2, "cpu_milli": 4000, "mem_mib": 8192, "gpu_count": 1, "gpu_milli": 500}],
}


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FLEETLOG_LOG_DIR", "FLEETLOG_KAFKA_BOOTSTRAP_SERVERS", "FLEETLOG_LOG_FSYNC"):
        monkeypatch.delenv(name, raising=False)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``fleetlog ARGV`` in this process: (exit code, stdout, stderr)."""
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse's own usage errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def logged(directory: Path) -> list[Envelope]:
    async def read() -> list[Envelope]:
        async with FileLogStore(directory, read_only=True) as store:
            records = await store.log(INPUTS).read(0, 100)
        return [decode(r.value, r.header(CONTENT_TYPE_HEADER)) for r in records]

    return asyncio.run(read()) if directory.exists() else []


@pytest.fixture
def log_dir(tmp_path: Path) -> Iterator[Path]:
    return tmp_path / "log"


# -- what the commands append ---------------------------------------------------------------------


def test_submit_from_flags(capsys: pytest.CaptureFixture[str], log_dir: Path) -> None:
    code, out, err = run(
        capsys,
        "submit",
        "train-1",
        "--tenant",
        "vision",
        "--gpus",
        "8",
        "--tasks",
        "4",
        "--cpu-milli",
        "16000",
        "--mem-mib",
        "65536",
        "--queue",
        "gpu",
        "--priority",
        "5",
        "--topology",
        "rack",
        "--gpu-model",
        "A100",
        "--log",
        str(log_dir),
        "--create",
    )
    assert (code, err) == (0, "")
    assert out == (
        f"JobSubmitted train-1 (key submit/train-1) appended at inputs offset 0 (the file log at {log_dir})\n"
    )
    group = TaskGroup(
        count=4, cpu_milli=16000, mem_mib=65536, gpu_count=8, gpu_milli=1000, gpu_models=("A100",)
    )
    job = JobSubmitted(
        job_id="train-1",
        tenant="vision",
        task_groups=(group,),
        queue="gpu",
        priority=5,
        required_topology="rack",
    )
    assert logged(log_dir) == [envelope(job, "fleetlog-cli", "submit/train-1")]


def test_submit_a_bare_job_file_and_cancel_with_json_output(
    capsys: pytest.CaptureFixture[str], log_dir: Path, tmp_path: Path
) -> None:
    path = tmp_path / "job.json"
    path.write_text(json.dumps(JOB_JSON))
    code, out, _ = run(
        capsys, "submit", "--file", str(path), "--log", str(log_dir), "--json", "--producer-id", "ops",
        "--create",
    )
    assert code == 0
    assert json.loads(out) == {
        "event": "JobSubmitted",
        "job_id": "file-1",
        "key": "submit/file-1",
        "offset": 0,
        "duplicate": False,
        "log": f"the file log at {log_dir}",
    }
    code, out, _ = run(
        capsys, "cancel", "file-1", "--reason", "no longer needed", "--log", str(log_dir), "--json"
    )
    assert code == 0
    assert json.loads(out)["offset"] == 1
    got = logged(log_dir)
    assert got[0].producer_id == "ops"
    assert isinstance(got[0].event, JobSubmitted)
    assert got[0].event.task_groups[0].gpu_milli == 500
    assert got[1] == envelope(
        JobCancelled(job_id="file-1", reason="no longer needed"), "fleetlog-cli", "cancel/file-1"
    )


def test_submit_a_full_envelope_from_stdin_keeps_its_producer_and_key(log_dir: Path) -> None:
    env = envelope(
        JobSubmitted(job_id="stdin-1", tenant="t", task_groups=(TaskGroup(count=1, cpu_milli=1, mem_mib=1),)),
        "go-svc",
        "k-9",
    )
    done = subprocess.run(
        [sys.executable, "-m", "fleetlog.cli", "submit", "--file", "-", "--log", str(log_dir), "--create"],
        input=encode(env, "json"),
        capture_output=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert logged(log_dir) == [env]


def test_the_config_file_and_the_environment_name_the_log(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "fleetlog.toml"
    config.write_text(f'[log]\ndir = "{tmp_path / "from-file"}"\nfsync = "always"\n')
    new = ("--tenant", "t", "--create")
    assert run(capsys, "submit", "a", *new, "--config", str(config))[0] == 0
    monkeypatch.setenv("FLEETLOG_LOG_DIR", str(tmp_path / "from-env"))
    assert run(capsys, "submit", "b", *new, "--config", str(config))[0] == 0
    flag = ("--log", str(tmp_path / "from-flag"))
    assert run(capsys, "submit", "c", *new, "--config", str(config), *flag)[0] == 0
    assert [e.key for e in logged(tmp_path / "from-file")] == ["submit/a"]
    assert [e.key for e in logged(tmp_path / "from-env")] == ["submit/b"]
    assert [e.key for e in logged(tmp_path / "from-flag")] == ["submit/c"]


def test_while_the_service_holds_the_log_the_command_posts_to_it(
    capsys: pytest.CaptureFixture[str], log_dir: Path
) -> None:
    with IngestService(log_dir) as service:
        code, out, err = run(capsys, "submit", "svc-1", "--tenant", "t", "--log", str(log_dir))
        assert (code, err) == (0, "")
        assert f"the running service at http://127.0.0.1:{service.port}/v1/events" in out
        assert service.requests == [200]
    assert [e.key for e in logged(log_dir)] == ["submit/svc-1"]


@pytest.mark.kafka
def test_submit_and_cancel_on_kafka(
    capsys: pytest.CaptureFixture[str], kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEETLOG_KAFKA_TOPIC_PREFIX", f"cli-{tmp_path.name}")
    code, out, _ = run(
        capsys,
        "submit",
        "k-1",
        "--tenant",
        "t",
        "--gpus",
        "1",
        "--gpu-milli",
        "250",
        "--kafka",
        kafka_bootstrap,
        "--json",
    )
    assert code == 0
    first = json.loads(out)["offset"]
    assert run(capsys, "cancel", "k-1", "--kafka", kafka_bootstrap)[0] == 0

    async def read() -> list[str | None]:
        config = KafkaConfig(bootstrap_servers=kafka_bootstrap, topic_prefix=f"cli-{tmp_path.name}")
        async with KafkaLogStore(config) as store:
            records = await store.log(INPUTS).read(first, 10, timeout_ms=5000)
        return [decode(r.value, r.header(CONTENT_TYPE_HEADER)).key for r in records]

    assert asyncio.run(read()) == ["submit/k-1", "cancel/k-1"]


# -- bad input: one line, exit 2, no traceback, nothing appended ----------------------------------

BAD_ARGUMENTS = [
    (["submit", "--tenant", "t"], "submit needs --file JOB.json, or JOB_ID and --tenant"),
    (["submit", "j"], "submit needs --file JOB.json, or JOB_ID and --tenant"),
    (["submit", "j", "--file", "x.json"], "give either --file or JOB_ID with flags, not both"),
    (["submit", "--file", "x.json", "--tenant", "t"], "give either --file or JOB_ID with flags, not both"),
    (["submit", "j", "--tenant", "t", "--gpus", "-1"], "argument --gpus: '-1' must be at least 0"),
    (["submit", "j", "--tenant", "t", "--tasks", "0"], "argument --tasks: '0' must be at least 1"),
    (["submit", "j", "--tenant", "t", "--tasks", "many"], "argument --tasks: 'many' is not an integer"),
    (["submit", "j", "--tenant", "t", "--topology", "zone"], "argument --topology: invalid choice: 'zone'"),
    (
        ["submit", "j", "--tenant", "t", "--gpus", "65"],
        "Expected `int` <= 64 - at `$.event.task_groups[0].gpu_count`",
    ),
    (
        ["submit", "j", "--tenant", "t", "--gpus", "2", "--gpu-milli", "500"],
        "a task with several GPUs must take whole GPUs",
    ),
    (["submit", "j", "--tenant", "t", "--gpu-milli", "500"], "gpu_milli must be 0 when gpu_count is 0"),
    (["submit", "j" * 300, "--tenant", "t"], "Expected `str` of length <= 253 - at `$.event.job_id`"),
    (["submit", "j", "--tenant", "t", "--cpu-milli", str(1 << 41)], "$.event.task_groups[0].cpu_milli"),
    (
        ["cancel", ""],
        "invalid cancel: invalid JobCancelled: Expected `str` of length >= 1 - at `$.event.job_id`",
    ),
    (["cancel", "j", "--reason", "x" * 5000], "$.event.reason"),
    (["cancel", "j", "--kafka", "k:1"], "argument --log: not allowed with argument --kafka"),
]


@pytest.mark.parametrize(("argv", "says"), BAD_ARGUMENTS)
def test_bad_arguments(capsys: pytest.CaptureFixture[str], log_dir: Path, argv: list[str], says: str) -> None:
    code, out, err = run(capsys, *argv, "--log", str(log_dir))
    assert code == 2
    assert says in err
    assert "Traceback" not in err
    assert out == ""
    assert logged(log_dir) == []


def bad_files(tmp_path: Path) -> list[tuple[Path, str]]:
    def file(name: str, text: str) -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path

    bad_cpu = {**JOB_JSON, "task_groups": [{"count": 1, "cpu_milli": -5, "mem_mib": 1}]}
    return [
        (tmp_path / "missing.json", "cannot read {path}: No such file or directory"),
        (file("broken.json", '{"job_id": "x",'), "{path}: not valid JSON"),
        (file("list.json", "[]"), "{path} holds no job (an empty JSON array)"),
        (file("number.json", "[1]"), "{path}: item 0: expected a JSON object, got int"),
        (
            file("cpu.json", json.dumps(bad_cpu)),
            "{path}: invalid JobSubmitted: Expected `int` >= 0 - at `$.event.task_groups[0].cpu_milli` "
            "(reason invalid_event)",
        ),
        (file("extra.json", json.dumps({**JOB_JSON, "colour": "red"})), "unknown field `colour`"),
        (file("type.json", json.dumps({**JOB_JSON, "type": "JobTeleported"})), "(reason unknown_event_type)"),
        (
            file("cancel.json", json.dumps({"type": "JobCancelled", "job_id": "x"})),
            "{path} holds a JobCancelled, not a JobSubmitted",
        ),
        (
            file("version.json", json.dumps({"schema_version": 2, "producer_id": "p", "event": JOB_JSON})),
            "(reason unsupported_schema_version)",
        ),
        (
            file(
                "decision.json",
                json.dumps(
                    {
                        "schema_version": 1,
                        "producer_id": "p",
                        "event": {"type": "DecisionBatch", "as_of": 0, "digest": ""},
                    }
                ),
            ),
            "DecisionBatch is a decision, not an input",
        ),
    ]


def test_bad_job_files(capsys: pytest.CaptureFixture[str], log_dir: Path, tmp_path: Path) -> None:
    cases = bad_files(tmp_path)
    for path, says in cases:
        code, out, err = run(capsys, "submit", "--file", str(path), "--log", str(log_dir))
        assert (code, out) == (2, ""), path
        assert says.format(path=path) in err, err
        assert len(err.strip().splitlines()) == 1
    assert logged(log_dir) == []


def test_bad_configurations(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "cancel", "j")
    assert code == 2
    assert "(now: neither) (use --log DIR, --kafka HOST:PORT or --config FILE)" in err
    config = tmp_path / "bad.toml"
    config.write_text('[log]\ndir = "d"\ncolour = "red"\n')
    code, _, err = run(capsys, "cancel", "j", "--config", str(config))
    assert code == 2
    assert f"{config}, line 3: unknown key log.colour" in err
    code, _, err = run(capsys, "cancel", "j", "--config", str(tmp_path / "nope.toml"))
    assert code == 2
    assert "cannot read config file" in err


def test_unreachable_logs(
    capsys: pytest.CaptureFixture[str], log_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log_dir.mkdir(parents=True)
    port = free_port()
    (log_dir / SERVICE_FILE).write_text(json.dumps({"pid": 1, "http": f"127.0.0.1:{port}"}))
    code, _, err = run(capsys, "cancel", "j", "--log", str(log_dir))
    assert code == 2
    assert f"cannot reach the running service at http://127.0.0.1:{port}/v1/events" in err
    (log_dir / SERVICE_FILE).unlink()

    async def locked() -> tuple[int, str, str]:
        async with FileLogStore(log_dir):
            return await asyncio.to_thread(run, capsys, "cancel", "j", "--log", str(log_dir))

    code, _, err = asyncio.run(locked())
    assert code == 2
    assert "already open for writing by another FileLogStore" in err
    monkeypatch.setenv("FLEETLOG_KAFKA_REQUEST_TIMEOUT_MS", "2000")
    code, _, err = run(capsys, "cancel", "j", "--kafka", f"127.0.0.1:{free_port()}")
    assert code == 2
    assert "cannot open Kafka at 127.0.0.1" in err
    assert len(err.strip().splitlines()) == 1
    assert logged(log_dir) == []


def test_a_real_invocation_prints_no_traceback(log_dir: Path) -> None:
    done = subprocess.run(
        ["fleetlog", "submit", "--file", "/nonexistent.json", "--log", str(log_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"PATH": str(Path(sys.executable).parent)},
    )
    assert done.returncode == 2
    assert done.stderr == "fleetlog submit: error: cannot read /nonexistent.json: No such file or directory\n"


@pytest.mark.parametrize("source", ["/dev/zero", "-"])
def test_an_endless_or_huge_job_file_is_a_one_line_error(log_dir: Path, source: str) -> None:
    """``--file /dev/zero`` (or stdin that never ends) reads at most one event's worth and stops."""
    feeder = subprocess.Popen(["cat", "/dev/zero"], stdout=subprocess.PIPE) if source == "-" else None
    try:
        done = subprocess.run(
            [sys.executable, "-m", "fleetlog.cli", "submit", "--file", source, "--log", str(log_dir),
             "--create"],
            stdin=feeder.stdout if feeder else subprocess.DEVNULL, capture_output=True, text=True,
            cwd=ROOT, timeout=60, check=False,
        )
    finally:
        if feeder is not None:
            feeder.kill()
            feeder.wait()
    name = "stdin" if source == "-" else source
    assert done.returncode == 2
    assert done.stderr == (f"fleetlog submit: error: {name} is over {4 << 20} bytes, the most submit --file "
                           "reads: split it into several files\n")
    assert logged(log_dir) == []


# -- the examples of docs/service.md run as written ------------------------------------------------


def doc_block(heading: str, language: str) -> str:
    section = (ROOT / "docs" / "service.md").read_text().split(heading, 1)[1]
    return section.split(f"```{language}\n", 1)[1].split("```", 1)[0]


def test_the_docs_python_example_runs(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", doc_block("### Python", "python")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "submitted at inputs offset 1"
    assert lines[1].startswith("invalid_event ")
    assert "$.event.job_id" in lines[1]
    assert [e.key for e in logged(tmp_path / "var" / "fleetlog")] == ["heartbeat/c1/n1/1", "submit/train-42"]


def test_the_docs_shell_example_posts_schema_valid_json_to_the_service(tmp_path: Path) -> None:
    with IngestService(tmp_path / "var" / "fleetlog") as service:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", doc_block("### JSON from other languages", "sh")],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"},
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == {"appended": 1, "first_offset": 0}
        assert service.requests == [200]
    schema = json.loads((tmp_path / "fleetlog.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(json.loads((tmp_path / "job.json").read_text()))
    assert [e.key for e in logged(tmp_path / "var" / "fleetlog")] == ["submit/train-7"]


def test_submit_with_placement_constraints_from_flags(
    capsys: pytest.CaptureFixture[str], log_dir: Path
) -> None:
    """``--selector``, ``--toleration`` (any value, a value, an effect, ``*``), a Slurm-style
    ``--constraint``, ``--prefer`` (a value, any value, a weight, a value holding a colon) and
    ``--spread host``; a malformed one is one line naming the flag and exit code 2, nothing
    appended. Without them a job has no soft affinity and no spread."""
    from fleetlog.events import NodeLabel, NodeSelectorRequirement, NodeSelectorTerm, Toleration
    from fleetlog.events.model import PreferredTerm

    flags = ["--tenant", "t", "--log", str(log_dir), "--create"]
    code, _, err = run(
        capsys, "submit", "c-1", *flags, "--gpus", "1",
        "--selector", "zone=eu-1", "--toleration", "nvidia.com/gpu:NoSchedule", "--toleration", "team=ml",
        "--toleration", "*", "--constraint", "ib&fast|h100",
        "--prefer", "rack=r1:10", "--prefer", "ssd", "--prefer", "fast:100", "--prefer", "url=a:b:7",
        "--spread", "host", "--tasks", "2",
    )  # fmt: skip
    assert (code, err) == (0, "")
    (env,) = logged(log_dir)
    assert isinstance(env.event, JobSubmitted)
    assert env.event.spread == "host"
    (group,) = env.event.task_groups
    term = lambda *r: NodeSelectorTerm(tuple(r))  # noqa: E731
    assert group.preferred_affinity == (
        PreferredTerm(10, term(NodeSelectorRequirement("rack", "In", ("r1",)))),
        PreferredTerm(1, term(NodeSelectorRequirement("ssd", "Exists"))),
        PreferredTerm(100, term(NodeSelectorRequirement("fast", "Exists"))),
        PreferredTerm(7, term(NodeSelectorRequirement("url", "In", ("a:b",)))),
    )
    assert group.node_selector == (NodeLabel("zone", "eu-1"),)
    assert group.tolerations == (
        Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule"),
        Toleration(key="team", value="ml"),
        Toleration(operator="Exists"),
    )
    exists = lambda f: NodeSelectorRequirement(f"slurm.feature/{f}", "Exists")  # noqa: E731
    assert group.node_affinity == (
        NodeSelectorTerm((exists("ib"), exists("fast"))),
        NodeSelectorTerm((exists("h100"),)),
    )
    for bad, says in (
        (["--selector", "zone"], "--selector takes KEY=VALUE"),
        (["--toleration", "k:Sometimes"], "--toleration 'k:Sometimes'"),
        (["--constraint", "[ib|fast]"], "brackets, parentheses and counts are not supported"),
        (["--prefer", "rack=r1:0"], "--prefer 'rack=r1:0': WEIGHT must be an integer 1..100"),
        (["--prefer", "rack=r1:101"], "--prefer 'rack=r1:101': WEIGHT must be an integer 1..100"),
        (["--prefer", "rack=r1:"], "--prefer 'rack=r1:': WEIGHT must be an integer 1..100"),
        (["--prefer", "rack=a:b"], "--prefer 'rack=a:b': WEIGHT must be an integer 1..100"),
        (["--prefer", "=r1:5"], "--prefer '=r1:5': KEY[=VALUE][:WEIGHT]"),
        (["--spread", "rack"], "argument --spread: invalid choice: 'rack'"),
        (["--spread"], "argument --spread: expected one argument"),
    ):
        code, _, err = run(capsys, "submit", "c-2", *flags, *bad)
        assert code == 2, bad
        assert says in err
        assert err.count("\n") == 1, err
    assert len(logged(log_dir)) == 1
    code, _, err = run(capsys, "submit", "c-3", *flags, "--gpus", "1")
    assert (code, err) == (0, "")
    plain = logged(log_dir)[-1].event
    assert isinstance(plain, JobSubmitted)
    assert (plain.spread, plain.task_groups[0].preferred_affinity) == (None, ())


# -- a log directory another local user may write (issue 46) --------------------------------------


def _planted(log_dir: Path, trap: int, dir_mode: int, file_mode: int) -> None:
    """What another local user leaves in a log directory: ``service.json`` naming a live pid (1)
    and an address of theirs (``trap``)."""
    log_dir.mkdir()
    log_dir.chmod(dir_mode)
    planted = log_dir / "service.json"
    planted.write_text(json.dumps({"pid": 1, "http": f"127.0.0.1:{trap}"}))
    planted.chmod(file_mode)


@pytest.mark.parametrize(("dir_mode", "file_mode", "says"), [
    (0o777, 0o600, "drwxrwxrwx lets other users write it"),
    (0o1777, 0o600, "drwxrwxrwt lets other users write it"),
    (0o700, 0o666, "-rw-rw-rw- lets other users write it"),
])
def test_a_log_directory_or_service_json_others_may_write_is_refused_before_any_token_is_sent(
    capsys: pytest.CaptureFixture[str], log_dir: Path, monkeypatch: pytest.MonkeyPatch,
    dir_mode: int, file_mode: int, says: str,
) -> None:
    import socket

    monkeypatch.setenv("FLEETLOG_TOKEN", "secret-token-of-the-victim")
    with socket.socket() as trap:
        trap.bind(("127.0.0.1", 0))
        trap.listen(8)
        trap.setblocking(False)
        _planted(log_dir, trap.getsockname()[1], dir_mode, file_mode)
        for argv in (["submit", "j1", "--tenant", "t"], ["cancel", "j1"], ["jobs"]):
            argv += ["--log", str(log_dir)]
            code, out, err = run(capsys, *argv)
            assert (code, out) == (2, ""), err
            assert says in err
            assert len(err.strip().splitlines()) == 1, err
            with pytest.raises(BlockingIOError):
                trap.accept()  # nobody connected: the token went nowhere
    log_dir.chmod(0o700)


def test_run_refuses_a_log_directory_others_may_write(
    capsys: pytest.CaptureFixture[str], log_dir: Path,
) -> None:
    log_dir.mkdir()
    log_dir.chmod(0o777)
    code, _, err = run(capsys, "run", "--log", str(log_dir), "--http-port", "0")
    assert code == 2, err
    assert "drwxrwxrwx lets other users write it" in err
    assert "chmod 700" in err
    assert len(err.strip().splitlines()) == 1, err
    log_dir.chmod(0o700)


# -- submit --file decodes as the HTTP API does (issue 46) ----------------------------------------

GROUP_JSON = '{"count": 1, "cpu_milli": 1000, "mem_mib": 1024}'


@pytest.mark.parametrize(("text", "reason", "says"), [
    ('{"job_id": "a", "job_id": "b", "tenant": "t", "task_groups": [' + GROUP_JSON + "]}",
     "duplicate_key", "repeats the key 'job_id'"),
    ('{"job_id": "a", "tenant": "t", "task_groups": [{"count": 1, "count": 9, "cpu_milli": 1000, '
     '"mem_mib": 1024}]}', "duplicate_key", "repeats the key 'count'"),
    ('{"job_id": "a", "tenant": "t", "task_groups": [' + GROUP_JSON + '], "labels": '
     + '{"a": ' * 100_000 + "1" + "}" * 100_000 + "}", "too_deep", "nested too deeply"),
    ('{"schema_version": 1, "producer_id": "p", "producer_id": "q", "event": {"type": "JobCancelled", '
     '"job_id": "a"}}', "duplicate_key", "repeats the key 'producer_id'"),
], ids=["top-level", "in-a-group", "deep", "envelope"])
def test_submit_file_refuses_what_the_http_api_refuses_in_one_line(
    capsys: pytest.CaptureFixture[str], log_dir: Path, tmp_path: Path, text: str, reason: str, says: str,
) -> None:
    path = tmp_path / "job.json"
    path.write_text(text)
    verb = "send" if "schema_version" in text else "submit"
    code, out, err = run(capsys, verb, "--file", str(path), "--log", str(log_dir), "--create")
    assert (code, out) == (2, ""), err
    assert says in err
    assert f"(reason {reason})" in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err[:500]
    assert logged(log_dir) == []
    head = '{"schema_version": 1, "producer_id": "p", "event": {"type": "JobSubmitted", '
    wrapped = text if verb == "send" else head + text.lstrip()[1:] + "}"
    with pytest.raises(BadEventError) as http:  # the HTTP API's decoder says the same
        decode(wrapped.encode(), CONTENT_TYPE_JSON)
    assert http.value.reason == reason


def test_run_and_submit_never_write_a_log_into_a_directory_of_other_files(
    capsys: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:
    """``fleetlog run --log /etc`` wrote ``LOCK``, ``inputs/``, ``decisions/`` beside the user's files.
    A directory holding anything but a fleetlog log is refused, ``--create`` or not; a new or empty
    one needs ``--create`` (a mistyped path is an error, as for ``submit``)."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "notes.txt").write_text("mine")
    for argv in (["run", "--log", str(home), "--http-port", "0"],
                 ["run", "--log", str(home), "--http-port", "0", "--create"],
                 ["submit", "j1", "--tenant", "t", "--log", str(home), "--create"]):
        code, _, err = run(capsys, *argv)
        assert code == 2, err
        assert "holds 'notes.txt', which is not part of a fleetlog log" in err
        assert len(err.strip().splitlines()) == 1, err
    assert sorted(p.name for p in home.iterdir()) == ["notes.txt"]  # nothing written beside it
    for missing in (tmp_path / "typo", tmp_path / "empty"):
        if missing.name == "empty":
            missing.mkdir(mode=0o700)
        code, _, err = run(capsys, "run", "--log", str(missing), "--http-port", "0")
        assert code == 2, err
        assert "--create starts a new one" in err
    assert not (tmp_path / "typo").exists()
