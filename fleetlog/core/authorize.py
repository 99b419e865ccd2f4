"""Who may append what (issue 22): the roles, the rules, and the fold's gate.

The rules are one piece of code for both places that apply them: the HTTP API refuses a
request before the log (``fleetlog.service.authz``), and the fold refuses a record that reached
the log carrying a principal its policy does not allow (:func:`fold_checked`) — a record a
producer wrote to the inputs topic directly, past the API, naming itself in the
``fleetlog-principal`` header.

The gate reads the log alone: the policy is the state's newest ``PolicySet`` (never the
service's policy file, which replay does not have), and each record is checked against the
state exactly as it is when the record would be folded — the submissions, cancellations and
placements before it included — so a record is refused or folded alike however the log is
cut into reads, live and in replay.  A record without a principal is not checked: it was
written by the service itself or by a writer the broker's ACLs trust with the whole topic.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple, Protocol

from fleetlog.core.state import State
from fleetlog.events.model import (
    Event,
    JobCancelled,
    JobSubmitted,
    NodeDrained,
    NodeHeartbeat,
    NodeRemoved,
    PolicySet,
    QuotaSet,
    TaskFailed,
    TaskFinished,
    TaskStarted,
)

NAMED_ROLES: Final = ("tenant", "node-agent", "backend")
"""Roles that take a name: ``KIND:NAME``."""
PLAIN_ROLES: Final = ("quota-admin", "operator", "reader", "policy-admin")


@dataclass(frozen=True)
class Roles:
    """What one principal holds."""

    names: tuple[str, ...]
    """As the policy wrote them, sorted (for messages)."""
    tenants: frozenset[str] = frozenset()
    cells: frozenset[str] = frozenset()
    """Of its ``node-agent:`` and ``backend:`` roles."""
    quota_admin: bool = False
    operator: bool = False
    backend_cells: frozenset[str] = frozenset()
    """Of its ``backend:`` roles alone."""
    policy_admin: bool = False
    ceilings: tuple[tuple[str, int], ...] = ()
    """(tenant, the highest priority its jobs may have), sorted: tenants whose every grant to
    this principal sets ``max_priority`` (the highest of them); the others' are unbounded."""

    @staticmethod
    def of(names: Sequence[str], ceilings: Mapping[str, int] | None = None) -> Roles:
        kinds = [name.partition(":") for name in names]
        return Roles(tuple(sorted(set(names))),
                     frozenset(n for k, _, n in kinds if k == "tenant"),
                     frozenset(n for k, _, n in kinds if k in ("node-agent", "backend")),
                     "quota-admin" in names, "operator" in names,
                     frozenset(n for k, _, n in kinds if k == "backend"), "policy-admin" in names,
                     tuple(sorted((ceilings or {}).items())))

    def ceiling(self, tenant: str) -> int | None:
        """The highest priority ``tenant``'s jobs may have from this principal (``None``: any)."""
        return next((top for name, top in self.ceilings if name == tenant), None)


class GrantLike(Protocol):
    @property
    def principal(self) -> str: ...
    @property
    def roles(self) -> Sequence[str]: ...


def roles_by_principal(grants: Sequence[GrantLike]) -> dict[str, Roles]:
    """Each principal's roles (a principal granted twice holds both grants' roles, and of a
    tenant granted twice, the higher priority ceiling: none if either grant sets none)."""
    found: dict[str, list[str]] = {}
    tops: dict[str, dict[str, int | None]] = {}
    for grant in grants:
        found.setdefault(grant.principal, []).extend(grant.roles)
        top: int | None = getattr(grant, "max_priority", None)
        mine = tops.setdefault(grant.principal, {})
        for tenant in (r.partition(":")[2] for r in grant.roles if r.startswith("tenant:")):
            before = mine.get(tenant, top)
            mine[tenant] = None if before is None or top is None else max(before, top)
    return {principal: Roles.of(roles, {t: c for t, c in tops[principal].items() if c is not None})
            for principal, roles in found.items()}


Problem = tuple[str, str] | None
"""What is wrong and the rule, or ``None``: allowed."""


