"""What a reader may see (issue 46): every read of the API shows a principal only the jobs it may
see, and a job's ``payload.env`` only to those who run it.

A job is seen by its tenant (``tenant:NAME``), by the ``backend:`` and ``node-agent:`` roles of
the cell it is placed in or held to (``allowed_cells``: they run it), and by ``operator`` and
``reader`` (the fleet's readers, as the policy says).  Other principals — another tenant, a
``quota-admin`` or ``policy-admin`` without a tenant role — see no job of that tenant: lists and
history leave it out (their ``total`` too), a job detail answers 404 as for a job that never
existed (so a job id's existence does not leak), and the watch leaves out its records.

``payload.env`` (where producers put what a job needs to run, too often an API key) is shown
only to the job's tenant and to a ``backend:`` of its cell: the values of everyone else's copy
are replaced by :data:`REDACTED` (the names stay: they say what the job expects, not what it
holds).  ``operator`` and ``reader`` see everything else.

Without ``[auth]`` (no principal) and with tokens but no policy file (every principal holds every
role) the viewer is :data:`EVERYTHING`: the API answers as it always did.  Nodes, queues, cells
and tenants are aggregates and show no job nor payload: every viewer sees them whole.

Pure functions of the roles, the state and the events: the live service, ``fleetlog replay
serve`` and the watch share them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, TypeVar

import msgspec
import numpy as np

from fleetlog.core.authorize import Roles
from fleetlog.core.state import State
from fleetlog.events.model import (
    Decision,
    DecisionBatch,
    Event,
    JobCancelled,
    JobDispatched,
    JobPlaced,
    JobReturned,
    JobSubmitted,
    PolicySet,
    TaskFailed,
    TaskFinished,
    TaskPreempted,
    TaskStarted,
)

if TYPE_CHECKING:
    from fleetlog.api.dryrun import DryRun, DryRunJob  # (which imports the lists, which import this)

R = TypeVar("R")

REDACTED: Final = "<redacted>"
"""What a ``payload.env`` value reads as to a viewer who may not see it."""


@dataclass(frozen=True)
class Viewer:
    """What one request may see (hashable: a watch can share frames among equal viewers)."""

    sees_all: bool
    """Every job (``operator``, ``reader``, or no policy in force)."""
    sees_env: bool = False
    """Every job's ``payload.env`` too (only when no policy is in force)."""
    tenants: frozenset[str] = frozenset()
    """Its ``tenant:`` roles: their jobs, env included."""
    cells: frozenset[str] = frozenset()
    """Its ``backend:`` and ``node-agent:`` roles: the jobs placed in or held to these cells."""
    env_cells: frozenset[str] = frozenset()
    """Its ``backend:`` roles alone: those jobs' env too (a backend runs what it is given)."""
    reads_policy: bool = False
    """``policy-admin`` or ``operator``: the ``PolicySet`` records of the watch (as ``GET /v1/policy``)."""


EVERYTHING: Final = Viewer(sees_all=True, sees_env=True, reads_policy=True)
"""No policy restricts the request: no ``[auth]``, or every principal holds every role."""


def viewer_for(roles: Roles | None) -> Viewer:
    """The viewer of a request whose principal holds ``roles``; ``None``: no policy restricts it
    (no ``[auth]``, or no policy file: the caller passes ``None`` for ``authz.EVERY_ROLE``)."""
    if roles is None:
        return EVERYTHING
    reads_all = roles.operator or "reader" in roles.names
    return Viewer(sees_all=reads_all, tenants=roles.tenants, cells=roles.cells, env_cells=roles.backend_cells,
                  reads_policy=roles.operator or roles.policy_admin)


def may_see(viewer: Viewer, tenant: str, cells: Iterable[str] = ()) -> bool:
    """Whether ``viewer`` may see a job of ``tenant`` placed in or held to ``cells``."""
    return viewer.sees_all or tenant in viewer.tenants or not viewer.cells.isdisjoint(cells)


