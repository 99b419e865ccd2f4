"""Replay verification: fold the inputs, decide again at every recorded ``as_of``, compare.

The first batch whose digest or decisions differ is reported with what differed, so an
incident responder sees at once where a run stopped being reproducible.
"""

from __future__ import annotations

import msgspec

from fleetlog.core.decide import decide
from fleetlog.core.digest import digest
from fleetlog.core.fold import fold, fold_many
from fleetlog.core.policy import policy_named
from fleetlog.core.state import CoreConfig, State
from fleetlog.events.model import DecisionBatch
from fleetlog.log.base import DECISIONS, LogStore
from fleetlog.log.consumer import EventConsumer, decision_batches


class Divergence(msgspec.Struct, frozen=True):
    decisions_offset: int
    as_of: int
    what: str
    recorded: str
    replayed: str


class VerifyReport(msgspec.Struct, frozen=True):
    batches: int
    decisions: int
    inputs: int
    final_digest: str
    divergence: Divergence | None = None

    @property
    def ok(self) -> bool:
        return self.divergence is None


async def verify(
    store: LogStore, core: CoreConfig | None = None, limit_batches: int | None = None
) -> VerifyReport:
    """Replay ``store``'s inputs against its decisions log; stop at the first divergence."""
    state, consumer, offset = State(core), EventConsumer(store), 0
    batches = decisions = 0
    log = store.log(DECISIONS)
    end, at = await log.end_offset(), 0
    while at < end and (limit_batches is None or batches < limit_batches):
        records = await log.read(at, 1000)
        if not records:
            break
        for record_offset, batch in decision_batches(records):
            offset = await _fold_until(consumer, state, offset, batch.as_of)
            problem = _compare(state, batch, record_offset)
            if problem is not None:
                return VerifyReport(batches, decisions, offset, digest(state), problem)
            fold(state, batch, state.now_ms)
            batches, decisions = batches + 1, decisions + len(batch.decisions)
        at = records[-1].offset + 1
    return VerifyReport(batches, decisions, offset, digest(state))


async def _fold_until(consumer: EventConsumer, state: State, offset: int, as_of: int) -> int:
    while offset < as_of:
        polled = await consumer.poll(offset, min(10_000, as_of - offset), park=False)
        if polled.next_offset == offset:
            break
        fold_many(state, ((d.envelope.event, d.timestamp_ms) for d in polled.events))
        offset = polled.next_offset
    return offset


def _compare(state: State, batch: DecisionBatch, record_offset: int) -> Divergence | None:
    mine = digest(state)
    if mine != batch.digest:
        return Divergence(record_offset, batch.as_of, "state digest", batch.digest, mine)
    replayed = tuple(decide(state, policy_named(batch.policy)))
    if replayed != batch.decisions:
        index = next(
            (i for i, (a, b) in enumerate(zip(replayed, batch.decisions, strict=False)) if a != b),
            min(len(replayed), len(batch.decisions)),
        )
        got = repr(replayed[index]) if index < len(replayed) else "(nothing)"
        want = repr(batch.decisions[index]) if index < len(batch.decisions) else "(nothing)"
        return Divergence(record_offset, batch.as_of, f"decision #{index}", want, got)
    return None
