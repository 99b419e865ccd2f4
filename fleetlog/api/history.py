"""``GET /v1/history``: the accounting records of finished jobs (``fleetlog history``), filtered
and paged.

The records come from a replay of the logs (:mod:`fleetlog.replay.history` folds them and its
docstring defines every field): the API, which never reads a log, only names their type, the
query the route takes and the page it answers, so the route table (and ``/v1/openapi.json``)
describes it.  ``fleetlog replay serve`` answers it; the live service does not (404
``not_served``: the history folds the whole log, and the service's loop must stay fast).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import msgspec

from fleetlog.api.resources import ApiError, Query, _single, check_params, one_of, paging
from fleetlog.api.visibility import EVERYTHING, Viewer, visible_records

ENDED: Final = ("succeeded", "failed", "cancelled", "rejected")
"""The end states a record can have (``fleetlog history --state``, ``GET /v1/history?state=``)."""
HISTORY_PARAMS: Final = ("tenant", "queue", "state", "since", "until", "limit", "page_token")


class Finished(msgspec.Struct, frozen=True):
    """One finished job's accounting record (:mod:`fleetlog.replay.history` defines the fields)."""

    job_id: str
    state: str
    tenant: str
    queue: str
    priority: int
    tasks: int
    cell: str | None
    submitted_at_ms: int
    placed_at_ms: int | None
    started_at_ms: int | None
    ended_at_ms: int
    wait_ms: int | None
    elapsed_ms: int | None
    exit_code: int | None
    end: str
    preemptions: int
    requeues: int
    gpu_hours: float
    cpu_hours: float
    partial: bool


class HistoryPage(msgspec.Struct, frozen=True):
    items: list[Finished]
    """In the order the jobs ended (``fleetlog history``'s order)."""
    total: int
    """How many records match the filters (all pages)."""
    next_page_token: str | None


@dataclass(frozen=True)
class HistoryQuery:
    """``GET /v1/history``'s query: the filters (``fleetlog history``'s flags) and the page."""

    tenants: frozenset[str]
    queues: frozenset[str]
    states: frozenset[str]
    since_ms: int | None
    until_ms: int | None
    start: int
    """The first record of the page (an index into every record the filters keep)."""
    limit: int


def history_query(query: Query, log_time_ms: Callable[[str], int]) -> HistoryQuery:
    """The query of ``GET /v1/history``; an :class:`ApiError` 400 naming the parameter at fault.
    ``log_time_ms`` parses ``since`` and ``until`` as ``fleetlog history --since`` does (a
    :class:`ValueError` with the reason for a text that is not a log time)."""
    check_params(query, HISTORY_PARAMS)
    states = one_of(query, "state", ENDED)
    start, limit = paging(query)
    since, until = (_log_time(query, name, log_time_ms) for name in ("since", "until"))
    return HistoryQuery(
        frozenset(query.get("tenant", ())),
        frozenset(query.get("queue", ())),
        frozenset(states),
        since,
        until,
        start,
        limit,
    )


def _log_time(query: Query, name: str, log_time_ms: Callable[[str], int]) -> int | None:
    text = _single(query, name)
    if text is None:
        return None
    try:
        return log_time_ms(text)
    except ValueError as exc:
        raise ApiError(400, "invalid_value", f"{name}={text!r}: {exc}", name) from None


def history_page(records: list[Finished], start: int, limit: int, viewer: Viewer = EVERYTHING) -> HistoryPage:
    """The page of ``records`` ``viewer`` may see (:mod:`fleetlog.api.visibility`: its tenants'
    records, unless it sees all) from index ``start``, at most ``limit``."""
    records = visible_records(records, viewer, lambda record: record.tenant)
    end = start + limit
    return HistoryPage(records[start:end], len(records), str(end) if end < len(records) else None)
