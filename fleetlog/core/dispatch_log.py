"""What the global dispatcher records of each step, and the digest of its state (issue 17).

Pure, like the rest of ``core/``.  The dispatcher's service loop writes one :class:`StepRecord`
per step that decided something into the global partition's decisions log, in the transaction
that writes the step's ``JobDispatched`` into the cells' partitions: the global offset the step
was computed at (``as_of``), what it sent where, the cancellations it forwarded, the waiting
reasons that changed, and :func:`state_digest` of the state after the step.  Folding the global
partition to ``as_of`` and calling :func:`fleetlog.core.dispatch.dispatch` must give the same
record in any process: that is what recovery relies on and what ``verify`` checks.

A step too large for one record (many thousands of dispatches) is split, in order, over
``parts`` records written in the same transaction (``part`` 0 to ``parts - 1``): their lists
run together are the step.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Final

import msgspec

from fleetlog.core.dispatch import DispatchState, Step
from fleetlog.events.model import CellSummary, JobCancelled, JobReturned, JobSubmitted, QuotaSet

GLOBAL_INPUTS: Final = (JobSubmitted, JobCancelled, QuotaSet, JobReturned, CellSummary)
"""The event kinds the global partition holds; any other there is dead-lettered."""
STEP_RECORD_BYTES: Final = 3_670_016
"""The most bytes one step record takes (3.5 MiB, as a decision record): a larger step is split."""


class Sent(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    """One ``JobDispatched`` of the step, by identity (its spec is in the global partition)."""

    job_id: str
    cell: str
    attempt: int
    seq: int


class Forwarded(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    """A ``JobCancelled`` of a held job, forwarded to the holding cell's partition."""

    cell: str
    job_id: str


