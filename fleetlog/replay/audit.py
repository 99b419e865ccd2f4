"""``fleetlog history --audit``: who asked for what, when — one entry per input record, from the logs.

Each mutation an operator or a tenant makes (a submission, a cancel, a quota change, a drain, a node
removed) is one entry: the record's offset and append time, the principal that appended it, the
producer and its idempotency key, the event type and what it names (job, tenant, cell and node).
``every=True`` lists the backends' observations too (heartbeats, task reports).

The principal is the :data:`~fleetlog.log.base.PRINCIPAL_HEADER` the authenticated HTTP API set
(:mod:`fleetlog.service.ingest`): ``None`` for a record appended without authentication or
straight to the log (a backend, a producer on Kafka).  On Kafka that header is only as
trustworthy as the topic's write ACLs (docs/service.md, "Authorization"): the API overwrites
whatever a producer sent, a direct producer is not overwritten.  Requests the API refused never
reach the log: they are counted (``fleetlog_http_forbidden_total``) and logged by the service.
A record that does not decode is listed as ``undecodable`` with its principal.  A record the
scheduler parked instead of folding it — one whose principal the log's policy did not allow
(``unauthorized``), or that did not decode — says so in ``parked``: the reason and the error,
from the dead-letter log.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from fleetlog.events.codec import CONTENT_TYPE_HEADER, BadEventError, decode
from fleetlog.events.model import (
    JobCancelled,
    JobSubmitted,
    NodeDrained,
    NodeRemoved,
    PolicySet,
    QuotaSet,
    Tick,
)
from fleetlog.log.base import DEAD_LETTERS, INPUTS, PRINCIPAL_HEADER, LogStore, Record, chunks
from fleetlog.log.consumer import why_parked
from fleetlog.numerals import whole
from fleetlog.replay.source import Progress, Source, end_offset, read, start_offset
from fleetlog.replay.terminal import progress_bar

MUTATIONS: Final = (JobSubmitted, JobCancelled, QuotaSet, NodeDrained, NodeRemoved, PolicySet)
"""What operators and tenants change: listed by default."""
TICK: Final = Tick.__name__


class AuditEntry(msgspec.Struct, frozen=True):
    offset: int
    at_ms: int
    """The record's append time (the log's clock)."""
    principal: str | None
    producer_id: str | None
    key: str | None
    type: str
    """The event type, or ``undecodable``."""
    job_id: str | None = None
    tenant: str | None = None
    cell: str | None = None
    node: str | None = None
    detail: str | None = None
    """A drain's state and reason; a policy's grants; why a record did not decode."""
    parked: str | None = None
    """``REASON: ERROR`` when the scheduler parked the record in the dead-letter log instead of
    folding it (``unauthorized``: its principal may not make it), else ``None``."""


@dataclass(frozen=True)
class AuditFilters:
    principals: frozenset[str] = frozenset()
    types: frozenset[str] = frozenset()
    since_ms: int | None = None
    until_ms: int | None = None
    every: bool = False
    """The backends' observations too (heartbeats, task reports)."""

    def keep(self, entry: AuditEntry, mutation: bool) -> bool:
        """Whether ``entry`` is listed.  The scheduler's ticks (one every few seconds of an idle
        log: who did nothing when) only when asked for by type, ``--type Tick``."""
        listed = (TICK in self.types if entry.type == TICK
                  else self.every or mutation or entry.type == "undecodable")
        return (listed
                and (not self.principals or (entry.principal or "-") in self.principals)
                and (not self.types or entry.type in self.types)
                and (self.since_ms is None or entry.at_ms >= self.since_ms)
                and (self.until_ms is None or entry.at_ms < self.until_ms))


def entry(record: Record) -> tuple[AuditEntry, bool]:
    """The record's entry, and whether it is a mutation."""
    raw = record.header(PRINCIPAL_HEADER)
    principal = raw.decode(errors="replace") if raw is not None else None
    try:
        env = decode(record.value, record.header(CONTENT_TYPE_HEADER))
    except BadEventError as exc:
        return AuditEntry(record.offset, record.timestamp_ms, principal, None, None, "undecodable",
                          detail=str(exc)[:200]), False
    e: Any = env.event
    detail = None
    if isinstance(e, NodeDrained):
        detail = ("drained" if e.drained else "undrained") + (f": {e.reason}" if e.reason else "")
    elif isinstance(e, PolicySet):
        detail = policy_detail(e)
    found = AuditEntry(record.offset, record.timestamp_ms, principal, env.producer_id, env.key,
                       type(e).__name__, getattr(e, "job_id", None), getattr(e, "tenant", None),
                       getattr(e, "cell", None) or None, getattr(e, "node", None), detail)
    return found, isinstance(e, MUTATIONS)


def policy_detail(e: PolicySet) -> str:
    """What a ``PolicySet`` grants, in one line: ``principal=role,role; …`` (its first 200
    characters, then how many grants in all) and its reason."""
    text = "; ".join(f"{g.principal}={','.join(g.roles) or '-'}" for g in e.grants) or "no grants"
    if len(text) > 200:
        text = f"{text[:200]}… ({len(e.grants)} grants)"
    return text + (f" ({e.reason[:200]})" if e.reason else "")


async def audit(source: Source, emit: Callable[[AuditEntry], None], filters: AuditFilters,
                limit: int | None = None, progress: Progress | None = None) -> int:
    """Emit the entries ``filters`` keeps, in log order (at most ``limit``); how many."""
    store, count = source.store, 0
    parked = await parked_inputs(store)
    end, at = await end_offset(store, INPUTS), await start_offset(store, INPUTS)
    while at < end and (limit is None or count < limit):
        records = await read(store, INPUTS, at)
        if not records:
            break
        for record in records:
            found, mutation = entry(record)
            if record.offset in parked:
                found = msgspec.structs.replace(found, parked=parked[record.offset])
            if filters.keep(found, mutation) and (limit is None or count < limit):
                emit(found)
                count += 1
        at = records[-1].offset + 1
        if progress is not None:
            progress(len(records))
    return count


async def parked_inputs(store: LogStore) -> dict[int, str]:
    """``REASON: ERROR`` of each inputs offset the dead-letter log holds a copy of (its
    ``source`` header names it: ``inputs@N``)."""
    found: dict[int, str] = {}
    async for records in chunks(store.log(DEAD_LETTERS)):
        for record in records:
            source, reason, error = why_parked(record)
            where, _, offset = source.rpartition("@")
            at = whole(offset)
            if where == INPUTS and at is not None:
                found[at] = f"{reason}: {error[:300]}"
    return found


async def command(args: Any, source: Source) -> int:
    """The ``history --audit`` replay handler: filters (``args.audit_filters``) and where each
    entry goes (``args.history_emit``) come from the CLI, as for ``history``."""
    total = await end_offset(source.store, INPUTS)
    bar = progress_bar("audit", total) if args.history_progress else contextlib.nullcontext(None)
    with bar as tick:
        await audit(source, args.history_emit, args.audit_filters, args.limit, tick)
    return 0
