"""``POST /v1/dry-run``: what submitting jobs would do now, without submitting them.

:func:`dry_run` folds the submissions into a copy of the state at the state's own log time and
runs one decide step with the policy the scheduler uses: the same code the loop runs, so the
answer is what the next step would decide if they were appended now (and nothing else arrived
first).  The given state is left untouched (the copy goes through the snapshot codec: it costs
about a snapshot of the state).  Each job's answer is ``placed`` (the cell, and the node and
GPU indices of each task), ``waits`` (the pending reason code and message, as
``GET /v1/jobs/ID`` would show them), ``rejected`` (the policy rejects what it cannot place),
``refused`` (ingest would refuse it: ``never_fits``, or ``already_exists`` for a job id the
state holds with another spec) or ``duplicate`` (the state holds that job with the same spec:
submitting it again appends nothing).

A request is bounded as ingest bounds one (:func:`parse_jobs`: jobs, tasks of all its jobs,
tasks of one job) and so is its answer: at most :data:`MAX_LISTED_TASKS` task placements and
:data:`MAX_LISTED_PREEMPTS` preempted jobs are listed in all, in the order of the jobs; a job
whose list was cut says how many it left out (``tasks_omitted``, ``preempts_omitted``), so a
request of the largest jobs answers in about a megabyte instead of hundreds.  The live service
runs it off its event loop (:mod:`fleetlog.service.dryruns`).
"""

from __future__ import annotations

from typing import Final

import msgspec

from fleetlog.api.errors import ApiError
from fleetlog.core.decide import decide
from fleetlog.core.digest import restore, snapshot
from fleetlog.core.fold import fold
from fleetlog.core.never_fits import Fleet, never_fits_submitted
from fleetlog.core.policy import Policy
from fleetlog.core.state import State
from fleetlog.core.views import as_folded, folded_spec, pending_reason
from fleetlog.events.codec import JSON, BadEventError, decode
from fleetlog.events.model import (
    SCHEMA_VERSION,
    JobPending,
    JobPlaced,
    JobRejected,
    JobSubmitted,
    TaskPreempted,
)
from fleetlog.events.spec import spec_differences, submission_spec

MAX_DRY_RUN_JOBS: Final = 1000
"""The most jobs one dry run answers for."""
MAX_LISTED_TASKS: Final = 10_000
"""Task placements listed in one answer, in all (past it a job lists none, and says so)."""
MAX_LISTED_PREEMPTS: Final = 10_000
"""Preempted jobs listed in one answer, in all."""
OUTCOMES: Final = ("placed", "waits", "rejected", "refused", "duplicate")
_PRODUCER: Final = "fleetlog-dry-run"
_RAW_LIST: Final = msgspec.json.Decoder(list[msgspec.Raw])
_RAW_MAP: Final = msgspec.json.Decoder(dict[str, msgspec.Raw])


class TaskWhere(msgspec.Struct, frozen=True):
    task_index: int
    node: str
    gpu_indices: list[int]
    """The GPUs of the node the task would get (empty: it asks for none)."""


class DryRunJob(msgspec.Struct, frozen=True):
    job_id: str
    outcome: str
    """``placed``, ``waits``, ``rejected``, ``refused`` or ``duplicate``."""
    reason: str
    """``""`` when placed; else the reason code (``docs/scheduling.md``; ``never_fits``,
    ``already_exists`` or ``already_submitted`` for ``refused`` and ``duplicate``)."""
    message: str
    cell: str = ""
    tasks: list[TaskWhere] = []
    preempts: list[str] = []
    """The jobs it would preempt to make room (their ids, sorted)."""
    tasks_omitted: int | msgspec.UnsetType = msgspec.UNSET
    """Present when ``tasks`` was cut (the answer lists at most ``MAX_LISTED_TASKS`` placements in
    all): how many of the job's placements it leaves out, the last ones."""
    preempts_omitted: int | msgspec.UnsetType = msgspec.UNSET
    """Present when ``preempts`` was cut (at most ``MAX_LISTED_PREEMPTS`` in all): how many."""


class DryRun(msgspec.Struct, frozen=True):
    at_ms: int
    """The log time of the state it was decided on (the jobs are folded at it)."""
    items: list[DryRunJob]
    """One per submitted job, in the order given."""


