"""Read-only views of a state for people and scripts: a job's status, pending jobs by reason,
and whole tables (nodes, jobs, tenants, queues).  Pure: they only read the state.

The service (``fleetlog status``, metrics) and replay (``fleetlog replay state-at``) share them.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from fleetlog.core.state import (
    LEVEL_MASK,
    MAX_GPU_MODELS,
    SPREAD_HOST,
    TERMINAL,
    TOPOLOGY_CODES,
    JobState,
    NodeStatus,
    State,
    TaskState,
)
from fleetlog.events.spec import SubmissionSpec, TaskShape, merged_tasks


def reason_code(state: State, code: int) -> str:
    """The pending reason recorded in a job's ``reason`` column (0: not explained yet)."""
    return state.reason_codes.names[code - 1] if code > 0 else "not_decided_yet"


def pending_reason(state: State, row: int) -> tuple[str, str]:
    """(reason code, message) of pending job ``row``: what the last decide said, or, when no
    decide has looked at it since it was requeued, why it was requeued (``preempted``,
    ``node_lost``...): the decision batch or input that requeued it says so at once."""
    code = int(state.jobs.cols["reason"][row])
    note = state.requeues.get(row)
    if code == 0 and note is not None:
        return note.cause, note.message
    return reason_code(state, code), state.reason_text.get(row, "")


def pending_by_reason(state: State) -> dict[str, int]:
    jobs = state.jobs
    codes = jobs.view("reason")[jobs.view("state") == JobState.PENDING]
    counts = np.bincount(codes.astype(np.int64), minlength=1) if codes.size else np.zeros(1, np.int64)
    return {reason_code(state, int(c)): int(n) for c, n in enumerate(counts) if n}


def pending_tasks(state: State) -> int:
    """Tasks of the jobs waiting to be placed."""
    jobs = state.jobs
    return int(jobs.view("ntasks")[jobs.view("state") == JobState.PENDING].sum())


def job_status(state: State, job_id: str) -> dict[str, Any] | None:
    """What the state knows of ``job_id``, or ``None`` if it was never submitted."""
    row = state.job_row(job_id)
    if row < 0:
        return None
    cols = state.jobs.cols
    status = JobState(int(cols["state"][row]))
    out: dict[str, Any] = {
        "job_id": job_id,
        "state": job_phase(state, row, status),
        "tenant": state.names["tenant"].names[int(cols["tenant"][row])],
        "queue": state.names["queue"].names[int(cols["queue"][row])],
        "priority": int(cols["priority"][row]),
        "submitted_at_ms": int(cols["submitted_at"][row]),
        "tasks": int(cols["ntasks"][row]),
        "tasks_started": tasks_started(state, row),
        "tasks_done": int(cols["tasks_done"][row]),
    }
    if status == JobState.PENDING:
        out["pending_reason"], out["pending_message"] = pending_reason(state, row)
        note = state.requeues.get(row)
        if note is not None:
            out["requeued"] = msgspec.to_builtins(note)
    elif int(cols["placed_at_ms"][row]) >= 0:  # (a requeued job's last placement is history)
        out["placed_at_ms"] = int(cols["placed_at_ms"][row])
    out["task_nodes"] = _task_nodes(state, row)
    seen = state.observations.by_job.get(job_id)
    if seen:  # task reports naming it that the fold did not apply as written (the latest few)
        out["ignored_observations"] = msgspec.to_builtins(seen)
    return out


def named_by_reports(state: State, job_id: str) -> str:
    """For a job the state does not hold: ``""``, or how many task reports named it (a broken node
    agent reporting a job that never was: ``unknown_job``) and the latest, to add to "unknown job"."""
    seen = state.observations.by_job.get(job_id)
    if not seen:
        return ""
    last = seen[-1]
    node = f" on node {last.node}" if last.node else ""
    return (f"; but {len(seen)} task report(s) named it (the latest kept: {last.ignored} of task "
            f"{last.task_index}{node} at inputs offset {last.inputs_offset}, ignored: {last.reason})")


def tasks_started(state: State, row: int) -> int:
    """How many of job ``row``'s tasks a backend has seen start (or end) since it was placed."""
    span = state.job_tasks(row)
    return int(np.count_nonzero(state.tasks.cols["state"][span.start:span.stop] >= TaskState.STARTED))


