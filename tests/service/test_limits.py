"""Submissions per second per tenant (issue 22): the bucket at its limits, and a real service that
answers 429 with ``Retry-After`` to one tenant while others go on."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest

from fleetlog.client import HttpTransport
from fleetlog.events import envelope
from fleetlog.service.auth import entry_toml
from fleetlog.service.config import AuthSettings, Config, LogConfig, ServiceSettings
from fleetlog.service.limits import FORGET_EVERY, SubmissionRates
from tests.core.builders import job, node
from tests.service.test_auth import acall, tokens_file
from tests.service.test_authz import PEOPLE, POLICY, TOKENS, secret, send
from tests.service.test_service import Running, events_body, start


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_bucket_holds_the_burst_and_refills_at_the_rate() -> None:
    clock = Clock()
    rates = SubmissionRates(2.0, 3, clock)
    assert rates.take({"a": 3}) is None
    limited = rates.take({"a": 1})
    assert limited is not None
    assert (limited.tenant, limited.retry_after_s) == ("a", 1)
    assert "tenant 'a'" in limited.message
    assert "max_submissions_per_s" in limited.message
    assert rates.take({"b": 3}) is None  # another tenant is not held back
    clock.now += 0.499
    assert rates.take({"a": 1}) is not None
    clock.now += 0.001
    assert rates.take({"a": 1}) is None  # exactly one refilled
    clock.now += 1000
    assert rates.take({"a": 3}) is None  # never more than the burst however long it waited
    assert rates.take({"a": 1}) is not None


def test_a_request_takes_from_every_tenant_or_from_none() -> None:
    clock = Clock()
    rates = SubmissionRates(1.0, 2, clock)
    assert rates.take({"b": 2}) is None
    limited = rates.take({"a": 2, "b": 1})
    assert limited is not None
    assert limited.tenant == "b"
    assert rates.take({"a": 2}) is None  # nothing was taken from a above


def test_more_than_the_burst_waits_for_a_full_bucket_then_leaves_a_debt() -> None:
    clock = Clock()
    rates = SubmissionRates(1.0, 2, clock)
    assert rates.take({"a": 1}) is None
    limited = rates.take({"a": 5})
    assert limited is not None
    assert limited.retry_after_s == 1  # until the bucket is full again
    clock.now += 1
    assert rates.take({"a": 5}) is None  # a full bucket lets a job set larger than the burst in
    limited = rates.take({"a": 1})
    assert limited is not None
    assert limited.retry_after_s == 4  # the debt of 3, then one more
    clock.now += 3.999
    assert rates.take({"a": 1}) is not None
    clock.now += 0.001
    assert rates.take({"a": 1}) is None


@pytest.mark.parametrize(("rate", "wanted", "wait"), [(0.5, 1, 2), (0.3, 1, 4), (1000.0, 1, 1), (3.0, 3, 1)])
def test_retry_after_is_the_whole_seconds_until_it_fits_and_at_least_one(
    rate: float, wanted: int, wait: int
) -> None:
    clock = Clock()
    rates = SubmissionRates(rate, 3, clock)
    assert rates.take({"a": 3}) is None
    limited = rates.take({"a": wanted})
    assert limited is not None
    assert limited.retry_after_s == wait
    clock.now += wait
    assert rates.take({"a": wanted}) is None  # after Retry-After it fits


def test_a_bad_rate_or_burst_is_refused() -> None:
    for rate, burst in [(0.0, 1), (-1.0, 1), (1.0, 0)]:
        with pytest.raises(ValueError, match="rate > 0 and a burst >= 1"):
            SubmissionRates(rate, burst)


def test_full_buckets_are_forgotten_so_the_table_stays_small() -> None:
    clock = Clock()
    rates = SubmissionRates(10.0, 10, clock)
    for i in range(FORGET_EVERY - 1):
        assert rates.take({f"t{i}": 1}) is None
    assert len(rates) == FORGET_EVERY - 1
    clock.now += 0.05  # half a submission back each: none full yet
    assert rates.take({"x": 1}) is None
    assert len(rates) == FORGET_EVERY
    clock.now += 1
    for _ in range(FORGET_EVERY):
        rates.take({"y": 1})
    assert len(rates) == 1  # only y, still in debt, is kept


def test_no_tenant_gets_more_than_the_burst_plus_the_rate_over_any_generated_run() -> None:
    """Generated runs (seeded): over every window the accepted submissions of a tenant stay
    within burst + rate x window, and a refused request was truly short of its tenant's tokens."""
    for seed in range(40):
        draw = random.Random(seed)
        rate, burst = draw.choice([0.2, 1.0, 3.5, 50.0]), draw.randint(1, 20)
        clock = Clock()
        rates = SubmissionRates(rate, burst, clock)
        accepted: list[tuple[float, str, int]] = []
        for _ in range(400):
            clock.now += draw.choice([0.0, 0.0, 0.001, 0.1, 0.5, 2.0, 30.0])
            counts = {t: draw.randint(1, burst) for t in draw.sample(["a", "b", "c"], draw.randint(1, 3))}
            if rates.take(counts) is None:
                accepted.extend((clock.now, t, n) for t, n in counts.items())
        for tenant in "abc":
            mine = [(at, n) for at, t, n in accepted if t == tenant]
            for i, (first, _) in enumerate(mine):
                taken = 0
                for at, n in mine[i:]:
                    taken += n
                    assert taken <= burst + rate * (at - first) + 1e-6, (seed, tenant, first, at)


