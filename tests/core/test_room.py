"""``insufficient_capacity`` counts the most free room only on nodes the job may use, and names
what excluded the nodes with more (issue 47, ``core/room.py``); with
``CoreConfig.most_free_usable`` off, the first text (how logs recorded before it replay)."""

from __future__ import annotations

import msgspec
import pytest

from fleetlog.core.state import CoreConfig
from fleetlog.events import JobPending, NodeDrained
from fleetlog.events.model import Event, Taint
from tests.core.builders import Driver, job, node

MAINT = Taint(key="gpu-maint", value="", effect="NoSchedule")
OLD = "the most free on one node: 8 whole GPUs"


def pending(config: CoreConfig | None, *others: Event, models: tuple[str, ...] = ()) -> JobPending:
    """``big`` (4 GPUs) waits beside ``small``, an A100 node with 2 of its 8 GPUs free, and ``others``."""
    d = Driver(config=config)
    d.feed(node("small"), *others, job("fill", gpus=6))
    assert set(d.placed(d.decide())) == {"fill"}
    d.feed(job("big", gpus=4, models=models))
    found = [x for x in d.decide() if isinstance(x, JobPending) and x.job_id == "big"]
    assert [x.reason for x in found] == ["insufficient_capacity"]
    return found[0]


def tainted(name: str) -> Event:
    return msgspec.structs.replace(node(name), taints=(MAINT,))


def drained(name: str) -> NodeDrained:
    return NodeDrained(cell="c1", node=name, drained=True, reason="disk swap")


ONE = "1 node with more room excluded:"
Case = tuple[tuple[Event, ...], tuple[str, ...], str]
CASES: dict[str, Case] = {  # what else the fleet holds, the models the job allows, what the reason names
    "taint": ((tainted("maint"),), (), f"{ONE} 1 with untolerated taint gpu-maint:NoSchedule"),
    "model": ((node("h100", model="H100"),), ("A100",), f"{ONE} 1 with GPU model H100"),
    "drained": ((node("spare"), drained("spare")), (), f"{ONE} 1 drained"),
    "all three": (
        (tainted("maint1"), tainted("maint2"), node("spare"), drained("spare"), node("h100", model="H100")),
        ("A100",),
        "4 nodes with more room excluded: 2 with untolerated taint gpu-maint:NoSchedule, 1 drained, "
        "1 with GPU model H100",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_most_free_counts_only_nodes_it_may_use_and_names_what_excluded_the_others(case: str) -> None:
    others, models, named = CASES[case]
    message = pending(None, *others, models=models).message
    assert "the most free on a node it may use: 2 whole GPUs," in message
    assert "8 whole GPUs" not in message
    assert message.endswith(f"({named})")


@pytest.mark.parametrize("case", sorted(CASES))
def test_off_it_says_what_it_said_before(case: str) -> None:
    """How a log recorded before the setting replays: the room over every up node."""
    others, models, _ = CASES[case]
    message = pending(CoreConfig(most_free_usable=False), *others, models=models).message
    assert OLD in message
    assert "excluded" not in message
    assert "may use" not in message


def test_with_nothing_excluded_the_text_is_the_first_one() -> None:
    """Every up node usable: the fleet's number, in the words it always had."""
    message = pending(None, node("other", gpus=1)).message
    assert message.endswith("the most free on one node: 2 whole GPUs, a GPU with 1000 milli free, "
                            "96000 mCPU, 786432 MiB")  # (the CPU and memory of the idle 1-GPU node)


def test_excluded_nodes_with_less_room_are_not_named() -> None:
    """A tainted node with 1 free GPU is no reason the job waits: the reason does not name it."""
    message = pending(None, msgspec.structs.replace(node("maint", gpus=1), taints=(MAINT,))).message
    assert message.endswith("the most free on a node it may use: 2 whole GPUs, a GPU with 1000 milli free, "
                            "95000 mCPU, 785408 MiB")


def waits(*events: Event) -> str:
    """The reason ``big`` (the last event) waits with, after the others were decided."""
    d = Driver()
    d.feed(*events[:-1])
    d.decide()
    d.feed(events[-1])
    found = [x for x in d.decide() if isinstance(x, JobPending) and x.job_id == "big"]
    assert [x.reason for x in found] == ["insufficient_capacity"]
    return found[0].message


def test_a_fraction_of_a_gpu_is_compared_by_the_share_free_on_one_gpu() -> None:
    """A 600-milli task beside a 1-GPU node with 500 free and a cordoned one wholly free."""
    cordoned = msgspec.structs.replace(node("idle", gpus=1), unschedulable=True)
    message = waits(node("small", gpus=1), cordoned, job("fill", milli=500), job("big", milli=600))
    assert "the most free on a node it may use: 0 whole GPUs, a GPU with 500 milli free," in message
    assert message.endswith("(1 node with more room excluded: 1 cordoned)")


def test_a_cpu_task_is_compared_by_free_cpu() -> None:
    """A CPU-only task of 50 cores beside a node with 40 free and a tainted one with 96."""
    message = waits(node("small", gpus=0), tainted("maint"), job("fill", gpus=0, cpu=56_000),
                    job("big", gpus=0, cpu=50_000))
    assert "the most free on a node it may use: 0 whole GPUs, a GPU with 0 milli free, 40000 mCPU," in message
    assert message.endswith("(1 node with more room excluded: 1 with untolerated taint gpu-maint:NoSchedule)")


def test_a_node_of_another_cell_is_neither_counted_nor_named() -> None:
    """Cells the job does not allow are outside the question, as they always were."""
    message = waits(node("small"), node("far", cell="c2"), job("fill", gpus=6, cells=("c1",)),
                    job("big", gpus=4, cells=("c1",)))
    assert "no node in cells c1 has room" in message
    assert message.endswith("the most free on one node: 2 whole GPUs, a GPU with 1000 milli free, "
                            "95000 mCPU, 785408 MiB")
