"""The scheduling loop's side of the fold's gate: what it refuses is parked with reason
``unauthorized``, and the consumer tells the gate whether a read holds a ``PolicySet``."""

from __future__ import annotations

from fleetlog.events import JobCancelled
from fleetlog.events.codec import encode, envelope
from fleetlog.log.base import DEAD_LETTERS, INPUTS, PRINCIPAL_HEADER, Message
from fleetlog.log.consumer import ERROR_HEADER, REASON_HEADER
from fleetlog.log.memory import MemoryLogStore
from fleetlog.service.loop import LoopConfig, SchedulerLoop
from tests.core.builders import job
from tests.core.test_authorize import grants
from tests.core.test_fold_batch import BEATS, CHUNK_CONFIG, CHUNK_POLICY, NODES


async def test_the_loop_parks_what_the_gate_refuses_in_a_read_that_also_sets_the_policy() -> None:
    """One read holding the first ``PolicySet`` and, after it, a cancellation it does not allow:
    the consumer says the read holds a ``PolicySet`` (so the gate looks), the loop leaves the
    cancellation out and parks it with reason ``unauthorized``; a read of heartbeats alone says
    it holds none (the gate does not scan it)."""
    store = MemoryLogStore()
    await store.open()
    named = (PRINCIPAL_HEADER, b"tb")
    await store.log(INPUTS).append([
        Message(encode(envelope(job("j0", tenant="a"), "t")), headers=((PRINCIPAL_HEADER, b"ta"),)),
        Message(encode(envelope(grants(), "t"))),
        Message(encode(envelope(JobCancelled(job_id="j0"), "t")), headers=(named,)),
    ])
    loop = SchedulerLoop(store, CHUNK_POLICY, LoopConfig(), CHUNK_CONFIG)
    result = await loop.step()
    assert (result.inputs, result.dead_lettered) == (3, 1)
    parked = await store.log(DEAD_LETTERS).read(0, 10)
    assert [r.header(REASON_HEADER) for r in parked] == [b"unauthorized"]
    assert b"may not cancel job 'j0' of tenant 'a' (principal 'tb'" in (parked[0].header(ERROR_HEADER) or b"")
    assert parked[0].header(PRINCIPAL_HEADER) == b"tb"
    assert loop.state.policy == grants()
    await store.log(INPUTS).append([Message(encode(envelope(BEATS[n], "t"))) for n in NODES])
    polled = await loop.consumer.poll_inputs(3)
    assert not polled.policy_sets
    assert len(polled.events) == len(NODES)
