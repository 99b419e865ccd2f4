"""What makes two submissions of one job id "the same spec".

The fold keeps the first ``JobSubmitted`` of a job id and ignores every later one.  Whether a
later one is a harmless resend or a conflicting job is decided here, once, for every reader: the
service's ingest (an identical resend is idempotent, a different spec is refused), ``fleetlog
submit`` on a file log, and replay's explain and dump (a resubmission that reached the log is
marked "duplicate, ignored").

Two submissions are the same spec when everything the scheduler folds is equal: tenant, queue,
priority, the *set* of allowed cells, the required topology, the expected duration, the spread,
and the tasks in order — each task's CPU, memory, GPU count, GPU share, *set* of allowed GPU models and
placement constraints (selector, affinity, tolerations and soft affinity as sets: :func:`constraints_key`).
How the tasks are split into groups (two groups of 1 or one group of 2 alike) and the groups'
``name`` (a label the fold does not keep) do not count; neither does the envelope (producer, key).

Nor do the job's ``labels``, ``annotations`` and ``payload``: the scheduler's state keeps none of
them (the service compares a resend with what it folded), so a resend that differs only there is
the same spec — an idempotent duplicate that changes nothing: what the log kept first (the first
submission's payload) is what runs.  To run something else, cancel the job and submit a new id.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, NamedTuple

from fleetlog.events.model import JobSubmitted, NodeSelectorRequirement, TaskGroup

Requirement = tuple[str, str, tuple[str, ...]]
"""(key, operator, sorted values) of one affinity requirement."""
TolerationKey = tuple[str, str, str, str]
"""(key, operator, value, effect) of one toleration."""
PreferenceKey = tuple[tuple[Requirement, ...], int]
"""(a soft affinity term's sorted requirements, its weight: the sum of the weights of every
entry with that term, as Kubernetes sums the weights of the terms a node matches)."""
ConstraintsKey = tuple[
    tuple[tuple[str, str], ...],
    tuple[tuple[Requirement, ...], ...],
    tuple[TolerationKey, ...],
    tuple[PreferenceKey, ...],
]
"""(sorted selector labels, sorted affinity terms of sorted requirements, sorted tolerations,
soft affinity terms sorted by term): equal keys constrain alike, however the entries were
ordered or repeated."""
NO_CONSTRAINTS: Final[ConstraintsKey] = ((), (), (), ())
TaintKey = tuple[str, str, str]
"""(key, value, effect) of one taint."""
NodeAttrs = tuple[tuple[tuple[str, str], ...], tuple[TaintKey, ...], bool]
"""A node's (sorted labels, taints in the heartbeat's order, cordoned)."""
NO_ATTRS: Final[NodeAttrs] = ((), (), False)


def constraints_key(g: TaskGroup) -> ConstraintsKey:
    """A task group's placement constraints in canonical form (``NO_CONSTRAINTS`` itself, the
    same object, when it has none)."""
    if not (g.node_selector or g.node_affinity or g.tolerations or g.preferred_affinity):
        return NO_CONSTRAINTS
    selector = tuple(sorted({(label.key, label.value) for label in g.node_selector}))
    terms = tuple(sorted({_term(t.match_expressions) for t in g.node_affinity}))
    tolerations = tuple(sorted({(t.key, t.operator, t.value, t.effect) for t in g.tolerations}))
    weights: dict[tuple[Requirement, ...], int] = {}
    for p in g.preferred_affinity:
        term = _term(p.preference.match_expressions)
        weights[term] = weights.get(term, 0) + p.weight
    return selector, terms, tolerations, tuple(sorted(weights.items()))


def _term(requirements: tuple[NodeSelectorRequirement, ...]) -> tuple[Requirement, ...]:
    return tuple(sorted({(r.key, r.operator, tuple(sorted(set(r.values)))) for r in requirements}))


def tolerates(tolerations: Sequence[TolerationKey], taint: TaintKey) -> bool:
    """Whether one of ``tolerations`` matches ``taint``, by Kubernetes' rules (the core's
    placements and evictions and the Kubernetes backend's evictions read it alike)."""
    key, value, effect = taint
    for t_key, op, t_value, t_effect in tolerations:
        if t_effect and t_effect != effect:
            continue
        if not t_key:
            if op == "Exists":
                return True
            continue
        if t_key == key and (op == "Exists" or t_value == value):
            return True
    return False


