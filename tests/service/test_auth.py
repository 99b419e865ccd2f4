"""Authentication (issue 22, first slice): bearer tokens from a hashed tokens file, on a real service."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import msgspec
import pytest

from fleetlog.service.auth import Authenticator, AuthError, entry_toml, new_token, token_hash
from fleetlog.service.config import AuthSettings, Config, LogConfig, ServiceSettings, load_config
from tests.core.builders import job, node
from tests.service.process import REPO, ServiceProcess, health_at
from tests.service.test_service import Running, events_body, start

GOOD, OLD, EXPIRED, REVOKED = (new_token() for _ in range(4))


def tokens_file(path: Path, *entries: str) -> Path:
    path.write_text("".join(entries))
    path.chmod(0o600)
    return path


def standard_tokens(path: Path) -> Path:
    return tokens_file(
        path, entry_toml("tenant:a", GOOD, None), entry_toml("tenant:old", OLD, None),
        entry_toml("tenant:x", EXPIRED, "2001-01-01T00:00:00Z"),
        entry_toml("tenant:r", REVOKED, None) + "revoked = true\n")


def call(url: str, token: str | None = None, body: bytes | None = None,
         method: str | None = None) -> tuple[int, dict[str, str], bytes]:
    headers = {"content-type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=body, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


async def acall(url: str, token: str | None = None, body: bytes | None = None,
                method: str | None = None) -> tuple[int, dict[str, str], bytes]:
    return await asyncio.to_thread(call, url, token, body, method)


async def authed(tmp_path: Path, tokens: Path) -> Running:
    config = Config(log=LogConfig(dir=str(tmp_path / "log"), fsync="never"),
                    service=ServiceSettings(http_port=0, idle_wait_ms=20),
                    auth=AuthSettings(tokens_file=str(tokens)))
    return await start(config)


ROUTES = [("/v1/events", events_body(node("n1")), "POST"), ("/v1/jobs", None, None),
          ("/v1/tenants", None, None), ("/v1/watch?log=inputs&from=0", None, None),
          ("/v1/quotas/t1", b'{"gpus": 4}', "PUT"), ("/v1/openapi.json", None, None),
          ("/metrics", None, None), ("/v1/jobs/nope", None, None)]


async def test_every_route_but_health_needs_a_known_live_token(tmp_path: Path) -> None:
    running = await authed(tmp_path, standard_tokens(tmp_path / "tokens.toml"))
    try:
        for path, body, method in ROUTES:
            for token, problem in [(None, "no token"), ("wrong-" + GOOD, "not known"),
                                   (EXPIRED, "expired"), (REVOKED, "revoked")]:
                status, headers, raw = await acall(running.url + path, token, body, method)
                assert status == 401, (path, token, raw)
                answer = json.loads(raw)
                assert answer["code"] == "unauthenticated"
                assert problem in answer["message"]
                assert headers["WWW-Authenticate"].startswith("Bearer")
                assert GOOD not in raw.decode()
                assert (token is None or token not in raw.decode())
        for path in ("/healthz", "/readyz"):
            assert (await acall(running.url + path))[0] == 200
        ingest = events_body(node("n1"), job("j1"))
        status, _, _ = await acall(running.url + "/v1/events", GOOD, ingest, "POST")
        assert status == 200
        assert (await acall(running.url + "/v1/jobs", GOOD))[0] == 200
        status, _, raw = await acall(running.url + "/metrics", GOOD)
        assert status == 200
        assert b"fleetlog_http_unauthenticated_total 32.0" in raw
        assert GOOD.encode() not in raw
    finally:
        await running.stop()


async def test_a_rotated_token_is_honoured_without_restart(tmp_path: Path) -> None:
    tokens = standard_tokens(tmp_path / "tokens.toml")
    running = await authed(tmp_path, tokens)
    try:
        fresh = new_token()
        assert (await acall(running.url + "/v1/jobs", fresh))[0] == 401
        tokens_file(tokens, entry_toml("tenant:old", OLD, None) + "revoked = true\n",
                    entry_toml("tenant:a", fresh, None))
        await asyncio.sleep(1.2)
        assert (await acall(running.url + "/v1/jobs", fresh))[0] == 200
        assert (await acall(running.url + "/v1/jobs", OLD))[0] == 401
        assert (await acall(running.url + "/v1/jobs", GOOD))[0] == 401
    finally:
        await running.stop()


async def refused_until_good(running: Running, tokens: Path, spoil: Any, said: str) -> None:
    """After ``spoil(tokens)`` every token (the revoked one too) gets 401 naming the file's problem
    and health says why; once a good file is back the good token works again."""
    spoil(tokens)
    await asyncio.sleep(1.2)
    for token in (GOOD, OLD):
        status, _, raw = await acall(running.url + "/v1/jobs", token)
        assert status == 401, raw
        message = json.loads(raw)["message"]
        assert said in message
        assert "tokens file" in message
    health = json.loads((await acall(running.url + "/healthz"))[2])
    assert said in health["auth_refused"]["auth.tokens_file"]
    tokens_file(tokens, entry_toml("tenant:a", GOOD, None),
                entry_toml("tenant:old", OLD, None) + "revoked = true\n")
    await asyncio.sleep(1.2)
    assert (await acall(running.url + "/v1/jobs", GOOD))[0] == 200
    assert (await acall(running.url + "/v1/jobs", OLD))[0] == 401
    assert "auth_refused" not in json.loads((await acall(running.url + "/healthz"))[2])


def _public(path: Path) -> None:  # the revocation written at a mode the service refuses
    path.write_text(entry_toml("tenant:a", GOOD, None) + entry_toml("tenant:old", OLD, None)
                    + "revoked = true\n")
    path.chmod(0o644)


@pytest.mark.parametrize(("spoil", "said"), [
    (_public, "lets others read or write it"),
    (lambda path: path.unlink(), "No such file"),
    (lambda path: tokens_file(path, "[[token]]\nprincipal = \n"), "Invalid"),
], ids=["mode-0644", "deleted", "not-toml"])
async def test_a_refused_or_missing_tokens_file_authenticates_nobody_until_a_good_one_is_back(
    tmp_path: Path, spoil: Any, said: str,
) -> None:
    tokens = standard_tokens(tmp_path / "tokens.toml")
    running = await authed(tmp_path, tokens)
    try:
        assert (await acall(running.url + "/v1/jobs", OLD))[0] == 200
        await refused_until_good(running, tokens, spoil, said)
    finally:
        await running.stop()


def test_the_principal_comes_from_the_token(tmp_path: Path) -> None:
    auth = Authenticator(standard_tokens(tmp_path / "tokens.toml"))
    assert auth.check(f"Bearer {GOOD}").principal == "tenant:a"
    assert auth.check(f"bearer  {GOOD} ").principal == "tenant:a"
    assert auth.check(f"Basic {GOOD}").principal is None
    assert token_hash(GOOD) in (tmp_path / "tokens.toml").read_text()
    assert GOOD not in (tmp_path / "tokens.toml").read_text()


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620])
def test_a_tokens_file_others_may_read_or_write_is_refused(tmp_path: Path, mode: int) -> None:
    tokens = standard_tokens(tmp_path / "tokens.toml")
    tokens.chmod(mode)
    with pytest.raises(AuthError, match="chmod 600"):
        Authenticator(tokens)


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleetlog.cli", *args], cwd=REPO, capture_output=True,
                          check=False, text=True, timeout=60, env={**os.environ, **(env or {})})


def test_run_refuses_a_public_bind_without_auth_and_a_world_readable_tokens_file(tmp_path: Path) -> None:
    config = tmp_path / "fleetlog.toml"
    config.write_text(f'[log]\ndir = "{tmp_path / "log"}"\n[service]\nhttp_host = "0.0.0.0"\n')
    done = run_cli("run", "--config", str(config))
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "without authentication" in done.stderr
    tokens = standard_tokens(tmp_path / "tokens.toml")
    tokens.chmod(0o644)
    done = run_cli("run", "--config", str(config), env={"FLEETLOG_AUTH_TOKENS_FILE": str(tokens)})
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "chmod 600" in done.stderr
    assert token_hash(GOOD) not in done.stderr


def test_run_with_auth_on_a_public_bind_serves_and_never_logs_a_token(tmp_path: Path) -> None:
    tokens = standard_tokens(tmp_path / "tokens.toml")
    config = tmp_path / "fleetlog.toml"
    config.write_text(f'[log]\ndir = "{tmp_path / "log"}"\n[service]\nhttp_host = "0.0.0.0"\n'
                      f'[auth]\ntokens_file = "{tokens}"\n')
    proc = ServiceProcess(tmp_path / "service.log", ["--config", str(config)], {}).start()
    try:
        port = proc.address().rsplit(":", 1)[1]
        url = f"http://127.0.0.1:{port}"
        assert health_at(f"127.0.0.1:{port}") is not None
        proc.wait_leading(60)  # (HTTP is served before it leads: the kernels compile first)
        statuses = [call(url + "/v1/jobs", t)[0] for t in (GOOD, "x" + GOOD, EXPIRED, REVOKED, None)]
        assert statuses == [200, 401, 401, 401, 401]
        tokens_file(tokens, "not toml [[")
        time.sleep(1.2)
        assert call(url + "/v1/jobs", GOOD)[0] == 401  # (fail closed: issue 46)
    finally:
        proc.stop()
    logged = (tmp_path / "service.log").read_text()
    for secret in (GOOD, EXPIRED, REVOKED, token_hash(GOOD)):
        assert secret not in logged
    assert "no tokens in force (fail closed)" in logged


def test_auth_token_prints_a_token_and_its_entry(tmp_path: Path) -> None:
    done = run_cli("auth", "token", "--principal", "tenant:a", "--expires", "2027-01-01T00:00:00Z")
    assert done.returncode == 0, done.stderr
    token = done.stdout.strip()
    assert len(token) >= 40
    assert token_hash(token) in done.stderr
    assert token not in done.stderr
    tokens = tokens_file(tmp_path / "tokens.toml", done.stderr)
    assert Authenticator(tokens, clock=lambda: 0.0).check(f"Bearer {token}").principal == "tenant:a"
    as_json: Any = json.loads(run_cli("auth", "token", "--principal", "p", "--json").stdout)
    assert token_hash(as_json["token"]) in as_json["entry"]


def test_the_cli_sends_fleetlog_token_and_says_in_one_line_when_it_has_none(tmp_path: Path) -> None:
    tokens = standard_tokens(tmp_path / "tokens.toml")
    log = tmp_path / "log"
    proc = ServiceProcess(tmp_path / "service.log", ["--log", str(log)],
                          {"FLEETLOG_AUTH_TOKENS_FILE": str(tokens)}).start()
    try:
        url = "http://" + proc.address()
        proc.wait_leading()
        submit = ("submit", "j1", "--tenant", "t", "--gpus", "1", "--log", str(log))
        for args in (submit, ("jobs", "--url", url)):
            done = run_cli(*args, env={"FLEETLOG_TOKEN": ""})
            assert done.returncode == 2, done.stderr
            assert len(done.stderr.strip().splitlines()) == 1, done.stderr
            assert "set FLEETLOG_TOKEN" in done.stderr
            done = run_cli(*args, env={"FLEETLOG_TOKEN": REVOKED})
            assert done.returncode == 2, done.stderr
            assert "revoked" in done.stderr
            assert REVOKED not in done.stderr
            done = run_cli(*args, env={"FLEETLOG_TOKEN": GOOD})
            assert done.returncode == 0, done.stderr
        assert "j1" in run_cli("jobs", "--url", url, env={"FLEETLOG_TOKEN": GOOD}).stdout
    finally:
        proc.stop()
    assert GOOD not in (tmp_path / "service.log").read_text()


def test_replay_serve_refuses_a_public_bind_in_one_line(tmp_path: Path) -> None:
    log = tmp_path / "log"
    created = run_cli("submit", "j1", "--tenant", "t", "--gpus", "1", "--log", str(log), "--create")
    assert created.returncode == 0, created.stderr
    done = run_cli("replay", "serve", "--log", str(log), "--http-host", "0.0.0.0", "--http-port", "0")
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "loopback only" in done.stderr


async def test_the_roles_health_says_why_nobody_is_authenticated(tmp_path: Path) -> None:
    """``--role all`` with a ``[cells]`` map: the same fail-closed tokens file, the same health."""
    from fleetlog.service.roles import RoleService

    tokens = standard_tokens(tmp_path / "tokens.toml")
    config = load_config(None, {}, log_dir=str(tmp_path / "log"))
    config = msgspec.structs.replace(config, cells=(("a", 0), ("b", 1)),
                                     auth=AuthSettings(tokens_file=str(tokens)))
    service = RoleService(config)
    assert "auth_refused" not in service.health()
    assert service.http.auth is not None
    assert service.http.auth.check(f"Bearer {GOOD}").principal == "tenant:a"
    tokens.unlink()
    await asyncio.sleep(1.2)
    verdict = service.http.auth.check(f"Bearer {GOOD}")
    assert verdict.principal is None
    assert "No such file" in verdict.problem
    assert "No such file" in service.health()["auth_refused"]["auth.tokens_file"]