async def limited_service(tmp_path: Path, rate: float, burst: int) -> Running:
    tokens = tokens_file(tmp_path / "tokens.toml", *(entry_toml(who, TOKENS[who], None) for who in PEOPLE))
    config = Config(log=LogConfig(dir=str(tmp_path / "log"), fsync="never"),
                    service=ServiceSettings(http_port=0, idle_wait_ms=20, max_submissions_per_s=rate,
                                            max_submission_burst=burst),
                    auth=AuthSettings(tokens_file=str(tokens),
                                      policy_file=str(secret(tmp_path / "policy.toml", POLICY))))
    return await start(config)


async def test_a_tenant_past_its_rate_gets_429_with_retry_after_and_others_go_on(tmp_path: Path) -> None:
    running = await limited_service(tmp_path, 0.5, 2)
    try:
        assert (await send(running, "alice", job("a1", tenant="a"), job("a2", tenant="a")))[0] == 200
        end = await running.inputs_end()
        status, headers, raw = await acall(running.url + "/v1/events", TOKENS["alice"],
                                           events_body(job("a3", tenant="a")), "POST")
        answer = json.loads(raw)
        assert (status, answer["code"], answer["tenant"], answer["limit"]) == (
            429, "too_many_submissions", "a", 0.5), answer
        assert headers["Retry-After"] == "2"
        assert await running.inputs_end() == end  # nothing appended
        assert (await send(running, "bob", job("b1", tenant="b"), job("b2", tenant="b")))[0] == 200
        assert (await send(running, "alice", job("a1", tenant="a")))[0] == 200  # a duplicate: not counted
        assert (await send(running, "alice", job("a1", tenant="a")))[0] == 200
        backend = job("o1", tenant="a", cells=("c2",))
        assert (await send(running, "agent2", backend))[0] == 429  # a backend of a cell with no node: limited
        assert (await send(running, "agent2", node("n2", cell="c2")))[0] == 200
        await running.until(lambda: running.service.loop is not None
                            and running.service.loop.state.names["cell"].get("c2") >= 0)
        assert (await send(running, "agent2", backend))[0] == 200  # a backend of its own cell: not limited
        metrics = (await acall(running.url + "/metrics", TOKENS["reader"]))[2].decode()
        assert "fleetlog_http_rate_limited_total 2.0" in metrics
    finally:
        await running.stop()


async def test_the_client_waits_out_retry_after_and_its_submission_lands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    running = await limited_service(tmp_path, 1.0, 1)
    try:
        monkeypatch.setenv("FLEETLOG_TOKEN", TOKENS["alice"])
        transport = HttpTransport("127.0.0.1", running.service.http.port)
        try:
            await transport.deliver([envelope(job("a1", tenant="a"), "k-a1")])
            started = time.monotonic()
            sent = await transport.deliver([envelope(job("a2", tenant="a"), "k-a2")])
            assert sent.appended == 1
            assert time.monotonic() - started >= 0.9  # it waited for Retry-After, then landed
        finally:
            await transport.close()
        assert await running.inputs_end() == 2  # both submissions, once each
    finally:
        await running.stop()

