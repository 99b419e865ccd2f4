"""One error policy for every loop that reads the logs: the service and the backends.

A fault that may pass by itself (a lost connection, an OS error, a backend's cluster away) is
*retrying*: tried again with exponential back-off.  One an operator must fix (a decisions record
this build cannot read, a damaged segment, an unexpected exception) is *stalled*: the loop keeps
its place, says what and where once, and re-checks every few seconds, so it resumes by itself
once the log is restored.  Nothing here skips a record: a decision not acted on is an
operator's call, never the loop's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    RetryError,
    retry_if_exception_type,
    wait_exponential_jitter,
)

from fleetlog.log.base import LogError
from fleetlog.log.consumer import CorruptDecisionsError
from fleetlog.log.file import CorruptLogError

Action = tuple[type[BaseException], str]
RETRY_INITIAL_S: Final = 0.1
RETRY_MAX_S: Final = 5.0
"""A fault that may pass is retried after 0.1, 0.2, 0.4 … s, at most 5 s, plus up to 0.25 s jitter."""
STALL_RECHECK_S: Final = 5.0
"""A fault an operator must fix is re-checked after 1, 2, 4, then every 5 s (plus up to 0.5 s jitter)."""
RETRYING: Final = "retried with exponential back-off (jittered, at most 5 s)"
UNEXPECTED: Final = "unexpected error (see the stalled line in the log); re-checked every few seconds"
STALLED: Final[tuple[Action, ...]] = (
    (CorruptDecisionsError, "the decisions log holds a record this build cannot read: restore the log "
                            "or run a build that reads it; re-checked every few seconds"),
    (CorruptLogError, "restore the damaged segment or move it away; re-checked every few seconds"),
)


def classify(
    exc: BaseException, stalled: Sequence[Action] = (), retryable: tuple[type[BaseException], ...] = ()
) -> tuple[str, str]:
    """``(status, action)``: ``stalled`` for what needs an operator (``stalled`` first, then the
    log's own), ``retrying`` for a log, OS or ``retryable`` fault, ``stalled`` for anything else
    (retrying it blindly would spin; exiting would lose the place and the reporting)."""
    for kind, action in (*stalled, *STALLED):
        if isinstance(exc, kind):
            return "stalled", action
    if isinstance(exc, (LogError, OSError, *retryable)):
        return "retrying", RETRYING
    return "stalled", UNEXPECTED


def backoff() -> Callable[[RetryCallState], float]:
    """The wait before retrying a fault that may pass (the ``attempt``-th in a row)."""
    return wait_exponential_jitter(multiplier=RETRY_INITIAL_S, max=RETRY_MAX_S, jitter=0.25)


def recheck() -> Callable[[RetryCallState], float]:
    """The wait before re-checking a fault an operator must fix."""
    return wait_exponential_jitter(multiplier=1.0, max=STALL_RECHECK_S, jitter=0.5)


def where(exc: BaseException) -> tuple[str, int | None]:
    """The log and offset an error names, when it names one (``("", None)`` otherwise)."""
    if isinstance(exc, CorruptDecisionsError):
        return "decisions", exc.offset
    return "", None


async def persist(
    call: Callable[[], Awaitable[object]],
    report: Callable[[RetryCallState, str, str], None],
    *,
    stopped: Callable[[], bool],
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    retryable: tuple[type[BaseException], ...] = (),
    retry_wait: Callable[[RetryCallState], float] | None = None,
) -> bool:
    """``call()`` until it succeeds (``True``), each failure classified, reported (``report(state, status,
    action)``, ``state.upcoming_sleep`` set) and waited on as its class calls for; ``False`` once
    ``stopped()``.  A backend's loop step goes through here instead of an ``except`` of its own."""
    fast, slow = retry_wait or backoff(), recheck()

    def status(state: RetryCallState) -> tuple[str, str]:
        exc = state.outcome.exception() if state.outcome is not None else None
        return classify(exc, retryable=retryable) if exc is not None else ("retrying", RETRYING)

    def wait(state: RetryCallState) -> float:
        return float(slow(state) if status(state)[0] == "stalled" else fast(state))

    retrying = AsyncRetrying(
        retry=retry_if_exception_type(Exception), wait=wait, sleep=sleep,
        stop=lambda _: stopped(), before_sleep=lambda state: report(state, *status(state)),
    )
    async def attempt() -> None:  # a coroutine function: tenacity would not await a lambda's coroutine
        await call()

    try:
        await retrying(attempt)
    except RetryError:  # stopped while failing
        return False
    return True
