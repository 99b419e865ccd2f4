"""Dry runs cannot halt the scheduler (issue 46): ``POST /v1/dry-run`` runs off the event loop on a
copy taken between steps, is bounded as ingest is (request and answer), and is rate-limited per
principal (docs/api.md, "Dry run: would it fit now?")."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp
import msgspec

from fleetlog.api.dryrun import MAX_LISTED_TASKS, dry_run
from fleetlog.core.fold import fold
from fleetlog.core.policy import policy_named
from fleetlog.core.state import State
from fleetlog.log.location import LogConfig
from fleetlog.service.auth import entry_toml, new_token
from fleetlog.service.config import AuthSettings, Config, ServiceSettings
from tests.core.builders import job, node
from tests.service.test_auth import acall, call, tokens_file
from tests.service.test_service import Running, events_body, serving, start


async def post(session: aiohttp.ClientSession, url: str, body: bytes
               ) -> tuple[int, dict[str, str], Any, float]:
    """(status, headers, JSON answer, seconds) of one POST."""
    started = time.monotonic()
    async with session.post(url, data=body, headers={"content-type": "application/json"}) as r:
        answer = await r.json(content_type=None)
        return r.status, dict(r.headers), answer, time.monotonic() - started


async def fleet_of(running: Running, nodes: int) -> None:
    body = events_body(*(node(f"n{i}", gpus=8) for i in range(nodes)))
    assert (await running.request("/v1/events", body))[0] == 200
    loop = running.service.loop
    assert loop is not None
    await running.until(lambda: loop.offset == nodes)


async def test_the_attack_body_of_a_thousand_jobs_of_ten_thousand_tasks_is_refused_at_once(
    tmp_path: Path
) -> None:
    """The 114 KB body that held the loop 54 s and answered 499 MB: a 413 naming the bound, in
    seconds (ingest's ``max_request_tasks``), the loop untouched."""
    async with serving(tmp_path / "log") as running:
        await fleet_of(running, 4)
        attack = events_body(*(job(f"a{i}", gpus=0, cpu=1, mem=1, tasks=10_000) for i in range(1000)))
        assert 100_000 < len(attack) < 200_000
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            status, _, answer, seconds = await post(session, running.url + "/v1/dry-run", attack)
        assert (status, answer["code"]) == (413, "too_many_tasks"), answer
        assert "over 100000 tasks" in answer["message"], answer
        assert "max_request_tasks" in answer["message"], answer
        assert seconds < 5, seconds
        status, small = await running.request("/v1/dry-run", events_body(job("d1", gpus=8)))
        assert (status, small["items"][0]["outcome"]) == (200, "placed")


async def test_health_and_submissions_answer_while_a_big_dry_run_runs(tmp_path: Path) -> None:
    """A dry run of a million tasks (allowed here) takes seconds; meanwhile health and a
    submission answer within a second, the loop folds and decides that submission, and the same
    principal's second dry run is 429 (one in flight).  The clients run in threads of their own:
    their clocks go on whatever the service's event loop does."""
    async with serving(tmp_path / "log", max_request_tasks=1_000_000) as running:
        await fleet_of(running, 200)
        big = events_body(*(job(f"b{i}", gpus=0, cpu=1, mem=1, tasks=1000) for i in range(1000)))
        ended = threading.Event()
        dry = asyncio.to_thread(_timed_call, running.url + "/v1/dry-run", big, ended)
        probe = asyncio.to_thread(_probe, running.url, ended)
        (status, _, answer, took), seen = await asyncio.gather(dry, probe)
    assert status == 200, answer
    assert took > 1.5, f"the dry run took {took:.2f} s: too small to show anything"
    assert seen["submitted"][0] == 200, seen
    assert seen["submitted"][3] < 1.0, seen
    assert seen["slowest_health_s"] < 1.0, seen
    assert seen["decided_during"], seen
    second = seen["second"]
    assert (second[0], second[2]["code"]) == (429, "too_many_dry_runs"), second
    assert "in flight" in second[2]["message"]
    assert second[1]["Retry-After"] == "1"
    assert len(answer["items"]) == 1000
    assert sum(len(item["tasks"]) for item in answer["items"]) <= MAX_LISTED_TASKS


def _timed_call(url: str, body: bytes | None = None, ended: threading.Event | None = None
                ) -> tuple[int, dict[str, str], Any, float]:
    """(status, headers, JSON answer, seconds) of one request (a POST with ``body``); sets ``ended``."""
    started = time.monotonic()
    request = urllib.request.Request(url, data=body, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            status, headers, raw = r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as exc:
        status, headers, raw = exc.code, dict(exc.headers), exc.read()
    finally:
        if ended is not None:
            ended.set()
    return status, headers, json.loads(raw), time.monotonic() - started


def _probe(url: str, ended: threading.Event) -> dict[str, Any]:
    """Health, a submission, a second dry run and the submission's job, asked while ``ended`` is
    not set."""
    time.sleep(0.3)  # (the dry run's body is read and it is deciding)
    seen: dict[str, Any] = {"slowest_health_s": 0.0, "decided_during": False}
    seen["submitted"] = _timed_call(url + "/v1/events", events_body(job("s1", gpus=1)))
    seen["second"] = _timed_call(url + "/v1/dry-run", events_body(job("d2", gpus=1)))
    while not ended.is_set():
        health = _timed_call(url + "/healthz")
        seen["slowest_health_s"] = max(seen["slowest_health_s"], health[3])
        placed = _timed_call(url + "/v1/jobs/s1")
        if placed[0] == 200 and placed[2]["state"] == "placed" and not ended.is_set():
            seen["decided_during"] = True
        time.sleep(0.05)
    return seen


PEOPLE = ("alice", "bob")
TOKENS = {who: new_token() for who in PEOPLE}


async def test_a_principal_over_its_dry_run_rate_gets_429_with_retry_after(tmp_path: Path) -> None:
    tokens = tokens_file(tmp_path / "tokens.toml", *(entry_toml(who, TOKENS[who], None) for who in PEOPLE))
    config = Config(log=LogConfig(dir=str(tmp_path / "log"), fsync="never"),
                    service=ServiceSettings(http_port=0, idle_wait_ms=20, max_dry_runs_per_s=0.01,
                                            max_dry_run_burst=2),
                    auth=AuthSettings(tokens_file=str(tokens)))
    running = await start(config)
    try:
        url = running.url + "/v1/dry-run"
        body = events_body(job("d1", gpus=1))
        for _ in range(2):
            status, _, raw = await acall(url, TOKENS["alice"], body, "POST")
            assert status == 200, raw
        status, headers, raw = await acall(url, TOKENS["alice"], body, "POST")
        refused = json.loads(raw)
        assert (status, refused["code"], refused["principal"]) == (429, "too_many_dry_runs", "alice"), refused
        assert int(headers["Retry-After"]) >= 1
        assert "max_dry_runs_per_s" in refused["message"]
        status, _, raw = await acall(url, TOKENS["bob"], body, "POST")  # another principal's own bucket
        assert status == 200, raw
        assert running.service.dry_runs.copies == 1  # (the state did not move: its copy was reused)
    finally:
        await running.stop()


def test_the_answer_lists_at_most_so_many_placements_and_says_what_it_cut() -> None:
    state = State()
    for i in range(200):
        fold(state, node(f"n{i}", gpus=8), 1)
    jobs = [job(f"p{i}", gpus=0, cpu=1, mem=1, tasks=4_000) for i in range(25)]  # 100,000 tasks, all placed
    answer = dry_run(state, policy_named("default"), jobs)
    items = answer.items
    assert [item.outcome for item in items] == ["placed"] * 25
    listed = [len(item.tasks) for item in items]
    assert sum(listed) == MAX_LISTED_TASKS
    assert listed[:3] == [4000, 4000, 2000]
    assert set(listed[3:]) == {0}
    assert [item.tasks_omitted for item in items[:4]] == [msgspec.UNSET, msgspec.UNSET, 2000, 4000]
    encoded = msgspec.json.encode(answer)
    assert len(encoded) < 2_000_000, len(encoded)
    assert b"tasks_omitted" not in msgspec.json.encode(dry_run(state, policy_named("default"), jobs[:2]))


async def test_past_eight_dry_runs_running_or_waiting_the_next_is_429_busy(tmp_path: Path) -> None:
    """One worker for the whole service: while one principal's dry run decides, seven others'
    wait, and the ninth is refused (the waiting ones are answered once the worker is free)."""
    who = [f"p{i}" for i in range(9)]
    secrets = {name: new_token() for name in who}
    tokens = tokens_file(tmp_path / "tokens.toml", *(entry_toml(name, secrets[name], None) for name in who))
    config = Config(log=LogConfig(dir=str(tmp_path / "log"), fsync="never"),
                    service=ServiceSettings(http_port=0, idle_wait_ms=20, max_request_tasks=1_000_000),
                    auth=AuthSettings(tokens_file=str(tokens)))
    running = await start(config)
    try:
        nodes = events_body(*(node(f"n{i}", gpus=8) for i in range(200)))
        assert (await acall(running.url + "/v1/events", secrets["p0"], nodes, "POST"))[0] == 200
        await running.until(lambda: running.service.loop is not None and running.service.loop.offset == 200)
        url = running.url + "/v1/dry-run"
        big = events_body(*(job(f"b{i}", gpus=0, cpu=1, mem=1, tasks=1000) for i in range(400)))
        with ThreadPoolExecutor(max_workers=len(who)) as threads:  # (at once: the default pool is smaller)
            asked = asyncio.get_running_loop().run_in_executor
            first = asked(threads, call, url, secrets["p0"], big, "POST")
            await asyncio.sleep(0.5)
            small = events_body(job("d1", gpus=1))
            answers = await asyncio.gather(*(asked(threads, call, url, secrets[name], small, "POST")
                                             for name in who[1:]))
            status, _, raw = await first
    finally:
        await running.stop()
    assert status == 200, raw
    assert sorted(answer[0] for answer in answers) == [200] * 7 + [429], answers
    busy = next(answer for answer in answers if answer[0] == 429)
    assert json.loads(busy[2])["code"] == "busy", busy
    assert busy[1]["Retry-After"] == "1"
