"""``replay explain``'s node ranking (``why``) counts only the nodes the job could have used: a
node whose taint the job does not tolerate was counted feasible and ranked first (issue 47)."""

from __future__ import annotations

import msgspec

from fleetlog.core.decide import decide
from fleetlog.core.fold import fold
from fleetlog.core.policy import Policy
from fleetlog.core.state import State
from fleetlog.events.model import JobPlaced, Taint
from fleetlog.replay.explain import rank_nodes
from tests.core.builders import job, node


def test_a_node_the_job_may_not_use_is_neither_counted_nor_ranked() -> None:
    state = State()
    roomy = msgspec.structs.replace(node("n0", gpus=8), taints=(Taint(key="gpu-maint", effect="NoSchedule"),))
    for at, event in enumerate([roomy, node("n1", gpus=8), node("n2", gpus=8), job("j1", gpus=4)]):
        fold(state, event, 1_000 + at)
    (placed,) = [d for d in decide(state, Policy()) if isinstance(d, JobPlaced)]
    why = rank_nodes(state, Policy(), placed)
    assert why["feasible_nodes"] == 2, why  # n1 and n2; never the tainted n0, however roomy
    assert "n0" not in [r["node"] for r in why["best"]], why
    assert why["node"] in ("n1", "n2")
    assert why["rank"] == 1, why
    assert why["up_nodes_in_cell"] == 3, why
