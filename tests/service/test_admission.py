"""Admission and fairness under ``[auth]`` (issue 46), against a real service: one tenant
cannot take every tenant's share of the pending work, tasks count in the rate limit, a
``backend:``/``node-agent:`` role exempts from it only what a backend submits for its own
existing cell, and a grant's ``max_priority`` bounds the priority its tenant submits at."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fleetlog.api.resources import list_policy
from fleetlog.core.authorize import PRIORITY_RULE, refusal, roles_by_principal
from fleetlog.core.fold import fold
from fleetlog.core.state import CoreConfig, State
from fleetlog.events import PolicyGrant, PolicySet, decode, encode, envelope
from fleetlog.service.auth import entry_toml
from fleetlog.service.config import AuthSettings, Config, LogConfig, ServiceSettings
from fleetlog.service.ingest import RESERVED_IDS_RULE, TENANT_IDS_RULE
from tests.core.builders import job, node
from tests.service.test_auth import acall, tokens_file
from tests.service.test_authz import TOKENS, secret, send
from tests.service.test_service import Running, events_body, start

POLICY = """
[[grant]]
principal = "alice"
roles = ["tenant:a"]
[[grant]]
principal = "bob"
roles = ["tenant:b"]
[[grant]]
principal = "agent2"
roles = ["backend:c2"]
[[grant]]
principal = "agent1"
roles = ["backend:nope", "node-agent:nope"]
[[grant]]
principal = "ops"
roles = ["operator"]
"""
WHO = ("alice", "bob", "agent1", "agent2", "ops")


async def policed(tmp_path: Path, **settings: Any) -> Running:
    tokens = tokens_file(tmp_path / "tokens.toml", *(entry_toml(who, TOKENS[who], None) for who in WHO))
    config = Config(log=LogConfig(dir=str(tmp_path / "log"), fsync="never"),
                    service=ServiceSettings(http_port=0, idle_wait_ms=20, **settings),
                    auth=AuthSettings(tokens_file=str(tokens),
                                      policy_file=str(secret(tmp_path / "policy.toml", POLICY))))
    return await start(config)


async def test_one_tenant_fills_its_share_of_pending_work_and_another_still_submits(tmp_path: Path) -> None:
    running = await policed(tmp_path, max_pending_tasks=1_000, max_request_tasks=100)
    try:  # (no node: everything stays pending)
        sent = 0
        while True:  # alice submits 100 tasks at a time until she is refused
            status, answer = await send(running, "alice", job(f"a{sent}", tenant="a", tasks=100))
            if status != 200:
                break
            sent += 1
        assert sent == 2, "her share: a quarter of max_pending_tasks"
        assert (status, answer["code"], answer["tenant"], answer["limit"], answer["pending"]) == (
            429, "too_much_pending", "a", 250, 200), answer
        assert answer["bound"] == "max_pending_tasks_per_tenant"
        assert "tenant 'a'" in answer["message"]
        assert "max_pending_tasks_per_tenant" in answer["message"]
        assert (await send(running, "alice", job("a-small", tenant="a", tasks=50)))[0] == 200  # (to 250)
        for i in range(2):
            status, answer = await send(running, "bob", job(f"b{i}", tenant="b", tasks=100))
            assert status == 200, answer
    finally:
        await running.stop()


async def test_the_share_is_a_setting_and_the_bound_in_all_still_holds(tmp_path: Path) -> None:
    running = await policed(tmp_path, max_pending_tasks=300, max_pending_tasks_per_tenant=200)
    try:
        assert (await send(running, "alice", job("a0", tenant="a", tasks=200)))[0] == 200
        status, answer = await send(running, "alice", job("a1", tenant="a", tasks=1))
        assert (status, answer["tenant"], answer["limit"]) == (429, "a", 200), answer
        assert (await send(running, "bob", job("b0", tenant="b", tasks=100)))[0] == 200
        status, answer = await send(running, "bob", job("b1", tenant="b", tasks=1))
        assert (status, answer["code"], answer["bound"], answer["limit"]) == (
            429, "too_much_pending", "max_pending_tasks", 300), answer
    finally:
        await running.stop()


async def test_tasks_count_in_the_rate_limit(tmp_path: Path) -> None:
    running = await policed(tmp_path, max_submissions_per_s=1_000, max_submitted_tasks_per_s=0.5,
                            max_submitted_task_burst=100)
    try:
        assert (await send(running, "alice", job("a0", tenant="a", tasks=100)))[0] == 200
        status, answer = await send(running, "alice", job("a1", tenant="a", tasks=1))
        assert (status, answer["code"], answer["tenant"], answer["unit"]) == (
            429, "too_many_submissions", "a", "tasks"), answer
        assert "max_submitted_tasks_per_s" in answer["message"]
        assert (await send(running, "bob", *[job(f"b{i}", tenant="b") for i in range(100)]))[0] == 200
    finally:
        await running.stop()


async def test_a_backend_role_for_a_cell_that_does_not_exist_is_rate_limited(tmp_path: Path) -> None:
    running = await policed(tmp_path, max_submissions_per_s=0.5, max_submission_burst=2)
    try:
        jobs = [job(f"n{i}", tenant="a", cells=("nope",)) for i in range(3)]
        assert (await send(running, "agent1", *jobs[:2]))[0] == 200
        status, answer = await send(running, "agent1", jobs[2])
        assert (status, answer["code"], answer["tenant"]) == (429, "too_many_submissions", "a"), answer
        # its own existing cell: what the backend reports is there already, not limited
        assert (await send(running, "agent2", node("n2", cell="c2")))[0] == 200
        await running.until(lambda: running.service.loop is not None
                            and running.service.loop.state.names["cell"].get("c2") >= 0)
        for i in range(5):
            status, answer = await send(running, "agent2", job(f"k{i}", tenant="a", cells=("c2",)))
            assert status == 200, answer
    finally:
        await running.stop()


CEILED = POLICY.replace('''principal = "alice"
roles = ["tenant:a"]''', '''principal = "alice"
roles = ["tenant:a"]
max_priority = 100''')


async def test_a_grant_bounds_the_priority_its_tenant_submits_at(tmp_path: Path) -> None:
    tokens = tokens_file(tmp_path / "tokens.toml", *(entry_toml(who, TOKENS[who], None) for who in WHO))
    config = Config(log=LogConfig(dir=str(tmp_path / "log"), fsync="never"),
                    service=ServiceSettings(http_port=0, idle_wait_ms=20),
                    auth=AuthSettings(tokens_file=str(tokens),
                                      policy_file=str(secret(tmp_path / "policy.toml", CEILED))))
    running = await start(config)
    try:
        assert (await send(running, "alice", job("a0", tenant="a", priority=100)))[0] == 200
        end = await running.inputs_end()
        status, answer = await send(running, "alice", job("a1", tenant="a", priority=1_000_000))
        assert (status, answer["code"], answer["rule"], answer["action"]) == (
            403, "forbidden", PRIORITY_RULE, "JobSubmitted"), answer
        assert "priority 1000000" in answer["message"]
        assert "max_priority is 100" in answer["message"]
        assert await running.inputs_end() == end  # nothing appended
        assert (await send(running, "bob", job("b0", tenant="b", priority=1_000_000)))[0] == 200  # (none)
        assert (await send(running, "ops", job("o0", tenant="a", priority=1_000_000)))[0] == 200  # (operator)
        status, _, raw = await acall(running.url + "/v1/policy", TOKENS["ops"])
        items = {item["principal"]: item for item in json.loads(raw)["items"]}
        assert (status, items["alice"]["max_priority"]) == (200, {"a": 100})
        assert "max_priority" not in items["bob"]
    finally:
        await running.stop()


def test_the_ceiling_is_in_the_policy_set_and_the_folds_gate_refuses_past_it() -> None:
    grants = (PolicyGrant("alice", ("tenant:a",), max_priority=100), PolicyGrant("alice", ("tenant:c",)),
              PolicyGrant("carol", ("tenant:a",), max_priority=5), PolicyGrant("carol", ("tenant:a",), 50),
              PolicyGrant("padmin", ("policy-admin",)))
    state = State(CoreConfig())
    fold(state, PolicySet(grants=grants), 1)
    refused = refusal(state, "alice", job("x", tenant="a", priority=101))
    assert refused is not None
    assert refused[1] == PRIORITY_RULE
    assert refusal(state, "alice", job("x", tenant="a", priority=100)) is None
    assert refusal(state, "alice", job("x", tenant="c", priority=1_000_000)) is None
    assert refusal(state, "carol", job("x", tenant="a", priority=50)) is None  # (the higher of two grants)
    assert roles_by_principal(grants)["carol"].ceiling("a") == 50
    shown = {item.principal: item.max_priority for item in list_policy(state, {}).items}
    assert shown == {"alice": {"a": 100}, "carol": {"a": 50}, "padmin": {}}
    wire = envelope(PolicySet(grants=grants), "k")
    assert decode(encode(wire)).event == wire.event
    old = PolicySet(grants=(PolicyGrant("padmin", ("policy-admin",)),))
    assert b"max_priority" not in encode(envelope(old, "k"), "json")  # (encodes as before the field)


async def test_with_job_ids_by_tenant_no_tenant_can_take_anothers_ids(tmp_path: Path) -> None:
    running = await policed(tmp_path, job_ids_by_tenant=True)
    try:
        end = await running.inputs_end()
        for squat in ("b/train-1", "train-1"):
            status, answer = await send(running, "alice", job(squat, tenant="a"))
            assert (status, answer["code"], answer["rule"]) == (403, "forbidden", TENANT_IDS_RULE), answer
            assert "does not start with 'a/'" in answer["message"]
        assert await running.inputs_end() == end
        assert (await send(running, "bob", job("b/train-1", tenant="b")))[0] == 200  # the victim's id is free
        assert (await send(running, "alice", job("a/train-1", tenant="a")))[0] == 200
        assert (await send(running, "ops", job("anything", tenant="a")))[0] == 200  # (an operator: any id)
    finally:
        await running.stop()


async def test_by_default_a_tenants_prefix_is_its_own_and_no_other_tenant_can_take_those_ids(
    tmp_path: Path,
) -> None:
    """Without any setting: alice squatted bob's ids before he used them (his 409s were the
    attack's wins).  ``b/...`` is tenant b's from the start — b has not submitted anything yet,
    the policy names it — while plain ids stay first come, and an operator submits any id."""
    running = await policed(tmp_path)
    try:
        end = await running.inputs_end()
        for squat in ("b/train-1", "b/x/y"):
            status, answer = await send(running, "alice", job(squat, tenant="a"))
            assert (status, answer["code"], answer["rule"]) == (403, "forbidden", RESERVED_IDS_RULE), answer
            assert "under tenant 'b''s prefix" in answer["message"]
        assert await running.inputs_end() == end
        assert (await send(running, "bob", job("b/train-1", tenant="b")))[0] == 200  # the victim's id is free
        for mine in ("a/train-1", "train-1", "bx/1"):  # its own prefix, a plain id, another word
            assert (await send(running, "alice", job(mine, tenant="a")))[0] == 200, mine
        assert (await send(running, "ops", job("b/ops-made", tenant="a")))[0] == 200  # (an operator: any id)
    finally:
        await running.stop()


async def test_another_tenants_id_is_a_distinct_409_that_says_nothing_of_its_job(tmp_path: Path) -> None:
    running = await policed(tmp_path)
    try:
        taken = job("train-1", tenant="a", tasks=7, gpus=0, cpu=4321)
        assert (await send(running, "alice", taken))[0] == 200
        status, answer = await send(running, "bob", job("train-1", tenant="b"))
        assert (status, answer["code"], answer["job_id"]) == (409, "job_id_taken", "train-1"), answer
        assert "'a'" not in answer["message"]
        assert "4321" not in answer["message"]
        assert "TENANT/NAME" in answer["message"]
        status, answer = await send(running, "alice", job("train-1", tenant="a"))  # (her own id: as before)
        assert (status, answer["code"]) == (409, "already_exists"), answer
    finally:
        await running.stop()


async def test_a_dry_run_under_another_tenants_id_says_nothing_of_its_job(tmp_path: Path) -> None:
    running = await policed(tmp_path)
    try:
        assert (await send(running, "alice", job("train-1", tenant="a", cpu=4321)))[0] == 200
        await running.until(lambda: running.service.loop is not None
                            and running.service.loop.state.job_row("train-1") >= 0)
        status, _, raw = await acall(running.url + "/v1/dry-run", TOKENS["bob"],
                                     events_body(job("train-1", tenant="b")), "POST")
        assert status == 200, raw
        (item,) = json.loads(raw)["items"]
        assert (item["outcome"], item["reason"]) == ("refused", "job_id_taken"), item
        assert "4321" not in item["message"]
        assert "'a'" not in item["message"]
    finally:
        await running.stop()


async def test_one_largest_request_always_fits_an_empty_share(tmp_path: Path) -> None:
    running = await policed(tmp_path, max_pending_tasks=1_000, max_request_tasks=600)
    try:  # (a quarter is 250: the share is the 600 of one request instead)
        assert (await send(running, "alice", job("a0", tenant="a", tasks=600)))[0] == 200
        status, answer = await send(running, "alice", job("a1", tenant="a", tasks=1))
        assert (status, answer["limit"]) == (429, 600), answer
        assert (await send(running, "bob", job("b0", tenant="b", tasks=400)))[0] == 200
    finally:
        await running.stop()
