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
    retry_if_not_exception_type,
    wait_exponential_jitter,
)

from fleetlog.log.base import LogError
from fleetlog.log.consumer import CorruptDecisionsError
from fleetlog.log.file import CorruptLogError
from fleetlog.log.highwater import ACCEPT_LOSS, LogShorterError

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
    (LogShorterError, ACCEPT_LOSS),  # (before CorruptLogError: a log shorter than it once was, issue 46)
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


class Retrier:
    """:func:`persist` as an object, for a call that runs long and can say part-way through that
    it is well again (:meth:`recovered`): its next failure then backs off from the start, as
    the first of a new run.  The service's lead-recover-serve cycle runs through here.

    ``report(state, status, action)`` is told of every failure before the wait
    (``state.upcoming_sleep`` set); ``stalled`` and ``retryable`` extend :func:`classify`;
    ``fatal`` exceptions are not retried but raised; ``retry_wait`` replaces :func:`backoff`
    for a fault that may pass; ``sleep`` is how to wait (one that returns early on a stop)."""

    def __init__(
        self,
        report: Callable[[RetryCallState, str, str], None],
        *,
        stopped: Callable[[], bool],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        stalled: Sequence[Action] = (),
        retryable: tuple[type[BaseException], ...] = (),
        fatal: tuple[type[BaseException], ...] = (),
        retry_wait: Callable[[RetryCallState], float] | None = None,
    ) -> None:
        self.report, self.stopped, self.sleep = report, stopped, sleep
        self.stalled, self.retryable, self.fatal = stalled, retryable, fatal
        self.fast, self.slow = retry_wait or backoff(), recheck()
        self._state: RetryCallState | None = None

    def status(self, state: RetryCallState) -> tuple[str, str]:
        """``(status, action)`` of the failure ``state`` holds (:func:`classify`)."""
        exc = state.outcome.exception() if state.outcome is not None else None
        return classify(exc, self.stalled, self.retryable) if exc is not None else ("retrying", RETRYING)

    def wait(self, state: RetryCallState) -> float:
        return float(self.slow(state) if self.status(state)[0] == "stalled" else self.fast(state))

    async def run(self, call: Callable[[], Awaitable[object]]) -> bool:
        """``call()`` until it succeeds (``True``) or ``stopped()`` (``False``)."""
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(Exception) & retry_if_not_exception_type(self.fatal),
            wait=self.wait, sleep=self.sleep, stop=lambda _: self.stopped(),
            before_sleep=lambda state: self.report(state, *self.status(state)),
        )
        try:
            async for attempt in retrying:
                with attempt:
                    self._state = attempt.retry_state
                    await call()
        except RetryError:  # stopped while failing
            return False
        finally:
            self._state = None
        return True

    def recovered(self) -> None:
        """The running call is well again: its next failure is the first of a new run."""
        if self._state is not None:
            self._state.attempt_number = 1


async def persist(
    call: Callable[[], Awaitable[object]],
    report: Callable[[RetryCallState, str, str], None],
    *,
    stopped: Callable[[], bool],
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    retryable: tuple[type[BaseException], ...] = (),
    retry_wait: Callable[[RetryCallState], float] | None = None,
    stalled: Sequence[Action] = (),
    fatal: tuple[type[BaseException], ...] = (),
) -> bool:
    """``call()`` until it succeeds (``True``), each failure classified, reported (``report(state, status,
    action)``, ``state.upcoming_sleep`` set) and waited on as its class calls for; ``False`` once
    ``stopped()``.  A backend's loop step goes through here instead of an ``except`` of its own
    (the options: :class:`Retrier`)."""
    return await Retrier(report, stopped=stopped, sleep=sleep, stalled=stalled, retryable=retryable,
                         fatal=fatal, retry_wait=retry_wait).run(call)
