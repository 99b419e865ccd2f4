"""A job's payload on Slurm (docs/slurm.md, "A job's payload"): the backend runs the job's own
command or script, with its env, instead of ``--command``; every string of a payload is hostile
input and reaches the task as it was written — quotes, ``$()``, backquotes, newlines, CR LF,
``#SBATCH`` lines — never as shell or sbatch syntax.

The batch script is first run by the real ``/bin/sh`` here (fast, no cluster), then by Slurm."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from fleetlog.backends.slurm import __main__ as slurm_main
from fleetlog.backends.slurm.backend import Run, SlurmBackend, SlurmConfig
from fleetlog.backends.slurm.mapping import (
    PayloadError,
    SubmitSettings,
    interpreter,
    script,
    sh_quote,
    sleep_for_expected_duration,
    submission,
)
from fleetlog.cli import main
from fleetlog.events import (
    DecisionBatch,
    Event,
    InputEvent,
    JobCancelled,
    JobPayload,
    JobPlaced,
    JobRejected,
    JobSubmitted,
    TaskFailed,
    TaskFinished,
    TaskPlacement,
    envelope,
)
from fleetlog.events.model import MAX_ARG_CHARS, MAX_PAYLOAD_CHARS
from fleetlog.log.consumer import Delivered
from fleetlog.log.file import FileLogStore
from tests.backends.slurm.harness import Harness, job, of_type
from tests.slurm_cluster import SlurmCluster
from tests.test_cli_client import logged

ROOT = Path(__file__).resolve().parents[3]

HOSTILE = [
    "it's \"quoted\"",
    "$(touch {marker}-dollar)",
    "`touch {marker}-backquote`",
    "two\nlines",
    "crlf\r\nend\r",
    "\n#SBATCH --array=0-9\n#SBATCH --nodelist=n9\n",
    "'; touch {marker}-semicolon; '",
    "\\$HOME ${HOME} $$ * ? ~ ! & | > <",
    "ünïcødé 训练 \U0001f680",
    "",
    "--help",
]
REPORT = """
import json, os, sys
out = sys.argv[1] + "-" + os.environ["FLEETLOG_TASK_INDEX"]
env = {k: os.environ.get(k) for k in ("GREETING", "EMPTY", "CRLF", "FLEETLOG_JOB_ID", "FLEETLOG_NODE")}
with open(out, "w") as f:
    json.dump({"argv": sys.argv[2:], "env": env}, f)