class Waiting(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    """A job left waiting whose reason changed in this step."""

    job_id: str
    code: str
    message: str


class StepRecord(
    msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="DispatchStep", tag_field="type"
):
    """One dispatcher step (or one part of it), as the global partition's decisions log holds it."""

    as_of: int
    digest: str
    dispatched: tuple[Sent, ...] = ()
    cancels: tuple[Forwarded, ...] = ()
    waiting: tuple[Waiting, ...] = ()
    part: int = 0
    parts: int = 1


class StepRecordError(ValueError):
    """Bytes in the global decisions log that are not a dispatcher step record."""


_ENCODER: Final = msgspec.msgpack.Encoder()
_DECODER: Final = msgspec.msgpack.Decoder(StepRecord)


def record_of(step: Step, as_of: int, digest: str) -> StepRecord:
    """The record of ``step``, computed after folding the global partition to ``as_of``."""
    return StepRecord(
        as_of=as_of,
        digest=digest,
        dispatched=tuple(Sent(d.job.job_id, d.cell, d.attempt, d.seq) for d in step.dispatched),
        cancels=tuple(Forwarded(cell, c.job_id) for cell, c in step.cancels),
        waiting=tuple(Waiting(*w) for w in step.waiting),
    )


def is_empty(step: Step) -> bool:
    """A step that decided nothing also changed nothing in the state: it is not recorded."""
    return not (step.dispatched or step.cancels or step.waiting)


def encode_record(record: StepRecord, limit: int = STEP_RECORD_BYTES) -> list[bytes]:
    """The record's bytes: one value, or its parts in order when it is larger than ``limit``."""
    whole = _ENCODER.encode(record)
    if len(whole) <= limit:
        return [whole]
    items: list[Sent | Forwarded | Waiting] = [*record.dispatched, *record.cancels, *record.waiting]
    chunks: list[list[Sent | Forwarded | Waiting]] = [[]]
    size = 0
    for item in items:
        cost = len(_ENCODER.encode(item)) + 1
        if chunks[-1] and size + cost > limit - 256:
            chunks.append([])
            size = 0
        chunks[-1].append(item)
        size += cost
    return [_ENCODER.encode(_part(record, chunk, i, len(chunks))) for i, chunk in enumerate(chunks)]


def _part(record: StepRecord, items: list[Sent | Forwarded | Waiting], part: int, parts: int) -> StepRecord:
    return StepRecord(
        as_of=record.as_of, digest=record.digest, part=part, parts=parts,
        dispatched=tuple(i for i in items if isinstance(i, Sent)),
        cancels=tuple(i for i in items if isinstance(i, Forwarded)),
        waiting=tuple(i for i in items if isinstance(i, Waiting)),
    )


def decode_record(value: bytes) -> StepRecord:
    """A step record (or part), or :class:`StepRecordError` saying why the bytes are not one."""
    try:
        record = _DECODER.decode(value)
    except msgspec.DecodeError as exc:
        raise StepRecordError(f"not a dispatcher step record ({len(value)} bytes): {exc}") from None
    if not 0 <= record.part < record.parts:
        raise StepRecordError(f"part {record.part} of a step in {record.parts} parts")
    return record


def join_parts(parts: Sequence[StepRecord]) -> StepRecord:
    """The step the ``parts`` (in order, all of one step) were split from."""
    first = parts[0]
    if [p.part for p in parts] != list(range(first.parts)) or any(
        (p.as_of, p.digest, p.parts) != (first.as_of, first.digest, first.parts) for p in parts
    ):
        raise StepRecordError(f"the parts of the step at as_of {first.as_of} do not line up")
    return StepRecord(
        as_of=first.as_of, digest=first.digest,
        dispatched=tuple(s for p in parts for s in p.dispatched),
        cancels=tuple(c for p in parts for c in p.cancels),
        waiting=tuple(w for p in parts for w in p.waiting),
    )


def state_digest(state: DispatchState) -> str:
    """A digest of everything in ``state`` a later decision depends on, the same in any process
    (no set or hash order: jobs and tenants in log order, the rest sorted).  Specs and summary
    rows are the log's own bytes: the digest names them by id and seq."""
    jobs = [
        (job_id, j.status, j.cell, j.attempt, j.seq, j.tenant, j.demand, sorted(j.returned.items()), j.reason)
        for job_id, j in state.jobs.items()
    ]
    quotas = sorted(
        (key, q.nominal, q.borrowing_limit, q.cohort, q.weight_milli) for key, q in state.quotas.items()
    )
    summaries = sorted((cell, s.seq, s.as_of, s.dispatched_seq) for cell, s in state.summaries.items())
    doc = (
        state.cells.partitions, state.offset, state.now_ms, jobs, list(state.tenants.items()), quotas,
        summaries, sorted(state.dispatch_seq.items()), [(cell, c.job_id) for cell, c in state.cancels],
    )
    return hashlib.blake2b(_ENCODER.encode(doc), digest_size=16).hexdigest()


class DispatchSnapshotError(ValueError):
    """Bytes that do not restore to the dispatcher state they claim (damaged, or another build's)."""


class _Snapshot(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    digest: str
    state: DispatchState


_SNAPSHOT_DECODER: Final = msgspec.msgpack.Decoder(_Snapshot)


def snapshot_state(state: DispatchState) -> bytes:
    """The whole state as bytes, with its digest (checked again by :func:`restore_state`)."""
    return _ENCODER.encode(_Snapshot(state_digest(state), state))


def restore_state(data: bytes) -> DispatchState:
    """The state :func:`snapshot_state` wrote; :class:`DispatchSnapshotError` when the bytes do
    not decode or the state restored does not have the digest it was saved with."""
    try:
        snap = _SNAPSHOT_DECODER.decode(data)
    except (msgspec.DecodeError, RecursionError, ValueError, TypeError) as exc:
        raise DispatchSnapshotError(f"not a dispatcher snapshot: {exc}") from None
    found = state_digest(snap.state)
    if found != snap.digest:
        raise DispatchSnapshotError(f"the restored state's digest is {found}, not the {snap.digest} saved")
    return snap.state