def may_see_env(viewer: Viewer, tenant: str, cells: Iterable[str] = ()) -> bool:
    """Whether ``viewer`` may see the ``payload.env`` of a job of ``tenant`` placed in or held to
    ``cells``: its tenant, a backend of its cell, or no policy in force."""
    return viewer.sees_env or tenant in viewer.tenants or not viewer.env_cells.isdisjoint(cells)


# --- the state's jobs: lists, details, history -----------------------------------------------

JobWhere = tuple[str, tuple[str, ...]]
"""A job's tenant and the cells it is placed in (none while it waits)."""
JobLookup = Callable[[Collection[str]], Mapping[str, JobWhere]]
"""Where each of some job ids is, as the state knows them (an id it does not know is left out).
One call per event, for every job the event names: a lookup that must hop to the thread that
owns the state (the watch: :func:`on_owner`) hops once per event, not per job."""


def state_lookup(state: State) -> JobLookup:
    """:data:`JobLookup` over ``state`` (its current placements and submissions), to be called
    where ``state`` does not change meanwhile (its loop's thread).  Each column is read once for
    all the ids (a decision batch names up to 10,000 jobs: a few milliseconds)."""
    def lookup(job_ids: Collection[str]) -> dict[str, JobWhere]:
        ids = list(job_ids)
        if not ids or not state.jobs.size:
            return {}
        where = state.names["job"].ids
        rows = np.fromiter((where.get(job_id, -1) for job_id in ids), np.int64, len(ids))
        known = (rows >= 0) & (rows < state.jobs.size)
        rows = np.where(known, rows, 0)
        cols, tenants, cells = state.jobs.cols, state.names["tenant"].names, state.names["cell"].names
        tenant_ids, cell_ids = cols["tenant"][rows].tolist(), cols["cell"][rows].tolist()
        return {job_id: (tenants[t], (cells[c],) if c >= 0 else ())
                for job_id, ok, t, c in zip(ids, known.tolist(), tenant_ids, cell_ids, strict=True) if ok}
    return lookup


Found = Mapping[str, JobWhere]


def on_owner(lookup: Callable[[], JobLookup], call: Callable[[Callable[[], Found]], Found]) -> JobLookup:
    """A :data:`JobLookup` that runs ``lookup()`` (the current state's) through ``call`` — which
    runs a function on the thread that owns the state and returns its result (the service's event
    loop) — so a watch's worker thread never reads a state the loop is changing."""
    def hop(job_ids: Collection[str]) -> Found:
        if not job_ids:
            return {}
        wanted = tuple(job_ids)
        return call(lambda: lookup()(wanted))
    return hop


def view_of(viewer: Viewer, lookup: JobLookup) -> Callable[[Event], Event | None] | None:
    """What the watch applies to each event for ``viewer`` (``None``: it sees every event whole)."""
    if viewer.sees_env and viewer.reads_policy:
        return None
    return WatchView(viewer, lookup)


KEPT_TENANTS: Final = 10_000
"""Job ids whose tenant one watcher remembers (about 1 MB)."""


class WatchView:
    """One watcher's view: :func:`redact_event`, with the tenants of the jobs it has met kept
    (the newest :data:`KEPT_TENANTS`): a job's tenant never changes, so a tenant's watcher asks
    the state once per job, not once per record — and knows the jobs whose submissions it read
    before the scheduler folded them (a cancel read right after its submission is shown to its
    tenant).  Where a job is placed changes, so a viewer with cells still asks for the others."""

    def __init__(self, viewer: Viewer, lookup: JobLookup) -> None:
        self.viewer, self.lookup = viewer, lookup
        self.tenants: OrderedDict[str, str] = OrderedDict()

    def __call__(self, event: Event) -> Event | None:
        if isinstance(event, (JobSubmitted, JobDispatched)):
            job = event if isinstance(event, JobSubmitted) else event.job
            self._keep(job.job_id, job.tenant)
        return redact_event(event, self.viewer, self._lookup)

    def _lookup(self, job_ids: Collection[str]) -> Mapping[str, JobWhere]:
        found: dict[str, JobWhere] = {}
        asked = []
        for job_id in job_ids:
            tenant = self.tenants.get(job_id)
            if tenant is not None and (not self.viewer.cells or tenant in self.viewer.tenants):
                found[job_id] = (tenant, ())  # (its cells do not change what this viewer sees)
            else:
                asked.append(job_id)
        for job_id, where in self.lookup(asked).items() if asked else ():
            found[job_id] = where
            self._keep(job_id, where[0])
        return found

    def _keep(self, job_id: str, tenant: str) -> None:
        self.tenants[job_id] = tenant
        self.tenants.move_to_end(job_id)
        while len(self.tenants) > KEPT_TENANTS:
            self.tenants.popitem(last=False)


