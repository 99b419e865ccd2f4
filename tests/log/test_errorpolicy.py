"""The one retry policy (:mod:`fleetlog.log.errorpolicy`): what the service's cycle and the backends'
steps are retried with.  The waits are recorded by the sleep handed in (the policy takes its
clock as an input), the failures are real exceptions of the classes the policy names."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from tenacity import RetryCallState

from fleetlog.log import errorpolicy
from fleetlog.log.base import LogError
from fleetlog.log.file import CorruptLogError


class Behind(RuntimeError):
    """A caller's own class of fault an operator must fix (as the service's ``LogBehindError``)."""


class Fatal(Exception):
    """A caller's fault that must end it (as the service's ``BindError``)."""


class Recorder:
    """The report and the sleep of a retry loop, recorded; stops after ``limit`` failures."""

    def __init__(self, limit: int = 50) -> None:
        self.limit = limit
        self.reports: list[tuple[str, str, int, float]] = []  # (status, error type, attempt, wait)
        self.slept: list[float] = []

    def report(self, state: RetryCallState, status: str, action: str) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        assert action
        self.reports.append((status, type(error).__name__, state.attempt_number, state.upcoming_sleep))

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)

    def stopped(self) -> bool:
        return len(self.reports) >= self.limit


def retrier(rec: Recorder, **options: Any) -> errorpolicy.Retrier:
    return errorpolicy.Retrier(rec.report, stopped=rec.stopped, sleep=rec.sleep, **options)


def failing(*errors: BaseException) -> tuple[list[int], Callable[[], Awaitable[None]]]:
    """A call that raises ``errors`` in turn, then succeeds; and how often it was called."""
    calls: list[int] = []

    async def call() -> None:
        calls.append(1)
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]

    return calls, call


async def test_a_fault_that_may_pass_backs_off_and_one_an_operator_must_fix_is_rechecked_slowly() -> None:
    rec = Recorder()
    calls, call = failing(LogError("away"), LogError("away"), LogError("away"), CorruptLogError("torn"))
    assert await retrier(rec).run(call)
    assert len(calls) == 5
    assert [r[:3] for r in rec.reports] == [("retrying", "LogError", 1), ("retrying", "LogError", 2),
                                            ("retrying", "LogError", 3), ("stalled", "CorruptLogError", 4)]
    waits = [r[3] for r in rec.reports]
    assert rec.slept == waits
    assert 0.1 <= waits[0] <= 0.35
    assert 0.2 <= waits[1] <= 0.45
    assert 0.4 <= waits[2] <= 0.65
    assert errorpolicy.STALL_RECHECK_S <= waits[3] <= errorpolicy.STALL_RECHECK_S + 0.5


async def test_the_callers_own_stalled_classes_and_retry_wait_are_used() -> None:
    rec = Recorder()
    _, call = failing(Behind("the log lost records"), LogError("away"))
    run = retrier(rec, stalled=((Behind, "restore the log"),), retry_wait=lambda _: 7.0)
    assert await run.run(call)
    assert [r[:2] for r in rec.reports] == [("stalled", "Behind"), ("retrying", "LogError")]
    assert 1.0 <= rec.slept[0] <= 1.5
    assert rec.slept[1] == 7.0
    unexpected = Recorder()
    _, call = failing(Behind("the log lost records"))
    assert await retrier(unexpected).run(call)
    assert unexpected.reports[0][0] == "stalled"  # without the caller's class: an unexpected error


async def test_a_fatal_class_is_raised_at_once_never_retried_or_reported() -> None:
    rec = Recorder()
    calls, call = failing(LogError("away"), Fatal("cannot serve"))
    with pytest.raises(Fatal, match="cannot serve"):
        await retrier(rec, fatal=(Fatal,)).run(call)
    assert len(calls) == 2
    assert [r[1] for r in rec.reports] == ["LogError"]


async def test_a_call_that_recovered_backs_off_from_the_start_at_its_next_failure() -> None:
    rec = Recorder()
    run = retrier(rec)
    calls: list[int] = []

    async def cycle() -> None:  # fails 4 times before it leads; leads; then fails once more
        calls.append(1)
        if len(calls) <= 4:
            raise OSError("not yet")
        if len(calls) == 5:
            run.recovered()
            raise LogError("lost it while serving")

    assert await run.run(cycle)
    assert [(r[1], r[2]) for r in rec.reports] == [
        ("OSError", 1), ("OSError", 2), ("OSError", 3), ("OSError", 4), ("LogError", 1)]
    assert rec.slept[-1] <= errorpolicy.RETRY_INITIAL_S + 0.25  # the first wait again, not the fifth


async def test_without_recovered_the_attempts_keep_counting() -> None:
    rec = Recorder()
    _, call = failing(*(OSError("not yet") for _ in range(5)))
    assert await retrier(rec).run(call)
    assert [r[2] for r in rec.reports] == [1, 2, 3, 4, 5]


async def test_stopped_while_failing_is_false_and_a_cancel_is_never_swallowed() -> None:
    rec = Recorder(limit=3)
    calls, call = failing(*(LogError("away") for _ in range(10)))
    assert not await retrier(rec).run(call)
    assert len(calls) == 4  # the failure after the stop is not reported, nor waited on
    assert len(rec.reports) == len(rec.slept) == 3

    async def cancelled() -> None:
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await retrier(Recorder()).run(cancelled)


async def test_persist_keeps_its_signature_and_takes_the_new_options() -> None:
    rec = Recorder()
    _, call = failing(Behind("x"), LogError("y"))
    assert await errorpolicy.persist(call, rec.report, stopped=rec.stopped, sleep=rec.sleep,
                                     stalled=((Behind, "restore it"),), retry_wait=lambda _: 0.5)
    assert [r[:2] for r in rec.reports] == [("stalled", "Behind"), ("retrying", "LogError")]
    assert rec.slept[1] == 0.5
    rec = Recorder()
    _, call = failing(Fatal("no"))
    with pytest.raises(Fatal):
        await errorpolicy.persist(call, rec.report, stopped=rec.stopped, fatal=(Fatal,))
    rec = Recorder(limit=2)
    _, call = failing(*(ValueError("odd") for _ in range(5)))
    assert not await errorpolicy.persist(call, rec.report, stopped=rec.stopped, sleep=rec.sleep,
                                         retryable=(ValueError,))
    assert [r[0] for r in rec.reports] == ["retrying", "retrying"]
