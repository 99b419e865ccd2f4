"""A decision record the Slurm backend cannot read (issue 14, the backends): it stands by at that
record, says so once with the log and the offset, stays alive, and acts again once the log is
restored — never a traceback, never a skipped decision."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from fleetlog.events import NodeHeartbeat, TaskFinished, encode, envelope
from fleetlog.events.codec import CONTENT_TYPE_HEADER, JSON, MAX_EVENT_BYTES
from fleetlog.log.base import DECISIONS, Message
from tests.backends.helpers import restore, segment
from tests.backends.slurm.harness import Harness, job, of_type
from tests.slurm_cluster import SlurmCluster

POISON = b'{"schema_version":1,"producer_id":"x","event":' + b"[" * 1000 + b"]" * 1000 + b"}"
BAD = {
    "nested_1000_deep": (Message(POISON, headers=((CONTENT_TYPE_HEADER, JSON),)), "cannot be read"),
    "not_a_batch": (Message(encode(envelope(job("evil"), "evil"))), "holds JobSubmitted"),
    "over_the_size_limit": (Message(b"\x92" + b"\x00" * MAX_EVENT_BYTES), "EventTooLargeError"),
}


async def eventually(check: Callable[[], bool], timeout_s: float = 20.0) -> None:
    for _ in range(int(timeout_s * 20)):
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not met in time")


def said(caplog: pytest.LogCaptureFixture, start: str) -> list[logging.LogRecord]:
    ours = [r for r in caplog.records if r.name == "fleetlog.backends.slurm"]
    return [r for r in ours if r.getMessage().startswith(start)]


@pytest.mark.parametrize("case", sorted(BAD))
async def test_an_unreadable_decision_stalls_the_backend_at_it_until_the_log_is_restored(
    slurm_cluster: SlurmCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    caplog.set_level(logging.DEBUG, logger="fleetlog.backends.slurm")
    bad, says = BAD[case]
    async with Harness(slurm_cluster, tmp_path, {"after": "true"}) as h:
        await h.ready()
        decisions = h.store.log(DECISIONS)
        offset = await decisions.end_offset()
        good = segment(h.directory / "log").read_bytes()
        await decisions.append([bad])  # a hostile producer, or a direct file append
        stop = asyncio.Event()
        task = asyncio.create_task(h.backend.run(stop))
        try:
            await eventually(lambda: task.done() or h.backend.stats.failures >= 2)  # reported, re-checked
            assert not task.done()  # alive: no traceback, no exit
            assert h.backend.decisions_offset == offset  # its place kept: the record is not skipped
            assert f"decisions@{offset}" in h.backend.stats.stalled
            assert says in h.backend.stats.stalled
            errors = [r for r in said(caplog, "slurm_backend_stalled") if r.levelno == logging.ERROR]
            assert len(errors) == 1  # one clear line, not one per re-check
            assert f"log=decisions offset={offset} error_type=CorruptDecisionsError" in errors[0].getMessage()
            assert "restore the log" in errors[0].getMessage()
            # stalled, it still reports its nodes (else the scheduler would take them down)
            beats = len(of_type(await h.inputs(), NodeHeartbeat))
            await eventually(lambda: h.backend.stats.failures >= 3, timeout_s=30)  # one more re-check
            assert len(of_type(await h.inputs(), NodeHeartbeat)) >= beats + 4
            assert h.backend.decisions_offset == offset
            await h.store.close()  # the operator restores the decisions log from a backup
            restore(segment(h.directory / "log"), good)
            await h.store.open()
            await h.submit(job("after"))  # its placement lands where the bad record was
            for _ in range(400):
                await h.loop.step(20)
                if of_type(await h.inputs(), TaskFinished, "after"):
                    break
                await asyncio.sleep(0.1)
            assert of_type(await h.inputs(), TaskFinished, "after"), "the backend never acted again"
            await eventually(lambda: h.backend.stats.stalled == "", timeout_s=10)  # said resumed
            assert said(caplog, "slurm_backend_resumed")
        finally:
            stop.set()
            await task