class TaskShape(NamedTuple):
    """``copies`` consecutive tasks of one shape."""

    copies: int
    cpu_milli: int
    mem_mib: int
    gpu_count: int
    gpu_milli: int
    gpu_models: tuple[str, ...]
    """Sorted, without repeats: the models a task may use (empty: any)."""
    constraints: ConstraintsKey = ((), (), (), ())
    """Its selector, affinity terms, tolerations and soft affinity, canonical (:func:`constraints_key`)."""


class SubmissionSpec(NamedTuple):
    """The canonical form of a job's spec: equal forms are the same spec."""

    tenant: str
    queue: str
    priority: int
    allowed_cells: tuple[str, ...]
    """Sorted, without repeats (empty: any cell)."""
    required_topology: str
    """``""`` for none."""
    expected_duration_ms: int
    """``-1`` for none."""
    spread: str
    """``""`` for none."""
    tasks: tuple[TaskShape, ...]
    """Runs of equal consecutive tasks, merged."""


def merged_tasks(shapes: list[TaskShape]) -> tuple[TaskShape, ...]:
    """``shapes`` with each run of equal consecutive shapes merged into one (counts summed)."""
    out: list[TaskShape] = []
    for shape in shapes:
        if out and out[-1][1:] == shape[1:]:
            out[-1] = out[-1]._replace(copies=out[-1].copies + shape.copies)
        else:
            out.append(shape)
    return tuple(out)


def submission_spec(event: JobSubmitted) -> SubmissionSpec:
    """The canonical spec of ``event`` (see the module docstring for what counts)."""
    shapes = [
        TaskShape(
            g.count,
            g.cpu_milli,
            g.mem_mib,
            g.gpu_count,
            g.gpu_milli,
            tuple(sorted(set(g.gpu_models))),
            constraints_key(g),
        )
        for g in event.task_groups
    ]
    return SubmissionSpec(
        tenant=event.tenant,
        queue=event.queue,
        priority=event.priority,
        allowed_cells=tuple(sorted(set(event.allowed_cells))),
        required_topology=event.required_topology or "",
        expected_duration_ms=-1 if event.expected_duration_ms is None else event.expected_duration_ms,
        spread=event.spread or "",
        tasks=merged_tasks(shapes),
    )


def same_submission(a: JobSubmitted, b: JobSubmitted) -> bool:
    """Whether ``b`` resubmits ``a`` unchanged (same job id, same spec)."""
    return a.job_id == b.job_id and submission_spec(a) == submission_spec(b)


def spec_differences(old: SubmissionSpec, new: SubmissionSpec) -> list[str]:
    """The fields in which ``new`` differs from ``old``, as ``field: old -> new`` (tasks shown as
    their runs), for an error message that says what changed."""
    out = [
        f"{name}: {before!r} -> {after!r}"
        for name, before, after in zip(SubmissionSpec._fields[:-1], old[:-1], new[:-1], strict=True)
        if before != after
    ]
    if old.tasks != new.tasks:
        out.append(f"tasks: {_tasks_text(old.tasks)} -> {_tasks_text(new.tasks)}")
    return out


def _tasks_text(tasks: tuple[TaskShape, ...]) -> str:
    return ", ".join(
        f"{t.copies}x(cpu_milli={t.cpu_milli}, mem_mib={t.mem_mib}, gpu_count={t.gpu_count}, "
        f"gpu_milli={t.gpu_milli}{', gpu_models=' + '/'.join(t.gpu_models) if t.gpu_models else ''}"
        f"{', constraints=' + repr(t.constraints) if t.constraints != NO_CONSTRAINTS else ''})"
        for t in tasks
    )