"""


def paying(job_id: str, tasks: int = 1, **fields: Any) -> JobSubmitted:
    """A job of ``tasks`` one-CPU tasks whose payload has ``fields``."""
    return msgspec.structs.replace(job(job_id, tasks=tasks), payload=JobPayload(**fields))


def hostile(marker: Path) -> list[str]:
    return [arg.replace("{marker}", str(marker)) for arg in HOSTILE]


def env(marker: Path) -> dict[str, str]:
    return {"GREETING": f"hello; touch {marker}-env $(touch {marker}-env2)", "EMPTY": "", "CRLF": "a\r\nb",
            "FLEETLOG_JOB_ID": "forged"}


def reporting(job_id: str, out: Path, marker: Path, tasks: int = 1) -> JobSubmitted:
    """A job whose tasks write their argv (after the output path) and some env to ``out-<task>``."""
    command = (sys.executable, "-c", REPORT, str(out), *hostile(marker))
    return paying(job_id, tasks, command=command, env=env(marker))


def report(out: Path, task: int = 0) -> dict[str, Any]:
    return json.loads(Path(f"{out}-{task}").read_text())


def no_marker(marker: Path) -> None:
    assert not list(marker.parent.glob(marker.name + "*")), "a payload string ran as shell"


def run_sh(text: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["/bin/sh", "-c", text], capture_output=True, text=True, timeout=60, check=False)


def batch_script(spec: JobSubmitted, index: int = 0, node: str = "n1") -> str:
    return script(spec, TaskPlacement(index, node, (0, 2)), sleep_for_expected_duration)


# --- the batch script, run by /bin/sh ----------------------------------------------------------------


def test_a_command_reaches_the_task_argument_for_argument(tmp_path: Path) -> None:
    out, marker = tmp_path / "out", tmp_path / "pwned"
    text = batch_script(reporting("j", out, marker))
    assert "\r\n" not in text  # sbatch refuses DOS line breaks
    assert text.splitlines()[1].startswith("export FLEETLOG_JOB_ID=")  # no #SBATCH line is read after it
    done = run_sh(text)
    assert done.returncode == 0, done.stderr
    got = report(out)
    assert got["argv"] == hostile(marker)
    assert got["env"] == {**env(marker), "FLEETLOG_JOB_ID": "j", "FLEETLOG_NODE": "n1"}  # ours are not forged
    no_marker(marker)


@pytest.mark.parametrize(
    ("first_line", "want"),
    [
        ("#!/bin/sh", ["/bin/sh"]),
        ("#! /usr/bin/env python3", ["/usr/bin/env", "python3"]),
        ("#!/usr/bin/env  -S  python3 -u \t", ["/usr/bin/env", "-S  python3 -u"]),
        ("#!\t/bin/bash\t-e\r", ["/bin/bash", "-e"]),
    ],
)
def test_a_scripts_interpreter_is_read_as_linux_reads_it(first_line: str, want: list[str]) -> None:
    assert interpreter(first_line + "\necho\n") == want


def test_a_script_runs_under_its_interpreter_from_a_file_that_is_gone(tmp_path: Path) -> None:
    """A shell script and a Python script, written with CR LF and every quote; the script file is
    removed before it runs (the interpreter reads ``/dev/fd/9``); its exit code is its own."""
    out, marker = tmp_path / "out", tmp_path / "pwned"
    body = (f"#!{sys.executable}\r\nimport os, sys\r\n# it's \"$(touch {marker})\" `x`\r\n"
            f"open({str(out)!r}, 'w').write(repr([sys.argv[0], os.environ['GREETING']]))\r\nsys.exit(3)\r\n")
    spec = paying("s", script=body, env=env(marker))
    text = batch_script(spec)
    assert "\r\n" not in text
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    done = subprocess.run(["/bin/sh", "-c", text], capture_output=True, text=True, timeout=60, check=False,
                          env={"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp)})
    assert done.returncode == 3, done.stderr
    assert out.read_text() == repr(["/dev/fd/9", env(marker)["GREETING"]])
    assert list(tmp.iterdir()) == []  # nothing left behind
    no_marker(marker)
    shell = "#!/bin/sh\nprintf '%s|%s' \"$1\" \"$GREETING\" > \"$OUT\"\nexit 0\n"
    spec = paying("s", script=shell, env={"GREETING": "a b", "OUT": str(out)})
    assert run_sh(batch_script(spec)).returncode == 0
    assert out.read_text() == "|a b"


def test_env_only_runs_the_workload_with_it_and_no_payload_is_unchanged(tmp_path: Path) -> None:
    spec = paying("w", env={"GREETING": "hi 'there'"})
    text = script(spec, TaskPlacement(0, "n1"), lambda _, __: f'echo "$GREETING" > {tmp_path}/w')
    assert run_sh(text).returncode == 0
    assert (tmp_path / "w").read_text() == "hi 'there'\n"
    plain = job("p")
    assert batch_script(plain) == (
        "#!/bin/sh\nexport FLEETLOG_JOB_ID=p\nexport FLEETLOG_TASK_INDEX=0\nexport FLEETLOG_NODE=n1\n"
        "export FLEETLOG_GPU_INDICES=0,2\ntrue\n"
    )  # as before payloads: the workload alone


def test_the_largest_payload_stays_under_sbatchs_script_limit(tmp_path: Path) -> None:
    """Every character a quote (five in the script), in the most a payload may hold."""
    arguments = ("p", *["'" * MAX_ARG_CHARS] * 8)
    text = batch_script(paying("big", command=arguments, env={"Q": "'" * (MAX_PAYLOAD_CHARS - 256_003)}))
    assert len(text.encode()) < 4_000_000
    assert sh_quote("a\r\nb") == "'a\r''\nb'"


def test_an_image_is_an_sbatch_option_only_when_the_backend_has_one() -> None:
    spec = paying("i", image="nvcr.io/nvidia/pytorch:24.01-py3")
    placement = TaskPlacement(0, "n1")
    with pytest.raises(PayloadError, match="runs no images"):
        submission("x", spec, placement, sleep_for_expected_duration, SubmitSettings())
    options = submission("x", spec, placement, sleep_for_expected_duration,
                         SubmitSettings(image_option="--container-image")).options
    assert "--container-image=nvcr.io/nvidia/pytorch:24.01-py3" in options


# --- on the real cluster ---------------------------------------------------------------------------------


def ended(job_id: str, tasks: int = 1) -> Any:
    def check(events: list[Event]) -> bool:
        return len(of_type(events, TaskFinished, job_id) + of_type(events, TaskFailed, job_id)) >= tasks

    return check


async def test_slurm_runs_a_gangs_own_command_with_hostile_arguments(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    out, marker = tmp_path / "out", tmp_path / "pwned"
    async with Harness(slurm_cluster, tmp_path, {"cmd": "exit 99"}) as h:  # (--command: not run)
        await h.ready()
        await h.submit(reporting("cmd", out, marker, tasks=2))
        inputs = await h.until(ended("cmd", 2))
        done = sorted((e.task_index, e.exit_code) for e in of_type(inputs, TaskFinished, "cmd"))
        assert done == [(0, 0), (1, 0)]
        (placed,) = await h.placements()
        for task in placed.tasks:
            got = report(out, task.task_index)
            assert got["argv"] == hostile(marker)
            assert got["env"] == {**env(marker), "FLEETLOG_JOB_ID": "cmd", "FLEETLOG_NODE": task.node}
        no_marker(marker)
        assert len(h.slurm_jobs()) == 2  # one Slurm job a task: no #SBATCH line was read (no array)


async def test_slurm_runs_a_script_its_exit_code_and_a_job_without_payload_runs_the_command(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    body = (f"#!{sys.executable} -u\r\nimport os, sys\r\n"  # (CR LF: Python reads it; sbatch would refuse it)
            f"open({str(out)!r}, 'w').write(os.environ['GREETING'])\r\nsys.exit(3)\r\n")
    scripted = paying("scr", script=body, env={"GREETING": "it's $(x)"})
    async with Harness(slurm_cluster, tmp_path, {"plain": f"echo plain > {tmp_path}/plain"}) as h:
        await h.ready()
        await h.submit(scripted, job("plain"))
        inputs = await h.until(lambda events: ended("scr")(events) and ended("plain")(events))
        assert [e.exit_code for e in of_type(inputs, TaskFinished, "scr")] == [3]
        assert out.read_text() == "it's $(x)"
        assert [e.exit_code for e in of_type(inputs, TaskFinished, "plain")] == [0]
        assert (tmp_path / "plain").read_text() == "plain\n"


async def test_slurm_an_image_without_an_image_option_fails_the_job_saying_so(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    image = "nvcr.io/nvidia/pytorch:24.01-py3"
    imaged = paying("img", command=("true",), image=image)
    async with Harness(slurm_cluster, tmp_path) as h:
        await h.ready()
        await h.submit(imaged)
        inputs = await h.until(ended("img"))
        (failed,) = of_type(inputs, TaskFailed, "img")
        assert image in failed.reason
        assert "runs no images" in failed.reason
        assert h.slurm_jobs() == []  # nothing was submitted
        h.backend = h.new_backend(submit=SubmitSettings(image_option="--comment"))  # (one sbatch takes)
        await h.submit(msgspec.structs.replace(imaged, job_id="img2"))
        await h.until(ended("img2"))
        (ran,) = h.slurm_jobs()
        listed = json.loads(slurm_cluster.command("squeue", "--json"))["jobs"]
        comments = {j["name"]: j["comment"] for j in listed}
        assert comments[ran.name] == image


async def test_slurm_runs_the_first_submissions_payload_of_a_job_id(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """A second ``JobSubmitted`` of an id in the log (a producer writing straight to it; the
    service's ingest would not append it) is a duplicate the fold ignores: so does the backend."""
    out = tmp_path / "which"
    first, second = (paying("dup", command=("/bin/sh", "-c", f"echo {n} > {out}")) for n in ("1", "2"))
    async with Harness(slurm_cluster, tmp_path) as h:
        await h.ready()
        await h.submit(first, second)
        await h.until(ended("dup"))
        assert out.read_text() == "1\n"


def test_the_backend_keeps_a_jobs_first_submission_until_the_job_ends(tmp_path: Path) -> None:
    """What ``specs`` holds, read from the logs as the fold reads them: the first submission of
    an id (a resend with another payload is a duplicate), forgotten once the job is rejected,
    cancelled, failed or finished, so a later submission of the id is a new job's."""
    backend = SlurmBackend(FileLogStore(tmp_path / "log"), SlurmConfig())
    first, second = paying("j", command=("a",)), paying("j", command=("b",))
    offsets = iter(range(100))

    def read(event: InputEvent) -> None:
        backend.apply_input(Delivered(next(offsets), 0, envelope(event, "p")))

    def placed() -> Run:
        run = backend.runs["j"] = Run(next(offsets), JobPlaced(job_id="j", cell="slurm",
                                                               tasks=(TaskPlacement(0, "n1"),)))
        return run

    read(first)
    read(second)
    assert backend.specs["j"] == first
    rejected = JobRejected(job_id="j", reason="never_fits")
    backend.apply_batch(7, DecisionBatch(as_of=2, digest="", decisions=(rejected,)))
    assert "j" not in backend.specs
    read(second)
    assert backend.specs["j"] == second
    read(JobCancelled(job_id="j"))
    assert "j" not in backend.specs
    for kind, code in (("failed", 1), ("finished", 2), ("finished", 0)):
        read(first)
        backend.apply_task("j", placed(), 0, kind, code)  # type: ignore[arg-type]
        assert "j" not in backend.specs, (kind, code)
    read(first)
    backend.apply_task("j", placed(), 0, "started", 0)
    assert backend.specs["j"] == first  # (running: kept)


def test_the_batch_script_docs_slurm_md_shows_is_what_its_submit_line_makes(tmp_path: Path) -> None:
    section = (ROOT / "docs" / "slurm.md").read_text().split("## A job's payload\n")[1]
    command = section.split("```\n")[1].split("\n")[0:2]
    argv = shlex.split(" ".join(line.rstrip("\\") for line in command))
    assert argv[:2] == ["fleetlog", "submit"]
    assert main([*argv[1:], "--log", str(tmp_path / "log"), "--create"]) == 0
    (env,) = logged(tmp_path / "log")
    assert isinstance(env.event, JobSubmitted)
    shown = section.split("```sh\n")[1].split("```")[0]
    assert script(env.event, TaskPlacement(0, "n3", (0, 1, 2, 3)), sleep_for_expected_duration) == shown


def test_the_command_lines_image_option_and_command_reach_the_backend() -> None:
    args = slurm_main.arguments(["--log", "x", "--image-option=--container-image", "--command", "make run"])
    assert slurm_main.config(args).submit.image_option == "--container-image"
    assert slurm_main.workload(args.command)(job("j"), 0) == "make run"
    assert slurm_main.config(slurm_main.arguments(["--log", "x"])).submit.image_option == ""
