"""What the soak test checks, read from the logs the service and its producers left behind.

The reference is the fold itself, one event at a time (``fold`` per input, each decision batch
folded after the inputs before its ``as_of``, as :meth:`SchedulerLoop.recover` orders them): no
batching, no chunking, no snapshot.  Every property is collected as a violation (with where it
happened), so one run names every promise it saw broken, not just the first.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from fleetlog.core.digest import digest
from fleetlog.core.fold import fold
from fleetlog.core.state import CoreConfig, JobState, State
from fleetlog.events.model import (
    DecisionBatch,
    JobPending,
    JobPlaced,
    JobRejected,
    JobSubmitted,
    NodeHeartbeat,
    TaskPreempted,
)
from fleetlog.log.base import DECISIONS, INPUTS, LogStore, Record
from fleetlog.log.consumer import Delivered, EventConsumer, decision_batches

SHOWN = 5
"""How many examples a violation lists."""


async def read_all(store: LogStore, name: str) -> list[Record]:
    log, out, at = store.log(name), [], 0
    end = await log.end_offset()
    while at < end:
        records = await log.read(at, 10_000)
        if not records:
            break
        out.extend(records)
        at = records[-1].offset + 1
    return out


@dataclass
class Logs:
    """The decoded logs: inputs (with offsets and append times) and decision batches."""

    inputs: list[Delivered]
    undecodable: int
    batches: list[tuple[int, DecisionBatch]]

    @classmethod
    async def read(cls, store: LogStore) -> Logs:
        good, bad = EventConsumer(store).split(await read_all(store, INPUTS))
        return cls(good, len(bad), list(decision_batches(await read_all(store, DECISIONS))))

    def submitted(self) -> set[str]:
        return {d.envelope.event.job_id for d in self.inputs if isinstance(d.envelope.event, JobSubmitted)}

    def silences(self, timeout_ms: int) -> dict[str, list[tuple[int, int]]]:
        """Per node, the spans of log time in which it counted as down: from ``timeout_ms`` after
        a heartbeat to the next one (or to the end of the log)."""
        beats: dict[str, list[int]] = defaultdict(list)
        for d in self.inputs:
            if isinstance(d.envelope.event, NodeHeartbeat):
                beats[d.envelope.event.node].append(d.timestamp_ms)
        end = self.inputs[-1].timestamp_ms if self.inputs else 0
        return {node: [(a + timeout_ms, b) for a, b in zip(times, [*times[1:], end], strict=True)
                       if b - a > timeout_ms]
                for node, times in beats.items()}

    def time_of(self, as_of: int) -> int:
        """The log time a batch computed at ``as_of`` saw: that of the input before it."""
        at = bisect.bisect_left(self.inputs, as_of, key=lambda d: d.offset) - 1
        return self.inputs[at].timestamp_ms if at >= 0 else 0


def silent_between(silences: list[tuple[int, int]], start: int, end: int) -> bool:
    return any(a < end and b > start for a, b in silences)


@dataclass
class Reference:
    """The state folded one event at a time, and what it saw on the way."""

    state: State
    violations: list[str] = field(default_factory=list)
    running_at_mark: int = -1
    """Jobs running when log time first reached the mark (the end of the long outage)."""


def _problem(violations: list[str], text: str) -> None:
    violations.append(text)


def fold_reference(logs: Logs, core: CoreConfig, mark_ms: int | None = None) -> Reference:
    """Fold the inputs one by one and each batch after the inputs before its ``as_of``;
    compare each batch's recorded digest with the reference's, and check that every
    placement finds its job pending."""
    ref = Reference(State(core))
    state, inputs, at = ref.state, logs.inputs, 0
    diverged = placed_running = 0
    for offset, batch in logs.batches:
        while at < len(inputs) and inputs[at].offset < batch.as_of:
            _fold_input(ref, inputs[at], mark_ms)
            at += 1
        if batch.digest != digest(state):
            diverged += 1
            if diverged <= SHOWN:
                _problem(ref.violations, f"decisions@{offset} (as_of {batch.as_of}): the recorded digest "
                                         "differs from folding the log one event at a time")
        placed = (d.job_id for d in batch.decisions if isinstance(d, JobPlaced))
        twice = [job for job in placed if not _pending(state, job)]
        placed_running += len(twice)
        if twice and placed_running - len(twice) < SHOWN:
            _problem(ref.violations, f"decisions@{offset} places {twice[:SHOWN]}, which the one-at-a-time "
                                     "fold has not released (placed twice)")
        if twice:
            continue  # this batch cannot be folded onto the reference: go on with the next
        try:
            fold(state, batch, state.now_ms)
        except ValueError as exc:
            _problem(ref.violations, f"decisions@{offset} cannot be folded one event at a time: {exc}")
    while at < len(inputs):
        _fold_input(ref, inputs[at], mark_ms)
        at += 1
    if diverged > SHOWN or placed_running > SHOWN:
        _problem(ref.violations, f"in all {diverged} batches diverged, {placed_running} placements of "
                                 "jobs not pending")
    return ref


def _fold_input(ref: Reference, delivered: Delivered, mark_ms: int | None) -> None:
    if mark_ms is not None and ref.running_at_mark < 0 and delivered.timestamp_ms >= mark_ms:
        ref.running_at_mark = int((ref.state.jobs.view("state") == JobState.RUNNING).sum())
    fold(ref.state, delivered.envelope.event, delivered.timestamp_ms)


def _pending(state: State, job_id: str) -> bool:
    row = state.job_row(job_id)
    return row >= 0 and int(state.jobs.cols["state"][row]) == JobState.PENDING


def check_decisions(logs: Logs, acked: set[str], timeout_ms: int) -> list[str]:
    """Every acknowledged submission in the log and decided; no batch twice for one ``as_of``;
    a job placed again only after a preemption or with a task on a node that fell silent for
    longer than the timeout while it ran."""
    out: list[str] = []
    missing = sorted(acked - logs.submitted())
    if missing:
        out.append(f"{len(missing)} acknowledged submissions are not in the inputs log: {missing[:SHOWN]}")
    as_of = [b.as_of for _, b in logs.batches]
    repeated = sorted(k for k, n in Counter(as_of).items() if n > 1)
    if repeated:
        out.append(f"{len(repeated)} as_of values have more than one decision batch: {repeated[:SHOWN]}")
    if as_of != sorted(as_of):
        out.append("decision batches are not in as_of order")
    decided = {d.job_id for _, b in logs.batches for d in b.decisions
               if isinstance(d, JobPlaced | JobPending | JobRejected)}
    undecided = sorted(acked - decided)
    if undecided:
        out.append(f"{len(undecided)} acknowledged submissions were never decided: {undecided[:SHOWN]}")
    replaced = _replaced_without_cause(logs, logs.silences(timeout_ms))
    if replaced:
        out.append(f"{len(replaced)} jobs running on healthy nodes were placed again without a preemption "
                   f"(decisions offset, job): {replaced[:SHOWN]}")
    return out


def _replaced_without_cause(logs: Logs, silences: dict[str, list[tuple[int, int]]]) -> list[tuple[int, str]]:
    """(decisions offset, job) of each placement that follows an earlier one of the same job with
    no ``TaskPreempted`` of it in between, and no node of the earlier one silent in between."""
    last: dict[str, tuple[int, JobPlaced]] = {}
    out = []
    for offset, batch in logs.batches:
        now = logs.time_of(batch.as_of)
        for d in batch.decisions:
            if isinstance(d, TaskPreempted):
                last.pop(d.job_id, None)
            elif isinstance(d, JobPlaced):
                before = last.get(d.job_id)
                if before is not None and not any(
                    silent_between(silences.get(t.node, []), before[0], now) for t in before[1].tasks
                ):
                    out.append((offset, d.job_id))
                last[d.job_id] = (now, d)
    return out
