"""Authorization of the HTTP API (issue 22): who may do what, as data, checked before the log.

The policy file (config ``[auth] policy_file``, ``FLEETLOG_AUTH_POLICY_FILE``) is TOML and maps
each principal (what its token names, :mod:`fleetlog.service.auth`) to roles::

    [[grant]]
    principal = "ci-team-a"
    roles = ["tenant:team-a", "tenant:team-a-batch"]
    max_priority = 100    # optional: the highest priority these tenants' jobs may have (issue 46)

    [[grant]]
    principal = "slurm-backend"
    roles = ["backend:cell-1"]

The roles:

- ``tenant:NAME``: submit jobs of tenant NAME, cancel them (and dry-run, read);
- ``node-agent:CELL`` and ``backend:CELL``: heartbeats and removals of the nodes of cell CELL, and
  the task observations (started, finished, failed) of jobs placed in that cell; ``backend:CELL``
  also submits jobs held to cell CELL (``allowed_cells``: the pod groups a Kubernetes cluster
  holds);
- ``quota-admin``: ``QuotaSet`` (``PUT /v1/quotas``, ``fleetlog quota set``);
- ``operator``: drain and undrain nodes, cancel any job, add and remove nodes;
- ``reader``: the reads only (lists, job details, the watch, dry runs, metrics; the policy itself,
  ``GET /v1/policy``, only ``policy-admin`` and ``operator`` read);
- ``policy-admin``: ``PolicySet`` (``fleetlog policy set``): the policy itself.

**The policy in the log.** A ``PolicySet`` event (appended through the API by a ``policy-admin``,
or by ``fleetlog policy set``) replaces the file's grants, whole, once the loop has folded it:
the log's newest ``PolicySet`` is the policy in force from then on, the file only until the
first.  So a policy change is replayable and audited (``fleetlog history --audit`` lists who
appended it), survives restarts in the snapshots, and is the same in every process that
folds the log.  A ``PolicySet`` that would leave no principal with ``policy-admin`` is refused
(nobody could change the policy again through the API).

Every role may read.  A principal the policy does not name may do nothing (403 on every route but
the health probes); every refusal names the rule that refused it.  A principal is what a token
names or a client certificate's CN.  With tokens (or client certificates) but no policy file,
every authenticated principal holds every role (the first slice's behaviour; the service says so at
start).  The file is kept as the tokens file is: refused when others may read or write it, re-read
when it changes; a rewrite that is refused (mode, owner, syntax) or a deleted file fails closed (no
principal holds a role from it until a good file is back; ``/healthz`` says why).

The checks read the state only to find the policy, the tenant of a job being cancelled and the
cell a job is placed in; they never change what is appended or what the core decides.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Final

import msgspec

from fleetlog.api.resources import PolicyList, policy_list
from fleetlog.core.authorize import NAMED_ROLES, NOT_THEIRS, PLAIN_ROLES, RULES, Roles, roles_by_principal
from fleetlog.core.state import State
from fleetlog.events.model import InputEvent, JobSubmitted, NodeHeartbeat, PolicyGrant, PolicySet
from fleetlog.service.auth import AuthError, WatchedFile
from fleetlog.service.config import AuthSettings
from fleetlog.service.http import Response, refusal


class Grant(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    principal: str
    roles: list[str]
    max_priority: Annotated[int, msgspec.Meta(ge=0, le=1_000_000)] | None = None
    """The highest priority the jobs of this grant's ``tenant:`` roles may have (issue 46)."""


class PolicyFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    grant: list[Grant] = []


EVERY_ROLE: Final = Roles(("every role (no auth.policy_file)",), quota_admin=True, operator=True,
                          policy_admin=True)
"""What an authenticated principal holds when no policy file is configured."""


class Forbidden(Exception):
    """A request the principal's roles do not allow: 403 with ``rule``."""

    def __init__(self, message: str, rule: str, index: int | None = None, action: str = "any") -> None:
        super().__init__(message)
        self.rule, self.index, self.action = rule, index, action
        """``action``: the event type refused, or ``any`` (a principal without roles): a metric label."""