def _submit(roles: Roles, state: State, e: JobSubmitted, batch: object, unfolded: object) -> Problem:
    if roles.operator:
        return None
    if e.tenant in roles.tenants:
        top = roles.ceiling(e.tenant)
        if top is None or e.priority <= top:
            return None
        return (f"may not submit job {e.job_id!r} of tenant {e.tenant!r} at priority {e.priority} "
                f"(its grant's max_priority is {top})", PRIORITY_RULE)
    if e.allowed_cells and roles.backend_cells.issuperset(e.allowed_cells):
        return None  # a backend reports the jobs its cluster holds (a Kubernetes pod group)
    return (f"may not submit job {e.job_id!r} for tenant {e.tenant!r}",
            "tenant:NAME submits the jobs of tenant NAME; backend:CELL those held to cell CELL")


def _cancel(roles: Roles, state: State, e: JobCancelled, batch: Mapping[str, JobSubmitted],
            unfolded: Mapping[str, JobSubmitted]) -> Problem:
    if roles.operator:
        return None
    tenant = job_tenant(state, e.job_id, batch, unfolded)
    if tenant is None or tenant in roles.tenants:
        return None
    return (f"may not cancel job {e.job_id!r} of tenant {tenant!r}",
            "tenant:NAME cancels the jobs of tenant NAME; operator cancels any")


def _node(roles: Roles, state: State, e: NodeHeartbeat | NodeRemoved, batch: object,
          unfolded: object) -> Problem:
    if roles.operator or e.cell in roles.cells:
        return None
    return (f"may not report node {e.node!r} of cell {e.cell!r}",
            "node-agent:CELL and backend:CELL report the nodes of cell CELL; operator adds and removes nodes")


def _drain(roles: Roles, state: State, e: NodeDrained, batch: object, unfolded: object) -> Problem:
    if roles.operator:
        return None
    return (f"may not drain node {e.node!r} of cell {e.cell!r}", "operator drains and undrains nodes")


def _quota(roles: Roles, state: State, e: QuotaSet, batch: object, unfolded: object) -> Problem:
    if roles.quota_admin:
        return None
    return (f"may not set the quota of tenant {e.tenant!r}", "quota-admin sets quotas")


def _policy(roles: Roles, state: State, e: PolicySet, batch: object, unfolded: object) -> Problem:
    if roles.policy_admin:
        return None
    return "may not change the policy", "policy-admin sets the policy (PolicySet)"


def _task(roles: Roles, state: State, e: TaskStarted | TaskFinished | TaskFailed, batch: object,
          unfolded: object) -> Problem:
    if roles.operator:
        return None
    cell = job_cell(state, e.job_id)
    if cell is not None and cell in roles.cells:
        return None
    where = f"placed in cell {cell!r}" if cell is not None else "not placed"
    return (f"may not report a task of job {e.job_id!r} ({where})",
            "node-agent:CELL and backend:CELL report the tasks of jobs placed in cell CELL")


RULES: Final[dict[type, Callable[..., Problem]]] = {
    JobSubmitted: _submit, JobCancelled: _cancel, NodeHeartbeat: _node, NodeRemoved: _node,
    NodeDrained: _drain, QuotaSet: _quota, TaskStarted: _task, TaskFinished: _task, TaskFailed: _task,
    PolicySet: _policy,
}
"""The rule of each event type a principal may append; any other type is the service's own."""
STATEFUL: Final = frozenset({JobCancelled, TaskStarted, TaskFinished, TaskFailed})
"""The types whose rule reads the state (a job's tenant, the cell it is placed in): checked only
once every record before them is folded.  The others' rules read the roles alone."""
NOT_THEIRS: Final = "only the service's own parts append it"
PRIORITY_RULE: Final = "a grant's max_priority bounds the priority of the jobs its tenant:NAME roles submit"
UNNAMED: Final = "a principal the policy does not name may do nothing"


def job_tenant(state: State, job_id: str, batch: Mapping[str, JobSubmitted],
               unfolded: Mapping[str, JobSubmitted]) -> str | None:
    """The tenant of ``job_id``: submitted in this batch, appended but not folded, or in the state."""
    submitted = batch.get(job_id) or unfolded.get(job_id)
    if submitted is not None:
        return submitted.tenant
    row = state.job_row(job_id)
    if row < 0:
        return None
    return state.names["tenant"].names[int(state.jobs.cols["tenant"][row])]


def job_cell(state: State, job_id: str) -> str | None:
    """The cell ``job_id`` is placed in, or ``None`` (unknown, pending or ended)."""
    row = state.job_row(job_id)
    if row < 0:
        return None
    cell = int(state.jobs.cols["cell"][row])
    return state.names["cell"].names[cell] if cell >= 0 else None


