"""Scheduling policies: one frozen struct, selectable by name."""

from __future__ import annotations

from typing import Annotated, Final, Literal

import msgspec

from fleetlog.events.model import MAX_TYPICAL_PODS, TypicalPod

Scoring = Literal["best-fit", "fgd", "fgd-published"]


class Policy(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Everything ``decide`` may vary. Recorded by name in every decision batch."""

    name: str = "default"
    scoring: Scoring = "fgd"
    """How a node is chosen among those that fit: least free left (best-fit) or least
    fragmentation added, measured against the recent task-shape distribution (fgd), or the
    published FGD rule (fgd-published: Weng et al., ATC'23, as the authors' simulator scores,
    against ``typical_pods``; see docs/scheduling.md)."""
    typical_pods: tuple[tuple[int, int, int, int], ...] = ()
    """fgd-published: the workload's typical pods, (gpus, milli, cpu, count) rows
    (:func:`fleetlog.core.typical.typical_pods`), fixed for the run; empty: the recent window's
    shape mix cut at the same popularity threshold."""
    tie_seed: Annotated[int, msgspec.Meta(ge=0, lt=1 << 62)] = 0
    """fgd-published: equal scores go to the node of the least pseudo-random key drawn from its
    index and this seed (the scheduler framework draws one at random); replayable."""
    preemption: bool = True
    """A higher priority may preempt lower ones."""
    reclaim: bool = True
    """A tenant under its nominal quota may preempt borrowers in its cohort."""
    priority_within_tenant: bool = False
    """Priority preempts only the same tenant's lower jobs; another tenant's running job is
    evicted only by reclaim (its tenant uses more than its nominal quota, the preemptor's less),
    as Kueue does: a tenant inside its guarantee is never preempted by another tenant's
    priority (issue 46). The service turns it on (:func:`service_policy`); a bare policy name
    leaves it off, as every log recorded before 2026-12-07 decided, so they replay unchanged."""
    thrash_window_ms: int = 300_000
    """A job preempted for a cause is not preempted again for the same cause within this window."""
    max_victims: int = 64
    """The most running jobs one preemption considers."""
    reserve: bool = True
    """A blocked gang at the head of a priority class reserves the domain it fits best in."""
    max_reservations: int = 1
    fail_unplaced: bool = False
    """Reject every job that cannot be placed right now (the FGD paper's inflate protocol)."""
    require_quota: bool = False
    """Tenants without a QuotaSet get nothing (otherwise they are unlimited)."""


POLICIES: Final = {
    "default": Policy(),
    "fgd": Policy(name="fgd", scoring="fgd-published"),
    "best-fit": Policy(name="best-fit", scoring="best-fit"),
}


class UnknownPolicyError(KeyError):
    """No policy of that name, or an override that does not apply."""

    def __str__(self) -> str:
        return str(self.args[0])


def policy_named(spec: str, **overrides: object) -> Policy:
    """The policy a spec names: a built-in name, optionally with overrides after ``?``, e.g.
    ``fgd?fail_unplaced=true&thrash_window_ms=0``.  The returned policy's ``name`` is its full
    spec, so a decision batch names exactly the policy that made it."""
    base_name, _, query = spec.partition("?")
    try:
        base = POLICIES[base_name]
    except KeyError:
        raise UnknownPolicyError(
            f"unknown policy {base_name!r}; choose one of {', '.join(sorted(POLICIES))}"
        ) from None
    fields = dict(_parse_query(query)) | {k: _text(v) for k, v in overrides.items()}
    if not fields:
        return base
    raw = msgspec.to_builtins(base) | {
        k: msgspec.json.decode(v) if k != "name" else v for k, v in fields.items()
    }
    raw["name"] = base_name + "?" + "&".join(f"{k}={fields[k]}" for k in sorted(fields))
    try:
        return msgspec.convert(raw, Policy)
    except msgspec.ValidationError as exc:
        raise UnknownPolicyError(f"policy {spec!r}: {exc}") from None


GUARDED: Final = {"priority_within_tenant": True}
"""What the service adds to its policy spec unless the spec sets it (:func:`service_policy`)."""


def service_policy(spec: str) -> Policy:
    """The policy the service decides with: ``spec`` with :data:`GUARDED` wherever the spec does
    not set those fields itself. The additions are part of the policy's name, so each decision
    batch records them and replay rebuilds the same policy from the log alone."""
    _, _, query = spec.partition("?")
    named = {key for key, _ in _parse_query(query)}
    return policy_named(spec, **{k: v for k, v in GUARDED.items() if k not in named})


def batch_policy(name: str, typical_pods: tuple[tuple[int, int, int, int], ...] = ()) -> Policy:
    """The policy a decision batch records: its name (a spec) and its typical pods, which the
    name leaves out (``DecisionBatch.typical_pods``)."""
    policy = policy_named(name)
    return with_typical_pods(policy, typical_pods) if typical_pods else policy


def with_typical_pods(policy: Policy, typical_pods: tuple[tuple[int, int, int, int], ...]) -> Policy:
    """``policy`` scoring against ``typical_pods``, under the same name (decision batches carry
    the typical pods beside the name, so they must be what a batch may hold: else
    :class:`UnknownPolicyError`)."""
    try:
        rows = msgspec.convert(list(typical_pods), tuple[TypicalPod, ...])
    except msgspec.ValidationError as exc:
        raise UnknownPolicyError(f"typical pods: {exc}") from None
    if len(rows) > MAX_TYPICAL_PODS:
        raise UnknownPolicyError(f"typical pods: {len(rows)}, more than {MAX_TYPICAL_PODS}")
    return msgspec.structs.replace(policy, typical_pods=rows)


def _text(value: object) -> str:
    return msgspec.json.encode(value).decode()


def _parse_query(query: str) -> list[tuple[str, str]]:
    out = []
    for part in filter(None, query.split("&")):
        key, eq, value = part.partition("=")
        if not eq or key not in Policy.__struct_fields__ or key == "name":
            raise UnknownPolicyError(f"policy override {part!r} is not field=value of a Policy field")
        try:
            msgspec.json.decode(value)
        except msgspec.DecodeError:
            value = _text(value)  # a bare word: a string
        out.append((key, value))
    return out