def parse_policy(path: Path, data: bytes) -> dict[str, Roles]:
    """Roles by principal, or an :class:`AuthError` naming the file and the grant at fault."""
    return roles_by_principal(_grants(path, data))


def _grants(path: Path, data: bytes) -> list[Grant]:
    """The grants of a policy file, each role checked; an :class:`AuthError` names what is wrong."""
    try:
        grants = msgspec.convert(tomllib.loads(data.decode()), PolicyFile).grant
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, msgspec.ValidationError) as exc:
        raise AuthError(f"auth.policy_file {path}: {exc}") from None
    for i, grant in enumerate(grants):
        for role in grant.roles:
            kind, colon, name = role.partition(":")
            if not (kind in NAMED_ROLES and colon and name) and role not in PLAIN_ROLES:
                raise AuthError(f"auth.policy_file {path}: grant[{i}] ({grant.principal}): unknown role "
                                f"{role!r} (tenant:NAME, node-agent:CELL, backend:CELL, "
                                f"{', '.join(PLAIN_ROLES)})")
    return grants


def policy_set(path: Path, data: bytes) -> PolicySet:
    """A policy file's grants as a ``PolicySet`` (``fleetlog policy set``), not validated yet (the
    client's envelope check does it); an :class:`AuthError` names what is wrong, as for the file."""
    return PolicySet(grants=tuple(PolicyGrant(g.principal, tuple(g.roles), g.max_priority)
                                  for g in _grants(path, data)))


def leaves_no_admin(policy: PolicySet) -> bool:
    """Whether ``policy`` grants ``policy-admin`` to nobody: then nobody could change it again
    through the API (refused by :func:`check_events` and by ``fleetlog policy set``)."""
    return not any("policy-admin" in g.roles for g in policy.grants)


class Authorizer:
    """The policy in force: the log's newest ``PolicySet``, else the file's (re-read when it
    changes), else every role for everyone."""

    def __init__(self, path: str | None, monotonic: Callable[[], float] | None = None) -> None:
        self.file = None if path is None else WatchedFile(
            Path(path), "auth.policy_file", parse_policy, *(() if monotonic is None else (monotonic,)))
        self._folded: tuple[PolicySet | None, dict[str, Roles]] = (None, {})

    def roles(self, principal: str, logged: PolicySet | None = None) -> Roles | None:
        """``principal``'s roles under ``logged`` (the state's newest ``PolicySet``) or the file;
        ``None`` when the policy does not name it."""
        if logged is not None:
            if self._folded[0] is not logged:
                self._folded = (logged, roles_by_principal(logged.grants))
            return self._folded[1].get(principal)
        if self.file is None:
            return EVERY_ROLE
        grants = self.file.current()  # (None: the file is refused or missing: fail closed)
        return None if grants is None else grants.get(principal)

    def tenants(self, logged: PolicySet | None = None) -> frozenset[str]:
        """Every tenant a ``tenant:`` role of the policy in force names (none without a policy)."""
        if logged is not None:
            if self._folded[0] is not logged:
                self._folded = (logged, roles_by_principal(logged.grants))
            grants = self._folded[1]
        else:
            grants = (self.file.current() or {}) if self.file is not None else {}
        return frozenset().union(*(r.tenants for r in grants.values()))

    def file_policy(self) -> PolicyList | None:
        """The policy file's grants as ``GET /v1/policy`` answers them (``None``: no file)."""
        if self.file is None:
            return None
        grants = self.file.current() or {}
        return policy_list([(p, r.names) for p, r in grants.items()], "file",
                           ceilings={p: dict(r.ceilings) for p, r in grants.items()})


def authenticates(auth: AuthSettings) -> bool:
    """Whether ``[auth]`` authenticates anyone: bearer tokens or client certificates."""
    return auth.tokens_file is not None or auth.client_ca_file is not None


