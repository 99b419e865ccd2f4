"""Capacity fleetlog does not own: work a node's heartbeat says others hold (``foreign_*``: a job
submitted straight to Slurm, another scheduler's pod) is never placed on, also when it arrives on
what fleetlog's tasks hold, and the batched fold and snapshots agree (docs/scheduling.md)."""

from __future__ import annotations

import re

import msgspec
import pytest

from fleetlog.core.digest import digest, restore, snapshot
from fleetlog.core.fold import fold
from fleetlog.core.fold_batch import fold_lists, fold_many
from fleetlog.core.state import State
from fleetlog.core.views import nodes_table
from fleetlog.events import NodeRemoved, TaskFinished
from fleetlog.events.model import NodeHeartbeat
from tests.core.builders import Driver, job, node


def gpus_free(state: State, name: str) -> list[int]:
    row = state.node_row("c1", name)
    return state.nodes.cols["gpu_free"][row, : int(state.nodes.cols["gpu_count"][row])].tolist()


def test_fleetlog_routes_around_gpus_foreign_work_holds() -> None:
    d = Driver()
    d.feed(node("n1", foreign=(8_000, 1_024, 6)), node("n2", foreign=(0, 0, 8)), node("n3"))
    assert gpus_free(d.state, "n1") == [1000, 1000, 0, 0, 0, 0, 0, 0]  # (the highest GPUs first)
    d.feed(job("eight", gpus=8), job("two", gpus=2))
    placed = d.placed(d.decide())
    assert placed["eight"].tasks[0].node == "n3"
    assert placed["two"].tasks[0].node == "n1"
    assert sorted(placed["two"].tasks[0].gpu_indices) == [0, 1]
    d.feed(job("more", gpus=1))
    assert "more" in d.reasons(d.decide())
    d.feed(node("n2"))  # (the foreign work on n2 ended)
    assert d.placed(d.decide())["more"].tasks[0].node == "n2"
    assert d.state.node_foreign.keys() == {d.state.node_row("c1", "n1")}
    rows = {r["node"]: r for r in nodes_table(d.state)}
    held = [rows["n1"][k] for k in ("foreign_gpus", "foreign_cpu_milli", "foreign_mem_mib")]
    assert held == [6, 8_000, 1_024]
    assert rows["n2"]["foreign_gpus"] == 0


def test_foreign_cpu_and_memory_count_as_held() -> None:
    d = Driver()
    d.feed(node("n1", gpus=0, cpu=8_000, foreign=(6_000, 0, 0)))
    d.feed(job("big", gpus=0, cpu=4_000), job("small", gpus=0, cpu=2_000))
    placed = d.placed(d.decide())
    assert set(placed) == {"small"}
    d.feed(node("n1", gpus=0, cpu=8_000, mem=786_432, foreign=(0, 786_000, 0)))
    d.feed(job("mem", gpus=0, cpu=1_000))
    assert "mem" not in d.placed(d.decide())  # (the memory is held now)


def test_foreign_work_on_what_fleetlog_holds_is_taken_once_fleetlog_leaves() -> None:
    """The backend saw a foreign job start on GPUs fleetlog's task holds (a race the real
    system settles): only what is free is held, the rest once the task has gone — through the
    steady-heartbeat path of the batched fold too (the very same heartbeat object again)."""
    d = Driver()
    d.feed(node("n1"))
    d.feed(job("ours", gpus=6))
    d.decide()
    beat = node("n1", foreign=(0, 0, 4))
    d.feed(beat)
    row = d.state.node_row("c1", "n1")
    assert d.state.node_foreign[row][2:] == (4, 0, 0, 0b1100_0000)  # (2 of the 4 held)
    assert gpus_free(d.state, "n1").count(0) == 8
    d.feed(TaskFinished(job_id="ours", task_index=0), beat)
    assert d.state.node_foreign[row][5] == 0b1111_0000
    d.feed(job("after", gpus=4))
    assert sorted(d.placed(d.decide())["after"].tasks[0].gpu_indices) == [0, 1, 2, 3]
    # the same inputs folded in bulk, the repeated heartbeat the same object
    one, many = State(), State()
    for state in (one, many):  # (each remembers the node's first heartbeat as its steady one)
        fold(state, node("n1"), 1_000)
        fold(state, job("ours", gpus=6), 1_001)
        fold(state, d.batches[0], 1_010)
    # (a heartbeat equal to the one the node sent before the foreign work came must not pass
    # for a steady one: the foreign work ended)
    runs = [[beat, beat, node("n1")], [beat, TaskFinished(job_id="ours", task_index=0), beat, beat],
            [node("n1")]]
    for k, run in enumerate(runs):
        for i, e in enumerate(run):
            fold(one, e, 1_020 + 10 * k + i)
        fold_many(many, [(e, 1_020 + 10 * k + i) for i, e in enumerate(run)])
        assert digest(many) == digest(one)
        assert many.node_foreign == one.node_foreign
    assert one.node_foreign == {}


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 1_000])
def test_foreign_holdings_fold_alike_in_any_chunking_and_survive_snapshots(chunk: int) -> None:
    events: list[object] = []
    for r in range(6):
        for i in range(5):
            held = ((r + i) % 3 * 2_000, (r * i) % 4 * 1_000, (r + 2 * i) % 9)
            events.append(node(f"n{i}", foreign=held))
        events += [job(f"j{r}-{k}", gpus=1 + k % 2) for k in range(3)]
    events += [NodeRemoved(cell="c1", node="n0"), node("n1", gpus=4, foreign=(0, 0, 4))]  # (reshaped)
    times = [1_000 + i for i in range(len(events))]
    one = State()
    for e, t in zip(events, times, strict=True):
        fold(one, e, t)  # type: ignore[arg-type]
    cut = State()
    for start in range(0, len(events), chunk):
        fold_lists(cut, events[start:start + chunk], times[start:start + chunk])  # type: ignore[arg-type]
    assert digest(cut) == digest(one)
    again = restore(snapshot(one))
    assert digest(again) == digest(one)
    assert again.node_foreign == one.node_foreign
    assert one.node_row("c1", "n0") not in one.node_foreign
    assert one.node_foreign[one.node_row("c1", "n1")][2:] == (4, 0, 0, 0b1111)


def test_a_log_without_foreign_work_digests_as_before() -> None:
    """No heartbeat names foreign work: the digest leaves the field out (recorded replays verify)."""
    state = State()
    fold(state, node("n1"), 1_000)
    plain = digest(state)
    fold(state, node("n1", foreign=(0, 0, 1)), 1_001)
    assert digest(state) != plain
    fold(state, node("n1"), 1_002)
    back = State()
    fold(back, node("n1"), 1_000)
    fold(back, node("n1"), 1_001)
    fold(back, node("n1"), 1_002)
    assert digest(state) == digest(back)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("foreign_gpus", 9, "foreign_gpus 9 is more than the node has (8)"),
        ("foreign_cpu_milli", 96_001, "foreign_cpu_milli 96001 is more than the node has (96000)"),
        ("foreign_mem_mib", -1, "Expected `int` >= 0"),
    ],
)
def test_foreign_work_past_the_node_is_refused_by_name(field: str, value: int, message: str) -> None:
    raw = msgspec.to_builtins(node("n1"))
    raw[field] = value
    with pytest.raises(msgspec.ValidationError, match=re.escape(message)):
        msgspec.json.decode(msgspec.json.encode(raw), type=NodeHeartbeat)