def job_phase(state: State, row: int, status: JobState) -> str:
    """A job's state as people read it: a placed job is ``placed`` until the backends saw every
    one of its tasks start (a bound pod still ``Pending``, a Slurm job still ``PENDING``), then
    ``running``; any other state by its name."""
    if status != JobState.RUNNING:
        return status.name.lower()
    return "running" if tasks_started(state, row) == int(state.jobs.cols["ntasks"][row]) else "placed"


def folded_spec(state: State, job_id: str) -> SubmissionSpec | None:
    """The spec the state folded for ``job_id`` (its first submission), in the canonical form of
    :func:`fleetlog.events.spec.submission_spec`; ``None`` if it was never submitted.  Compare it
    with :func:`as_folded` of a new submission's spec."""
    row = state.job_row(job_id)
    if row < 0:
        return None
    cols, tasks, names = state.jobs.cols, state.tasks.cols, state.names
    topology = {code: name for name, code in TOPOLOGY_CODES.items()}
    span = state.job_tasks(row)
    columns = ("cpu", "mem", "gpus", "milli", "models", "cls")
    rows = zip(*(tasks[c][span.start:span.stop].tolist() for c in columns), strict=True)
    names_of: dict[int, tuple[str, ...]] = {}
    shapes = [TaskShape(1, cpu, mem, gpus, milli, names_of.get(models) or names_of.setdefault(
        models, _model_names(state, models)), state.classes[cls])
        for cpu, mem, gpus, milli, models, cls in rows]
    return SubmissionSpec(
        tenant=names["tenant"].names[int(cols["tenant"][row])],
        queue=names["queue"].names[int(cols["queue"][row])],
        priority=int(cols["priority"][row]),
        allowed_cells=tuple(sorted(names["cell"].names[c] for c in state.job_cells.get(row, ()))),
        required_topology=topology.get(int(cols["topology"][row]) & LEVEL_MASK, ""),
        expected_duration_ms=int(cols["expected_ms"][row]),
        spread="host" if int(cols["topology"][row]) & SPREAD_HOST else "",
        tasks=merged_tasks(shapes),
    )


def as_folded(state: State, spec: SubmissionSpec) -> SubmissionSpec:
    """``spec`` as the state would keep it: GPU models past the state's 64th share one bit (the
    documented limit), so they are named by the model that bit stands for; a task without GPUs
    keeps no models (they constrain nothing, :func:`fleetlog.core.fold.models_mask`)."""
    models = state.names["model"]

    def kept(name: str) -> str:
        row = models.get(name)
        return models.names[MAX_GPU_MODELS - 1] if row >= MAX_GPU_MODELS - 1 else name

    tasks = [t._replace(gpu_models=tuple(sorted({kept(m) for m in t.gpu_models})) if t.gpu_count else ())
             for t in spec.tasks]
    return spec._replace(tasks=merged_tasks(tasks))


def _model_names(state: State, mask: int) -> tuple[str, ...]:
    names = state.names["model"].names
    return tuple(sorted(names[bit] for bit in range(min(len(names), MAX_GPU_MODELS)) if mask >> bit & 1))


def submitted_offset(state: State, job_id: str) -> int:
    """The inputs offset of the submission the state folded for ``job_id`` (-1: none)."""
    row = state.job_row(job_id)
    return int(state.jobs.cols["seq"][row]) if row >= 0 else -1


def job_ended(state: State, job_id: str) -> str | None:
    """The final state (``succeeded``, ``cancelled``…) of ``job_id`` if it has ended, else ``None``."""
    row = state.job_row(job_id)
    if row < 0 or int(state.jobs.cols["state"][row]) not in TERMINAL:
        return None
    return JobState(int(state.jobs.cols["state"][row])).name.lower()


def _task_nodes(state: State, row: int) -> list[dict[str, Any]]:
    tasks = state.tasks.cols
    out = []
    for t in state.job_tasks(row):
        node = int(tasks["node"][t])
        out.append(
            {
                "task": t - int(state.jobs.cols["first_task"][row]),
                "state": TaskState(int(tasks["state"][t])).name.lower(),
                "node": state.node_name(node) if node >= 0 else None,
            }
        )
    return out


# --- whole tables ---------------------------------------------------------------------------


