"""Task reports the fold could not apply as they were written, and why.

A broken node agent that reports tasks of jobs that do not exist, reports them twice or from the
wrong node changes nothing the scheduler decides — the fold ignores such a report and counts it
(``State.ignored``) — but it must not be invisible: an operator sees it in
``fleetlog_ignored_observations_total{reason}``, one log line per producer and reason, and
``fleetlog status`` of the job (``GET /v1/jobs/{id}``) or ``GET /v1/nodes`` of the node it names.

What is kept here is snapshotted, never digested (no decision reads it, so every old log still
verifies), bounded (the last :data:`PER_NAME` per job and per node, for at most :data:`MAX_NAMES`
of each, the least recently named dropped first) and deterministic (insertion-ordered dicts).
"""

from __future__ import annotations

import collections
from typing import Any, Final

import msgspec

REASONS: Final = (
    "unknown_job", "unknown_task", "not_placed", "already_started", "already_finished", "unknown_node",
    "wrong_node",
)
"""Why: no such job (never submitted here, or retired long ago); a task index past the job's tasks;
the job is pending (or handed back), so its tasks are on no node; a second start; a report after
the task or its job ended; and, for a start that IS applied, the node it names does not exist in
the job's cell, or is not the node the task is placed on (recorded only: the fold still starts
the task, as it always did)."""
PER_NAME: Final = 8
"""The latest observations kept per job id and per node name."""
MAX_NAMES: Final = 1024
"""The most job ids (and, apart, node names) kept: a producer that invents ids cannot grow this."""
RECENT: Final = 256
"""The latest observations of all, in order: what the service reads after each step."""


class Observation(msgspec.Struct, frozen=True, omit_defaults=True):
    """One task report the fold did not apply as written."""

    ignored: str
    """The event type: ``TaskStarted``, ``TaskFinished`` or ``TaskFailed``."""
    reason: str
    """One of :data:`REASONS`."""
    job_id: str
    task_index: int
    node: str = ""
    """The node the report names (``TaskStarted``), else the node the task was placed on (``""``:
    none)."""
    inputs_offset: int = 0
    """The input it was folded at."""
    at_ms: int = 0
    """Its log time."""
    folded: bool = False
    """The report was applied all the same (``unknown_node``, ``wrong_node``: the task started)."""


class Observations:
    """The counts by reason, the latest per job and per node, and the :data:`RECENT` latest."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.seq = 0  # observations recorded since the log's start
        self.recent: collections.deque[Observation] = collections.deque(maxlen=RECENT)
        self.by_job: dict[str, list[Observation]] = {}
        self.by_node: dict[str, list[Observation]] = {}

    def record(self, seen: Observation) -> None:
        self.counts[seen.reason] = self.counts.get(seen.reason, 0) + 1
        self.seq += 1
        self.recent.append(seen)
        _keep(self.by_job, seen.job_id, seen)
        if seen.node:
            _keep(self.by_node, seen.node, seen)

    def latest(self, since_seq: int) -> list[Observation]:
        """The observations recorded after the ``since_seq``-th (at most :data:`RECENT`)."""
        new = min(self.seq - since_seq, len(self.recent))
        return list(self.recent)[len(self.recent) - new:] if new > 0 else []

    def to_builtins(self) -> dict[str, Any]:
        """Its snapshot: plain lists, in the order kept (which is what restores the same bounds)."""
        return {
            "counts": sorted(self.counts.items()),
            "seq": self.seq,
            "recent": msgspec.to_builtins(list(self.recent)),
            "by_job": [[k, msgspec.to_builtins(v)] for k, v in self.by_job.items()],
            "by_node": [[k, msgspec.to_builtins(v)] for k, v in self.by_node.items()],
        }

    @classmethod
    def restore(cls, raw: dict[str, Any] | None) -> Observations:
        """From :meth:`to_builtins` (``None``: a snapshot from before, or of a log without any)."""
        out = cls()
        if raw is None:
            return out
        out.counts = {str(k): int(v) for k, v in raw["counts"]}
        out.seq = int(raw["seq"])
        out.recent.extend(msgspec.convert(raw["recent"], list[Observation]))
        out.by_job = {str(k): msgspec.convert(v, list[Observation]) for k, v in raw["by_job"]}
        out.by_node = {str(k): msgspec.convert(v, list[Observation]) for k, v in raw["by_node"]}
        return out

    def __bool__(self) -> bool:
        return self.seq > 0


def _keep(kept: dict[str, list[Observation]], name: str, seen: Observation) -> None:
    """Append ``seen`` to ``name``'s latest (the last :data:`PER_NAME`), ``name`` now the most
    recently named; past :data:`MAX_NAMES` names the least recently named is dropped."""
    latest = kept.pop(name, [])
    latest.append(seen)
    del latest[:-PER_NAME]
    kept[name] = latest
    if len(kept) > MAX_NAMES:
        del kept[next(iter(kept))]
