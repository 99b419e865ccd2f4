"""Serial replay verification of one stretch of the log: fold the inputs, decide again at every
recorded ``as_of``, compare; the first batch that differs becomes a :class:`Divergence`.

:mod:`fleetlog.replay.verify` runs it over the whole log, :mod:`fleetlog.replay.parallel` over
stretches cut at snapshots; both import it, neither imports the other's caller.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any, Final

import msgspec

from fleetlog.core.decide import decide
from fleetlog.core.digest import digest
from fleetlog.core.fold_batch import fold_fast
from fleetlog.core.policy import UnknownPolicyError, batch_policy
from fleetlog.core.state import State
from fleetlog.events.model import Decision, DecisionBatch
from fleetlog.log.base import LogStore
from fleetlog.replay.diff import Difference, after, diff_states
from fleetlog.replay.engine import Start, fold_inputs
from fleetlog.replay.source import Input, InputReader, Progress, ReplayError, batches

SHOWN_INPUTS: Final = 20


class InputSeen(msgspec.Struct, frozen=True):
    offset: int
    timestamp_ms: int
    event: dict[str, Any]


class Divergence(msgspec.Struct, frozen=True):
    decisions_offset: int
    as_of: int
    what: str
    """``state digest`` or ``decision #i`` (the index in the batch)."""
    recorded: str
    replayed: str
    policy: str = ""
    previous_as_of: int = 0
    recorded_decision: dict[str, Any] | None = None
    replayed_decision: dict[str, Any] | None = None
    state_diff: tuple[Difference, ...] = ()
    """Rows that differ after folding the recorded batch vs the recomputed one."""
    inputs_since: tuple[InputSeen, ...] = ()
    """The last inputs folded since the previous batch (at most 20)."""
    inputs_since_count: int = 0


class VerifyReport(msgspec.Struct, frozen=True):
    batches: int
    decisions: int
    inputs: int
    final_digest: str
    divergence: Divergence | None = None

    @property
    def ok(self) -> bool:
        """Every recorded batch replayed bit-exactly (see :attr:`empty`: maybe none)."""
        return self.divergence is None

    @property
    def empty(self) -> bool:
        """No decision batch to check (no scheduler ran on the log, or not yet): ``fleetlog
        replay verify`` does not count that as a pass."""
        return self.batches == 0 and self.divergence is None


class _Recent:
    """Observer keeping the last inputs folded since the previous batch: the last chunks
    themselves (only a divergence reads them), enough of them to show ``SHOWN_INPUTS``."""

    def __init__(self) -> None:
        self.chunks: deque[Sequence[Input]] = deque()
        self.kept = 0  # inputs in ``chunks``
        self.count = 0  # inputs since the previous batch

    def inputs(self, state: State, events: Sequence[Input]) -> None:
        self.chunks.append(events)
        self.kept += len(events)
        self.count += len(events)
        while self.kept - len(self.chunks[0]) >= SHOWN_INPUTS:
            self.kept -= len(self.chunks.popleft())

    def decided(self, state: State, batch: DecisionBatch) -> None:
        self.chunks.clear()
        self.kept = self.count = 0

    def shown(self) -> tuple[InputSeen, ...]:
        recent = [i for chunk in self.chunks for i in chunk][-SHOWN_INPUTS:]
        return tuple(InputSeen(offset, at_ms, msgspec.to_builtins(event)) for offset, event, at_ms in recent)


class Stretch(msgspec.Struct, frozen=True):
    """What :func:`verify_stretch` found between two points of the log."""

    report: VerifyReport
    start_digest: str
    """The state's digest where the stretch began (a snapshot's, once restored)."""


async def verify_stretch(
    log_store: LogStore,
    start: Start,
    stop: tuple[int, int] | None,
    limit_batches: int | None = None,
    progress: Progress | None = None,
) -> Stretch:
    """Verify the batches from ``start`` on; with ``stop`` = (inputs offset, decisions offset)
    of a snapshot, only those before it, and then fold the inputs up to it, so that the final
    digest is the replayed state's at the snapshot."""
    state, recent = start.state, _Recent()
    reader = InputReader(log_store, start.inputs, state.config.cells)
    start_digest = digest(state)
    count = decisions = previous = 0
    until = None if stop is None else stop[1]
    async for record_offset, _, batch in batches(log_store, start.decisions, until):
        if limit_batches is not None and count >= limit_batches:
            break
        await fold_inputs(reader, state, batch.as_of, (recent,), progress)
        problem = _compare(state, batch, record_offset)
        if problem is not None:
            found = msgspec.structs.replace(
                problem, previous_as_of=previous, inputs_since=recent.shown(), inputs_since_count=recent.count
            )
            return Stretch(VerifyReport(count, decisions, reader.offset, digest(state), found), start_digest)
        fold_fast(state, batch, state.now_ms)
        recent.decided(state, batch)
        count, decisions, previous = count + 1, decisions + len(batch.decisions), batch.as_of
    if stop is not None:
        await fold_inputs(reader, state, stop[0], (), progress)
    return Stretch(VerifyReport(count, decisions, reader.offset, digest(state)), start_digest)


def _compare(state: State, batch: DecisionBatch, record_offset: int) -> Divergence | None:
    mine = digest(state)
    if mine != batch.digest:
        return Divergence(record_offset, batch.as_of, "state digest", batch.digest, mine, batch.policy)
    try:
        policy = batch_policy(batch.policy, batch.typical_pods)
    except UnknownPolicyError as exc:
        raise ReplayError(f"decisions@{record_offset} names a policy this build lacks: {exc}") from None
    replayed = tuple(decide(state, policy))
    if replayed == batch.decisions:
        return None
    index = next(
        (i for i, (a, b) in enumerate(zip(replayed, batch.decisions, strict=False)) if a != b),
        min(len(replayed), len(batch.decisions)),
    )
    want, got = _at(batch.decisions, index), _at(replayed, index)
    return Divergence(
        record_offset,
        batch.as_of,
        f"decision #{index}",
        repr(want) if want is not None else "(nothing)",
        repr(got) if got is not None else "(nothing)",
        batch.policy,
        recorded_decision=None if want is None else msgspec.to_builtins(want),
        replayed_decision=None if got is None else msgspec.to_builtins(got),
        state_diff=tuple(diff_states(after(state, batch.decisions), after(state, replayed))),
    )


def _at(decisions: tuple[Decision, ...], index: int) -> Decision | None:
    return decisions[index] if index < len(decisions) else None
