"""Slurm's client commands (``sinfo``, ``squeue``, ``sbatch``, ``scancel``) as asyncio subprocesses.

Observations use the JSON output of ``sinfo --json`` and ``squeue --json`` (Slurm's OpenAPI
v0.0.38 data parser on 22.05), decoded into the few typed fields the backend needs.  Every
failure becomes a :class:`SlurmError` that says which command failed and why:
:class:`SlurmUnavailableError` when Slurm cannot be reached (retry later),
:class:`SlurmRejectedError` when it refused a submission (retrying would not help).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from typing import Final, TypeVar

import msgspec

from fleetlog.numerals import whole

T = TypeVar("T")
UNREACHABLE_HINTS: Final = (
    "unable to contact slurm controller",
    "socket timed out",
    "connection refused",
    "zero bytes were transmitted",
    "could not establish a configuration source",
    "unable to establish controller machine",
    "munge",
    "communication connection failure",
)


class SlurmError(RuntimeError):
    """A Slurm command failed; the message names the command and Slurm's own words."""


class SlurmUnavailableError(SlurmError):
    """Slurm cannot be reached (controller down, bad configuration, command missing, timeout)."""


class SlurmRejectedError(SlurmError):
    """Slurm refused a request it understood (e.g. a submission it can never run)."""


class SlurmNode(msgspec.Struct, frozen=True):
    name: str
    state: str = ""
    state_flags: list[str] = []
    cpus: int = 0
    real_memory: int = 0
    gres: str = ""
    features: str = ""
    partitions: list[str] = []
    reason: str = ""
    alloc_cpus: int = 0
    alloc_memory: int = 0
    gres_used: str = ""
    """What every job on the node holds now (ours and everyone else's)."""


class SlurmJob(msgspec.Struct, frozen=True):
    job_id: int
    name: str = ""
    job_state: str = ""
    state_reason: str = ""
    exit_code: int | None = None
    nodes: str = ""
    cpus: int = 0
    memory_per_node: int | None = None
    gres_detail: list[str] = []
    """What the job holds (while it runs): CPUs, MiB per node, GRES per node (``gpu:type:N(IDX:…)``)."""


class ApiError(msgspec.Struct, frozen=True):
    error: str = ""
    description: str = ""
    source: str = ""

    def __str__(self) -> str:
        return ": ".join(p for p in (self.source, self.description, self.error) if p) or "unspecified error"


class _Nodes(msgspec.Struct):
    nodes: list[SlurmNode] = []
    errors: list[ApiError] = []


class _Jobs(msgspec.Struct):
    jobs: list[SlurmJob] = []
    errors: list[ApiError] = []


_NODES_DECODER: Final = msgspec.json.Decoder(_Nodes)
_JOBS_DECODER: Final = msgspec.json.Decoder(_Jobs)


class Submission(msgspec.Struct, frozen=True):
    """One ``sbatch``: its options (without ``--parsable``) and the batch script on stdin."""

    options: tuple[str, ...]
    script: str


class SlurmClient:
    """Runs Slurm's commands against the cluster named by ``slurm_conf`` (or the environment's)."""

    def __init__(self, slurm_conf: str | None = None, timeout_s: float = 30.0, bin_dir: str = "") -> None:
        self.env = {**os.environ, **({"SLURM_CONF": slurm_conf} if slurm_conf else {})}
        self.env.pop("SLURM_JWT", None)  # a stale token would switch the commands to JWT auth
        self.timeout_s = timeout_s
        self.bin_dir = bin_dir

    async def nodes(self) -> list[SlurmNode]:
        out = await self.run(["sinfo", "--json"])
        answer = decode_json(_NODES_DECODER, out, "sinfo --json")
        check_errors("sinfo --json", answer.errors)
        return answer.nodes

    async def jobs(self) -> list[SlurmJob]:
        """Every job slurmctld still knows: pending, running, and finished within ``MinJobAge``."""
        out = await self.run(["squeue", "--json"])
        answer = decode_json(_JOBS_DECODER, out, "squeue --json")
        check_errors("squeue --json", answer.errors)
        return answer.jobs

    async def submit(self, submission: Submission) -> int:
        """Submit a batch job; its Slurm job id."""
        out = await self.run(["sbatch", "--parsable", *submission.options], stdin=submission.script.encode())
        job = whole(out.strip().split(";", 1)[0], 18)
        if job is None:
            raise SlurmError(f"sbatch printed {out.strip()!r} instead of a job id")
        return job

    async def cancel(self, job_ids: Sequence[int]) -> None:
        """``scancel`` the jobs (a job that already ended is not an error)."""
        if job_ids:
            await self.run(["scancel", *(str(j) for j in sorted(job_ids))])

    async def run(self, argv: list[str], stdin: bytes | None = None) -> str:
        """Run one command; its stdout, or a :class:`SlurmError` quoting its stderr."""
        command = [os.path.join(self.bin_dir, argv[0]) if self.bin_dir else argv[0], *argv[1:]]
        conf = self.env.get("SLURM_CONF")
        if conf and not os.path.isfile(conf):
            raise SlurmUnavailableError(f"SLURM_CONF names {conf}, which is not a file")
        try:
            proc = await asyncio.create_subprocess_exec(
                *command,
                stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self.env,
            )
        except OSError as e:
            raise SlurmUnavailableError(
                f"cannot run {argv[0]}: {e} (are Slurm's client commands installed?)"
            ) from e
        try:
            out, err = await asyncio.wait_for(proc.communicate(stdin), self.timeout_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise SlurmUnavailableError(f"{argv[0]} did not answer within {self.timeout_s:g}s") from None
        if proc.returncode != 0:
            raise failure(argv[0], proc.returncode or 0, err.decode(errors="replace"))
        return out.decode(errors="replace")


def check_errors(what: str, errors: list[ApiError]) -> None:
    """``sinfo``/``squeue --json`` exit 0 with an empty list and ``errors`` when slurmctld cannot be
    reached: an empty answer must never be taken for an empty cluster."""
    if errors:
        detail = "; ".join(str(e) for e in errors)
        raise SlurmUnavailableError(f"{what} could not reach slurmctld ({detail}): is the controller up?")


def decode_json(decoder: msgspec.json.Decoder[T], out: str, what: str) -> T:
    try:
        return decoder.decode(out)
    except msgspec.DecodeError as e:
        raise SlurmError(f"{what} printed output this backend cannot read: {e}") from e


def failure(command: str, returncode: int, stderr: str) -> SlurmError:
    """The error for a failed command: unavailable (retry) or rejected, with Slurm's message."""
    text = " ".join(stderr.split()) or "(no message)"
    message = f"{command} failed (exit {returncode}): {text}"
    if command != "sbatch" or any(hint in text.lower() for hint in UNREACHABLE_HINTS):
        return SlurmUnavailableError(message)
    return SlurmRejectedError(message)
