"""The checker of a run under faults: what was acknowledged against what the logs hold.

In the style of Jepsen's Kafka analyses: a producer records every input the log acknowledged
(each carries a unique envelope ``key``), and afterwards :func:`check` reads the inputs and
decisions logs back (through brokers no fault touches) and counts

- **lost**: acknowledged inputs not in the inputs log;
- **duplicated**: inputs in the log more than once (a key seen twice: a producer retry that
  wrote again);
- **decision duplicates**: a step written twice (``as_of`` not above the step before it, or a
  part twice), a job placed twice without a preemption between;
- **decision gaps**: a step with a part missing, or an acknowledged submission (not cancelled)
  that no decision ever answered;

and runs ``replay verify`` over the result (every recorded step recomputed bit-exactly: a step
lost in the middle changes the digest of the next one).  It also gives the timeline the
benchmark reports: the longest stall between decision records, and each input's decision
latency (its append time to the append time of the first step that folded it).
"""

from __future__ import annotations

import bisect
import itertools
from collections import Counter
from collections.abc import Collection, Sequence

import msgspec

from fleetlog.events import JobCancelled, JobPending, JobPlaced, JobRejected, JobSubmitted, TaskPreempted
from fleetlog.log.base import DECISIONS, INPUTS, LogStore, Record
from fleetlog.log.consumer import EventConsumer, decision_batches
from fleetlog.replay.verify import verify


class Step(msgspec.Struct, frozen=True):
    """One decision record: its offset and append time in the decisions log, and the step's
    ``as_of`` (the inputs it folded end before that offset)."""

    offset: int
    timestamp_ms: int
    as_of: int
    decisions: int


class Report(msgspec.Struct, frozen=True, kw_only=True):
    acked_inputs: int
    inputs_in_log: int
    lost: int
    duplicated: int
    decision_duplicates: int
    decision_gaps: int
    undecided: int
    steps: int
    replay_ok: bool
    divergence: str | None = None
    examples: tuple[str, ...] = ()
    """A few of the offending keys or job ids, to start looking."""

    @property
    def clean(self) -> bool:
        return (self.lost == self.duplicated == self.decision_duplicates == self.decision_gaps == 0
                and self.replay_ok and self.steps > 0)


async def read_all(store: LogStore, name: str) -> list[Record]:
    """Every record of log ``name`` up to its end now."""
    log, out, at = store.log(name), [], 0
    end = await log.end_offset()
    while at < end:
        records = await log.read(at, 10_000, timeout_ms=1000)
        if not records:
            break
        out.extend(records)
        at = records[-1].offset + 1
    return out


class Logs(msgspec.Struct, frozen=True):
    """The inputs and decisions logs as read back: keyed inputs and the decision steps."""

    keys: tuple[tuple[str, int, int], ...]
    """(envelope key, offset, append time) of every keyed input, in log order."""
    submitted: frozenset[str]
    cancelled: frozenset[str]
    steps: tuple[Step, ...]
    decided: frozenset[str]
    twice_placed: tuple[str, ...]
    duplicate_steps: int
    missing_parts: int


async def read_logs(store: LogStore) -> Logs:
    inputs, _ = EventConsumer(store).split(await read_all(store, INPUTS))
    keys = tuple((e.envelope.key, e.offset, e.timestamp_ms) for e in inputs if e.envelope.key is not None)
    events = [e.envelope.event for e in inputs]
    submitted = frozenset(e.job_id for e in events if isinstance(e, JobSubmitted))
    cancelled = frozenset(e.job_id for e in events if isinstance(e, JobCancelled))
    records = await read_all(store, DECISIONS)
    stamps = {r.offset: r.timestamp_ms for r in records}
    steps: list[Step] = []
    placed: Counter[str] = Counter()
    preempted: Counter[str] = Counter()
    decided: set[str] = set()
    duplicate_steps = missing_parts = 0
    last_as_of, expected_part = -1, 0
    for offset, batch in decision_batches(records):
        if batch.part == 0:
            if expected_part:  # the step before lacks its last parts
                missing_parts += 1
            if batch.as_of <= last_as_of:
                duplicate_steps += 1
            last_as_of = max(last_as_of, batch.as_of)
            steps.append(Step(offset, stamps[offset], batch.as_of, len(batch.decisions)))
        elif batch.part != expected_part or batch.as_of != last_as_of:
            if batch.part < expected_part:
                duplicate_steps += 1
            else:
                missing_parts += 1
        expected_part = (batch.part + 1) % batch.parts
        for d in batch.decisions:
            if isinstance(d, JobPlaced):
                placed[d.job_id] += 1
            elif isinstance(d, TaskPreempted):
                preempted[d.job_id] += 1
            if isinstance(d, JobPlaced | JobPending | JobRejected):
                decided.add(d.job_id)
    if expected_part:
        missing_parts += 1
    twice = tuple(sorted(j for j, n in placed.items() if n > 1 + preempted[j]))
    return Logs(keys, submitted, cancelled, tuple(steps), frozenset(decided), twice, duplicate_steps,
                missing_parts)


async def check(store: LogStore, acked: Collection[str], *, replay: bool = True,
                logs: Logs | None = None) -> Report:
    """Count what :mod:`this module <tests.faults.checker>` promises over ``store`` (read
    through brokers no fault touches) and the keys ``acked`` the producers were told were
    written; ``replay`` also runs ``replay verify``.  ``logs``: the logs already read."""
    logs = logs or await read_logs(store)
    seen = Counter(k for k, _, _ in logs.keys)
    lost = sorted(k for k in acked if k not in seen)
    duplicated = sorted(k for k, n in seen.items() if n > 1)
    undecided = sorted(logs.submitted - logs.cancelled - logs.decided)
    report = await verify(store) if replay else None
    divergence = None
    if report is not None and report.divergence is not None:
        divergence = str(report.divergence)[:500]
    return Report(
        acked_inputs=len(acked),
        inputs_in_log=len(logs.keys),
        lost=len(lost),
        duplicated=sum(seen[k] - 1 for k in duplicated),
        decision_duplicates=logs.duplicate_steps + len(logs.twice_placed),
        decision_gaps=logs.missing_parts + len(undecided),
        undecided=len(undecided),
        steps=len(logs.steps),
        replay_ok=report is None or (report.ok and report.batches > 0),
        divergence=divergence,
        examples=(*lost[:3], *duplicated[:3], *undecided[:3], *logs.twice_placed[:3]),
    )


def max_stall_s(steps: Sequence[Step], start_ms: int, end_ms: int) -> float:
    """The longest time without a decision record within [``start_ms``, ``end_ms``] (the
    window's edges count as the ends of a stall)."""
    stamps = [s.timestamp_ms for s in steps if start_ms <= s.timestamp_ms <= end_ms]
    edges = [start_ms, *stamps, end_ms]
    return max(b - a for a, b in itertools.pairwise(edges)) / 1000


def latencies_ms(logs: Logs, start_ms: int, end_ms: int) -> list[int]:
    """For each keyed input appended within [``start_ms``, ``end_ms``]: the time from its
    append to the append of the first step that folded it (``as_of`` past its offset);
    inputs no step folded yet are left out."""
    as_of = [s.as_of for s in logs.steps]
    out = []
    for _, offset, stamp in logs.keys:
        if start_ms <= stamp <= end_ms:
            i = bisect.bisect_right(as_of, offset)
            if i < len(logs.steps):
                out.append(max(0, logs.steps[i].timestamp_ms - stamp))
    return out
