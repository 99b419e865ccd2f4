"""Pure translations between Slurm and fleetlog: names, node health, job states, sbatch options.

One fleetlog task is one Slurm batch job, pinned to the node fleetlog chose.  Its Slurm job
name carries the fleetlog job id, the placement's incarnation (the decisions-log offset of the
batch that placed it) and the task index, so a replayed decision finds the job it already
submitted and observations are matched to the placement they belong to.
"""

from __future__ import annotations

import hashlib
import math
import shlex
from collections.abc import Callable, Iterable
from typing import Final, Literal

import msgspec

from fleetlog.backends.slurm.client import SlurmJob, SlurmNode, Submission
from fleetlog.events import JobPayload, JobSubmitted, NodeHeartbeat, TaskGroup, TaskPlacement
from fleetlog.events.features import FEATURE_LABEL, PARTITION_LABEL
from fleetlog.events.model import MAX_CONSTRAINT_ITEMS
from fleetlog.numerals import whole

Workload = Callable[[JobSubmitted, int], str]
"""The shell commands task ``index`` of a job runs (the body of its batch script)."""

UNHEALTHY_STATES: Final = frozenset({"down", "fail", "future", "unknown", "error", "inval"})
UNHEALTHY_FLAGS: Final = frozenset(
    {"DRAIN", "DRAINING", "DRAINED", "FAIL", "FAILING", "NOT_RESPONDING", "POWERED_DOWN",
     "POWERING_DOWN", "POWER_DOWN", "MAINTENANCE", "REBOOT_REQUESTED", "REBOOT_ISSUED"}
)  # fmt: skip
RUNNING_STATES: Final = frozenset(
    {"RUNNING", "SUSPENDED", "COMPLETING", "STOPPED", "SIGNALING", "RESIZING", "STAGE_OUT"}
)
ACTIVE_STATES: Final = RUNNING_STATES | {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"}
RAN_STATES: Final = frozenset({"FAILED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL"})
"""Ended states a job reaches only after it started (``CANCELLED`` may come before the start)."""
MAX_KEY: Final = 253

Kind = Literal["started", "finished", "failed"]


class TaskName(msgspec.Struct, frozen=True):
    """What a Slurm job name says: ``<prefix>:<incarnation>:<task index>:<job id>``."""

    incarnation: int
    task_index: int
    job_id: str


def job_name(prefix: str, incarnation: int, task_index: int, job_id: str) -> str:
    return f"{prefix}:{incarnation}:{task_index}:{job_id}"


def parse_name(prefix: str, name: str) -> TaskName | None:
    """The task a Slurm job name stands for, or ``None`` for a job fleetlog did not submit."""
    head, sep, rest = name.partition(":")
    if head != prefix or not sep:
        return None
    parts = rest.split(":", 2)
    numbers = [whole(part, 18) for part in parts[:2]]  # (a user's job named "fleetlog:²:…" is not ours)
    if len(parts) != 3 or numbers[0] is None or numbers[1] is None or not parts[2]:
        return None
    return TaskName(numbers[0], numbers[1], parts[2])


def event_key(name: str, kind: Kind) -> str:
    """The idempotency key of an observation: its Slurm job name and kind (hashed when too long)."""
    key = f"{name}/{kind}"
    return key if len(key) <= MAX_KEY else "sha256:" + hashlib.sha256(key.encode()).hexdigest()


# --- nodes -------------------------------------------------------------------------------


def gpu_gres(gres: str) -> tuple[int, str]:
    """(count, type) of the ``gpu`` entries of a GRES string like ``gpu:a100:4(S:0),nic:1``."""
    count, model = 0, ""
    for entry in gres.split(","):
        fields = entry.split("(", 1)[0].split(":")
        gpus = whole(fields[-1], 6)
        if fields[0] != "gpu" or len(fields) < 2 or gpus is None:
            continue
        count += gpus
        model = model or (fields[1] if len(fields) == 3 else "")
    return count, model


def healthy(node: SlurmNode) -> bool:
    """Whether work may run on ``node``: not down, failed or drained, and responding."""
    base = node.state.lower().rstrip("*~#!%$@^-")
    return base not in UNHEALTHY_STATES and not UNHEALTHY_FLAGS.intersection(node.state_flags)


def node_labels(node: SlurmNode) -> dict[str, str]:
    """The node's partitions and features as labels (the joined lists too, as before), at most 64."""
    labels = {"slurm/partition": ",".join(sorted(node.partitions))} if node.partitions else {}
    if node.features:
        labels["slurm/features"] = node.features
    names = [f for f in node.features.split(",") if f.strip()]
    labels |= {PARTITION_LABEL + p: "true" for p in sorted(node.partitions)}
    labels |= {FEATURE_LABEL + f.strip(): "true" for f in sorted(names)}
    return dict(list(labels.items())[:MAX_CONSTRAINT_ITEMS])


Held = tuple[int, int, int]
"""(CPUs, MiB, GPUs) some jobs hold on a node."""


def held_by(jobs: Iterable[SlurmJob]) -> dict[str, Held]:
    """What ``jobs`` hold per node while Slurm runs them (a job of ours runs on one node)."""
    out: dict[str, Held] = {}
    for job in jobs:
        if job.job_state not in RUNNING_STATES or not job.nodes or "," in job.nodes or "[" in job.nodes:
            continue
        cpus, mem, gpus = out.get(job.nodes, (0, 0, 0))
        detail = sum(gpu_gres(g)[0] for g in job.gres_detail)
        out[job.nodes] = (cpus + job.cpus, mem + (job.memory_per_node or 0), gpus + detail)
    return out


def heartbeat(cell: str, node: SlurmNode, default_gpu_model: str, ours: Held = (0, 0, 0)) -> NodeHeartbeat:
    """The node as fleetlog sees it; ``ours``: what fleetlog's own jobs hold on it, so that the
    rest of what Slurm says is allocated there (a job submitted straight to Slurm) is foreign."""
    count, model = gpu_gres(node.gres)
    labels = node_labels(node)
    used = gpu_gres(node.gres_used)[0]
    return NodeHeartbeat(
        cell=cell,
        node=node.name,
        cpu_milli=node.cpus * 1000,
        mem_mib=node.real_memory,
        gpu_count=count,
        gpu_model=(model or default_gpu_model) if count else "",
        labels=labels,
        healthy=healthy(node),
        foreign_cpu_milli=min(max(node.alloc_cpus - ours[0], 0), node.cpus) * 1000,
        foreign_mem_mib=min(max(node.alloc_memory - ours[1], 0), node.real_memory),
        foreign_gpus=min(max(used - ours[2], 0), count),
    )


# --- jobs --------------------------------------------------------------------------------


class Outcome(msgspec.Struct, frozen=True):
    """What a Slurm job's state means for its task: started, and how it ended (if it did)."""

    started: bool
    ended: Kind | None = None
    exit_code: int | None = None
    reason: str = ""


def outcome(job: SlurmJob) -> Outcome:
    state = job.job_state
    if state in ACTIVE_STATES - RUNNING_STATES:
        return Outcome(False)
    if state in RUNNING_STATES:
        return Outcome(True)
    code, signal = decode_status(job.exit_code)
    if state == "COMPLETED" or (state == "FAILED" and signal == 0):
        return Outcome(True, "finished", code)
    detail = f"killed by signal {signal}" if signal else f"exit code {code}"
    reason = f"slurm job {job.job_id} {state} ({job.state_reason or 'no reason'}): {detail}"
    return Outcome(state in RAN_STATES, "failed", code, reason)


def decode_status(status: int | None) -> tuple[int, int]:
    """(exit code, signal) from a wait(2) status; a signal gives exit code 128 + signal."""
    if not status:
        return 0, 0
    signal = status & 0x7F
    return (128 + signal, signal) if signal else ((status >> 8) & 0xFF, 0)


# --- submissions -------------------------------------------------------------------------


class SubmitSettings(msgspec.Struct, frozen=True):
    partition: str = ""
    gpu_type: str = ""
    output: str = "/dev/null"
    extra_options: tuple[str, ...] = ()
    image_option: str = ""
    """The sbatch option that runs a job in its payload's ``image`` (``--container-image``
    with NVIDIA's pyxis plugin): ``<image_option>=<image>``.  Empty: a job whose payload names
    an image is not run (its tasks fail, saying so) — never run outside the image it asked for."""


class PayloadError(ValueError):
    """A job's payload this backend cannot run as asked (an image, without ``image_option``)."""


def task_group(job: JobSubmitted, task_index: int) -> TaskGroup:
    """The group task ``task_index`` of ``job`` belongs to (tasks are numbered group by group)."""
    first = 0
    for group in job.task_groups:
        if task_index < first + group.count:
            return group
        first += group.count
    raise ValueError(f"job {job.job_id!r} has no task {task_index}")


def submission(
    name: str, job: JobSubmitted, task: TaskPlacement, workload: Workload, settings: SubmitSettings
) -> Submission:
    """``sbatch`` for one task: exactly its node, CPUs (whole, rounded up), memory and GPUs; the
    payload's image as ``settings.image_option`` (:class:`PayloadError` without one)."""
    group = task_group(job, task.task_index)
    options = [
        f"--job-name={name}",
        f"--nodelist={task.node}",
        "--nodes=1",
        "--ntasks=1",
        f"--cpus-per-task={max(1, math.ceil(group.cpu_milli / 1000))}",
        f"--mem={max(1, group.mem_mib)}M",
        "--no-requeue",
        f"--output={settings.output}",
        *([f"--partition={settings.partition}"] if settings.partition else []),
        *gres_options(group, settings.gpu_type),
        *image_options(job, settings.image_option),
        *settings.extra_options,
    ]
    return Submission(tuple(options), script(job, task, workload))


def image_options(job: JobSubmitted, image_option: str) -> list[str]:
    """``[<image_option>=<image>]`` for a payload with an image (one argument: no shell reads
    it), ``[]`` without; :class:`PayloadError` when the backend has no way to run images."""
    image = job.payload.image if job.payload is not None else ""
    if not image:
        return []
    if not image_option:
        raise PayloadError(
            f"the payload asks for the image {image!r}, and this Slurm backend runs no images "
            "(start it with --image-option=OPTION, e.g. --image-option=--container-image for pyxis)"
        )
    return [f"{image_option}={image}"]


def gres_options(group: TaskGroup, gpu_type: str) -> list[str]:
    """``--gres=gpu[:type]:N`` for whole GPUs; a fractional GPU takes a whole one in Slurm."""
    if group.gpu_count == 0:
        return []
    return [f"--gres=gpu:{gpu_type + ':' if gpu_type else ''}{group.gpu_count}"]


SCRIPT_FD: Final = 9
"""The descriptor a payload's script is read from by its interpreter (``/dev/fd/9``)."""


def sh_quote(text: str) -> str:
    """``text`` as one shell word, taken literally whatever it holds (quotes, ``$()``, backquotes,
    newlines): single-quoted.  A CR before a LF is split off into its own quotes (``'\\r''\\n'``):
    sbatch refuses a script with DOS line breaks, and the word still means the same text."""
    return shlex.quote(text).replace("\r\n", "\r''\n")


def script(job: JobSubmitted, task: TaskPlacement, workload: Workload) -> str:
    """The batch script of one task: fleetlog's variables first (so sbatch reads no ``#SBATCH``
    line past them), then the payload's script put aside (:func:`script_setup`), its ``env``
    (every value quoted; fleetlog's own names are not overridden), then what runs: the
    payload's command or script (:func:`payload_run`), or else the backend's workload."""
    ours = {
        "FLEETLOG_JOB_ID": job.job_id,
        "FLEETLOG_TASK_INDEX": str(task.task_index),
        "FLEETLOG_NODE": task.node,
        "FLEETLOG_GPU_INDICES": ",".join(str(g) for g in task.gpu_indices),
    }
    payload = job.payload
    env = {k: v for k, v in payload.env.items() if k not in ours} if payload is not None else {}
    lines = ["#!/bin/sh", *(f"export {k}={sh_quote(v)}" for k, v in ours.items())]
    lines += script_setup(payload.script) if payload is not None and payload.script else []
    lines += [f"export {k}={sh_quote(v)}" for k, v in env.items()]  # (names: [A-Za-z_][A-Za-z0-9_]*)
    run = payload_run(payload) if payload is not None else ""
    lines.append(run or workload(job, task.task_index))
    return "\n".join(lines) + "\n"


def script_setup(text: str) -> list[str]:
    """Shell lines that write a payload's script to a temporary file, open it as descriptor 8
    and remove the file (the open descriptor keeps it readable: nothing is left behind, even if
    the job is killed).  They run before the payload's ``env`` is set, which cannot change them."""
    return [
        'fleetlog_script=$(mktemp "${TMPDIR:-/tmp}/fleetlog-script.XXXXXXXX") || exit 1',
        f"printf '%s' {sh_quote(text)} > \"$fleetlog_script\" && exec 8< \"$fleetlog_script\" "
        '|| { rm -f "$fleetlog_script"; exit 1; }',
        'rm -f "$fleetlog_script"; unset fleetlog_script',
    ]


def payload_run(payload: JobPayload) -> str:
    """The line that runs a payload: ``exec`` of its command, every argument quoted (no shell
    reads them), or of its script's interpreter (its ``#!`` line, read as Linux reads it) on
    ``/dev/fd/9``; ``""`` for a payload with neither."""
    if payload.command:
        return "exec " + " ".join(sh_quote(arg) for arg in payload.command)
    if payload.script:
        program = " ".join(sh_quote(a) for a in interpreter(payload.script))
        return f"exec {program} /dev/fd/{SCRIPT_FD} {SCRIPT_FD}<&8 8<&-"
    return ""


def interpreter(text: str) -> list[str]:
    """The interpreter a script's ``#!`` line names and its one optional argument, as Linux's
    ``binfmt_script`` reads them (blanks around both trimmed; a trailing CR too)."""
    line = text[2:].split("\n", 1)[0].rstrip(" \t\r").lstrip(" \t")
    cut = next((i for i, c in enumerate(line) if c in " \t"), len(line))
    program, argument = line[:cut], line[cut:].lstrip(" \t")
    return [program, argument] if argument else [program]


def sleep_for_expected_duration(job: JobSubmitted, task_index: int) -> str:
    """The default workload: sleep for the job's expected duration (or end at once)."""
    seconds = (job.expected_duration_ms or 0) / 1000
    return f"sleep {seconds:.3f}" if seconds else "true"