def nodes_table(state: State) -> list[dict[str, Any]]:
    """Every node ever seen, in first-seen order: status, capacity, what is free, and what work
    fleetlog does not own holds there (``foreign_*``, docs/scheduling.md)."""
    c, names = state.nodes.cols, state.names
    out = []
    for row in range(state.nodes.size):
        count = int(c["gpu_count"][row])
        model = int(c["model"][row])
        foreign = state.node_foreign.get(row, (0, 0, 0, 0, 0, 0))
        out.append(
            {
                "cell": names["cell"].names[int(c["cell"][row])],
                "node": state.node_name(row),
                "status": NodeStatus(int(c["status"][row])).name.lower(),
                "gpu_model": names["model"].names[model] if model >= 0 else "",
                "gpus": count,
                "gpu_free_milli": int(c["gpu_free"][row, :count].sum()),
                "cpu_milli": int(c["cpu_alloc"][row]),
                "cpu_free_milli": int(c["cpu_free"][row]),
                "mem_mib": int(c["mem_alloc"][row]),
                "mem_free_mib": int(c["mem_free"][row]),
                "foreign_gpus": foreign[5].bit_count(),
                "foreign_cpu_milli": foreign[3],
                "foreign_mem_mib": foreign[4],
                "last_heartbeat_ms": int(c["last_heartbeat_ms"][row]),
            }
        )
    return out


def jobs_table(state: State, include_finished: bool = True) -> list[dict[str, Any]]:
    """Every job in submission order with its state, tenant, queue and pending reason."""
    c, names = state.jobs.cols, state.names
    out = []
    for row in range(state.jobs.size):
        status = JobState(int(c["state"][row]))
        if status == JobState.RETIRED or (
            not include_finished and status not in (JobState.PENDING, JobState.RUNNING)
        ):
            continue
        cell = int(c["cell"][row])
        out.append(
            {
                "job_id": names["job"].names[row],
                "state": job_phase(state, row, status),
                "tenant": names["tenant"].names[int(c["tenant"][row])],
                "queue": names["queue"].names[int(c["queue"][row])],
                "priority": int(c["priority"][row]),
                "tasks": int(c["ntasks"][row]),
                "gpu_milli": int(c["req_gpu"][row]),
                "cell": names["cell"].names[cell] if cell >= 0 else "",
                "submitted_at_ms": int(c["submitted_at"][row]),
                "reason": pending_reason(state, row)[0] if status == JobState.PENDING else "",
            }
        )
    return out


def tenants_table(state: State) -> list[dict[str, Any]]:
    """Per tenant: running and pending jobs, resources in use (all cells), nominal quota, and
    how many of its jobs retired from the state (docs/retention.md) in each end state."""
    c, names = state.jobs.cols, state.names
    tenant_col, job_state = c["tenant"][: state.jobs.size], c["state"][: state.jobs.size]
    out = []
    for tid, tenant in enumerate(names["tenant"].names):
        mine = tenant_col == tid
        use = state.usage.get((tid, -1), [0, 0, 0])
        quota = state.quotas.get((tid, -1))
        out.append(
            {
                "tenant": tenant,
                "running": int(np.count_nonzero(mine & (job_state == JobState.RUNNING))),
                "pending": int(np.count_nonzero(mine & (job_state == JobState.PENDING))),
                "cpu_milli": int(use[0]),
                "mem_mib": int(use[1]),
                "gpu_milli": int(use[2]),
                "nominal_gpu_milli": None if quota is None else int(quota.nominal[2]),
                "weight_milli": None if quota is None else int(quota.weight_milli),
                **dict(zip(("retired_succeeded", "retired_failed", "retired_cancelled", "retired_rejected"),
                           state.retired_counts.get(tid, [0, 0, 0, 0]), strict=True)),
            }
        )
    return out


def queues_table(state: State) -> list[dict[str, Any]]:
    """Per queue: pending and running jobs, and the pending jobs' GPU demand."""
    c = state.jobs.cols
    queue_col, job_state = c["queue"][: state.jobs.size], c["state"][: state.jobs.size]
    gpu = c["req_gpu"][: state.jobs.size]
    out = []
    for qid, queue in enumerate(state.names["queue"].names):
        mine = queue_col == qid
        pending = mine & (job_state == JobState.PENDING)
        out.append(
            {
                "queue": queue,
                "pending": int(np.count_nonzero(pending)),
                "running": int(np.count_nonzero(mine & (job_state == JobState.RUNNING))),
                "pending_gpu_milli": int(gpu[pending].sum()),
            }
        )
    return out


def gpu_totals(state: State) -> tuple[int, int]:
    """(GPU milli on up nodes, GPU milli allocated on them)."""
    c, n = state.nodes.cols, state.nodes.size
    up = c["status"][:n] == NodeStatus.UP
    total = int(c["gpu_count"][:n][up].sum()) * 1000
    free = int(c["gpu_free"][:n][up].sum())
    return total, total - free
