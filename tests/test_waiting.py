"""``fleetlog.waiting.event_or_timeout``: the one timed wait on an event (logs' reads, the
services' and backends' sleeps between steps)."""

from __future__ import annotations

import asyncio

import pytest

from fleetlog.waiting import event_or_timeout


def test_it_says_whether_the_event_was_set() -> None:
    async def main() -> tuple[bool, bool]:
        event = asyncio.Event()
        late = await event_or_timeout(event, 0.01)
        asyncio.get_running_loop().call_later(0.01, event.set)
        return late, await event_or_timeout(event, 5)

    assert asyncio.run(main()) == (False, True)


def test_a_cancellation_that_comes_as_the_event_is_set_is_not_swallowed() -> None:
    """The event set and the waiting task cancelled in the same turn: the task ends cancelled
    (3.11's ``asyncio.wait_for`` returned normally here, and the task ran on)."""

    async def main() -> None:
        event, after = asyncio.Event(), []

        async def sleeper() -> None:
            await event_or_timeout(event, 5)
            after.append("ran on")

        task = asyncio.create_task(sleeper())
        await asyncio.sleep(0)
        event.set()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert after == []

    asyncio.run(main())
