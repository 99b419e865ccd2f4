"""One way to wait for an event with a time limit."""

from __future__ import annotations

import asyncio


async def event_or_timeout(event: asyncio.Event, seconds: float) -> bool:
    """Wait until ``event`` is set or ``seconds`` pass; whether it is set. Through
    ``asyncio.timeout``, not ``wait_for``: Python 3.11's ``wait_for`` swallows a cancellation that
    arrives as the event wakes the wait, and the cancelled task runs on (found as a 60 s test
    teardown: a log read woken by an append; tests/log/test_contract.py)."""
    try:
        async with asyncio.timeout(seconds):
            await event.wait()
    except TimeoutError:
        pass
    return event.is_set()