def job_tenant(state: State, row: int) -> str:
    return state.names["tenant"].names[int(state.jobs.cols["tenant"][row])]


def job_cells(state: State, row: int) -> tuple[str, ...]:
    """The cell job ``row`` is placed in (none while it waits)."""
    cell = int(state.jobs.cols["cell"][row])
    return (state.names["cell"].names[cell],) if cell >= 0 else ()


def job_mask(state: State, viewer: Viewer) -> np.ndarray | None:
    """Per job row, whether ``viewer`` sees it (``None``: every row, nothing to filter)."""
    if viewer.sees_all:
        return None
    n, cols = state.jobs.size, state.jobs.cols
    mask = np.isin(cols["tenant"][:n], _ids(state, "tenant", viewer.tenants))
    if viewer.cells:
        mask |= np.isin(cols["cell"][:n], _ids(state, "cell", viewer.cells))
    return mask


def sees_row(state: State, viewer: Viewer, row: int) -> bool:
    """Whether ``viewer`` sees job ``row`` (a job detail's check)."""
    return may_see(viewer, job_tenant(state, row), job_cells(state, row))


def _ids(state: State, table: str, names: Iterable[str]) -> list[int]:
    found = (state.names[table].get(name) for name in sorted(names))
    return [i for i in found if i >= 0]


def visible_records(records: Iterable[R], viewer: Viewer, tenant_of: Callable[[R], str]) -> list[R]:
    """The records (e.g. history's) of jobs ``viewer`` sees, in order: by tenant alone (an ended
    job is held to no cell any more; its backend reads the logs)."""
    if viewer.sees_all:
        return list(records)
    return [r for r in records if tenant_of(r) in viewer.tenants]


# --- the watch: one event at a time ----------------------------------------------------------


def redact_event(event: Event, viewer: Viewer, lookup: JobLookup) -> Event | None:
    """``event`` as ``viewer`` may see it in ``GET /v1/watch``: ``None`` to leave it out (another
    tenant's job's record, a ``PolicySet`` to one who may not read the policy), a decision batch
    with only the decisions of jobs it sees, a submission with ``payload.env`` redacted unless it
    may see it.  ``lookup`` names the tenant and cell of the jobs the event names by id alone (a
    job it does not know is not shown to a viewer who does not see all); it is called at most
    once, and only when the answer depends on it (never for ``operator`` and ``reader``)."""
    if viewer.sees_env and viewer.reads_policy:
        return event
    if isinstance(event, JobSubmitted):
        return redact_submission(event, viewer, lookup)
    if isinstance(event, JobDispatched):
        job = redact_submission(event.job, viewer, lookup)
        return None if job is None else msgspec.structs.replace(event, job=job)
    if isinstance(event, DecisionBatch):
        return _decisions(event, viewer, lookup)
    if isinstance(event, PolicySet):
        return event if viewer.reads_policy else None
    if isinstance(event, (JobCancelled, JobReturned, TaskStarted, TaskFinished, TaskFailed)):
        seen = viewer.sees_all or ((viewer.tenants or viewer.cells) and _seen(viewer, lookup([event.job_id]),
                                                                               event.job_id))
        return event if seen else None
    return event  # (nodes, quotas, cell summaries: aggregates, no job's)