def parse_jobs(body: bytes, max_jobs: int = MAX_DRY_RUN_JOBS, max_tasks: int | None = None
               ) -> list[JobSubmitted]:
    """The jobs of a dry-run body: a JSON object or a JSON array of them, each an envelope (as
    ``POST /v1/events`` takes) or a bare ``JobSubmitted`` (its ``type`` may be left out).  A bad one
    is an :class:`ApiError` 400 naming it; more than ``max_jobs`` jobs, or more than ``max_tasks``
    tasks in all (ingest's ``max_request_tasks``), a 413 — found as the jobs are decoded, so a
    body of many large jobs is refused at the first job past the bound, not after all of them."""
    stripped = body.strip()
    if not stripped:
        raise ApiError(400, "undecodable", "the body is empty: give a JobSubmitted, an envelope or an array")
    try:
        parts = _RAW_LIST.decode(stripped) if stripped.startswith(b"[") else [msgspec.Raw(stripped)]
    except (msgspec.DecodeError, RecursionError) as exc:
        raise ApiError(400, "undecodable", f"body is not a JSON array of jobs: {exc}") from None
    if not parts:
        raise ApiError(400, "undecodable", "the body is an empty array: give at least one job")
    if len(parts) > max_jobs:
        raise ApiError(413, "too_many_events", f"{len(parts)} jobs; a dry run takes at most {max_jobs}")
    jobs, tasks = [], 0
    for index, part in enumerate(parts):
        job = _job(index, bytes(part))
        tasks += sum(group.count for group in job.task_groups)
        if max_tasks is not None and tasks > max_tasks:
            raise ApiError(413, "too_many_tasks", f"the jobs of this dry run have over {max_tasks} tasks "
                           f"(job {index} passes it; max_request_tasks, as for ingest): split it")
        jobs.append(job)
    return jobs


def _job(index: int, data: bytes) -> JobSubmitted:
    try:
        fields = _RAW_MAP.decode(data)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise ApiError(400, "undecodable", f"job {index}: not a JSON object: {exc}") from None
    if "event" not in fields:  # a bare event: wrapped as is (its own bytes, so repeated keys are seen)
        if "type" not in fields:
            data = b'{"type":"JobSubmitted",' + data.strip()[1:] if len(fields) else data
        data = b'{"schema_version":%d,"producer_id":"%s","event":%s}' % (
            SCHEMA_VERSION, _PRODUCER.encode(), data)
    try:
        event = decode(data, JSON).event
    except BadEventError as exc:
        raise ApiError(400, exc.reason, f"job {index}: {exc}") from None
    if not isinstance(event, JobSubmitted):
        raise ApiError(400, "invalid_event", f"job {index}: a {type(event).__name__}, not a JobSubmitted")
    return event


def dry_run(state: State, policy: Policy, jobs: list[JobSubmitted], owned: bool = False) -> DryRun:
    """What appending ``jobs`` now would do to each: ``state`` is not changed, unless ``owned`` (a
    copy the caller made for this dry run alone: it is folded into instead of copied again)."""
    answers: dict[int, DryRunJob] = {}
    new: list[tuple[int, JobSubmitted]] = []
    seen: dict[str, JobSubmitted] = {}
    fleet: Fleet | None = None
    for index, job in enumerate(jobs):
        known = _known(state, seen.get(job.job_id), job)
        if known is not None:
            answers[index] = known
            continue
        fleet = fleet or Fleet(state)
        why = never_fits_submitted(state, job, fleet)
        if why is not None:
            answers[index] = DryRunJob(job.job_id, "refused", "never_fits",
                                       f"job {job.job_id!r} can never fit on the current fleet: {why}")
            continue
        seen[job.job_id] = job
        new.append((index, job))
    at_ms = state.now_ms
    if new:
        answers |= _decided(state if owned else restore(snapshot(state)), policy, new)
    return DryRun(at_ms, _bounded([answers[i] for i in range(len(jobs))]))