def warn_unpoliced(auth: AuthSettings, log: Any) -> None:
    """Log at start that authenticated principals may do everything, when that is so."""
    if authenticates(auth) and auth.policy_file is None:
        sources = " and ".join(k for k in ("tokens_file", "client_ca_file") if getattr(auth, k) is not None)
        log.warning("auth_without_policy", detail=f"[auth] {sources} without policy_file: every "
                    "authenticated principal may do everything (set [auth] policy_file to give roles)")


def refused_principal(principal: str) -> Forbidden:
    return Forbidden(f"principal {principal!r} has no roles in the policy in force (auth.policy_file, or the "
                     "log's newest PolicySet once there is one: fleetlog policy get)",
                     "a principal the policy does not name may do nothing")


def policy_reader(roles: Roles) -> Forbidden | None:
    """``GET /v1/policy`` shows who holds what: a ``policy-admin``'s or an ``operator``'s to read."""
    if roles.policy_admin or roles.operator:
        return None
    return Forbidden(f"may not read the policy (roles: {', '.join(roles.names) or 'none'})",
                     "policy-admin and operator read the policy (GET /v1/policy)", action="read_policy")


def may_send(principal: str, roles: Roles | None, route: str) -> Forbidden | None:
    """What the head of a request with a body already shows (issue 46): a principal the policy
    does not name, or one without ``quota-admin`` putting a quota (``route``: a route template),
    is refused before a byte of its body is read or a body slot is taken; the events themselves
    are checked by :func:`check_events` once the body is in (a principal with roles holds at most
    its share of the body slots meanwhile)."""
    if roles is None:
        return refused_principal(principal)
    names = ", ".join(roles.names) or "none"
    if route == "/v1/quotas/{tenant}" and not roles.quota_admin:
        return Forbidden(f"may not set quotas (roles: {names})", "quota-admin sets quotas", action="QuotaSet")
    return None


def forbidden(exc: Forbidden) -> Response:
    """The 403 answer: the message, the rule that refused, the event type (and index)."""
    extra: dict[str, object] = {"rule": exc.rule, "action": exc.action}
    if exc.index is not None:
        extra["index"] = exc.index
    return refusal(403, "forbidden", str(exc), extra=extra)


def check_events(roles: Roles, state: State, events: Sequence[InputEvent],
                 unfolded: Mapping[str, JobSubmitted] | None = None) -> None:
    """A :class:`Forbidden` for the first event ``roles`` may not append.  A job cancelled or
    observed is looked up in the batch itself, then among the submissions appended but not folded
    yet (``unfolded``), then in the state; one the service does not know passes here (ingest
    answers 404 for it)."""
    kinds = set(map(type, events))
    for index, event in enumerate(events) if PolicySet in kinds else ():
        if isinstance(event, PolicySet) and leaves_no_admin(event):
            raise Forbidden(f"event {index}: a PolicySet that grants policy-admin to nobody",
                            "a PolicySet grants policy-admin to at least one principal (else nobody could "
                            "change the policy again)", index, "PolicySet")
    if roles.operator and roles.quota_admin and roles.policy_admin:
        return
    batch = {e.job_id: e for e in events if isinstance(e, JobSubmitted)} if JobSubmitted in kinds else {}
    for index, event in enumerate(events):
        kind = type(event)
        if kind is NodeHeartbeat and (roles.operator or event.cell in roles.cells):  # type: ignore[union-attr]
            continue  # (a fleet's heartbeats: the rule of _node, without a call each)
        rule = RULES.get(kind)
        if rule is None:
            raise Forbidden(f"event {index}: a {kind.__name__} is not sent through the API",
                            NOT_THEIRS, index, kind.__name__)
        problem = rule(roles, state, event, batch, unfolded or {})
        if problem is not None:
            message, why = problem
            raise Forbidden(f"event {index}: {message} (roles: {', '.join(roles.names) or 'none'})", why,
                            index, kind.__name__)
