"""Scheduling policies: one frozen struct, selectable by name."""

from __future__ import annotations

from typing import Final, Literal

import msgspec

Scoring = Literal["best-fit", "fgd"]


class Policy(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Everything ``decide`` may vary. Recorded by name in every decision batch."""

    name: str = "default"
    scoring: Scoring = "fgd"
    """How a node is chosen among those that fit: least free left (best-fit) or least
    fragmentation added, measured against the recent task-shape distribution (fgd)."""
    preemption: bool = True
    """A higher priority may preempt lower ones."""
    reclaim: bool = True
    """A tenant under its nominal quota may preempt borrowers in its cohort."""
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
    "fgd": Policy(name="fgd", scoring="fgd"),
    "best-fit": Policy(name="best-fit", scoring="best-fit"),
}


class UnknownPolicyError(KeyError):
    """No policy of that name."""


def policy_named(name: str, **overrides: object) -> Policy:
    """The built-in policy ``name`` with ``overrides`` applied."""
    try:
        base = POLICIES[name]
    except KeyError:
        raise UnknownPolicyError(f"unknown policy {name!r}; choose one of {', '.join(sorted(POLICIES))}") from None
    return msgspec.structs.replace(base, **overrides) if overrides else base
