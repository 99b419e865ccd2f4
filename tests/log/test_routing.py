"""The routing rule (fleetlog.log.routing): every producer's event to its partition by cell."""

from __future__ import annotations

import time

import pytest

from fleetlog.events.model import (
    InputEvent,
    JobCancelled,
    JobSubmitted,
    NodeHeartbeat,
    NodeRemoved,
    QuotaSet,
    Resources,
    TaskFailed,
    TaskFinished,
    TaskGroup,
    TaskStarted,
)
from fleetlog.log.base import Shard
from fleetlog.log.routing import CELL_HEADER, SHOWN_CELLS, Router, RoutingError, producer_cell, route

MAP = (("a100-east", 0), ("a100-west", 1), ("t4-lab", 1))


def job(job_id: str = "j") -> JobSubmitted:
    return JobSubmitted(job_id=job_id, tenant="t", task_groups=(TaskGroup(count=1, cpu_milli=1, mem_mib=1),))


def beat(cell: str, node: str = "n") -> NodeHeartbeat:
    return NodeHeartbeat(cell=cell, node=node, cpu_milli=1000, mem_mib=1024)


def every_kind(cell: str) -> list[InputEvent]:
    return [job(), JobCancelled(job_id="j"), QuotaSet(tenant="t", nominal=Resources()),
            QuotaSet(tenant="t", cell=cell, nominal=Resources()), beat(cell),
            NodeRemoved(cell=cell, node="n"),
            TaskStarted(job_id="j", task_index=0, node="n"), TaskFinished(job_id="j", task_index=0),
            TaskFailed(job_id="j", task_index=0, reason="oom")]


def test_without_a_map_everything_is_the_single_shard_unchecked() -> None:
    for router in (Router(), Router(cell="nowhere")):
        assert not router.routed
        assert router.home() == Shard.SINGLE
        assert {router.shard_of(e) for e in every_kind("nowhere")} == {Shard.SINGLE}
        assert router.split(every_kind("x")) == [(Shard.SINGLE, list(range(9)))]
        assert router.split([]) == []


def test_with_a_map_each_event_goes_to_its_partition() -> None:
    router = Router(MAP, cell="t4-lab")
    shards = [router.shard_of(e) for e in every_kind("a100-east")]
    # submissions, cancels, quotas (a cell's quota too: the dispatcher forwards it) go global;
    # a node's events to its cell's partition; task events to the producer's cell's
    assert shards == [Shard.GLOBAL] * 4 + [Shard.cell(0)] * 2 + [Shard.cell(1)] * 3
    assert router.home() == Shard.cell(1)
    # two cells sharing a partition: one shard
    assert router.shard_of(beat("a100-west")) == router.shard_of(beat("t4-lab")) == Shard.cell(1)


def test_a_mixed_batch_is_split_by_partition_in_order() -> None:
    router = Router(MAP, cell="a100-east")
    batch: list[InputEvent] = [beat("t4-lab", "x"), job("1"), TaskStarted(job_id="1", task_index=0, node="n"),
                               beat("a100-west", "y"), JobCancelled(job_id="1"), beat("a100-east", "z")]
    assert router.split(batch) == [(Shard.cell(1), [0, 3]), (Shard.GLOBAL, [1, 4]), (Shard.cell(0), [2, 5])]


def test_an_unknown_cell_is_refused_naming_it_and_the_map() -> None:
    router = Router(MAP)
    with pytest.raises(RoutingError) as caught:
        router.split([job(), beat("a100-east"), beat("h100-north")])
    error = caught.value
    assert (error.reason, error.cell) == ("unknown_cell", "h100-north")
    assert str(error) == ("event 2: NodeHeartbeat of node 'n': cell 'h100-north' is not in the [cells] map "
                          "(it names a100-east, a100-west, t4-lab): add it to the map, or fix the cell; "
                          "nothing was sent")
    with pytest.raises(RoutingError, match="'gone' is not in the"):
        router.shard_of(NodeRemoved(cell="gone", node="n"))
    with pytest.raises(RoutingError, match="QuotaSet of tenant 't': cell 'gone' is not in the"):
        router.shard_of(QuotaSet(tenant="t", cell="gone", nominal=Resources()))
    with pytest.raises(RoutingError, match="the producer's cell 'nope' is not in the") as caught:
        Router(MAP, cell="nope")
    assert caught.value.reason == "unknown_cell"


def test_a_task_event_needs_the_producers_cell() -> None:
    router = Router(MAP)
    assert router.shard_of(job()) == Shard.GLOBAL  # a client without a cell submits
    with pytest.raises(RoutingError, match="event 1: TaskFinished of job 'j' carries no cell") as caught:
        router.split([job(), TaskFinished(job_id="j", task_index=0)])
    assert caught.value.reason == "cell_needed"
    with pytest.raises(RoutingError, match="must say its cell"):
        router.home()


def test_limits_ten_thousand_cells_and_names_at_253() -> None:
    cells = [(f"cell-{i:05d}", i % 64) for i in range(10_000)]
    long = "c" * 253
    started = time.perf_counter()
    router = Router([*cells, (long, 63)], cell=long)
    batch: list[InputEvent] = [beat(c, f"n{i}") for i, (c, _) in enumerate(cells)]
    parts = router.split([*batch, TaskStarted(job_id="j" * 253, task_index=0, node="n"), beat(long)])
    assert time.perf_counter() - started < 2.0  # a dictionary lookup per event, not a scan of the map
    assert len(parts) == 64
    by_shard = dict(parts)
    assert by_shard[Shard.cell(5)][:2] == [5, 69]
    assert by_shard[Shard.cell(63)][-2:] == [10_000, 10_001]
    assert sum(len(i) for i in by_shard.values()) == 10_002
    with pytest.raises(RoutingError) as caught:  # a refusal lists some cells and counts the rest
        router.shard_of(beat("c" * 252))
    message = str(caught.value)
    # sorted: the long "ccc…" name first, then cell-00000 ..
    assert f"(it names {'c' * 253}, cell-00000, " in message
    assert f"cell-{SHOWN_CELLS - 2:05d}, … (10001 cells in all)" in message
    assert f"cell-{SHOWN_CELLS - 1:05d}" not in message
    assert len(message) < 1200


def test_an_ingest_request_is_routed_with_the_producers_cell_from_its_header() -> None:
    events: list[InputEvent] = [job("1"), TaskFinished(job_id="1", task_index=0), beat("a100-east")]
    router = Router(MAP, producer_cell({CELL_HEADER: "t4-lab", "content-type": "application/json"}))
    assert route(router, events, ["r0", "r1", "r2"]) == [
        (Shard.GLOBAL, ["r0"]), (Shard.cell(1), ["r1"]), (Shard.cell(0), ["r2"])]
    assert producer_cell({}) is None
    with pytest.raises(RoutingError, match="carries no cell"):
        route(Router(MAP, producer_cell({})), events, ["r0", "r1", "r2"])
    assert route(Router(), events, [0, 1, 2]) == [(Shard.SINGLE, [0, 1, 2])]
    with pytest.raises(ValueError, match="2 records for 3 events"):
        route(router, events, [0, 1])
