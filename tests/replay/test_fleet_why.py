"""``replay explain``'s reason for a dispatch (``fleet_job._why``): each candidate cell's share of
the job's tenant and the room left for the job **at its turn in the step** (with the room at the
step's start, which breaks ties of shares), not only at the step's start — the jobs the step
dispatched before it have drawn on the rooms (found trying the embedded mode: a 4-GPU job sent to cell
``west`` was explained as a tie, ``east: room 6; west: room 6``, "ties to the smaller id",
while a gang dispatched before it in the same step had taken four of east's six slots)."""

from __future__ import annotations

import copy

from fleetlog.core import dispatch as d
from fleetlog.core.dispatch_log import record_of, state_digest
from fleetlog.replay.fleet_job import _why
from tests.core.test_dispatch import cells, gpu_job, summary


def test_the_room_shown_for_a_dispatch_is_the_room_at_its_turn_in_the_step() -> None:
    state = d.DispatchState(cells(2))
    for event in (summary("c000", 1, nodes=3), summary("c001", 1, nodes=3),
                  gpu_job("gang", tasks=2, gpus=8), gpu_job("four", gpus=4)):
        assert d.fold(state, event, 10) == ""
    before = copy.deepcopy(state)
    step = d.dispatch(state)
    assert [(e.job.job_id, e.cell) for e in step.dispatched] == [("gang", "c000"), ("four", "c001")]
    recorded = record_of(step, state.offset, state_digest(state))
    share = "tenant's share"
    # a tie: the smaller id
    assert _why(before, "gang", recorded) == (
        f"c000: {share} 0.0%, room 3 (3 left); c001: {share} 0.0%, room 3 (3 left)")
    # the gang took 2 x 2 of c000's slots and 16 of its 24 GPUs for the tenant: c001 by share
    assert _why(before, "four", recorded) == (
        f"c000: {share} 66.7%, room 6 (2 left); c001: {share} 0.0%, room 6 (6 left)")
