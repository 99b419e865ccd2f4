"""One warning line per producer and reason for the task reports the fold did not apply as written.

The fold records why (:mod:`fleetlog.core.observations`: a start or end of a job, task or node that
does not exist, a second report...) and the metric counts them
(``fleetlog_ignored_observations_total{reason}``); this names who sent them, which the state does
not keep: the producer id of the record's envelope. A broken node agent repeating one mistake
makes one line, not one per report; a second agent making it makes another. The pairs logged are
bounded (the oldest forgotten first, so a pair may be logged again after many others).
Only the live loop notes them (recovery and replay fold the same records silently), and only the
service writes the lines (:meth:`ObservationLog.flush`, after each step): ``fleetlog simulate``
and the other users of the loop print nothing.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Final

import structlog

from fleetlog.core.observations import Observation
from fleetlog.core.state import State
from fleetlog.events.codec import CONTENT_TYPE_HEADER, BadEventError, decode
from fleetlog.log.base import PRINCIPAL_HEADER, Record

log = structlog.get_logger("fleetlog.service")
MAX_PAIRS: Final = 4096
"""The most (producer, reason) pairs remembered as logged."""
MAX_WAITING: Final = 256
"""The most lines noted and not yet flushed (a loop nobody flushes keeps no more)."""
UNKNOWN: Final = "(unknown)"
"""The producer of a record whose envelope cannot be read again (never expected: it was folded)."""


class ObservationLog:
    """Remembers the (producer, reason) pairs already logged."""

    def __init__(self) -> None:
        self.pairs: dict[tuple[str, str], None] = {}
        self.waiting: list[tuple[Observation, str, str | None, str]] = []
        """Lines noted, not yet written: (observation, producer, principal, loop)."""

    def note(self, state: State, since_seq: int, first_offset: int, records: Sequence[Record],
             refused: Collection[int], loop: str) -> int:
        """Log the observations recorded after the ``since_seq``-th by a fold of ``records`` that
        began at state offset ``first_offset`` (``refused``: the indices the gate left out, which
        took no offset): a line for each first (producer, reason), written by :meth:`flush`; return
        how many were noted."""
        new = state.observations.latest(since_seq)
        folded = [i for i in range(len(records)) if i not in refused] if refused else range(len(records))
        lines = 0
        for seen in new:
            at = seen.inputs_offset - first_offset
            record = records[folded[at]] if 0 <= at < len(folded) else None
            producer, principal = _who(record)
            if self._first(producer, seen.reason) and len(self.waiting) < MAX_WAITING:
                self.waiting.append((seen, producer, principal, loop))
                lines += 1
        return lines

    def flush(self) -> None:
        """Write the lines noted (the service, after each step)."""
        waiting, self.waiting = self.waiting, []
        for line in waiting:
            _warn(*line)

    def _first(self, producer: str, reason: str) -> bool:
        pair = (producer, reason)
        if pair in self.pairs:
            return False
        self.pairs[pair] = None
        if len(self.pairs) > MAX_PAIRS:
            del self.pairs[next(iter(self.pairs))]
        return True


def _who(record: Record | None) -> tuple[str, str | None]:
    """The producer id of ``record``'s envelope, and its principal (``None``: it names none)."""
    if record is None:
        return UNKNOWN, None
    raw = record.header(PRINCIPAL_HEADER) if record.headers else None
    principal = None if raw is None else raw.decode("utf-8", "replace")
    try:
        env = decode(record.value, record.header(CONTENT_TYPE_HEADER) if record.headers else None)
    except (BadEventError, RecursionError):
        return UNKNOWN, principal
    return str(env.producer_id), principal


def _warn(seen: Observation, producer: str, principal: str | None, loop: str) -> None:
    log.warning(
        "ignored_observation", producer=producer, principal=principal, reason=seen.reason,
        event_type=seen.ignored, job_id=seen.job_id, task_index=seen.task_index, node=seen.node or None,
        inputs_offset=seen.inputs_offset, applied=seen.folded, loop=loop,
        note="logged once per producer and reason; each one is counted in "
             "fleetlog_ignored_observations_total and shown by fleetlog status of the job it names")