def _bounded(items: list[DryRunJob]) -> list[DryRunJob]:
    """``items`` with at most :data:`MAX_LISTED_TASKS` placements and :data:`MAX_LISTED_PREEMPTS`
    preempted jobs listed in all, the jobs in order: the answer's size is bounded whatever the
    jobs' sizes (a cut list says how much it left out)."""
    tasks_left, preempts_left, out = MAX_LISTED_TASKS, MAX_LISTED_PREEMPTS, []
    for item in items:
        cut: dict[str, object] = {}
        if len(item.tasks) > tasks_left:
            cut |= {"tasks": item.tasks[:tasks_left], "tasks_omitted": len(item.tasks) - tasks_left}
        if len(item.preempts) > preempts_left:
            cut |= {"preempts": item.preempts[:preempts_left],
                    "preempts_omitted": len(item.preempts) - preempts_left}
        tasks_left -= min(tasks_left, len(item.tasks))
        preempts_left -= min(preempts_left, len(item.preempts))
        out.append(msgspec.structs.replace(item, **cut) if cut else item)
    return out


def _known(state: State, earlier: JobSubmitted | None, job: JobSubmitted) -> DryRunJob | None:
    """The answer for a job id the state (or this request, ``earlier``) holds already; ``None``
    for a new one."""
    if earlier is not None:
        before, after = submission_spec(earlier), submission_spec(job)
    elif job.job_id in state.retired:
        return DryRunJob(job.job_id, "duplicate", "already_submitted",
                         f"job {job.job_id!r} ended and retired: a resubmission appends nothing")
    elif state.job_row(job.job_id) < 0:
        return None
    else:
        folded = folded_spec(state, job.job_id)
        assert folded is not None
        before, after = folded, as_folded(state, submission_spec(job))
    if before == after:
        return DryRunJob(job.job_id, "duplicate", "already_submitted",
                         f"job {job.job_id!r} was submitted already with this spec: submitting it "
                         "appends nothing")
    if before.tenant != after.tenant:  # (another tenant's job: say nothing of it, as ingest)
        return DryRunJob(job.job_id, "refused", "job_id_taken",
                         f"job id {job.job_id!r} is taken by another tenant's job; job ids are global: "
                         "choose ids under your tenant's prefix (TENANT/NAME, docs/api.md)")
    changed = "; ".join(spec_differences(before, after))
    return DryRunJob(job.job_id, "refused", "already_exists",
                     f"job {job.job_id!r} already exists with another spec ({changed})")


def _decided(copy: State, policy: Policy, new: list[tuple[int, JobSubmitted]]) -> dict[int, DryRunJob]:
    """Fold ``new`` into ``copy`` (a copy of the state, changed here) at its log time, decide once,
    and read each job's fate."""
    for _, job in new:
        fold(copy, job, copy.now_ms)
    mine = {job.job_id for _, job in new}
    placed: dict[str, JobPlaced] = {}
    said: dict[str, tuple[str, str, str]] = {}  # job id -> (outcome, reason, message)
    preempts: dict[str, set[str]] = {}
    for decision in decide(copy, policy):
        if isinstance(decision, TaskPreempted) and decision.by_job_id in mine:
            preempts.setdefault(decision.by_job_id, set()).add(decision.job_id)
        elif decision.job_id not in mine:
            continue
        elif isinstance(decision, JobPlaced):
            placed[decision.job_id] = decision
        elif isinstance(decision, JobRejected):
            said[decision.job_id] = ("rejected", decision.reason, decision.message)
        elif isinstance(decision, JobPending):
            said[decision.job_id] = ("waits", decision.reason, decision.message)
    out = {}
    for index, job in new:
        victims = sorted(preempts.get(job.job_id, ()))
        where = placed.get(job.job_id)
        if where is not None:
            tasks = [TaskWhere(t.task_index, t.node, list(t.gpu_indices)) for t in where.tasks]
            out[index] = DryRunJob(job.job_id, "placed", "", _placed_message(where), where.cell, tasks,
                                   victims)
            continue
        outcome, reason, message = said.get(job.job_id) or (
            "waits", *pending_reason(copy, copy.job_row(job.job_id)))
        out[index] = DryRunJob(job.job_id, outcome, reason, message, preempts=victims)
    return out


def _placed_message(where: JobPlaced, most: int = 8) -> str:
    shown = [f"{t.node} (GPUs {','.join(map(str, t.gpu_indices))})" if t.gpu_indices else t.node
             for t in where.tasks[:most]]
    more = len(where.tasks) - most
    return f"in cell {where.cell} on " + ", ".join(shown) + (f" and {more} more tasks" if more > 0 else "")
