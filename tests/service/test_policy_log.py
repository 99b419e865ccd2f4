"""The authorization policy as events in the log (issue 22): ``PolicySet`` replaces the policy
file's grants once folded, survives a restart, is audited, and never changes a decision."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from fleetlog.api.resources import PolicyList, list_policy
from fleetlog.core.decide import decide
from fleetlog.core.digest import restore, snapshot
from fleetlog.core.fold import fold
from fleetlog.core.policy import Policy
from fleetlog.core.state import State
from fleetlog.events import DecisionBatch, PolicyGrant, PolicySet, decode, encode, envelope
from fleetlog.events.codec import EventTooLargeError, InvalidEventError
from fleetlog.events.model import MAX_GRANTS, MAX_ROLES
from fleetlog.log.base import Shard
from fleetlog.log.routing import Router, RoutingError
from fleetlog.replay.audit import policy_detail
from fleetlog.service.auth import entry_toml, new_token
from fleetlog.service.config import AuthSettings, Config, LogConfig, ServiceSettings
from tests.core.builders import job, node
from tests.service.test_auth import acall, run_cli, tokens_file
from tests.service.test_authz import POLICY, refused, secret, settled
from tests.service.test_authz import send as authz_send
from tests.service.test_service import Running, start

PEOPLE = ("alice", "bob", "padmin", "ops")
TOKENS = {who: new_token() for who in PEOPLE}
FILE_POLICY = POLICY + '[[grant]]\nprincipal = "padmin"\nroles = ["policy-admin"]\n'


def config(tmp_path: Path) -> Config:
    tokens = tokens_file(tmp_path / "tokens.toml", *(entry_toml(who, TOKENS[who], None) for who in PEOPLE))
    return Config(log=LogConfig(dir=str(tmp_path / "log"), fsync="never"),
                  service=ServiceSettings(http_port=0, idle_wait_ms=20),
                  auth=AuthSettings(tokens_file=str(tokens),
                                    policy_file=str(secret(tmp_path / "policy.toml", FILE_POLICY))))


async def send(running: Running, who: str, *events: Any) -> tuple[int, dict[str, Any]]:
    return await authz_send(running, who, *events, tokens=TOKENS)


async def policy(running: Running, who: str) -> dict[str, Any]:
    status, _, raw = await acall(running.url + "/v1/policy", TOKENS[who])
    assert status == 200, raw
    found: dict[str, Any] = json.loads(raw)
    return found


NEW = PolicySet(grants=(PolicyGrant("bob", ("tenant:a",)), PolicyGrant("padmin", ("policy-admin",))),
                reason="bob takes over team a")


async def test_a_policy_in_the_log_replaces_the_file_and_outlives_a_restart(tmp_path: Path) -> None:
    running = await start(config(tmp_path))
    try:
        assert (await send(running, "alice", job("a1", tenant="a")))[0] == 200
        refused(await send(running, "bob", job("a2", tenant="a")), "tenant:NAME submits")
        status, _, raw = await acall(running.url + "/v1/policy", TOKENS["bob"])
        refused((status, json.loads(raw)), "policy-admin and operator read the policy")
        before = await policy(running, "ops")
        assert before["source"] == "file"
        assert {"principal": "alice", "roles": ["tenant:a"]} in before["items"]
        refused(await send(running, "alice", NEW), "policy-admin sets the policy",
                "may not change the policy")
        refused(await send(running, "ops", NEW), "policy-admin sets the policy")  # operator is not enough
        lockout = PolicySet(grants=(PolicyGrant("padmin", ("operator",)),))
        refused(await send(running, "padmin", lockout), "grants policy-admin to at least one principal")
        bad = {"type": "PolicySet", "grants": [{"principal": "bob", "roles": ["king"]}]}
        status, body = await send(running, "padmin", bad)
        assert status == 400, body
        assert "grants[0].roles[0]" in body["message"], body
        assert (await send(running, "padmin", NEW))[0] == 200
        await settled(running)
        assert (await send(running, "bob", job("a3", tenant="a")))[0] == 200
        refused(await send(running, "alice", job("a4", tenant="a")), "a principal the policy does not name",
                "no roles in the policy in force")
        assert await policy(running, "padmin") == {
            "items": [{"principal": "bob", "roles": ["tenant:a"]},
                      {"principal": "padmin", "roles": ["policy-admin"]}],
            "source": "log", "reason": "bob takes over team a"}
    finally:
        await running.stop()
    running = await start(config(tmp_path))  # the file says otherwise; the log wins
    try:
        await settled(running)
        assert (await send(running, "bob", job("a5", tenant="a")))[0] == 200
        assert (await policy(running, "padmin"))["source"] == "log"
        refused(await send(running, "alice", job("a6", tenant="a")), "a principal the policy does not name")
    finally:
        await running.stop()
    done = run_cli("history", "--audit", "--type", "PolicySet", "--log", str(tmp_path / "log"), "-o", "json")
    assert done.returncode == 0, done.stderr
    [entry] = json.loads(done.stdout)["items"]
    assert (entry["principal"], entry["detail"]) == (
        "padmin", "bob=tenant:a; padmin=policy-admin (bob takes over team a)")


def test_policy_set_appends_a_file_and_refuses_one_it_cannot_use_in_one_line(tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    good = tmp_path / "p.toml"
    good.write_text('[[grant]]\nprincipal = "Jane Doe"\nroles = ["policy-admin", "tenant:a"]\n')
    done = run_cli("policy", "set", str(good), "--reason", "rota", "--log", log, "--create")
    assert done.returncode == 0, done.stderr
    done = run_cli("history", "--audit", "--log", log, "-o", "json")
    assert [(e["type"], e["detail"]) for e in json.loads(done.stdout)["items"]] == [
        ("PolicySet", "Jane Doe=policy-admin,tenant:a (rota)")]
    done = run_cli("policy", "get", "--log", log, "-o", "json")
    jane = {"principal": "Jane Doe", "roles": ["policy-admin", "tenant:a"]}
    assert json.loads(done.stdout) == {"items": [jane], "source": "log", "reason": "rota"}
    done = run_cli("policy", "get", "--log", log)
    assert "Jane Doe" in done.stdout
    assert "source: the log's newest PolicySet (rota)" in done.stdout
    for text, said in [('[[grant]]\nprincipal = "x"\nroles = ["tenant:a"]\n',
                        "no principal keeps policy-admin"),
                       ('[[grant]]\nprincipal = "x"\nroles = ["king"]\n', "unknown role 'king'"),
                       ('[[grant]]\nprincipal = "x"\nroles = ["policy-admin", "tenant:a b"]\n',
                        "grants[0].roles[1]"),
                       ("not toml =", "p.toml")]:
        good.write_text(text)
        done = run_cli("policy", "set", str(good), "--log", log)
        assert done.returncode == 2, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert said in done.stderr, done.stderr
    done = run_cli("policy", "set", str(tmp_path / "missing.toml"), "--log", log)
    assert done.returncode == 2, done.stderr
    assert "cannot read" in done.stderr


def test_the_core_keeps_the_newest_policy_in_snapshots_and_decides_alike_without_it() -> None:
    def run(with_policy: bool) -> tuple[State, list[tuple[object, ...]]]:
        state, decided, t = State(), [], 0
        for i in range(12):
            t += 500
            fold(state, node(f"n{i % 3}", gpus=8), t)
            fold(state, job(f"j{i}", gpus=4 + i % 5), t)
            if with_policy:
                fold(state, PolicySet(grants=(PolicyGrant(f"p{i}", ("policy-admin",)),)), t)
            decisions = tuple(decide(state, Policy()))
            decided.append(decisions)
            fold(state, DecisionBatch(as_of=state.offset, digest="", decisions=decisions), t)
        return state, decided

    plain, with_policy = run(False), run(True)
    assert plain[1] == with_policy[1]
    assert plain[0].policy is None
    assert list_policy(plain[0], {}) == PolicyList([], "none")
    assert with_policy[0].policy == PolicySet(grants=(PolicyGrant("p11", ("policy-admin",)),))
    assert restore(snapshot(with_policy[0])).policy == with_policy[0].policy
    assert restore(snapshot(plain[0])).policy is None


def test_with_a_cells_map_a_policy_set_is_refused_with_the_reason() -> None:
    assert Router().shard_of(NEW) == Shard.SINGLE
    with pytest.raises(RoutingError, match="no process serves the HTTP API") as caught:
        Router([("c1", 0)]).shard_of(NEW)
    assert caught.value.reason == "not_served_by_role"


def test_a_policy_at_and_past_its_bounds() -> None:
    widest = PolicySet(grants=tuple(PolicyGrant(f"p{i}", ("reader",)) for i in range(MAX_GRANTS)))
    back = decode(encode(envelope(widest, "t"))).event
    assert back == widest
    detail = policy_detail(widest)
    assert detail.endswith(f"({MAX_GRANTS} grants)")
    assert len(detail) < 260
    state = State()
    fold(state, back, 1)
    assert restore(snapshot(state)).policy == widest
    grant = PolicyGrant("x" * 253, tuple(f"tenant:t{i}" for i in range(MAX_ROLES)))
    assert decode(encode(envelope(PolicySet(grants=(grant,)), "t"))).event == PolicySet(grants=(grant,))
    for past, where in [
        (PolicySet(grants=(*widest.grants, PolicyGrant("one-more", ()))), "$.event.grants"),
        (PolicySet(grants=(PolicyGrant("x", (*grant.roles, "reader")),)), "$.event.grants[0].roles"),
        (PolicySet(grants=(PolicyGrant("x" * 254, ()),)), "$.event.grants[0].principal"),
        (PolicySet(grants=(PolicyGrant("", ()),)), "$.event.grants[0].principal"),
        (PolicySet(grants=(PolicyGrant("tab\there", ()),)), "$.event.grants[0].principal"),
    ]:
        with pytest.raises(InvalidEventError, match=re.escape(where)):
            decode(encode(envelope(past, "t")))
    long_roles = tuple(f"tenant:{i:04d}{'t' * 240}" for i in range(MAX_ROLES))  # 0.25 MB a grant
    huge = PolicySet(grants=tuple(PolicyGrant(f"p{i}", long_roles) for i in range(20)))
    with pytest.raises(EventTooLargeError):
        decode(encode(envelope(huge, "t")))
