"""A step's decisions split over records, each within DECISION_RECORD_BYTES, and joined back."""

from __future__ import annotations

import msgspec
import pytest

from fleetlog.events import DecisionBatch, JobPending, JobPlaced, decode, encode, envelope
from fleetlog.events.codec import MAX_EVENT_BYTES, InvalidEventError
from fleetlog.events.model import (
    MAX_DECISION_PARTS,
    MAX_GPUS_PER_NODE,
    MAX_TASKS_PER_JOB,
    Decision,
    TaskPlacement,
)
from fleetlog.events.parts import DECISION_RECORD_BYTES, PartsError, StepJoiner, encode_step, join_parts
from fleetlog.log.kafka import DECISION_TOPIC_BYTES, KafkaConfig
from tests.core.builders import job

PRODUCER = "fleetlog-scheduler"
NAME = "x" * 253  # the longest name the vocabulary allows


def pending(i: int, pad: int = 3000) -> JobPending:
    return JobPending(job_id=f"job-{i:07d}", reason="no_capacity", message="m" * pad)


def batch_of(decisions: list[Decision]) -> DecisionBatch:
    return DecisionBatch(as_of=123_456, digest="d" * 64, decisions=tuple(decisions), policy="default")


def exactly(size: int) -> DecisionBatch:
    """A batch whose envelope is exactly ``size`` bytes (messages of 256..4096 chars keep
    a 3-byte string header, so a longer last message adds exactly its extra characters)."""
    per = len(msgspec.msgpack.encode(pending(0)))
    decisions: list[Decision] = [pending(i) for i in range((size - 2000) // per)]
    last = pending(len(decisions), 300)
    base = len(encode(envelope(batch_of([*decisions, last]), PRODUCER)))
    assert base <= size, (base, size)
    assert size - base + 300 <= 4096, (base, size)
    found = batch_of([*decisions, pending(len(decisions), 300 + size - base)])
    assert len(encode(envelope(found, PRODUCER))) == size
    return found


def test_the_record_bound_is_below_every_limit_a_reader_or_kafka_applies() -> None:
    assert DECISION_RECORD_BYTES < MAX_EVENT_BYTES
    assert DECISION_RECORD_BYTES + 64 * 1024 <= DECISION_TOPIC_BYTES
    assert KafkaConfig(bootstrap_servers="x").max_decision_bytes >= DECISION_TOPIC_BYTES
    with pytest.raises(ValueError, match="max_decision_bytes"):
        KafkaConfig(bootstrap_servers="x", max_decision_bytes=1 << 20)


def test_a_small_batch_encodes_exactly_as_before_the_part_fields() -> None:
    batch = batch_of([pending(1, 10)])
    (value,) = encode_step(batch, PRODUCER)
    assert value == encode(envelope(batch, PRODUCER))
    assert b"part" not in value
    raw = msgspec.msgpack.decode(value)
    assert set(raw["event"]) == {"type", "as_of", "digest", "decisions", "policy"}


def test_a_batch_exactly_at_the_bound_is_one_record() -> None:
    batch = exactly(DECISION_RECORD_BYTES)
    (value,) = encode_step(batch, PRODUCER)
    assert len(value) == DECISION_RECORD_BYTES
    assert decode(value).event == batch


def test_a_batch_one_byte_over_the_bound_is_split_into_readable_parts() -> None:
    batch = exactly(DECISION_RECORD_BYTES + 1)
    values = encode_step(batch, PRODUCER)
    assert len(values) == 2
    assert all(len(v) <= DECISION_RECORD_BYTES for v in values)
    parts = [decode(v).event for v in values]
    assert all(isinstance(p, DecisionBatch) for p in parts)
    assert [(p.part, p.parts, p.as_of, p.digest, p.policy) for p in parts] == [
        (0, 2, batch.as_of, batch.digest, batch.policy),
        (1, 2, batch.as_of, batch.digest, batch.policy),
    ]
    assert join_parts(parts) == msgspec.structs.replace(batch, parts=2)


def test_a_35_mb_step_splits_in_order_and_joins_back() -> None:
    batch = batch_of([pending(i, 170) for i in range(180_000)])
    values = encode_step(batch, PRODUCER)
    total, n = sum(map(len, values)), len(values)
    assert total > 35_000_000
    least = -(-total // DECISION_RECORD_BYTES)
    assert least <= n <= least + 1  # greedy: the parts are nearly full
    assert all(len(v) <= DECISION_RECORD_BYTES for v in values)
    joiner, steps = StepJoiner(), []
    for offset, value in enumerate(values, start=40):
        step = joiner.add(offset, decode(value).event)  # type: ignore[arg-type]
        steps.append(step)
    assert steps[:-1] == [None] * (n - 1)
    assert steps[-1] == (40, 40 + n - 1, msgspec.structs.replace(batch, parts=n))
    assert not joiner.pending


def worst_job_placed(tasks: int) -> JobPlaced:
    gpus = tuple(range(MAX_GPUS_PER_NODE))
    placements = tuple(TaskPlacement(task_index=i, node=NAME, gpu_indices=gpus) for i in range(tasks))
    return JobPlaced(job_id=NAME, cell=NAME, tasks=placements)


def test_the_largest_placement_a_valid_job_can_get_fits_in_one_record() -> None:
    batch = DecisionBatch(
        as_of=(1 << 63) - 1,
        digest="f" * 128,
        decisions=(worst_job_placed(MAX_TASKS_PER_JOB),),
        policy=NAME,
        part=MAX_DECISION_PARTS - 1,
        parts=MAX_DECISION_PARTS,
    )
    value = encode(envelope(batch, NAME, key=NAME))
    assert len(value) <= DECISION_RECORD_BYTES
    assert decode(value).event == batch
    (again,) = encode_step(msgspec.structs.replace(batch, part=0, parts=1), NAME)
    assert decode(again).event.decisions == batch.decisions  # type: ignore[union-attr]


def test_a_job_at_the_task_limit_is_valid_and_one_over_is_refused_by_name() -> None:
    at = job("at", tasks=MAX_TASKS_PER_JOB, gpus=0)
    assert decode(encode(envelope(at, "p"))).event == at
    over = msgspec.structs.replace(at, job_id="over")
    raw = msgspec.msgpack.decode(encode(envelope(over, "p")))
    raw["event"]["task_groups"][0]["count"] = MAX_TASKS_PER_JOB + 1
    named = f"at most {MAX_TASKS_PER_JOB} tasks, not {MAX_TASKS_PER_JOB + 1}"
    with pytest.raises(InvalidEventError, match=named):
        decode(msgspec.msgpack.encode(raw))
    two_groups = dict(raw["event"]["task_groups"][0], count=MAX_TASKS_PER_JOB // 2 + 1)
    raw["event"]["task_groups"] = [two_groups, two_groups]
    with pytest.raises(InvalidEventError, match="at most"):
        decode(msgspec.msgpack.encode(raw))


def test_a_part_index_past_its_count_does_not_decode() -> None:
    raw = msgspec.msgpack.decode(encode(envelope(batch_of([pending(1, 5)]), PRODUCER)))
    raw["event"].update(part=2, parts=2)
    with pytest.raises(InvalidEventError, match="part 2 of a step in 2 parts"):
        decode(msgspec.msgpack.encode(raw))


def parts_of(n: int, as_of: int = 7) -> list[DecisionBatch]:
    return [
        DecisionBatch(as_of=as_of, digest="d", decisions=(pending(i, 1),), part=i, parts=n) for i in range(n)
    ]


@pytest.mark.parametrize(
    ("sequence", "message"),
    [
        ([1], "no step's part 0 came before it"),
        ([0, 2], "part 1 of the step at decisions@0 was due"),
        ([0, 0], "part 1 of the step at decisions@0 was due"),
    ],
)
def test_parts_out_of_order_are_corrupt(sequence: list[int], message: str) -> None:
    parts, joiner = parts_of(3), StepJoiner()
    for offset, i in enumerate(sequence[:-1]):
        joiner.add(offset, parts[i])
    with pytest.raises(PartsError, match=message):
        joiner.add(len(sequence) - 1, parts[sequence[-1]])


def test_a_part_of_another_step_or_a_lone_batch_inside_a_step_is_corrupt() -> None:
    joiner = StepJoiner()
    joiner.add(0, parts_of(3)[0])
    with pytest.raises(PartsError, match="does not continue the step at decisions@0"):
        joiner.add(1, parts_of(3, as_of=8)[1])
    joiner = StepJoiner()
    joiner.add(0, parts_of(3)[0])
    with pytest.raises(PartsError, match="part 0 of 1"):
        joiner.add(1, batch_of([pending(1, 5)]))


def test_a_log_that_ends_inside_a_step_says_so() -> None:
    joiner = StepJoiner()
    for offset, part in enumerate(parts_of(3)[:2], start=5):
        assert joiner.add(offset, part) is None
    assert joiner.pending
    assert joiner.incomplete() == "the step at decisions@5 has 3 parts, only 2 are in the log"
