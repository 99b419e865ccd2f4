"""Mutual TLS on the HTTP API (issue 22, "Who may do what"): client certificates from a configured
CA name the principal (their CN); one from another CA, or expired, is refused at the handshake.
The CAs and certificates are made here with the ``openssl`` command (EC keys: milliseconds)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import ssl
import subprocess
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from fleetlog.auth_client import tls_context
from fleetlog.cli import main
from fleetlog.client import ClientError, HttpTransport, keyed
from fleetlog.log.base import INPUTS, PRINCIPAL_HEADER
from fleetlog.log.discovery import announce, announced, running_service
from fleetlog.reader import Reader
from fleetlog.service.auth import (
    NEITHER,
    Authenticator,
    AuthError,
    certificate_principal,
    entry_toml,
    new_token,
    security,
)
from fleetlog.service.config import AuthSettings, Config, LogConfig, ServiceSettings
from tests.core.builders import job
from tests.service.process import REPO, ServiceProcess
from tests.service.test_auth import tokens_file
from tests.service.test_authz import secret
from tests.service.test_service import Running, events_body, start

TOKEN = new_token()
POLICY = "".join(f'[[grant]]\nprincipal = "tenant:{t}"\nroles = ["tenant:{t}"]\n' for t in "ab")


class Pki:
    """Two CAs (``ca``, the configured one, and ``other``), a server certificate for 127.0.0.1 and
    client certificates, made with ``openssl ca`` (which also signs with dates in the past)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        for ca in ("ca", "other"):
            (root / ca).mkdir()
            (root / ca / "index.txt").touch()
            (root / ca / "serial").write_text("1000\n")
            self._openssl("req", "-x509", "-nodes", *self._ec(f"{ca}/ca.key"), "-out", f"{ca}/ca.pem",
                          "-days", "2", "-subj", f"/CN=fleetlog test {ca}",
                          "-addext", "basicConstraints=critical,CA:TRUE",
                          "-addext", "keyUsage=critical,keyCertSign,cRLSign")
        (root / "ca.cnf").write_text(
            "[ca]\ndefault_ca = test\n[test]\ndir = $ENV::PKI_DIR\ndatabase = $dir/index.txt\n"
            "new_certs_dir = $dir\n"
            "serial = $dir/serial\ndefault_md = sha256\npolicy = anything\nunique_subject = no\n"
            "copy_extensions = none\n[anything]\ncommonName = optional\n"
            "[server]\nbasicConstraints = CA:FALSE\nkeyUsage = critical,digitalSignature\n"
            "extendedKeyUsage = serverAuth\nsubjectAltName = IP:127.0.0.1,DNS:localhost\n"
            "subjectKeyIdentifier = hash\nauthorityKeyIdentifier = keyid\n"
            "[client]\nbasicConstraints = CA:FALSE\nkeyUsage = critical,digitalSignature\n"
            "extendedKeyUsage = clientAuth\nsubjectKeyIdentifier = hash\nauthorityKeyIdentifier = keyid\n")
        self.server = self.issue("server", "/CN=localhost", "server")

    @property
    def ca(self) -> Path:
        return self.root / "ca" / "ca.pem"

    def issue(self, name: str, subject: str, kind: str = "client", ca: str = "ca",
              dates: tuple[str, str] | None = None) -> tuple[Path, Path]:
        """(certificate, key) of ``subject`` signed by ``ca`` (``dates``: not before, not after)."""
        self._openssl("req", "-new", "-nodes", *self._ec(f"{name}.key"), "-out", f"{name}.csr",
                      "-subj", subject)
        when = ["-startdate", dates[0], "-enddate", dates[1]] if dates else ["-days", "2"]
        self._openssl("ca", "-batch", "-notext", "-config", "ca.cnf", "-name", "test", "-extensions", kind,
                      "-cert", f"{ca}/ca.pem", "-keyfile", f"{ca}/ca.key", "-in", f"{name}.csr",
                      "-out", f"{name}.pem", *when, ca=ca)
        key = self.root / f"{name}.key"
        key.chmod(0o600)
        return self.root / f"{name}.pem", key

    @staticmethod
    def _ec(key: str) -> list[str]:
        return ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-keyout", key]

    def _openssl(self, *args: str, ca: str = "ca") -> None:
        done = subprocess.run(["openssl", *args], cwd=self.root, capture_output=True, text=True, check=False,
                              env={**os.environ, "PKI_DIR": str(self.root / ca)})
        assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    found = Pki(tmp_path_factory.mktemp("pki"))
    found.issue("alice", "/CN=tenant:a")
    found.issue("bob", "/CN=tenant:b")
    found.issue("stranger", "/CN=tenant:a", ca="other")
    found.issue("expired", "/CN=tenant:a", dates=("20200101000000Z", "20200102000000Z"))
    found.issue("nameless", "/O=fleetlog")
    return found


