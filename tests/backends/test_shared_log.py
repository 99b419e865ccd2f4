"""The file log a backend shares with ``fleetlog run --log DIR`` (a real child process): appends
go through the service's ingest endpoint while it leads, in order and past the per-request bound;
a backend alone writes the log itself, hands it over to a service that starts, and takes it back
when the service stops; nothing is lost or reordered on the way."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from fleetlog.backends.shared_log import EVENTS_PER_REQUEST, SharedFileStore
from fleetlog.events import decode, encode, envelope
from fleetlog.events.model import NodeHeartbeat
from fleetlog.log.base import DECISIONS, INPUTS, LogError, Message
from fleetlog.log.file import INTENT_NAME
from fleetlog.service.config import load_config
from tests.core.builders import node
from tests.service.process import ServiceProcess


def beats(prefix: str, count: int) -> list[Message]:
    return [Message(encode(envelope(node(f"{prefix}{i:05d}"), "test-backend"))) for i in range(count)]


async def names(store: SharedFileStore) -> list[str]:
    end = await store.log(INPUTS).end_offset()
    records = await store.log(INPUTS).read(0, end + 1)
    events = [decode(r.value, r.header("content-type")).event for r in records]
    return [e.node for e in events if isinstance(e, NodeHeartbeat)]


@pytest.fixture
async def shared(tmp_path: Path) -> AsyncIterator[SharedFileStore]:
    store = SharedFileStore(load_config(None, {}, log_dir=str(tmp_path / "log")))
    yield store
    await store.close()


async def test_appends_go_through_the_service_in_order_at_and_past_the_request_bound(
    tmp_path: Path, shared: SharedFileStore
) -> None:
    # the service refuses a request of more events than the backend sends in one: it must split
    limit = {"FLEETLOG_SERVICE_MAX_REQUEST_EVENTS": str(EVENTS_PER_REQUEST)}
    service = ServiceProcess(tmp_path / "service.out", ["--log", str(tmp_path / "log")], limit).start()
    try:
        address = service.address()
        service.wait_leading()
        await shared.open()
        assert shared.describe() == f"the running service at http://{address}/v1/events"
        sizes = [1, EVENTS_PER_REQUEST - 1, EVENTS_PER_REQUEST, EVENTS_PER_REQUEST + 1,
                 2 * EVENTS_PER_REQUEST + 501]
        expected: list[str] = []
        for n, size in enumerate(sizes):
            batch = beats(f"b{n}-", size)
            first = await shared.log(INPUTS).append(batch)
            assert first == len(expected)
            expected += [f"b{n}-{i:05d}" for i in range(size)]
        assert await names(shared) == expected
        assert await shared.log(INPUTS).append([]) == len(expected)
        with pytest.raises(LogError, match="only to the inputs log, not decisions"):
            await shared.log(DECISIONS).append(beats("x", 1))
        with pytest.raises(LogError, match="only the scheduling service appends decisions"):
            await shared.append_transactional(DECISIONS, [], group="g", consumed=0)
    finally:
        assert service.stop() == 0, service.tail()


async def test_alone_it_writes_the_log_hands_it_to_a_service_and_takes_it_back(
    tmp_path: Path, shared: SharedFileStore
) -> None:
    log = tmp_path / "log"
    await shared.open()  # no service: the backend writes the (new) log itself
    assert shared.describe() == f"the file log at {log}"
    await shared.log(INPUTS).append(beats("alone-", 3))
    service = ServiceProcess(tmp_path / "service.out", ["--log", str(log)], {}).start()
    try:
        address = service.address()
        while not (log / INTENT_NAME).exists():  # the service waits for the lock the backend holds
            service._check_alive()
            await asyncio.sleep(0.05)
        await shared.log(INPUTS).append(beats("handed-", 2))  # hands the log over, then goes to it
        assert shared.describe() == f"the running service at http://{address}/v1/events"
        assert service.wait_leading()["inputs_offset"] >= 0
        await shared.log(INPUTS).append(beats("served-", 2))
    finally:
        assert service.stop() == 0, service.tail()
    await shared.log(INPUTS).append(beats("after-", 1))  # the service is gone: the log again
    assert shared.describe() == f"the file log at {log}"
    assert await names(shared) == ["alone-00000", "alone-00001", "alone-00002", "handed-00000",
                                   "handed-00001", "served-00000", "served-00001", "after-00000"]


async def test_an_event_the_service_refuses_is_left_out_and_the_rest_of_its_request_goes_in(
    tmp_path: Path, shared: SharedFileStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A job id taken under another spec (409 ``already_exists``) must not stop the backend nor
    hold back the other events of its request: it is left out with a warning naming it, the rest
    are appended in order.  A pod group no host can ever hold is not refused (the backend's
    requests say ``fleetlog-never-fits: accept``): it goes in, and is explained as never fitting."""
    from tests.core.builders import job
    from tests.service.test_service import serving

    async with serving(tmp_path / "log") as running:
        await shared.open()
        assert shared.describe().startswith("the running service at http://")
        await shared.log(INPUTS).append(beats("n", 2))
        loop = running.service.loop
        assert loop is not None
        await running.until(lambda: loop.offset == 2)

        def message(event: object) -> Message:
            return Message(encode(envelope(event, "test-backend")))  # type: ignore[arg-type]

        batch = [message(job("ok", tasks=8, topology="host")), message(node("n3")),
                 message(job("huge", tasks=16, topology="host")), message(node("n4")),
                 message(job("ok", tasks=8, topology="host", priority=5)), message(node("n5"))]
        first = await shared.log(INPUTS).append(batch)
        assert first == 2
        end = await shared.log(INPUTS).end_offset()
        records = await shared.log(INPUTS).read(0, end + 1)
        events = [decode(r.value, r.header("content-type")).event for r in records]
        assert [e.node if isinstance(e, NodeHeartbeat) else getattr(e, "job_id", "?") for e in events] == [
            "n00000", "n00001", "ok", "n3", "huge", "n4", "n5"]
        warned = [r.getMessage() for r in caplog.records if r.name == "fleetlog.backends"]
        assert [w for w in warned if "left out" in w and "already exists" in w], warned
        assert not [w for w in warned if "never fit" in w], warned
        await running.until(lambda: loop.offset == end)
        status, found = await running.request("/v1/jobs/huge")
        assert (status, found["pending_reason"]) == (200, "never_fits"), found