def redact_submission(job: JobSubmitted, viewer: Viewer, lookup: JobLookup) -> JobSubmitted | None:
    """``job`` as ``viewer`` may see it: ``None`` if it may not see the job, else with the values
    of ``payload.env`` replaced by :data:`REDACTED` unless it may see them.  Where the job is
    placed is looked up only for a viewer with cells, which the job is not held to."""
    cells: tuple[str, ...] = job.allowed_cells
    mine = job.tenant in viewer.tenants or not viewer.cells.isdisjoint(cells)
    if not mine and viewer.cells:
        found = lookup([job.job_id]).get(job.job_id)
        cells += found[1] if found is not None else ()
    if not may_see(viewer, job.tenant, cells):
        return None
    if job.payload is None or not job.payload.env or may_see_env(viewer, job.tenant, cells):
        return job
    return msgspec.structs.replace(job, payload=msgspec.structs.replace(
        job.payload, env=dict.fromkeys(job.payload.env, REDACTED)))


def _seen(viewer: Viewer, found: Mapping[str, JobWhere], job_id: str) -> bool:
    where = found.get(job_id)
    return viewer.sees_all or (where is not None and may_see(viewer, *where))


def _decisions(batch: DecisionBatch, viewer: Viewer, lookup: JobLookup) -> DecisionBatch:
    """The batch with only the decisions of jobs ``viewer`` sees (a placement into one of its
    cells included); a preemption of its job by one it does not see names no preemptor."""
    if viewer.sees_all:
        return batch
    ids = {d.job_id for d in batch.decisions} | {d.by_job_id for d in batch.decisions
                                                 if isinstance(d, TaskPreempted)}
    found = lookup(sorted(ids)) if viewer.tenants or viewer.cells else {}
    kept: list[Decision] = []
    for decision in batch.decisions:
        placed_here = isinstance(decision, JobPlaced) and decision.cell in viewer.cells
        if not (placed_here or _seen(viewer, found, decision.job_id)):
            continue
        if isinstance(decision, TaskPreempted) and not _seen(viewer, found, decision.by_job_id):
            kept.append(msgspec.structs.replace(decision, by_job_id="", message=""))
        else:
            kept.append(decision)
    if kept == list(batch.decisions):
        return batch
    return msgspec.structs.replace(batch, decisions=tuple(kept))


# --- dry runs --------------------------------------------------------------------------------

HIDDEN_JOB: Final = "<another tenant's job>"
"""What a dry run lists, in ``preempts``, for a job its reader may not see."""


def redact_dry_run(answer: DryRun, viewer: Viewer, lookup: JobLookup) -> DryRun:
    """``answer`` as ``viewer`` may read it: a job it would preempt that the viewer may not see is
    :data:`HIDDEN_JOB` (how many it would preempt stays: it is the viewer's job's cost); a job id
    the state holds for a job the viewer may not see is ``job_id_taken``, as when the tenants
    differ, without comparing the specs — else a dry run naming that job's tenant would tell its
    spec field by field (``already_exists`` lists the differences, ``duplicate`` confirms a guess)."""
    if viewer.sees_all:
        return answer
    known = {j.job_id for j in answer.items if j.reason in ("already_exists", "already_submitted")}
    ids = known | {p for j in answer.items for p in j.preempts}
    found = lookup(sorted(ids)) if ids else {}
    items = [_dry_run_job(job, viewer, found) for job in answer.items]
    return answer if items == answer.items else msgspec.structs.replace(answer, items=items)


def _dry_run_job(job: DryRunJob, viewer: Viewer, found: Mapping[str, JobWhere]) -> DryRunJob:
    if job.reason in ("already_exists", "already_submitted") and job.job_id in found \
            and not _seen(viewer, found, job.job_id):
        return msgspec.structs.replace(
            job, outcome="refused", reason="job_id_taken",
            message=f"job id {job.job_id!r} is taken by another tenant's job; job ids are global: choose "
                    "ids under your tenant's prefix (TENANT/NAME, docs/api.md)")
    if all(_seen(viewer, found, p) for p in job.preempts):
        return job
    return msgspec.structs.replace(job, preempts=[p if _seen(viewer, found, p) else HIDDEN_JOB
                                                  for p in job.preempts])