def client(pki: Pki, who: str | None) -> ssl.SSLContext:
    """What a fleetlog client builds from FLEETLOG_CA_FILE and the client certificate variables."""
    env = {"FLEETLOG_CA_FILE": str(pki.ca)}
    if who is not None:
        env |= {"FLEETLOG_CLIENT_CERT_FILE": str(pki.root / f"{who}.pem"),
                "FLEETLOG_CLIENT_KEY_FILE": str(pki.root / f"{who}.key")}
    context = tls_context(env)
    assert context is not None
    return context


def call(url: str, context: ssl.SSLContext, token: str | None = None, body: bytes | None = None,
         ) -> tuple[int, dict[str, Any]]:
    headers = {"content-type": "application/json"} | ({"Authorization": f"Bearer {token}"} if token else {})
    req = urllib.request.Request(url, data=body, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10, context=context) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def acall(url: str, context: ssl.SSLContext, token: str | None = None,
                body: bytes | None = None) -> tuple[int, dict[str, Any]]:
    return await asyncio.to_thread(call, url, context, token, body)


def handshake_refusal(port: int, context: ssl.SSLContext) -> str:
    """What a client that asks for /healthz gets: never an HTTP answer.  The server's handshake
    fails and it closes the connection — without the alert that would say why (asyncio's and
    uvloop's SSL transports drop it: cpython gh-98078).  Under TLS 1.2 the client is still in the
    handshake and ``wrap_socket`` raises; under TLS 1.3 its half of the handshake is done when the
    server checks the certificate, and its first read finds the connection closed."""
    received = b""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        stage = "handshake"
        try:
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                stage = "read"
                tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                while chunk := tls.recv(4096):
                    received += chunk
        except (ssl.SSLError, ConnectionError) as exc:
            assert received == b""
            return f"{stage}: {exc}"
    assert received == b"", received[:80]
    return f"{stage}: closed"


