"""The cost of authentication and authorization (issue 22): ``ingest_auth_ratio`` and
``authz_check_p99_us``.

* ``ingest_auth_ratio`` — HTTP ingest events/s with authentication and authorization on over off:
  two embedded services (file log, ``fsync = "never"``) in this process, one with a tokens file of
  ``TOKENS`` entries and a policy file granting each of them a role, one with neither, fed the
  same requests (``EVENTS`` heartbeats each, one keep-alive connection) in alternated runs; the
  ratio of the medians (target >= 0.9).  The heartbeats are of a fleet of ``FLEET`` nodes, the
  same in every run (until 2026-12-06 every heartbeat named a new node, so each service's state
  grew by 20,000-50,000 nodes a run and its rate fell threefold across the rounds).  Every
  heartbeat is checked against the sender's
  ``node-agent:c1`` role.  ``ingest_auth_ratio_log_policy``: the same with a third service whose
  policy is its log's ``PolicySet`` (the same grants), so the fold's gate
  (``fleetlog.core.authorize.fold_checked``) checks every record again where it is folded.
* ``fold_gate_ratio`` — the fold alone, in this process: 100,000 heartbeats of 1,000 nodes
  folded in reads of 10,000 through the gate with every record naming its principal and a
  ``PolicySet`` in the state, over the same through ``fold_lists`` without principals (the
  median of alternated runs; 1.0 = free).
* ``authz_check_p99_us`` — p99 of one request's whole check, in microseconds: the bearer token
  (:meth:`Authenticator.check`: parse the header, SHA-256 the token, look it up, check expiry and
  revocation), the principal's roles (:meth:`Authorizer.roles`) and the rules over one event
  (:func:`check_events`, a heartbeat of the principal's cell).  ``authn_check_p99_us`` is the first
  part alone; ``authz_check_p99_us_log_policy`` the whole with the same grants as the log's
  ``PolicySet`` (the policy in force once one is folded) instead of the policy file.

Client and services share this process and its cores, so the rates are lower than
``benchmarks.http_ingest``'s; only their ratio is the measurement.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import structlog
import uvloop

from benchmarks.common import emit, machine, parse
from fleetlog.core.authorize import fold_checked
from fleetlog.core.fold_batch import fold_lists
from fleetlog.core.state import State
from fleetlog.events import NodeHeartbeat, PolicyGrant, PolicySet, encode, envelope
from fleetlog.service.auth import Authenticator, entry_toml, new_token
from fleetlog.service.authz import Authorizer, check_events, policy_set
from fleetlog.service.config import AuthSettings, Config, LogConfig, ServiceSettings
from fleetlog.service.service import Service

TOKENS = 1_000
CHECK_IS = "bearer token, the principal's roles and the rules over one heartbeat"
"""What ``authz_check_p99_us`` times."""
EVENTS = 100
FLEET = 10_000


def _tokens(path: Path) -> str:
    """A tokens file of :data:`TOKENS` principals and, beside it (``policy.toml``), a policy
    granting each a role; the token of ``agent-bench`` (``node-agent:c1``)."""
    token = new_token()
    path.write_text("".join(entry_toml(f"agent-{i}", new_token(), None) for i in range(TOKENS - 1))
                    + entry_toml("agent-bench", token, None))
    path.chmod(0o600)
    policy = path.with_name("policy.toml")
    policy.write_text("".join(f'[[grant]]\nprincipal = "agent-{i}"\nroles = ["node-agent:c{i}"]\n\n'
                              for i in range(TOKENS - 1))
                      + '[[grant]]\nprincipal = "agent-bench"\nroles = ["node-agent:c1"]\n')
    policy.chmod(0o600)
    return token


def _body(run: int, request: int) -> bytes:
    """``EVENTS`` heartbeats of a fleet of :data:`FLEET` nodes (the same nodes run after run: a
    state that does not grow, so the rounds measure the same work)."""
    beats = [NodeHeartbeat(cell="c1", node=f"n{(request * EVENTS + i) % FLEET}", cpu_milli=96_000,
                           mem_mib=786_432, gpu_count=8, gpu_model="A100") for i in range(EVENTS)]
    return b"[" + b",".join(encode(envelope(b, f"bench-{run}-{request}"), "json") for b in beats) + b"]"


async def _ingest(url: str, headers: dict[str, str], bodies: list[bytes]) -> float:
    """Events per second of POSTing ``bodies`` one after another on one connection."""
    async with aiohttp.ClientSession(headers={"Content-Type": "application/json", **headers}) as http:
        started = time.perf_counter()
        for body in bodies:
            async with http.post(url + "/v1/events", data=body) as answer:
                await answer.read()
                assert answer.status == 200, answer.status
        return len(bodies) * EVENTS / (time.perf_counter() - started)


async def _started(config: Config) -> tuple[Service, asyncio.Task[None]]:
    service = Service(config)
    task = asyncio.create_task(service.run())
    while service.loop is None:
        await asyncio.sleep(0.05)
    return service, task


async def ingest_ratio(root: Path, requests: int, rounds: int) -> dict[str, Any]:
    token = _tokens(root / "tokens.toml")
    settings = ServiceSettings(http_port=0, idle_wait_ms=20)
    off = await _started(Config(log=LogConfig(dir=str(root / "off"), fsync="never"), service=settings))
    auth = AuthSettings(tokens_file=str(root / "tokens.toml"), policy_file=str(root / "policy.toml"))
    on = await _started(Config(log=LogConfig(dir=str(root / "on"), fsync="never"), service=settings,
                               auth=auth))
    logged = await _started(Config(log=LogConfig(dir=str(root / "log"), fsync="never"), service=settings,
                                   auth=msgspec.structs.replace(auth, policy_file=None)))
    await _append_policy(logged[0], token, root / "policy.toml")
    services = {"off": off, "on": on, "log": logged}
    rates: dict[str, list[float]] = {mode: [] for mode in services}
    try:
        for run in range(rounds):
            for k, mode in enumerate(list(services)[run % 3:] + list(services)[:run % 3]):  # (rotated)
                headers = {"Authorization": f"Bearer {token}"} if mode != "off" else {}
                bodies = [_body(run * 3 + k, i) for i in range(requests)]
                url = f"http://127.0.0.1:{services[mode][0].http.port}"
                rates[mode].append(await _ingest(url, headers, bodies))
    finally:
        for service, task in services.values():
            service.stop()
            await task
    off_rate = statistics.median(rates["off"])
    return {"ingest_auth_ratio": statistics.median(rates["on"]) / off_rate,
            "ingest_auth_ratio_log_policy": statistics.median(rates["log"]) / off_rate,
            "ingest_events_per_s": rates, "target_ingest_auth_ratio": 0.9}


async def _append_policy(service: Service, token: str, policy: Path) -> None:
    """The policy file's grants, and a ``policy-admin``, as a ``PolicySet`` in ``service``'s log
    (appended with ``token``: every role, the service having no policy file); waits until folded."""
    grants = (*policy_set(policy, policy.read_bytes()).grants, PolicyGrant("bench-admin", ("policy-admin",)))
    body = encode(envelope(PolicySet(grants=grants), "bench-policy"), "json")
    async with aiohttp.ClientSession() as http, http.post(
            f"http://127.0.0.1:{service.http.port}/v1/events", data=body,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"}) as answer:
        assert answer.status == 200, await answer.text()
    while service.loop is None or service.loop.state.policy is None:
        await asyncio.sleep(0.02)


def fold_gate_ratio(rounds: int, beats: int = 100_000, nodes: int = 1_000,
                    read: int = 10_000) -> dict[str, Any]:
    """:func:`fold_checked` with every record naming a principal the log's policy allows, over
    :func:`fold_lists` of the same heartbeats without principals (median of ``rounds`` each)."""
    fleet = [NodeHeartbeat(cell="c1", node=f"n{i}", cpu_milli=96_000, mem_mib=786_432, gpu_count=8,
                           gpu_model="A100") for i in range(nodes)]
    events, times = [fleet[i % nodes] for i in range(beats)], list(range(1_000, 1_000 + beats))
    policy = PolicySet(grants=(PolicyGrant("agent-bench", ("node-agent:c1",)),))
    seconds: dict[str, list[float]] = {"plain": [], "gated": []}
    for _ in range(rounds):
        for mode in ("plain", "gated"):
            state = State()
            fold_lists(state, [policy], [999])
            named = ["agent-bench"] * read

            def principals(named: list[str | None] = named) -> list[str | None]:
                return named
            started = time.perf_counter()
            for at in range(0, beats, read):
                if mode == "plain":
                    fold_lists(state, events[at:at + read], times[at:at + read])
                else:
                    fold_checked(state, events[at:at + read], times[at:at + read], principals, fold_lists)
            seconds[mode].append(time.perf_counter() - started)
    plain, gated = statistics.median(seconds["plain"]), statistics.median(seconds["gated"])
    return {"fold_gate_ratio": plain / gated,
            "fold_beats_per_s": {"plain": beats / plain, "gated": beats / gated}}


def check_p99_us(root: Path, checks: int) -> dict[str, float]:
    """p99 of one request's check (token, roles, one heartbeat) against :data:`TOKENS`
    principals, of the token check alone, and of the whole check with the same grants as the
    log's ``PolicySet`` instead of the file (``_log_policy``), in microseconds."""
    (root / "check").mkdir()
    token = _tokens(root / "check" / "tokens.toml")
    auth = Authenticator(root / "check" / "tokens.toml")
    policy = root / "check" / "policy.toml"
    authz = Authorizer(str(policy))
    logged = policy_set(policy, policy.read_bytes())
    header = f"Bearer {token}"
    beat = [NodeHeartbeat(cell="c1", node="n1", cpu_milli=96_000, mem_mib=786_432, gpu_count=8,
                          gpu_model="A100")]
    state = State()
    whole, authn, in_log = [], [], []
    for _ in range(checks):
        for times, policed in ((whole, None), (in_log, logged)):
            started = time.perf_counter_ns()
            principal = auth.check(header).principal
            middle = time.perf_counter_ns()
            assert principal is not None
            roles = authz.roles(principal, policed)
            assert roles is not None
            check_events(roles, state, beat)
            ended = time.perf_counter_ns()
            times.append(ended - started)
        authn.append(middle - started)
    return {"authz_check_p99_us": _p99(whole) / 1000, "authn_check_p99_us": _p99(authn) / 1000,
            "authz_check_p99_us_log_policy": _p99(in_log) / 1000}


def _p99(times: list[int]) -> float:
    times = sorted(times)
    return times[min(len(times) - 1, int(len(times) * 0.99))]


def measure(quick: bool, smoke: bool) -> dict[str, Any]:
    requests, rounds = (20, 2) if smoke else (200, 4) if quick else (500, 6)
    with tempfile.TemporaryDirectory(prefix="fleetlog-auth-bench-") as tmp:
        root = Path(tmp)
        ingest = uvloop.run(ingest_ratio(root, requests, rounds))
        p99 = check_p99_us(root, 1_000 if smoke else 100_000)
    gate = fold_gate_ratio(1 if smoke else 5, 20_000 if smoke else 100_000)
    return {"benchmark": "auth", "machine": machine(), **ingest, **p99, **gate,
            "authz_check_is": CHECK_IS,
            "requests_per_run": requests, "events_per_request": EVENTS, "rounds": rounds}


def main() -> None:
    args = parse(__doc__ or "")
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr),
                        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    emit(measure(args.quick, args.smoke), args.json)


if __name__ == "__main__":
    main()
