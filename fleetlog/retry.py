"""Waiting, one way: back-off delays with jitter (:class:`Backoff`), a call retried while its
error may pass (:func:`retry`), and a probe repeated until its answer is good (:func:`poll`),
each within a time limit.

Both share one rule for the limit: the first attempt is always made, no sleep runs past the
limit (the last is cut short), and one last attempt is made at the limit, so a limit shorter
than a back-off still gets its answer at the limit, not a back-off later.  ``within_s=None``
waits for as long as it takes (a child process's result, a server still starting).  The long
retries of the scheduling loops, with their retrying/stalled reporting, are
:mod:`fleetlog.log.errorpolicy`'s (on tenacity); these are the short waits of one request.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")
_JITTER = random.Random()  # (not the domain's: the order of sleeps decides nothing)
_AT_LIMIT_S = 1e-3
"""Left of the limit after a wake-up, counted as none (a timer may fire a hair early)."""


@dataclass(frozen=True)
class Backoff:
    """Delays ``first_s``, then ``factor`` times more each time up to ``max_s``; each one
    multiplied by a random factor in ``[1 - jitter, 1 + jitter]`` so that processes retrying
    the same server spread out.  ``Backoff(0.05)``: every 0.05 s, no jitter."""

    first_s: float
    max_s: float | None = None
    factor: float = 2.0
    jitter: float = 0.0
    rng: random.Random = field(default=_JITTER, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.first_s < 0 or not 0 <= self.jitter <= 1 or self.factor < 1:
            raise ValueError(f"bad back-off: {self!r} (delays >= 0, factor >= 1, 0 <= jitter <= 1)")

    def delays(self) -> Iterator[float]:
        base = self.first_s
        while True:
            capped = base if self.max_s is None else min(base, self.max_s)
            yield capped * self.rng.uniform(1 - self.jitter, 1 + self.jitter) if self.jitter else capped
            base = capped * self.factor


class _Clock:
    """The time left until ``within_s`` from now (``None``: no limit), on the loop's clock."""

    def __init__(self, within_s: float | None) -> None:
        self.loop = asyncio.get_running_loop()
        self.deadline = None if within_s is None else self.loop.time() + within_s

    def left(self) -> float | None:
        return None if self.deadline is None else self.deadline - self.loop.time()

    async def sleep(self, delay: float) -> bool:
        """Sleep ``delay`` or what is left of the limit; ``False`` when nothing was left."""
        left = self.left()
        if left is not None and left <= _AT_LIMIT_S:
            return False
        await asyncio.sleep(delay if left is None else min(delay, left))
        return True


async def poll(
    probe: Callable[[], Awaitable[T]], done: Callable[[T], bool], *, within_s: float | None,
    backoff: Backoff,
) -> T:
    """``probe()`` until ``done`` of its answer, at most ``within_s`` seconds; its last answer
    (the caller checks ``done`` again to tell success from running out of time)."""
    clock, delays = _Clock(within_s), backoff.delays()
    while True:
        answer = await probe()
        if done(answer) or not await clock.sleep(next(delays)):
            return answer


def always(_: BaseException) -> bool:
    """Every ``Exception`` may pass (a server that is still starting fails in many ways)."""
    return True


async def retry(
    call: Callable[[], Awaitable[T]], retryable: Callable[[BaseException], bool], *,
    within_s: float | None, backoff: Backoff, on_retry: Callable[[BaseException, float], None] | None = None,
) -> T:
    """``call()`` until it returns, retrying an ``Exception`` that ``retryable`` says may pass
    (``on_retry(error, delay)`` before each wait) for at most ``within_s`` seconds; then that
    error is raised.  Any other exception (and ``CancelledError``) is raised at once."""
    clock, delays = _Clock(within_s), backoff.delays()
    while True:
        try:
            return await call()
        except Exception as exc:
            if not retryable(exc):
                raise
            delay = next(delays)
            if on_retry is not None:
                on_retry(exc, delay)
            if not await clock.sleep(delay):
                raise