def fleetlog(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *args: str,
             env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """``fleetlog ARGS`` in this process (exit code, stdout, stderr) with ``env`` set ("" unsets)."""
    with monkeypatch.context() as patched:
        for name, value in (env or {}).items():
            if value:
                patched.setenv(name, value)
            else:
                patched.delenv(name, raising=False)
        capsys.readouterr()
        code = main(list(args))
        out, err = capsys.readouterr()
    return code, out, err


def tls_settings(pki: Pki, **more: str) -> AuthSettings:
    cert, key = pki.server
    given = {"tls_cert_file": str(cert), "tls_key_file": str(key), "client_ca_file": str(pki.ca)}
    return AuthSettings(**(given | more))


async def serving(tmp_path: Path, auth: AuthSettings) -> Running:
    return await start(Config(log=LogConfig(dir=str(tmp_path / "log"), fsync="never"),
                              service=ServiceSettings(http_port=0, idle_wait_ms=20), auth=auth))


def https(running: Running) -> str:
    return f"https://127.0.0.1:{running.service.http.port}"


async def test_a_client_certificate_names_its_principal_and_wins_over_a_token(
    tmp_path: Path, pki: Pki, monkeypatch: pytest.MonkeyPatch,
) -> None:
    tokens = tokens_file(tmp_path / "tokens.toml", entry_toml("tenant:b", TOKEN, None))
    policy = secret(tmp_path / "policy.toml", POLICY)
    running = await serving(tmp_path, tls_settings(pki, tokens_file=str(tokens), policy_file=str(policy)))
    url, alice = https(running), client(pki, "alice")
    try:
        status, answer = await acall(url + "/v1/events", alice, body=events_body(job("a1", tenant="a")))
        assert status == 200, answer
        status, answer = await acall(url + "/v1/events", alice, body=events_body(job("b1", tenant="b")))
        assert status == 403, answer
        assert answer["code"] == "forbidden"
        assert "tenant:NAME submits" in answer["rule"]
        assert "roles: tenant:a" in answer["message"]
        # a verified certificate wins over a token (tenant:b's): still tenant:a
        status, answer = await acall(url + "/v1/events", alice, TOKEN, events_body(job("b2", tenant="b")))
        assert status == 403, answer
        bob = client(pki, "bob")
        assert (await acall(url + "/v1/events", bob, body=events_body(job("b3", tenant="b"))))[0] == 200
        status, answer = await acall(url + "/v1/jobs", alice)
        assert status == 200
        assert [j["job_id"] for j in answer["items"]] == ["a1"]  # (b3 is tenant b's: not alice's to see)
        # fleetlog's aiohttp clients (reader, producer) present the certificate the environment names
        monkeypatch.setenv("FLEETLOG_CA_FILE", str(pki.ca))
        monkeypatch.setenv("FLEETLOG_CLIENT_CERT_FILE", str(pki.root / "alice.pem"))
        monkeypatch.setenv("FLEETLOG_CLIENT_KEY_FILE", str(pki.root / "alice.key"))
        async with Reader(url) as api:
            assert [j.job_id for j in await api.jobs()] == ["a1"]
        transport = HttpTransport("127.0.0.1", running.service.http.port, scheme="https")
        try:
            found = await transport.job("a1")
            assert found is not None
            assert found["tenant"] == "a"
            sent = await transport.deliver([keyed(job("a2", tenant="a"), "test")])
            assert sent.appended == 1
            with pytest.raises(ClientError, match=r"HTTP 403"):
                await transport.deliver([keyed(job("b4", tenant="b"), "test")])
        finally:
            await transport.close()
        store = running.service.store
        assert store is not None
        records = await store.log(INPUTS).read(0, 10)
        assert [r.header(PRINCIPAL_HEADER) for r in records] == [b"tenant:a", b"tenant:b", b"tenant:a"]
        # a certificate of the CA without a commonName names no one
        status, answer = await acall(url + "/v1/jobs", client(pki, "nameless"))
        assert status == 401
        assert "commonName" in answer["message"]
    finally:
        await running.stop()


async def test_a_certificate_of_another_ca_or_expired_is_refused_at_the_handshake(
    tmp_path: Path, pki: Pki,
) -> None:
    running = await serving(tmp_path, tls_settings(pki))
    port = running.service.http.port
    try:
        for who in ("stranger", "expired"):
            tls12 = client(pki, who)
            tls12.maximum_version = ssl.TLSVersion.TLSv1_2
            assert (await asyncio.to_thread(handshake_refusal, port, tls12)).startswith("handshake: ")
            refused = await asyncio.to_thread(handshake_refusal, port, client(pki, who))  # TLS 1.3
            assert refused.startswith("read: "), refused
            with pytest.raises(OSError) as caught:  # noqa: PT011 (urllib, as the CLI reads: no answer)
                await acall(https(running) + "/healthz", client(pki, who))
            assert not isinstance(caught.value, urllib.error.HTTPError)
        for who in ("alice", None):  # the same server answers a good certificate, or none
            assert (await acall(https(running) + "/healthz", client(pki, who)))[0] == 200
    finally:
        await running.stop()


async def test_without_a_certificate_the_probes_answer_and_the_api_needs_a_token(
    tmp_path: Path, pki: Pki,
) -> None:
    tokens = tokens_file(tmp_path / "tokens.toml", entry_toml("tenant:b", TOKEN, None))
    running = await serving(tmp_path, tls_settings(pki, tokens_file=str(tokens)))
    url, anonymous = https(running), client(pki, None)
    try:
        for path in ("/healthz", "/readyz"):
            assert (await acall(url + path, anonymous))[0] in (200, 503)
        status, answer = await acall(url + "/v1/jobs", anonymous)
        assert status == 401
        assert answer["code"] == "unauthenticated"
        assert answer["message"] == NEITHER
        assert "no client certificate and no token" in answer["message"]
        assert (await acall(url + "/v1/jobs", anonymous, "x" + TOKEN))[0] == 401
        assert (await acall(url + "/v1/jobs", anonymous, TOKEN))[0] == 200
        status, _ = await acall(url + "/v1/events", anonymous, TOKEN, events_body(job("b1", tenant="b")))
        assert status == 200
        plain = url.replace("https", "http") + "/healthz"
        with pytest.raises(OSError):  # noqa: PT011 (plain HTTP gets no answer on the TLS port: any error)
            await asyncio.to_thread(urllib.request.urlopen, plain, None, 5)
    finally:
        await running.stop()


def test_the_principal_is_the_one_common_name_of_a_verified_certificate(tmp_path: Path) -> None:
    subject = ((("countryName", "DE"),), (("commonName", "tenant:a"),))
    assert certificate_principal({"subject": subject}).principal == "tenant:a"
    twice = ((("commonName", "tenant:a"),), (("commonName", "operator"),))
    assert certificate_principal({"subject": twice}).principal is None
    assert "0 commonNames" in certificate_principal({"subject": ((("organizationName", "x"),),)}).problem
    only_certificates = Authenticator(None, certificates=True)
    assert only_certificates.check(f"Bearer {TOKEN}").problem.startswith("no client certificate")
    assert only_certificates.check(None, {"subject": subject}).principal == "tenant:a"
    tokens = tokens_file(tmp_path / "tokens.toml", entry_toml("tenant:b", TOKEN, None))
    both = Authenticator(tokens, certificates=True)
    assert both.check(None).problem == NEITHER
    assert both.check(f"Bearer {TOKEN}").principal == "tenant:b"
    assert both.check(f"Bearer {TOKEN}", {"subject": subject}).principal == "tenant:a"
    assert Authenticator(tokens).check(None).problem.startswith("no token")  # tokens alone: as before


def test_the_tls_files_are_checked_before_anything_starts(tmp_path: Path, pki: Pki) -> None:
    cert, key = pki.server
    with pytest.raises(AuthError, match="client_ca_file checks client certificates over TLS"):
        security(AuthSettings(client_ca_file=str(pki.ca)), "127.0.0.1")
    with pytest.raises(AuthError, match=r"tls_cert_file needs auth\.tls_key_file"):
        security(AuthSettings(tls_cert_file=str(cert)), "127.0.0.1")
    with pytest.raises(AuthError, match="listens beyond this machine without authentication"):
        security(AuthSettings(tls_cert_file=str(cert), tls_key_file=str(key)), "0.0.0.0")  # TLS alone
    assert security(tls_settings(pki), "0.0.0.0").auth is not None  # client certificates authenticate
    with pytest.raises(AuthError, match=r"auth\.client_ca_file .*cannot be loaded"):
        security(tls_settings(pki, client_ca_file=str(key)), "127.0.0.1")
    open_key = tmp_path / "open.key"
    open_key.write_bytes(key.read_bytes())
    open_key.chmod(0o644)
    with pytest.raises(AuthError, match="chmod 600") as caught:
        security(AuthSettings(tls_cert_file=str(cert), tls_key_file=str(open_key)), "127.0.0.1")
    assert "PRIVATE KEY" not in str(caught.value)
    context = security(tls_settings(pki), "127.0.0.1").tls
    assert context is not None
    assert context.verify_mode == ssl.CERT_OPTIONAL
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2


def test_run_refuses_a_client_ca_without_a_server_certificate_in_one_line(
    tmp_path: Path, pki: Pki, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = tmp_path / "fleetlog.toml"
    config.write_text(f'[log]\ndir = "{tmp_path / "log"}"\n[auth]\nclient_ca_file = "{pki.ca}"\n')
    code, _, err = fleetlog(capsys, monkeypatch, "run", "--config", str(config), "--http-port", "0")
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("fleetlog run: error: auth.client_ca_file checks client certificates over TLS: "
                          "set [auth] tls_cert_file and tls_key_file"), err
    cert, key = pki.server
    open_key = tmp_path / "open.key"
    open_key.write_bytes(key.read_bytes())
    open_key.chmod(0o640)
    tls = {"FLEETLOG_AUTH_TLS_CERT_FILE": str(cert), "FLEETLOG_AUTH_TLS_KEY_FILE": str(open_key)}
    code, _, err = fleetlog(capsys, monkeypatch, "run", "--config", str(config), "--http-port", "0", env=tls)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert "auth.tls_key_file" in err
    assert "chmod 600" in err
    assert not (tmp_path / "log").exists()  # refused before anything started


@pytest.fixture
def public(tmp_path: Path, pki: Pki) -> Iterator[tuple[ServiceProcess, str, Path]]:
    """``fleetlog run`` on 0.0.0.0 with only client certificates for authentication (allowed)."""
    cert, key = pki.server
    config = tmp_path / "fleetlog.toml"
    log = tmp_path / "log"
    config.write_text(f'[log]\ndir = "{log}"\nfsync = "never"\n[service]\nhttp_host = "0.0.0.0"\n[auth]\n'
                      f'tls_cert_file = "{cert}"\ntls_key_file = "{key}"\nclient_ca_file = "{pki.ca}"\n')
    proc = ServiceProcess(tmp_path / "service.log", ["--config", str(config)], {}).start()
    try:
        url = "https://127.0.0.1:" + proc.address().rsplit(":", 1)[1]
        deadline = time.monotonic() + 60
        while True:  # until it leads (its health, over TLS, without a certificate)
            try:
                if call(url + "/healthz", client(pki, None))[1]["status"] == "leading":
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            assert time.monotonic() < deadline, proc.tail()
            time.sleep(0.1)
        yield proc, url, log
    finally:
        proc.stop()


def test_the_cli_reads_and_submits_over_mutual_tls(
    public: tuple[ServiceProcess, str, Path], pki: Pki, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    proc, url, log = public
    announced_at = announced(log)
    assert announced_at is not None
    assert announced_at.url.startswith("https://127.0.0.1:")  # bound to 0.0.0.0: dialled on loopback
    env = {"FLEETLOG_CA_FILE": str(pki.ca), "FLEETLOG_CLIENT_CERT_FILE": str(pki.root / "alice.pem"),
           "FLEETLOG_CLIENT_KEY_FILE": str(pki.root / "alice.key"), "FLEETLOG_TOKEN": "",
           "FLEETLOG_TOKEN_FILE": ""}

    def cli(*args: str, **more: str) -> tuple[int, str, str]:
        return fleetlog(capsys, monkeypatch, *args, env=env | more)

    # submit to the log the service holds: through its ingest, over TLS, as tenant:a (fleetlog.client)
    code, _, err = cli("submit", "j1", "--tenant", "a", "--gpus", "1", "--log", str(log))
    assert code == 0, err + proc.tail()
    deadline = time.monotonic() + 30
    while True:
        code, out, err = cli("jobs", "--url", url, "-o", "json")
        assert code == 0, err
        if [j["job_id"] for j in json.loads(out)["items"]] == ["j1"]:
            break
        assert time.monotonic() < deadline, out
        time.sleep(0.1)
    code, out, err = cli("jobs", "--log", str(log))  # the service service.json announces (https)
    assert code == 0, err
    assert "j1" in out
    code, _, err = cli("jobs", "--url", url, FLEETLOG_CLIENT_CERT_FILE="", FLEETLOG_CLIENT_KEY_FILE="")
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert "401" in err
    assert "no client certificate" in err
    code, _, err = cli("jobs", "--url", url, FLEETLOG_CLIENT_CERT_FILE=str(pki.root / "stranger.pem"),
                       FLEETLOG_CLIENT_KEY_FILE=str(pki.root / "stranger.key"))  # another CA's
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert "closed the connection at the TLS handshake" in err
    code, _, err = cli("jobs", "--url", url, FLEETLOG_CA_FILE=str(pki.root / "missing.pem"))
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("fleetlog jobs: error: FLEETLOG_CA_FILE "), err


def test_the_service_announces_https_and_producers_find_it(tmp_path: Path) -> None:
    announce(tmp_path, os.getpid(), "127.0.0.1:9464", "https")
    found = announced(tmp_path)
    assert found is not None
    assert found.url == "https://127.0.0.1:9464"
    assert running_service(tmp_path) == ("127.0.0.1", 9464)
    announce(tmp_path, os.getpid(), "127.0.0.1:9464")
    assert "scheme" not in json.loads((tmp_path / "service.json").read_text())  # as before
    assert announced(tmp_path) == ("127.0.0.1", 9464, "http")


def test_the_documented_auth_settings_are_every_key() -> None:
    """docs/service.md's ``[auth]`` table shows every key (none has a default: each commented)."""
    text = (Path(REPO) / "docs" / "service.md").read_text()
    block = text.split("```toml", 1)[1].split("```", 1)[0]
    assert tomllib.loads(block).get("auth", {}) == {}
    table = block.split("\n[auth]", 1)[1].split("\n[", 1)[0]
    defaults = msgspec.to_builtins(AuthSettings())
    assert all(value is None for value in defaults.values())
    for key in defaults:
        assert f"\n# {key} = " in table, key
