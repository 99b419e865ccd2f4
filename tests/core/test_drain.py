"""An operator's drain (``NodeDrained``): no new placements on the node, its work stays, the
backend's heartbeats do not undo it, undoing it goes back to the backend's own cordon, and it
survives a snapshot (docs/scheduling.md)."""

from __future__ import annotations

from fleetlog.core.digest import digest, restore, snapshot
from fleetlog.core.invariants import check
from fleetlog.core.state import JobState
from fleetlog.events import JobPending, NodeDrained, NodeRemoved
from tests.core.builders import Driver, job, node
from tests.core.test_constraints import with_attrs


def _drain(name: str, drained: bool = True) -> NodeDrained:
    return NodeDrained(cell="c1", node=name, drained=drained, reason="disk swap")


def test_a_drained_node_keeps_its_work_gets_none_new_and_heartbeats_do_not_undo_it() -> None:
    d = Driver()
    d.feed(node("n1"), job("before", gpus=1))
    assert d.placed(d.decide())["before"].tasks[0].node == "n1"
    d.feed(_drain("n1"), node("n1"), node("n1"), job("after", gpus=1))  # (the backend says: schedulable)
    decisions = d.decide()
    assert d.placed(decisions) == {}
    assert d.reasons(decisions) == {"after": "no_eligible_nodes"}
    assert "1 drained" in next(x.message for x in decisions if isinstance(x, JobPending))
    assert d.state.jobs.cols["state"][d.state.job_row("before")] == JobState.RUNNING
    assert d.state.drained == {d.state.node_row("c1", "n1"): ("disk swap", False)}
    d.feed(_drain("n1", drained=False))
    assert d.placed(d.decide())["after"].tasks[0].node == "n1"
    assert d.state.drained == {}
    assert d.state.node_attrs == {}


def test_undoing_a_drain_goes_back_to_the_cordon_the_backend_reported_meanwhile() -> None:
    d = Driver()
    d.feed(node("n1"), _drain("n1"), with_attrs(node("n1"), unschedulable=True), _drain("n1", False))
    d.feed(job("j", gpus=1))
    decisions = d.decide()
    assert d.reasons(decisions) == {"j": "no_eligible_nodes"}
    assert "1 cordoned" in next(x.message for x in decisions if isinstance(x, JobPending))
    d.feed(node("n1"))  # (the backend uncordons it)
    assert d.placed(d.decide())["j"].tasks[0].node == "n1"


def test_a_drain_of_an_unknown_or_removed_node_is_ignored_and_a_removal_ends_the_drain() -> None:
    d = Driver()
    d.feed(node("n1"), _drain("ghost"))
    assert d.state.ignored == 1
    assert d.state.drained == {}
    d.feed(_drain("n1"), NodeRemoved(cell="c1", node="n1"), _drain("n1"))
    assert d.state.ignored == 2
    assert d.state.drained == {}
    d.feed(node("n1"), job("j", gpus=1))  # (a node that comes back is not drained)
    assert d.placed(d.decide())["j"].tasks[0].node == "n1"


def test_a_drain_changes_the_digest_and_survives_a_snapshot() -> None:
    d = Driver()
    d.feed(node("n1"), node("n2"))
    before = digest(d.state)
    d.feed(_drain("n2"))
    assert digest(d.state) != before
    restored = restore(snapshot(d.state))
    check(restored)
    assert restored.drained == d.state.drained
    assert digest(restored) == digest(d.state)
    d.feed(_drain("n2", drained=False))
    drained_again = Driver()
    drained_again.feed(node("n1"), node("n2"), _drain("n2"), _drain("n2", drained=False))
    assert digest(drained_again.state) == digest(d.state)
