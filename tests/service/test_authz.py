"""Authorization (issue 22): roles from a policy file, checked before the log, on a real service."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest

from fleetlog.events.model import JobCancelled, NodeDrained, TaskStarted
from fleetlog.log.base import INPUTS, PRINCIPAL_HEADER
from fleetlog.service.auth import AuthError, entry_toml, new_token
from fleetlog.service.authz import Authorizer, parse_policy
from fleetlog.service.config import AuthSettings, Config, LogConfig, ServiceSettings
from tests.core.builders import job, node
from tests.service.test_auth import acall, run_cli, tokens_file
from tests.service.test_service import Running, events_body, start

PEOPLE = ("alice", "bob", "agent1", "agent2", "reader", "qadmin", "ops", "nobody")
TOKENS = {who: new_token() for who in PEOPLE}
POLICY = """
[[grant]]
principal = "alice"
roles = ["tenant:a"]
[[grant]]
principal = "bob"
roles = ["tenant:b"]
[[grant]]
principal = "agent1"
roles = ["node-agent:c1"]
[[grant]]
principal = "agent2"
roles = ["backend:c2"]
[[grant]]
principal = "reader"
roles = ["reader"]
[[grant]]
principal = "qadmin"
roles = ["quota-admin"]
[[grant]]
principal = "ops"
roles = ["operator"]
"""


def secret(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o600)
    return path


async def policed(tmp_path: Path, policy: str = POLICY) -> Running:
    tokens = tokens_file(tmp_path / "tokens.toml", *(entry_toml(who, TOKENS[who], None) for who in PEOPLE))
    config = Config(log=LogConfig(dir=str(tmp_path / "log"), fsync="never"),
                    service=ServiceSettings(http_port=0, idle_wait_ms=20),
                    auth=AuthSettings(tokens_file=str(tokens),
                                      policy_file=str(secret(tmp_path / "policy.toml", policy))))
    return await start(config)


async def send(running: Running, who: str, *events: Any, tokens: dict[str, str] = TOKENS
               ) -> tuple[int, dict[str, Any]]:
    status, _, raw = await acall(running.url + "/v1/events", tokens[who], events_body(*events), "POST")
    return status, json.loads(raw)


async def settled(running: Running) -> None:
    loop = running.service.loop
    assert loop is not None
    end = await running.inputs_end()
    await running.until(lambda: loop.offset == end)


def refused(answer: tuple[int, dict[str, Any]], rule: str, *said: str) -> None:
    status, body = answer
    assert status == 403, body
    assert body["code"] == "forbidden"
    assert rule in body["rule"], body
    for text in said:
        assert text in body["message"], body


async def test_each_role_may_do_its_own_and_is_refused_the_rest_with_the_rule(tmp_path: Path) -> None:
    running = await policed(tmp_path)
    try:
        assert (await send(running, "agent1", node("n1", cell="c1")))[0] == 200
        assert (await send(running, "agent2", node("n2", cell="c2")))[0] == 200
        refused(await send(running, "agent1", node("n3", cell="c2")), "node-agent:CELL", "cell 'c2'")
        refused(await send(running, "alice", node("n4", cell="c1")), "report the nodes", "node 'n4'")
        assert (await send(running, "alice", job("a1", tenant="a", cells=("c1",))))[0] == 200
        refused(await send(running, "alice", job("b1", tenant="b")), "tenant:NAME submits",
                "tenant 'b'", "roles: tenant:a")
        assert (await send(running, "bob", job("b2", tenant="b", cells=("c2",))))[0] == 200
        await settled(running)
        refused(await send(running, "bob", JobCancelled(job_id="a1")), "operator cancels any",
                "job 'a1' of tenant 'a'")
        refused(await send(running, "reader", job("r1", tenant="a")), "tenant:NAME submits")
        # a backend reports the jobs its cluster holds, held to its own cell; a node agent does not
        assert (await send(running, "agent2", job("k1", tenant="a", cells=("c2",))))[0] == 200
        both = job("k2", tenant="a", cells=("c1", "c2"))
        refused(await send(running, "agent2", both), "backend:CELL those")
        refused(await send(running, "agent2", job("k3", tenant="a")), "backend:CELL those held to cell CELL")
        refused(await send(running, "agent1", job("k4", tenant="a", cells=("c1",))), "tenant:NAME submits")
        refused(await send(running, "qadmin", NodeDrained(cell="c1", node="n1")), "operator drains")
        refused(await send(running, "alice", NodeDrained(cell="c1", node="n1")), "operator drains")
        assert (await send(running, "ops", NodeDrained(cell="c1", node="n1", drained=False)))[0] == 200
        # one refused event refuses the whole request: nothing of it is appended
        before = await running.inputs_end()
        refused(await send(running, "alice", job("a2", tenant="a"), job("b3", tenant="b")), "tenant:NAME",
                "event 1")
        assert await running.inputs_end() == before
        # task reports: only from the cell the job is placed in
        await running.until(lambda: _placed(running, "a1") == "c1")
        refused(await send(running, "agent2", TaskStarted(job_id="a1", task_index=0, node="n1")),
                "tasks of jobs placed in cell CELL", "placed in cell 'c1'")
        assert (await send(running, "agent1", TaskStarted(job_id="a1", task_index=0, node="n1")))[0] == 200
        assert (await send(running, "alice", JobCancelled(job_id="a1")))[0] == 200
        assert (await send(running, "ops", JobCancelled(job_id="b2")))[0] == 200
        # reads: every role; a principal the policy does not name: nothing
        for who in ("reader", "alice", "agent1", "qadmin"):
            assert (await acall(running.url + "/v1/jobs", TOKENS[who]))[0] == 200
        status, _, raw = await acall(running.url + "/v1/jobs", TOKENS["nobody"])
        assert status == 403
        assert "'nobody' has no roles" in json.loads(raw)["message"]
        assert (await acall(running.url + "/healthz"))[0] == 200
        metrics = (await acall(running.url + "/metrics", TOKENS["reader"]))[2].decode()
        assert 'fleetlog_http_forbidden_total{action="NodeHeartbeat"} 2.0' in metrics
        assert 'fleetlog_http_forbidden_total{action="JobSubmitted"} 6.0' in metrics
        assert 'fleetlog_http_forbidden_total{action="any"} 1.0' in metrics
        for token in TOKENS.values():
            assert token not in metrics
    finally:
        await running.stop()


def _placed(running: Running, job_id: str) -> str | None:
    from fleetlog.core.authorize import job_cell

    loop = running.service.loop
    return None if loop is None else job_cell(loop.state, job_id)


async def test_quotas_need_quota_admin_and_records_carry_their_principal(tmp_path: Path) -> None:
    running = await policed(tmp_path)
    try:
        quota = b'{"nominal": {"gpu_milli": 8000}}'
        status, _, raw = await acall(running.url + "/v1/quotas/a", TOKENS["alice"], quota, "PUT")
        assert status == 403
        assert json.loads(raw)["rule"] == "quota-admin sets quotas"
        status, _, raw = await acall(running.url + "/v1/quotas/a", TOKENS["qadmin"], quota, "PUT")
        assert status == 200, raw
        assert (await send(running, "agent1", node("n1", cell="c1")))[0] == 200
        store = running.service.store
        assert store is not None
        records = await store.log(INPUTS).read(0, 10)
        assert [r.header(PRINCIPAL_HEADER) for r in records] == [b"qadmin", b"agent1"]
    finally:
        await running.stop()


async def test_a_rewritten_policy_is_honoured_without_restart_and_a_bad_one_fails_closed(
    tmp_path: Path,
) -> None:
    running = await policed(tmp_path)
    policy = tmp_path / "policy.toml"
    try:
        refused(await send(running, "bob", job("a9", tenant="a")), "tenant:NAME submits")
        secret(policy, POLICY + '[[grant]]\nprincipal = "bob"\nroles = ["tenant:a"]\n')
        await asyncio.sleep(1.3)
        assert (await send(running, "bob", job("a9", tenant="a")))[0] == 200
        king = '[[grant]]\nprincipal = "bob"\nroles = ["king"]\n'
        spoils = [(lambda: secret(policy, king), "unknown role"),
                  (lambda: policy.chmod(0o666), "lets others read or write it"),
                  (policy.unlink, "No such file")]
        for i, (spoil, said) in enumerate(spoils):
            spoil()
            await asyncio.sleep(1.3)
            refused(await send(running, "bob", job(f"b{i}", tenant="a")), "")  # fail closed: no roles
            refused(await send(running, "alice", job(f"c{i}", tenant="a")), "")
            _, _, raw = await acall(running.url + "/healthz")
            assert said in json.loads(raw)["auth_refused"]["auth.policy_file"]
            secret(policy, POLICY)
            await asyncio.sleep(1.3)
            assert (await send(running, "alice", job(f"c{i}", tenant="a")))[0] == 200
            assert "auth_refused" not in json.loads((await acall(running.url + "/healthz"))[2])
    finally:
        await running.stop()


def test_the_policy_file_is_checked_whole(tmp_path: Path) -> None:
    roles = parse_policy(tmp_path, POLICY.encode())
    assert roles["alice"].tenants == frozenset({"a"})
    assert not roles["alice"].operator
    assert roles["agent2"].cells == frozenset({"c2"})
    for bad, said in [('[[grant]]\nprincipal = "x"\nroles = ["tenant:"]\n', "unknown role 'tenant:'"),
                      ('[[grant]]\nprincipal = "x"\nroles = ["admin"]\n', "grant[0] (x): unknown role"),
                      ('[[grant]]\nprincipal = "x"\n', "roles"),
                      ('[[grant]]\nprincipal = "x"\nroles = []\nextra = 1\n', "extra"),
                      ("not toml =", "auth.policy_file")]:
        with pytest.raises(AuthError, match=re.escape(said)):
            parse_policy(tmp_path / "p.toml", bad.encode())
    loose = secret(tmp_path / "loose.toml", POLICY)
    loose.chmod(0o644)
    with pytest.raises(AuthError, match="chmod 600"):
        Authorizer(str(loose))
    assert Authorizer(None).roles("anyone") is not None  # no policy: every role


@pytest.mark.parametrize(("setting", "said"), [
    ("policy_only", "auth.policy_file names the roles of the principals of auth.tokens_file"),
    ("loose_policy", "chmod 600"),
])
def test_run_refuses_a_policy_it_cannot_use_in_one_line(tmp_path: Path, setting: str, said: str) -> None:
    policy = secret(tmp_path / "policy.toml", POLICY)
    env = {"FLEETLOG_AUTH_POLICY_FILE": str(policy)}
    if setting == "loose_policy":
        policy.chmod(0o640)
        tokens = tokens_file(tmp_path / "tokens.toml", entry_toml("ops", TOKENS["ops"], None))
        env["FLEETLOG_AUTH_TOKENS_FILE"] = str(tokens)
    done = run_cli("run", "--log", str(tmp_path / "log"), "--http-port", "0", env=env)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert said in lines[0], done.stderr


async def test_the_audit_trail_names_who_did_what_and_when(tmp_path: Path) -> None:
    running = await policed(tmp_path)
    try:
        assert (await send(running, "agent1", node("n1", cell="c1")))[0] == 200
        assert (await send(running, "alice", job("a1", tenant="a")))[0] == 200
        refused(await send(running, "bob", JobCancelled(job_id="a1")), "operator cancels any")
        assert (await send(running, "ops", JobCancelled(job_id="a1")))[0] == 200
        assert (await send(running, "ops", NodeDrained(cell="c1", node="n1", reason="disk")))[0] == 200
        quota = b'{"nominal": {"gpu_milli": 8000}}'
        status, _, raw = await acall(running.url + "/v1/quotas/a", TOKENS["qadmin"], quota, "PUT")
        assert status == 200, raw
    finally:
        await running.stop()
    log = str(tmp_path / "log")
    done = run_cli("history", "--audit", "--log", log, "-o", "json")
    assert done.returncode == 0, done.stderr
    entries = [(e["principal"], e["type"], e["job_id"] or e["tenant"] or e["node"], e["detail"])
               for e in json.loads(done.stdout)["items"]]
    assert entries == [("alice", "JobSubmitted", "a1", None), ("ops", "JobCancelled", "a1", None),
                       ("ops", "NodeDrained", "n1", "drained: disk"), ("qadmin", "QuotaSet", "a", None)]
    every = json.loads(run_cli("history", "--audit", "--all", "--log", log, "-o", "json").stdout)["items"]
    assert [e["principal"] for e in every] == ["agent1", "alice", "ops", "ops", "qadmin"]
    assert all(e["at_ms"] > 0 for e in every)
    done = run_cli("history", "--audit", "--principal", "ops", "--type", "NodeDrained", "--log", log)
    assert done.returncode == 0, done.stderr
    assert "NodeDrained" in done.stdout
    assert "JobCancelled" not in done.stdout
    for wrong, said in [(["--principal", "ops"], "add --audit"), (["--audit", "--tenant", "a"], "--tenant")]:
        done = run_cli("history", *wrong, "--log", log)
        assert done.returncode == 2, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert said in done.stderr


async def test_tokens_without_a_policy_say_at_start_that_everyone_may_do_everything(tmp_path: Path) -> None:
    from structlog.testing import capture_logs

    tokens = tokens_file(tmp_path / "tokens.toml", entry_toml("alice", TOKENS["alice"], None))
    config = Config(log=LogConfig(dir=str(tmp_path / "log"), fsync="never"),
                    service=ServiceSettings(http_port=0, idle_wait_ms=20),
                    auth=AuthSettings(tokens_file=str(tokens)))
    with capture_logs() as logs:
        running = await start(config)
        try:
            assert (await send(running, "alice", job("b1", tenant="b")))[0] == 200  # every role
        finally:
            await running.stop()
        (tmp_path / "policed").mkdir()
        running = await policed(tmp_path / "policed")  # with a policy: no such warning
        await running.stop()
    warned = [e for e in logs if e["event"] == "auth_without_policy"]
    assert len(warned) == 1
    assert warned[0]["log_level"] == "warning"
    assert "may do everything" in warned[0]["detail"]