class Refused(NamedTuple):
    """A record the gate did not fold: its place in the run, what was wrong, the rule."""

    at: int
    message: str
    rule: str


def logged_roles(state: State, principal: str) -> Roles | None:
    """``principal``'s roles under the state's newest ``PolicySet`` (``None``: not named)."""
    policy = state.policy
    memo = state.derived.policy_roles
    if memo is None or memo[0] is not policy:
        memo = state.derived.policy_roles = (policy, roles_by_principal(policy.grants if policy else ()))
    return memo[1].get(principal)


def refusal(state: State, principal: str, event: Event) -> Problem:
    """Why the log's policy refuses ``event`` from ``principal`` at this point of the fold, or
    ``None``: allowed (always, before the log holds a ``PolicySet``)."""
    if state.policy is None:
        return None
    roles = logged_roles(state, principal)
    if roles is None:
        return (f"principal {principal!r} has no roles in the log's policy (its newest PolicySet)", UNNAMED)
    rule = RULES.get(type(event))
    if rule is None:
        return f"a {type(event).__name__} from principal {principal!r}", NOT_THEIRS
    problem = rule(roles, state, event, {}, {})
    if problem is None:
        return None
    return f"{problem[0]} (principal {principal!r}, roles: {', '.join(roles.names) or 'none'})", problem[1]


FoldRun = Callable[[State, list[Event], list[int]], None]


def fold_checked(state: State, events: Sequence[Event], times: Sequence[int],
                 principals: Callable[[], Sequence[str | None]], fold_run: FoldRun,
                 policy_sets: bool = True) -> list[Refused]:
    """Fold ``events`` with ``fold_run`` (``fold_lists``), leaving out each one whose principal
    the log's policy refuses at its place in the log; return those left out.

    Records without a principal, and every record before the log holds a ``PolicySet``, fold as
    they would without the gate.  Runs are cut before each ``PolicySet`` (the rules after it
    read the new policy) and before each record whose rule reads the state (a cancellation, a
    task report): that record is checked once everything before it is folded.  The other rules
    read the roles alone, so their records are checked where they lie and folded in runs.

    ``principals`` gives each event's principal (``None``: the record names none); it is asked
    only once the log holds a ``PolicySet`` or this run does.  ``policy_sets=False``: the reader
    knows ``events`` hold none (it decoded none), so they are not scanned for one."""
    unpoliced = state.policy is None and not (policy_sets and PolicySet in map(type, events))
    named = None if unpoliced else principals()
    if not named or not any(named):
        fold_run(state, events if isinstance(events, list) else list(events),
                 times if isinstance(times, list) else list(times))
        return []
    refused: list[Refused] = []
    run: list[Event] = []
    run_at: list[int] = []
    beats: dict[str, frozenset[str] | None] = {}  # (the cells each principal may report: below)
    for index, (event, at_ms, principal) in enumerate(zip(events, times, named, strict=True)):
        kind = type(event)
        if kind is NodeHeartbeat and principal is not None and state.policy is not None:
            cells = beats[principal] if principal in beats else beats.setdefault(
                principal, _beat_cells(state, principal))
            if cells is None or event.cell in cells:  # type: ignore[union-attr]  # (kind is NodeHeartbeat)
                run.append(event)
                run_at.append(at_ms)
                continue
        if kind is not PolicySet and (principal is None or kind not in STATEFUL):
            problem = refusal(state, principal, event) if principal is not None else None
            if problem is None:
                run.append(event)
                run_at.append(at_ms)
            else:
                refused.append(Refused(index, *problem))
            continue
        fold_run(state, run, run_at)  # (a cut: the state as it is at this record)
        run, run_at = [], []
        problem = refusal(state, principal, event) if principal is not None else None
        if problem is None:
            fold_run(state, [event], [at_ms])
            beats.clear()  # (a PolicySet: the cells allowed change)
        else:
            refused.append(Refused(index, *problem))
    fold_run(state, run, run_at)
    return refused


def _beat_cells(state: State, principal: str) -> frozenset[str] | None:
    """The cells whose heartbeats ``principal`` may send under the state's policy (``None``:
    any, an operator's), as :func:`_node` decides: ``fold_checked``'s shortcut for heartbeats."""
    roles = logged_roles(state, principal)
    if roles is None:
        return frozenset()
    return None if roles.operator else roles.cells
