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
