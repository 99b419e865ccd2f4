"""The one back-off helper (:mod:`fleetlog.retry`) at its limits: a limit of 0, a limit shorter
than one back-off, jitter at its bounds, errors that must not be retried, no limit at all."""

from __future__ import annotations

import asyncio
import itertools
import random
import time

import pytest

from fleetlog.retry import Backoff, always, poll, retry


class Flaky:
    """Fails with ``error`` the first ``failures`` calls, then answers ``"ok"``; counts calls."""

    def __init__(self, failures: int, error: BaseException) -> None:
        self.failures, self.error, self.calls = failures, error, 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return "ok"


def transient(exc: BaseException) -> bool:
    return isinstance(exc, ConnectionError)


def test_delays_grow_by_the_factor_up_to_the_cap_and_stay_put_without_one() -> None:
    growing = list(itertools.islice(Backoff(0.1, max_s=0.5).delays(), 5))
    assert growing == pytest.approx([0.1, 0.2, 0.4, 0.5, 0.5])
    assert list(itertools.islice(Backoff(0.05, factor=1).delays(), 3)) == [0.05, 0.05, 0.05]
    assert list(itertools.islice(Backoff(0.0).delays(), 3)) == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("jitter", [0.25, 1.0])
def test_jitter_stays_within_its_bounds_and_reaches_both_sides(jitter: float) -> None:
    plain = list(itertools.islice(Backoff(0.1, max_s=2.0).delays(), 2000))
    spread = Backoff(0.1, max_s=2.0, jitter=jitter, rng=random.Random(7))
    jittered = list(itertools.islice(spread.delays(), 2000))
    ratios = [j / p for j, p in zip(jittered, plain, strict=True)]
    assert all(1 - jitter <= r <= 1 + jitter for r in ratios)
    assert min(ratios) < 1 - jitter * 0.9
    assert max(ratios) > 1 + jitter * 0.9
    assert max(jittered) <= 2.0 * (1 + jitter)  # the cap applies before the jitter, never compounds


@pytest.mark.parametrize("bad", [{"first_s": -0.1}, {"jitter": 1.5}, {"jitter": -0.1}, {"factor": 0.5}])
def test_a_back_off_that_cannot_work_is_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="bad back-off"):
        Backoff(**{"first_s": 0.1, **bad})


async def test_a_limit_of_zero_tries_once_and_never_sleeps() -> None:
    flaky = Flaky(1, ConnectionError("refused"))
    started = time.monotonic()
    with pytest.raises(ConnectionError):
        await retry(flaky, transient, within_s=0, backoff=Backoff(10.0))
    assert flaky.calls == 1
    probes: list[int] = []

    async def probe() -> int:
        probes.append(1)
        return len(probes)

    assert await poll(probe, lambda n: n > 5, within_s=0, backoff=Backoff(10.0)) == 1
    assert time.monotonic() - started < 1.0


async def test_a_limit_shorter_than_one_back_off_tries_again_at_the_limit_not_a_back_off_later() -> None:
    flaky = Flaky(5, ConnectionError("refused"))
    started = time.monotonic()
    with pytest.raises(ConnectionError):
        await retry(flaky, transient, within_s=0.2, backoff=Backoff(30.0))
    elapsed = time.monotonic() - started
    assert flaky.calls == 2  # at once, and at the limit
    assert 0.19 <= elapsed < 2.0
    late = Flaky(1, ConnectionError("refused"))
    assert await retry(late, transient, within_s=0.2, backoff=Backoff(30.0)) == "ok"  # the last try counts


async def test_retry_stops_at_the_limit_with_the_last_error_and_reports_each_wait() -> None:
    flaky = Flaky(1000, ConnectionError("still down"))
    waits: list[float] = []
    started = time.monotonic()
    with pytest.raises(ConnectionError, match="still down"):
        await retry(flaky, transient, within_s=0.3, backoff=Backoff(0.05, factor=1),
                    on_retry=lambda _e, delay: waits.append(delay))
    assert 0.29 <= time.monotonic() - started < 2.0
    assert 4 <= flaky.calls <= 8
    assert waits == [0.05] * flaky.calls


@pytest.mark.parametrize("error", [ValueError("a bug, not a passing fault"), KeyError("job")])
async def test_an_error_that_may_not_pass_is_raised_at_once(error: Exception) -> None:
    flaky = Flaky(1, error)
    with pytest.raises(type(error)):
        await retry(flaky, transient, within_s=60, backoff=Backoff(0.01))
    assert flaky.calls == 1


async def test_cancellation_and_base_exceptions_are_never_retried_even_by_always() -> None:
    flaky = Flaky(1, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        await retry(flaky, always, within_s=60, backoff=Backoff(0.01))
    assert flaky.calls == 1
    forever = Flaky(10**9, ConnectionError("down"))
    task = asyncio.create_task(retry(forever, always, within_s=None, backoff=Backoff(0.01)))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert forever.calls >= 2


async def test_without_a_limit_it_waits_as_long_as_it_takes() -> None:
    flaky = Flaky(20, ConnectionError("starting"))
    assert await retry(flaky, always, within_s=None, backoff=Backoff(0.001, max_s=0.005)) == "ok"
    assert flaky.calls == 21
    seen: list[int] = []

    async def probe() -> int:
        seen.append(len(seen))
        return seen[-1]

    assert await poll(probe, lambda n: n == 30, within_s=None, backoff=Backoff(0.001, factor=1)) == 30


async def test_poll_returns_its_last_answer_when_time_runs_out() -> None:
    answers = iter(range(10**6))

    async def probe() -> int:
        return next(answers)

    last = await poll(probe, lambda n: n < 0, within_s=0.2, backoff=Backoff(0.02, factor=1))
    assert 5 <= last <= 12  # probes at 0, 0.02, ... and one at the limit
