"""What a reader may see (issue 46), on a real service with ``[auth]`` and a policy: tenant alice
reads nothing of bob's jobs on any read route (lists, filters, job detail, both watches), and
bob's ``payload.env`` (a ``WANDB_API_KEY``) reaches only bob and the backend of the cell his job
is held to; ``operator`` and ``reader`` see every job with the env redacted."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest

from fleetlog.api.visibility import REDACTED
from fleetlog.events.model import JobCancelled, JobPayload, JobSubmitted
from fleetlog.service.auth import entry_toml
from fleetlog.service.config import AuthSettings, Config, LogConfig, ServiceSettings
from tests.core.builders import job, node
from tests.service.test_auth import acall, tokens_file
from tests.service.test_authz import PEOPLE, POLICY, TOKENS, policed, secret, send, settled
from tests.service.test_service import Running, start

BOB_KEY, ALICE_KEY = "sk-bob-0123456789abcdef", "sk-alice-fedcba9876543210"


def with_secret(submitted: JobSubmitted, key: str) -> JobSubmitted:
    return msgspec.structs.replace(
        submitted, labels={"team": submitted.tenant},
        annotations={"owner": f"{submitted.tenant}@example.com"},
        payload=JobPayload(command=("python", "train.py"), env={"WANDB_API_KEY": key, "EPOCHS": "3"}))


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[Running]:
    """alice's job held to cell c1, bob's to c2, both placed; a heartbeat last (every viewer sees it)."""
    running = await policed(tmp_path)
    try:
        # (blocks not named b1: node topology is shown, and the probe looks for job b1's id)
        assert (await send(running, "agent1", node("n1", gpus=8, cell="c1", block="blk")))[0] == 200
        assert (await send(running, "agent2", node("n2", gpus=8, cell="c2", block="blk")))[0] == 200
        for who, tenant, cell, key in (("alice", "a", "c1", ALICE_KEY), ("bob", "b", "c2", BOB_KEY)):
            submitted = with_secret(job(f"{tenant}1", tenant=tenant, cells=(cell,)), key)
            assert (await send(running, who, submitted))[0] == 200
        await settled(running)
        await running.until(lambda: _committed(running), timeout_s=180)  # (a cold numba cache compiles first)
        assert (await send(running, "agent1", node("n1", gpus=8, cell="c1", block="blk")))[0] == 200
        await settled(running)
        yield running
    finally:
        await running.stop()


def _committed(running: Running) -> bool:
    loop = running.service.loop
    assert loop is not None
    return loop.committed == loop.offset and loop.state.job_row("b1") >= 0 and \
        int(loop.state.jobs.cols["cell"][loop.state.job_row("b1")]) >= 0


async def get(running: Running, who: str, path: str) -> tuple[int, Any]:
    status, _, raw = await acall(running.url + path, TOKENS[who])
    return status, json.loads(raw)


async def watched(running: Running, who: str, log: str) -> list[dict[str, Any]]:
    """Every event ``who`` is sent by ``GET /v1/watch?log=LOG&from=0`` up to the log's last record
    (read until the frame of the last offset, or a keepalive after it: a record left out has none)."""
    store = running.service.store
    assert store is not None
    last = await store.log(log).end_offset() - 1
    events: list[dict[str, Any]] = []
    headers = {"Authorization": f"Bearer {TOKENS[who]}"}
    async with asyncio.timeout(60), aiohttp.ClientSession() as session, session.get(
            f"{running.url}/v1/watch?log={log}&from=0", headers=headers) as answer:
        assert answer.status == 200, await answer.text()
        async for raw in answer.content:
            line = raw.decode().rstrip("\n")
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
                if events[-1]["offset"] >= last:
                    break
    return events


def jobs_in(events: list[dict[str, Any]]) -> set[str]:
    """The job ids the events name (submissions, cancellations, task reports, decisions)."""
    found: set[str] = set()
    for event in (e["event"] for e in events if "event" in e):
        found.update(str(event[k]) for k in ("job_id", "by_job_id") if event.get(k))
        for decision in event.get("decisions", ()):
            found.update(str(decision[k]) for k in ("job_id", "by_job_id") if decision.get(k))
    return found


def envs(events: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    return {e["event"]["job_id"]: e["event"]["payload"]["env"] for e in events
            if e.get("event", {}).get("type") == "JobSubmitted"}


READS = ("/v1/jobs", "/v1/jobs?tenant=b", "/v1/jobs?label=team=b", "/v1/jobs?cell=c2",
         "/v1/jobs?state=running", "/v1/jobs/b1", "/v1/tenants", "/v1/queues", "/v1/cells", "/v1/nodes")


async def test_a_tenant_reads_nothing_of_another_tenants_jobs_on_any_route(fleet: Running) -> None:
    for path in READS:  # (the probe: bob's key nowhere, his job only as an aggregate)
        status, body = await get(fleet, "alice", path)
        assert BOB_KEY not in json.dumps(body), (path, body)
        assert path.endswith("b1") or "b1" not in json.dumps(body), (path, body)  # (a 404 names the id)
    status, page = await get(fleet, "alice", "/v1/jobs")
    assert status == 200
    assert [i["job_id"] for i in page["items"]] == ["a1"]
    assert page["total"] == 1
    for path in ("/v1/jobs?tenant=b", "/v1/jobs?label=team=b", "/v1/jobs?cell=c2"):
        assert (await get(fleet, "alice", path))[1] == {"items": [], "total": 0, "next_page_token": None}
    # bob's job answers as a job that never was: its existence does not leak
    hidden, never = await get(fleet, "alice", "/v1/jobs/b1"), await get(fleet, "alice", "/v1/jobs/zz")
    assert hidden[0] == never[0] == 404
    assert hidden[1]["code"] == never[1]["code"] == "unknown_job"
    assert hidden[1]["message"].replace("b1", "zz") == never[1]["message"]
    for log in ("inputs", "decisions"):
        events = await watched(fleet, "alice", log)
        assert BOB_KEY not in json.dumps(events), log
        assert "b1" not in jobs_in(events), log
        assert "a1" in jobs_in(events), log
    assert envs(await watched(fleet, "alice", "inputs"))["a1"]["WANDB_API_KEY"] == ALICE_KEY


async def test_a_job_and_its_env_are_its_tenants_and_its_backends(fleet: Running) -> None:
    status, detail = await get(fleet, "bob", "/v1/jobs/b1")
    assert status == 200
    assert detail["labels"] == {"team": "b"}
    assert envs(await watched(fleet, "bob", "inputs")) == {"b1": {"WANDB_API_KEY": BOB_KEY, "EPOCHS": "3"}}
    # the backend of cell c2 runs b1: it sees the job and its env, not alice's (held to c1)
    seen = envs(await watched(fleet, "agent2", "inputs"))
    assert seen == {"b1": {"WANDB_API_KEY": BOB_KEY, "EPOCHS": "3"}}
    assert [i["job_id"] for i in (await get(fleet, "agent2", "/v1/jobs"))[1]["items"]] == ["b1"]
    # a node agent of c1 sees the job placed there, never its env
    redacted = {"WANDB_API_KEY": REDACTED, "EPOCHS": REDACTED}
    assert envs(await watched(fleet, "agent1", "inputs")) == {"a1": redacted}


@pytest.mark.parametrize("who", ["reader", "ops"])
async def test_readers_and_operators_see_every_job_but_no_env(fleet: Running, who: str) -> None:
    status, page = await get(fleet, who, "/v1/jobs")
    assert status == 200
    assert {i["job_id"] for i in page["items"]} == {"a1", "b1"}
    status, detail = await get(fleet, who, "/v1/jobs/b1")
    assert status == 200
    assert detail["annotations"] == {"owner": "b@example.com"}
    events = await watched(fleet, who, "inputs")
    assert envs(events) == {j: {"WANDB_API_KEY": REDACTED, "EPOCHS": REDACTED} for j in ("a1", "b1")}
    assert BOB_KEY not in json.dumps(events)
    assert ALICE_KEY not in json.dumps(events)
    assert {"a1", "b1"} <= jobs_in(await watched(fleet, who, "decisions"))


async def test_a_principal_without_a_tenant_sees_no_job_nor_the_policy_in_the_watch(fleet: Running) -> None:
    assert (await get(fleet, "qadmin", "/v1/jobs"))[1]["total"] == 0
    events = await watched(fleet, "qadmin", "inputs")
    assert jobs_in(events) == set()
    assert BOB_KEY not in json.dumps(events)
    assert [e["event"]["node"] for e in events] == ["n1", "n2", "n1"]  # (nodes: every viewer's)


async def test_a_retired_job_is_unknown_to_who_does_not_see_every_job(tmp_path: Path) -> None:
    tokens = tokens_file(tmp_path / "tokens.toml", *(entry_toml(who, TOKENS[who], None) for who in PEOPLE))
    running = await start(Config(
        log=LogConfig(dir=str(tmp_path / "log"), fsync="never"),
        service=ServiceSettings(http_port=0, idle_wait_ms=20, retain_finished_ms=0, node_timeout_ms=400),
        auth=AuthSettings(tokens_file=str(tokens),
                          policy_file=str(secret(tmp_path / "policy.toml", POLICY)))))
    try:
        assert (await send(running, "bob", with_secret(job("b1", tenant="b", gpus=0), BOB_KEY)))[0] == 200
        assert (await send(running, "bob", JobCancelled(job_id="b1")))[0] == 200
        loop = running.service.loop
        assert loop is not None
        for _ in range(150):  # (retired at a sweep: every 100 ms of log time, as inputs move it)
            assert (await send(running, "agent1", node("n1", cell="c1")))[0] == 200
            await settled(running)
            if "b1" in loop.state.retired:
                break
            await asyncio.sleep(0.2)
        assert "b1" in loop.state.retired
        assert (await get(running, "ops", "/v1/jobs/b1"))[1]["code"] == "retired"
        for who in ("alice", "bob", "agent2"):  # (whose it was, the state no longer knows)
            status, body = await get(running, who, "/v1/jobs/b1")
            assert status == 404
            never = (await get(running, who, "/v1/jobs/zz"))[1]
            assert body["message"].replace("b1", "zz") == never["message"]
    finally:
        await running.stop()


async def test_without_a_policy_every_principal_sees_everything_as_before(tmp_path: Path) -> None:
    tokens = tokens_file(tmp_path / "tokens.toml", entry_toml("bob", TOKENS["bob"], None),
                         entry_toml("alice", TOKENS["alice"], None))
    config = Config(log=LogConfig(dir=str(tmp_path / "log"), fsync="never"),
                    service=ServiceSettings(http_port=0, idle_wait_ms=20),
                    auth=AuthSettings(tokens_file=str(tokens)))
    running = await start(config)
    try:
        assert (await send(running, "bob", with_secret(job("b1", tenant="b"), BOB_KEY)))[0] == 200
        await settled(running)
        assert (await get(running, "alice", "/v1/jobs/b1"))[0] == 200
        assert envs(await watched(running, "alice", "inputs"))["b1"]["WANDB_API_KEY"] == BOB_KEY
    finally:
        await running.stop()


async def test_a_dry_run_tells_a_tenant_nothing_of_another_tenants_job(fleet: Running) -> None:
    guess = msgspec.structs.replace(job("b1", tenant="b", cells=("c2",)), priority=7)  # (bob's job, guessed)
    body = json.dumps([msgspec.to_builtins(guess)]).encode()
    status, _, raw = await acall(fleet.url + "/v1/dry-run", TOKENS["alice"], body, "POST")
    assert status == 200, raw
    answer = json.loads(raw)["items"][0]
    assert (answer["outcome"], answer["reason"]) == ("refused", "job_id_taken")
    assert "priority" not in answer["message"]
    assert "cell" not in answer["message"]  # (no field of bob's spec: only that the id is taken)
    status, _, raw = await acall(fleet.url + "/v1/dry-run", TOKENS["reader"], body, "POST")
    assert "priority" in json.loads(raw)["items"][0]["message"]  # (a reader sees bob's job: the difference)
