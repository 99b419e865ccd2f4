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
from fleetlog.events import JobSubmitted, NodeHeartbeat, TaskGroup, TaskPlacement
from fleetlog.events.features import FEATURE_LABEL, PARTITION_LABEL
from fleetlog.events.model import MAX_CONSTRAINT_ITEMS

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
    if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit() or not parts[2]:
        return None
    return TaskName(int(parts[0]), int(parts[1]), parts[2])


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
        if fields[0] != "gpu" or len(fields) < 2 or not fields[-1].isdigit():
            continue
        count += int(fields[-1])
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
    """``sbatch`` for one task: exactly its node, CPUs (whole, rounded up), memory and GPUs."""
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
        *settings.extra_options,
    ]
    return Submission(tuple(options), script(job, task, workload))


def gres_options(group: TaskGroup, gpu_type: str) -> list[str]:
    """``--gres=gpu[:type]:N`` for whole GPUs; a fractional GPU takes a whole one in Slurm."""
    if group.gpu_count == 0:
        return []
    return [f"--gres=gpu:{gpu_type + ':' if gpu_type else ''}{group.gpu_count}"]


def script(job: JobSubmitted, task: TaskPlacement, workload: Workload) -> str:
    env = {
        "FLEETLOG_JOB_ID": job.job_id,
        "FLEETLOG_TASK_INDEX": str(task.task_index),
        "FLEETLOG_NODE": task.node,
        "FLEETLOG_GPU_INDICES": ",".join(str(g) for g in task.gpu_indices),
    }
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
    return f"#!/bin/sh\n{exports}{workload(job, task.task_index)}\n"


def sleep_for_expected_duration(job: JobSubmitted, task_index: int) -> str:
    """The default workload: sleep for the job's expected duration (or end at once)."""
    seconds = (job.expected_duration_ms or 0) / 1000
    return f"sleep {seconds:.3f}" if seconds else "true"
