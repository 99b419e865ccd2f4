"""Read-only views of a state for people and scripts: a job's status, pending jobs by reason."""

from __future__ import annotations

from typing import Any

import numpy as np

from fleetlog.core.state import JobState, State, TaskState


def reason_code(state: State, code: int) -> str:
    """The pending reason recorded in a job's ``reason`` column (0: not explained yet)."""
    return state.reason_codes.names[code - 1] if code > 0 else "not_decided_yet"


def pending_by_reason(state: State) -> dict[str, int]:
    jobs = state.jobs
    codes = jobs.view("reason")[jobs.view("state") == JobState.PENDING]
    counts = np.bincount(codes.astype(np.int64), minlength=1) if codes.size else np.zeros(1, np.int64)
    return {reason_code(state, int(c)): int(n) for c, n in enumerate(counts) if n}


def job_status(state: State, job_id: str) -> dict[str, Any] | None:
    """What the state knows of ``job_id``, or ``None`` if it was never submitted."""
    row = state.job_row(job_id)
    if row < 0:
        return None
    cols = state.jobs.cols
    status = JobState(int(cols["state"][row]))
    out: dict[str, Any] = {
        "job_id": job_id,
        "state": status.name.lower(),
        "tenant": state.names["tenant"].names[int(cols["tenant"][row])],
        "queue": state.names["queue"].names[int(cols["queue"][row])],
        "priority": int(cols["priority"][row]),
        "submitted_at_ms": int(cols["submitted_at"][row]),
        "tasks": int(cols["ntasks"][row]),
        "tasks_done": int(cols["tasks_done"][row]),
    }
    if status == JobState.PENDING:
        out["pending_reason"] = reason_code(state, int(cols["reason"][row]))
        out["pending_message"] = state.reason_text.get(row, "")
    if int(cols["placed_at_ms"][row]) >= 0:
        out["placed_at_ms"] = int(cols["placed_at_ms"][row])
    out["task_nodes"] = _task_nodes(state, row)
    return out


def _task_nodes(state: State, row: int) -> list[dict[str, Any]]:
    tasks = state.tasks.cols
    out = []
    for t in state.job_tasks(row):
        node = int(tasks["node"][t])
        out.append({
            "task": t - int(state.jobs.cols["first_task"][row]),
            "state": TaskState(int(tasks["state"][t])).name.lower(),
            "node": state.node_name(node) if node >= 0 else None,
        })
    return out
