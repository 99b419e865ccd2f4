"""One step's decisions in as many records as it takes, and back: the scheduler can always read
what it wrote.

Every record the scheduler writes to the decisions log is at most :data:`DECISION_RECORD_BYTES`
encoded, below what :func:`fleetlog.events.codec.decode` reads (``MAX_EVENT_BYTES``) and below the
Kafka limits fleetlog configures (``KafkaConfig.max_decision_bytes``).  A step whose batch is
larger is split between decisions, in order, over several :class:`DecisionBatch` records — part
``i`` of ``parts`` — that are written in one transaction.  Each part is a valid batch: folding the
parts one after the other is folding the step.  Readers that compare a step as a whole (replay
verify, what-if, explain, recovery's checks) join the parts back with :class:`StepJoiner`.

A single decision can never be split; the largest one, a ``JobPlaced`` of a job with
``MAX_TASKS_PER_JOB`` tasks, fits in one record (checked by ``tests/events/test_parts.py``).
"""

from __future__ import annotations

from typing import Final

import msgspec

from fleetlog.events.codec import MAX_EVENT_BYTES, encode, envelope
from fleetlog.events.model import MAX_DECISION_PARTS, MAX_DECISIONS_PER_BATCH, Decision, DecisionBatch

DECISION_RECORD_BYTES: Final = 3_670_016
"""The largest decision record the scheduler writes (3.5 MiB): under ``MAX_EVENT_BYTES`` (4 MiB),
so every record decodes, with room for Kafka's record and batch headers under a 4 MiB
``max.message.bytes``."""
assert DECISION_RECORD_BYTES < MAX_EVENT_BYTES

_ENCODER: Final = msgspec.msgpack.Encoder()
_ARRAY_HEADER: Final = 5  # a msgpack array32 header: the most a decisions array adds


class DecisionTooLargeError(ValueError):
    """One decision alone does not fit in a decision record (validation should make it impossible)."""


class PartsError(ValueError):
    """The decisions log holds parts of a step out of order, mismatched or incomplete."""


def encode_step(batch: DecisionBatch, producer_id: str, limit: int = DECISION_RECORD_BYTES) -> list[bytes]:
    """The records of one step: ``batch`` encoded as it always was when it fits in ``limit``
    bytes, else split between decisions into parts of at most ``limit`` bytes each."""
    whole = encode(envelope(batch, producer_id))
    if len(whole) <= limit:
        return [whole]
    chunks = _chunks(batch, producer_id, limit)
    parts = [
        msgspec.structs.replace(batch, decisions=chunk, part=i, parts=len(chunks))
        for i, chunk in enumerate(chunks)
    ]
    values = [encode(envelope(part, producer_id)) for part in parts]
    assert all(len(v) <= limit for v in values), "a part over the limit: the size estimate is wrong"
    return values


def _chunks(batch: DecisionBatch, producer_id: str, limit: int) -> list[tuple[Decision, ...]]:
    """Greedy runs of decisions whose parts stay within ``limit`` (and the decoder's count
    limit): a decision's bytes inside the array are its bytes alone, and the rest of a part is at
    most ``overhead``."""
    widest = msgspec.structs.replace(
        batch, decisions=(), part=MAX_DECISION_PARTS - 1, parts=MAX_DECISION_PARTS
    )
    overhead = len(encode(envelope(widest, producer_id))) + _ARRAY_HEADER
    room = limit - overhead
    chunks: list[tuple[Decision, ...]] = []
    start = used = 0
    for i, decision in enumerate(batch.decisions):
        size = len(_ENCODER.encode(decision))
        if size > room:
            raise DecisionTooLargeError(
                f"decision #{i} ({type(decision).__name__} of job {decision.job_id!r}) is {size} "
                f"bytes encoded; a decision record holds at most {room}"
            )
        if used + size > room or i - start == MAX_DECISIONS_PER_BATCH:
            chunks.append(batch.decisions[start:i])
            start, used = i, 0
        used += size
    chunks.append(batch.decisions[start:])
    if len(chunks) > MAX_DECISION_PARTS:
        raise DecisionTooLargeError(f"a step of {len(chunks)} parts; the most is {MAX_DECISION_PARTS}")
    return chunks


def join_parts(parts: list[DecisionBatch]) -> DecisionBatch:
    """The step the ``parts`` (all of them, in order) were split from, as one batch that keeps
    ``parts`` (how many records it came from; ``part`` is 0)."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    decisions = tuple(d for part in parts for d in part.decisions)
    return msgspec.structs.replace(first, decisions=decisions, part=0)


class StepJoiner:
    """Fed the decision records in log order, returns each step once its last part arrived:
    ``(offset of its first record, offset of its last record, the whole batch)``."""

    def __init__(self) -> None:
        self.parts: list[DecisionBatch] = []
        self.first = -1

    @property
    def pending(self) -> bool:
        """Some parts of a step arrived, not yet all."""
        return bool(self.parts)

    def add(self, offset: int, batch: DecisionBatch) -> tuple[int, int, DecisionBatch] | None:
        self._check(offset, batch)
        if batch.part == 0:
            self.first = offset
        if batch.parts == 1:
            return offset, offset, batch
        self.parts.append(batch)
        if batch.part + 1 < batch.parts:
            return None
        joined, self.parts = join_parts(self.parts), []
        return self.first, offset, joined

    def _check(self, offset: int, batch: DecisionBatch) -> None:
        expected = len(self.parts)
        if batch.part != expected:
            head = f"decisions@{offset} is part {batch.part} of {batch.parts}"
            if expected == 0:
                raise PartsError(f"{head}, but no step's part 0 came before it")
            raise PartsError(f"{head}, but part {expected} of the step at decisions@{self.first} was due")
        if self.parts:
            first = self.parts[0]
            if (batch.as_of, batch.digest, batch.policy, batch.parts) != (
                first.as_of, first.digest, first.policy, first.parts
            ):
                raise PartsError(
                    f"decisions@{offset} (as_of {batch.as_of}, {batch.parts} parts) does not continue "
                    f"the step at decisions@{self.first} (as_of {first.as_of}, {first.parts} parts)"
                )

    def incomplete(self) -> str:
        """Why the log cannot end here (``""`` when no step is half read)."""
        if not self.parts:
            return ""
        first = self.parts[0]
        return (
            f"the step at decisions@{self.first} has {first.parts} parts, only {len(self.parts)} "
            "are in the log"
        )
