"""Issue 46's bar: the read path, admission and connections under attack, beside a victim.

``python -m benchmarks.abuse --json`` starts a real ``fleetlog run`` (a child process, its own
settings but for ``max_submissions_per_s = 5`` (burst 50), ``max_pending_tasks`` (below) and a
node timeout of a day: file log in a temporary directory, ``[auth]`` on with a tokens file and a
policy file; at most ``SERVICE_FDS`` (1,024) file descriptors, as in the issue's ``ulimit -n
1024``; a fleet of 4 nodes of 8 GPUs; ``alice`` and ``bob`` each a nominal quota of half) and
mounts each attack of issue 46 in turn, one at a time, for ``phase_s`` seconds (30; 8 at
``--quick``, 2 at ``--smoke``); then ``tls_handshakes`` against a second ``fleetlog run`` that
serves TLS (a self-signed certificate made with ``openssl``).  The victim's clients connect from
127.0.0.2, the attackers' from 127.0.0.3 (a service that shares its slots by peer tells them
apart as it would two hosts), beside a well-behaved tenant:

* **the victim**: ``bob`` (``tenant:bob``) submits one small job a second (a new connection
  each, as ``fleetlog submit`` does) — ``victim_submit_p99_ms`` over them; ``/healthz`` is probed
  one after another every 0.1 s on a new connection each (as a kubelet does) —
  ``victim_health_max_s``, the longest health went unanswered: a probe's latency or, while probes
  fail (a refused connection fails at once), the time from the first failing probe of the streak
  to the end of its last (a probe cut at the phase's end counts the time it waited); and
  ``rdr`` (``reader``) reads ``/v1/watch`` of the decisions all along (``victim_watch_bytes``).

Per attack, ``attacks_succeeded`` counts what the issue counts as the attack succeeding: each
victim submission refused (any answer but 200: 409, 429…) or not answered (a connection refused
or cut, or no answer in 60 s), each 500 any client of the phase got, and what the
attack itself wins (below).  The attacks (``alice`` is ``tenant:alice``, equal quotas to
``bob``'s; every job of hers is cancelled by ``ops`` after its phase):

* ``errors_500``: a non-UTF-8 ``Authorization``, ``²`` in ``page_token``, ``limit``, ``from``
  and ``Last-Event-ID`` (raw requests, repeated for the phase); wins: each probe that got a 500.
* ``reading``: ``alice`` and ``rdr`` read bob's job (its ``payload.env`` holds a secret) through
  the job list, the job's detail, ``/v1/history`` and both watches from the start; wins: each
  (principal, surface) whose answer held the secret (the policy lets a ``reader`` see every job,
  but ``payload.env`` is the job's tenant's and its backend's only).
* ``job_ids``: ``alice`` first submits the ids bob will use in the phase; bob's 409s are the wins.
  Bob names his jobs ``bob/…`` as docs/api.md ("Job ids") asks; the service runs with its
  defaults, under which ids under a tenant's prefix are that tenant's (alice's ``bob/…`` are 403;
  before that rule they were taken as any others).
* ``exemption``: ``ghost`` (``backend:nope``, a cell that does not exist) submits jobs held to its
  cell as fast as it can; wins 1 when it got more than the rate limit allows a tenant
  (5 a second after a burst of 50, plus a second's grace).
* ``metadata``: ``alice`` submits jobs at every metadata bound (64 labels and 64 annotations filling
  ``MAX_JOB_METADATA_BYTES``, or before it 64 labels of 253 characters and 64 KiB of annotations;
  a 256 KiB payload) as fast as she is let, in requests of 20 (7 MB).
* ``pending``: ``alice`` fills the pending work (gangs of up to 10,000 one-CPU tasks held to a
  cell without nodes, so they wait) up to ``max_pending_tasks`` (1,000,000; 400,000 at
  ``--quick``): 100,000 tasks a request until a 429 ``too_much_pending`` says how much room is
  left, then exactly that, and she holds the bound for the rest of the phase.
* ``watch``: ``watchers`` stuck watch streams of ``alice`` (16; 2 at ``--smoke``), half of the
  inputs, half of the decisions, from the start, read to their status line and never again, on
  sockets with a 4 KiB receive buffer; ``service_rss_growth_mib`` is the service's largest
  ``VmRSS`` during the phase over its ``VmRSS`` at the start (sampled every 0.25 s; every attack
  reports it), ``rss_at_close_mib`` and ``rss_2s_after_close_mib`` the ``VmRSS`` as the streams
  closed and 2 s later.  (The inputs then hold
  the ``metadata`` phase's jobs: the large records.)
* ``dry_run``: ``rdr`` posts one dry run of ``dry_jobs`` jobs × 10,000 tasks (1,000; 100 at
  ``--quick``; tasks that ask for nothing, so every one is placed and answered) while ``alice``
  repeats one-job dry runs on two connections and ``rdr`` the largest a request may hold
  (10 jobs: ``max_request_tasks``) for the phase.
* ``priority``: before the phase bob runs ``priority_jobs`` gangs (4; 2 at ``--smoke``) of 4
  one-GPU tasks on 4 distinct hosts (16 GPUs: his whole nominal quota), so that no node is free
  whole; ``alice`` submits 2 jobs of a whole node (8 GPUs: her nominal quota) at priority
  1,000,000; each of bob's jobs preempted (its story says ``preempted``, or it waits again) is a win.
* ``body_slots``: 16 request heads with ``Content-Length`` and no body from ``alice`` and 16 from
  ``nope`` (a token the policy names nowhere), each reopened when the service closes it.
* ``tls_handshakes``: ``tls_connections`` (1,200; 60 at ``--smoke``) TCP connections that never
  send a ClientHello, held for the phase.

``attacks_succeeded`` is their sum; ``targets_met`` checks the issue's targets (0 attacks
succeeded; victim submit p99 and health at most 1 s under every attack; RSS growth at most
256 MiB under the watch attack).  ``--smoke`` is a test that every attack runs, not a measure.
The service is stopped by its PID (SIGTERM, then SIGKILL after 30 s) whatever happens, and
restarted on the same log if an attack killed it (``service_exit`` in that attack).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import resource
import shutil
import signal
import ssl
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import FrameType
from typing import Any, Final
from urllib.parse import quote

import aiohttp
import uvloop

from benchmarks.abuse_harness import (
    BURST,
    RATE_PER_S,
    SIZES,
    STARTED,
    TIMEOUT_S,
    Run,
    ServiceProcess,
    Size,
    Victim,
    body,
    close,
    code_of,
    job,
    progress,
    secrets,
    stop,
)
from benchmarks.common import add_smoke, emit, machine
from fleetlog.events import JobSubmitted, NodeHeartbeat, model
from fleetlog.events.model import JobPayload

NODES: Final = 4
NODE_GPUS: Final = 8
NODE_CPU: Final = 64_000
NODE_MEM: Final = 524_288
FAR: Final = "far-cell"
"""A cell without nodes: jobs held to it wait (and are not refused as never fitting)."""
SECRET: Final = "wandb-" + "7f3c9a1e5b2d4c6f8a0b1c2d3e4f5a6b"
SECRET_JOB: Final = "bob/secret"
TARGET_MS: Final = 1000.0
TARGET_HEALTH_S: Final = 1.0
TARGET_RSS_MIB: Final = 256.0
BAD_PARAM: Final = "%C2%B2"  # ²: a Unicode digit


# -- the attacks ------------------------------------------------------------------------------

Attack = Callable[[Run, Victim], Awaitable[dict[str, Any]]]


async def until_end(run: Run, started: float) -> None:
    await asyncio.sleep(max(0.0, started + run.size.phase_s - time.monotonic()))


async def errors_500(run: Run, victim: Victim) -> dict[str, Any]:
    probes = {
        "authorization_not_utf8": run.head("GET", "/v1/jobs", None,
                                           b"Authorization: Bearer \xff\xfe\xfa\xc3("),
        "jobs_page_token": run.head("GET", f"/v1/jobs?page_token={BAD_PARAM}", "alice"),
        "jobs_limit": run.head("GET", f"/v1/jobs?limit={BAD_PARAM}", "alice"),
        "nodes_page_token": run.head("GET", f"/v1/nodes?page_token={BAD_PARAM}", "alice"),
        "history_page_token": run.head("GET", f"/v1/history?page_token={BAD_PARAM}", "alice"),
        "watch_from": run.head("GET", f"/v1/watch?from={BAD_PARAM}", "alice"),
        "watch_last_event_id": run.head("GET", "/v1/watch", "alice", "Last-Event-ID: ²".encode()),
    }
    seen: dict[str, Counter[str]] = {name: Counter() for name in probes}
    started = time.monotonic()
    while True:
        for name, request in probes.items():
            seen[name][str(await run.status_of(request))] += 1
        if time.monotonic() - started >= run.size.phase_s:
            break
        await asyncio.sleep(0.2)
    return {"succeeded": sum("500" in counts for counts in seen.values()),
            "probes": {name: dict(counts) for name, counts in seen.items()}}


async def _stream_holds(run: Run, who: str, path: str, secret: bytes, limit_s: float) -> bool:
    """Whether the watch ``path`` read as ``who`` for up to ``limit_s`` shows ``secret``."""
    tail = b""
    try:
        async with run.session() as http, http.get(
                run.service.url + path, headers={"Authorization": f"Bearer {run.service.tokens[who]}"},
                timeout=aiohttp.ClientTimeout(total=limit_s)) as answer:
            run.errors_500 += answer.status == 500
            async for chunk in answer.content.iter_any():
                tail = tail[-len(secret):] + chunk
                if secret in tail:
                    return True
    except (TimeoutError, aiohttp.ClientError, OSError):
        pass
    return False


async def reading(run: Run, victim: Victim) -> dict[str, Any]:
    started = time.monotonic()
    secret = SECRET.encode()
    read: dict[str, bool] = {}
    for who in ("alice", "rdr"):
        for surface, path in (("list", "/v1/jobs?limit=10000"), ("list_tenant", "/v1/jobs?tenant=bob"),
                              ("detail", f"/v1/jobs/{quote(SECRET_JOB, safe='')}"),
                              ("history", "/v1/history")):
            _, raw = await run.call("GET", path, who)
            read[f"{who}.{surface}"] = secret in raw
    streams = {f"{who}.watch_{log}": f"/v1/watch?log={log}&from=start"
               for who in ("alice", "rdr", "bob") for log in ("inputs", "decisions")}
    limit_s = max(1.0, run.size.phase_s / 4)
    found = await asyncio.gather(*(_stream_holds(run, name.split(".")[0], path, secret, limit_s)
                                   for name, path in streams.items()))
    seen = dict(zip(streams, found, strict=True))
    own = seen.pop("bob.watch_inputs")
    del seen["bob.watch_decisions"]
    read.update(seen)
    await until_end(run, started)
    return {"succeeded": sum(read.values()), "foreign_payload_read": read, "control_bob_reads_his_own": own}


async def patiently(run: Run, who: str, events: list[Any], limit_s: float = 30.0) -> tuple[int, bytes]:
    """Submit as ``who``, waiting out the rate limit (an earlier phase may have drained the bucket:
    a phase's setup must not fail for that)."""
    deadline = time.monotonic() + limit_s
    while True:
        status, raw = await run.submit(who, events)
        if status != 429 or code_of(raw) != "too_many_submissions" or time.monotonic() > deadline:
            return status, raw
        await asyncio.sleep(1)


async def squat_ids(run: Run, victim: Victim) -> dict[str, Any]:
    """(Before the victim starts.)  Alice takes the ids bob will use."""
    ids = victim.ids(int(run.size.phase_s) + 5)
    status, raw = await patiently(run, "alice", [job(i, "alice", cells=(FAR,)) for i in ids])
    return {"squat_status": f"{status} {code_of(raw) if status != 200 else ''}".strip(), "squatted": len(ids)}


async def job_ids(run: Run, victim: Victim) -> dict[str, Any]:
    await until_end(run, time.monotonic())
    return {"victim_409": sum(n for what, n in victim.refused.items() if what.startswith("409"))}


async def exemption(run: Run, victim: Victim) -> dict[str, Any]:
    started = time.monotonic()
    accepted, answers, n = 0, Counter[str](), 0
    while time.monotonic() - started < run.size.phase_s:
        allowed = BURST + RATE_PER_S * (time.monotonic() - started + 1)
        if accepted > 2 * allowed:
            await asyncio.sleep(0.1)  # (proven: no need to grow the state further)
            continue
        ids = [f"ghost-{n + i:06d}" for i in range(50)]
        n += 50
        status, raw = await run.submit("ghost", [job(i, "ghost", cells=("nope",)) for i in ids])
        answers[f"{status} {code_of(raw)}" if status != 200 else "200"] += 1
        accepted += 50 if status == 200 else 0
        if status != 200:
            await asyncio.sleep(0.05)
    allowed = BURST + RATE_PER_S * (time.monotonic() - started + 1)
    return {"succeeded": int(accepted > allowed), "ghost_jobs_accepted": accepted,
            "rate_limit_allows": int(allowed), "answers": dict(answers)}


METADATA_BYTES: Final[int | None] = getattr(model, "MAX_JOB_METADATA_BYTES", None)
"""The per-job bound of labels and annotations together (issue 46); ``None`` in a tree before it
(the harness also measures the revision before the fixes)."""


def _heavy(job_id: str) -> JobSubmitted:
    """A job at every metadata bound: 64 labels and 64 annotations of ``MAX_JOB_METADATA_BYTES``
    together (before issue 46: 64 labels of 253 characters and 64 KiB of annotations), 256 KiB of payload."""
    if METADATA_BYTES is None:
        labels = {f"label-{i:02d}": f"{i:02d}" + "v" * 251 for i in range(64)}
        annotations = {f"note-{i:02d}": "a" * (65_536 // 64 - 7) for i in range(64)}
    else:
        labels = {f"label-{i:02d}": f"{i:02d}" + "v" * 116 for i in range(64)}  # 64 x 126 bytes
        annotations = {f"note-{i:02d}": "a" * (METADATA_BYTES // 64 - 126 - 7) for i in range(64)}
    payload = JobPayload(command=("train",), env={f"VAR_{i}": "x" * 31_990 for i in range(8)}, image="img")
    return job(job_id, "alice", cpu=10, cells=(FAR,), labels=labels, annotations=annotations, payload=payload)


async def metadata(run: Run, victim: Victim) -> dict[str, Any]:
    started = time.monotonic()
    accepted, answers, n = 0, Counter[str](), 0
    while time.monotonic() - started < run.size.phase_s and accepted < run.size.metadata_jobs:
        ids = [f"alice/meta-{n + i:06d}" for i in range(20)]  # (20 jobs: 7 MB, under the 8 MiB body bound)
        n += 20
        status, raw = await run.submit("alice", [_heavy(i) for i in ids])
        answers[f"{status} {code_of(raw)}" if status != 200 else "200"] += 1
        accepted += 20 if status == 200 else 0
        if status != 200:
            await asyncio.sleep(0.5)
    await until_end(run, started)
    return {"heavy_jobs_accepted": accepted, "answers": dict(answers)}


def _room(raw: bytes) -> int | None:
    """The tasks a 429 ``too_much_pending`` says are left under the bound it names."""
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        answer = json.loads(raw)
        return int(answer["limit"]) - int(answer["pending"])
    return None


async def pending(run: Run, victim: Victim) -> dict[str, Any]:
    """Alice fills the pending work: requests of 100,000 tasks (``max_request_tasks``) until the
    service says how much room is left, then exactly that, then holds the bound."""
    started = time.monotonic()
    accepted, answers, n, want = 0, Counter[str](), 0, 100_000
    while time.monotonic() - started < run.size.phase_s:
        sizes = [min(10_000, want - first) for first in range(0, want, 10_000)]
        ids = [f"alice/fill-{n + i:06d}" for i in range(len(sizes))]
        n += len(sizes)
        status, raw = await run.submit("alice", [job(i, "alice", tasks=k, cpu=1000, cells=(FAR,))
                                                 for i, k in zip(ids, sizes, strict=True)])
        answers[f"{status} {code_of(raw)}" if status != 200 else "200"] += 1
        if status == 200:
            accepted += want
            continue
        room = _room(raw) if code_of(raw) == "too_much_pending" else None
        if room is not None and room > 0:
            want = min(want, room)
        else:
            await asyncio.sleep(0.5)
    return {"alice_tasks_accepted": accepted, "max_pending_tasks": run.size.max_pending_tasks,
            "answers": dict(answers)}


async def watch(run: Run, victim: Victim) -> dict[str, Any]:
    started = time.monotonic()
    held: list[asyncio.StreamWriter] = []
    statuses = Counter[str]()
    try:
        for i in range(run.size.watchers):
            log = "inputs" if i % 2 == 0 else "decisions"
            try:
                reader, writer = await run.raw(small_buffer=True)
                writer.write(run.head("GET", f"/v1/watch?log={log}&from=start", "alice"))
                held.append(writer)
                line = await asyncio.wait_for(reader.readline(), 10)
                statuses[line.split(b" ")[1].decode() if line.startswith(b"HTTP/") else "none"] += 1
            except (TimeoutError, OSError, ssl.SSLError, IndexError):
                statuses["none"] += 1
        run.errors_500 += statuses["500"]
        await until_end(run, started)
    finally:
        for writer in held:
            await close(writer)
    rss = run.service.rss_mib()
    await asyncio.sleep(2)
    return {"stuck_watchers": run.size.watchers, "watch_statuses": dict(statuses),
            "rss_at_close_mib": round(rss),
            "rss_2s_after_close_mib": round(run.service.rss_mib())}


async def _drain(run: Run, who: str, path: str, payload: bytes, limit_s: float) -> tuple[str, float, int]:
    """Status (and code), seconds and bytes of an answer read (and dropped) as it comes."""
    started, size = time.monotonic(), 0
    try:
        async with run.session() as http, http.post(
                run.service.url + path, data=payload, timeout=aiohttp.ClientTimeout(total=limit_s),
                headers={"Authorization": f"Bearer {run.service.tokens[who]}",
                         "Content-Type": "application/json"}) as answer:
            run.errors_500 += answer.status == 500
            first = b""
            async for chunk in answer.content.iter_any():
                first = first or chunk
                size += len(chunk)
            status = f"{answer.status}" + (f" {code_of(first)}" if answer.status != 200 else "")
    except (TimeoutError, aiohttp.ClientError, OSError) as e:
        status = type(e).__name__
    return status, round(time.monotonic() - started, 3), size


def _dry_body(n: int) -> bytes:
    """``n`` jobs of 10,000 tasks that ask for nothing: every one is placed, and answered."""
    return body(job(f"alice/dry-{i:05d}", "alice", tasks=10_000, cpu=0, mem=0) for i in range(n))


async def dry_run(run: Run, victim: Victim) -> dict[str, Any]:
    """The reader's one huge dry run; alice's one-job dry runs on two connections meanwhile, and the
    reader's largest a request may hold (10 jobs: ``max_request_tasks``) one after another."""
    started = time.monotonic()
    big, bounded, one = _dry_body(run.size.dry_jobs), _dry_body(10), body([job("alice/dry-one", "alice")])
    runs: dict[str, list[tuple[str, float, int]]] = {"one": [], "bounded": []}

    async def repeat(who: str, what: str, payload: bytes) -> None:
        while time.monotonic() - started < run.size.phase_s:
            runs[what].append(await _drain(run, who, "/v1/dry-run", payload, TIMEOUT_S))

    limit_s = max(TIMEOUT_S, 4 * run.size.phase_s)
    whole, *_ = await asyncio.gather(_drain(run, "rdr", "/v1/dry-run", big, limit_s),
                                     repeat("alice", "one", one), repeat("alice", "one", one),
                                     repeat("rdr", "bounded", bounded))
    await until_end(run, started)
    found: dict[str, Any] = {"big_body_bytes": len(big), "big_status": whole[0], "big_s": whole[1],
                             "big_answer_bytes": whole[2]}
    for what, done in runs.items():
        found[f"{what}_runs"] = len(done)
        found[f"{what}_statuses"] = dict(Counter(r[0] for r in done))
        found[f"{what}_p50_ms"] = round(statistics.median([r[1] for r in done]) * 1000, 1) if done else None
    found["bounded_max_s"] = max((r[1] for r in runs["bounded"]), default=None)
    return found


async def _placed(run: Run, ids: list[str], limit_s: float) -> int:
    """How many of bob's jobs ``ids`` are placed or running, once all are or ``limit_s`` passed."""
    deadline = time.monotonic() + limit_s
    while True:
        states = [await _job_state(run, i) for i in ids]
        placed = sum(s.get("state") in ("placed", "running") for s in states)
        if placed == len(ids) or time.monotonic() > deadline:
            return placed
        await asyncio.sleep(0.5)


async def _job_state(run: Run, job_id: str) -> dict[str, Any]:
    for who in ("bob", "ops"):
        with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError):
            status, raw = await run.call("GET", f"/v1/jobs/{quote(job_id, safe='')}", who)
            if status == 200:
                found = json.loads(raw)
                return found if isinstance(found, dict) else {}
    return {}


def _preempted(detail: dict[str, Any]) -> bool:
    story = detail.get("story") or []
    return detail.get("state") == "pending" or any(step.get("what") == "preempted" for step in story)


async def hold_gpus(run: Run, victim: Victim) -> dict[str, Any]:
    """(Before the victim starts.)  Bob runs gangs of 4 one-GPU tasks on 4 hosts (``spread``), his
    nominal quota's worth at full size: every node holds some of bob's GPUs, none is free whole."""
    ids = [f"{victim.prefix}-gpu-{i:02d}" for i in range(run.size.priority_jobs)]
    victim.held = ids
    status, raw = await patiently(run, "bob", [job(i, "bob", tasks=NODES, cpu=2000, mem=8192, gpus=1,
                                                   spread="host") for i in ids])
    placed = await _placed(run, ids, 30) if status == 200 else 0
    return {"victim_gpu_jobs": len(ids), "victim_gpu_jobs_placed": placed,
            "victim_gpu_submit": f"{status} {code_of(raw) if status != 200 else ''}".strip()}


async def priority(run: Run, victim: Victim) -> dict[str, Any]:
    """Alice, inside her nominal quota (2 jobs of a whole node each), at priority 1,000,000."""
    started = time.monotonic()
    ids = [f"alice/prio-{i:02d}" for i in range(2)]
    status, raw = await patiently(run, "alice", [job(i, "alice", cpu=8000, mem=65536, gpus=NODE_GPUS,
                                                     priority=1_000_000) for i in ids], run.size.phase_s / 2)
    await until_end(run, started)
    preempted = sum([_preempted(await _job_state(run, i)) for i in victim.held])
    placed = sum([(await _job_state(run, i)).get("state") in ("placed", "running") for i in ids])
    return {"succeeded": preempted, "victim_preempted": preempted, "alice_placed": placed,
            "alice_submit": f"{status} {code_of(raw) if status != 200 else ''}".strip()}


async def body_slots(run: Run, victim: Victim) -> dict[str, Any]:
    started = time.monotonic()
    opened, closed_by_service = Counter[str](), Counter[str]()
    answered: dict[str, Counter[str]] = {"alice": Counter(), "nope": Counter()}  # status of the head's answer

    async def hold(who: str) -> None:
        head = run.head("POST", "/v1/events", who, b"Content-Type: application/json",
                        b"Content-Length: 1000000")
        while time.monotonic() - started < run.size.phase_s:
            try:
                reader, writer = await run.raw()
            except (TimeoutError, OSError, ssl.SSLError):
                await asyncio.sleep(0.2)
                continue
            opened[who] += 1
            try:
                writer.write(head)
                left = started + run.size.phase_s - time.monotonic()
                with contextlib.suppress(asyncio.TimeoutError, OSError, ssl.SSLError):
                    line = await asyncio.wait_for(reader.readline(), max(0.0, left))
                    parts = line.split()
                    if len(parts) >= 2:  # (the answer to the head alone: 403, 429, or 408 in seconds)
                        answered[who][parts[1].decode(errors="replace")] += 1
                    rest = started + run.size.phase_s - time.monotonic()
                    await asyncio.wait_for(reader.read(), max(0.0, rest))
                    closed_by_service[who] += 1
            finally:
                await close(writer)

    await asyncio.gather(*(hold(who) for who in ["alice"] * 16 + ["nope"] * 16))
    return {"heads_opened": dict(opened), "heads_answered": {w: dict(c) for w, c in answered.items()},
            "closed_by_service": dict(closed_by_service)}


async def tls_handshakes(run: Run, victim: Victim) -> dict[str, Any]:
    started = time.monotonic()
    held: list[asyncio.StreamWriter] = []
    failed = 0
    try:
        for _ in range(run.size.tls_connections):
            try:
                held.append((await run.raw(tls=False))[1])
            except (TimeoutError, OSError):
                failed += 1
            if time.monotonic() - started > run.size.phase_s:
                break
        await until_end(run, started)
        alive = sum(not w.is_closing() and not w.transport.is_closing() for w in held)
    finally:
        for writer in held:
            writer.close()
    return {"silent_connections": len(held), "connect_failures": failed, "still_open_at_end": alive}


ATTACKS: Final[list[tuple[str, Attack | None, Attack]]] = [
    ("errors_500", None, errors_500),
    ("reading", None, reading),
    ("job_ids", squat_ids, job_ids),
    ("exemption", None, exemption),
    ("metadata", None, metadata),
    ("pending", None, pending),
    ("watch", None, watch),
    ("dry_run", None, dry_run),
    ("priority", hold_gpus, priority),
    ("body_slots", None, body_slots),
]
"""(name, what runs before the victim starts, the attack).  Order matters: ``watch`` reads the
large records ``metadata`` appended; ``body_slots`` comes last, as it may leave the service short
of slots.  ``tls_handshakes`` then runs on a service of its own that serves TLS."""


# -- phases -----------------------------------------------------------------------------------


async def setup(run: Run) -> None:
    """Quotas (equal for alice and bob: half the fleet each), the fleet, bob's job with a secret."""
    half = {"cpu_milli": NODES * NODE_CPU // 2, "mem_mib": NODES * NODE_MEM // 2,
            "gpu_milli": NODES * NODE_GPUS * 1000 // 2}
    for tenant in ("alice", "bob"):
        quota = json.dumps({"nominal": half}).encode()
        status, raw = await run.call("PUT", f"/v1/quotas/{tenant}", "quota", quota)
        if status != 200:
            raise SystemExit(f"benchmarks.abuse: quota for {tenant}: {status} {raw[:300]!r}")
    beats = [NodeHeartbeat(cell="cell-1", node=f"n{i}", cpu_milli=NODE_CPU, mem_mib=NODE_MEM,
                           gpu_count=NODE_GPUS, gpu_model="H100", topology=("b0", "r0", f"n{i}"))
             for i in range(NODES)]
    secret = job(SECRET_JOB, "bob", payload=JobPayload(command=("train",), env={"WANDB_API_KEY": SECRET}))
    for who, events in (("be", beats), ("bob", [secret])):
        status, raw = await run.submit(who, events)
        if status != 200:
            raise SystemExit(f"benchmarks.abuse: setup as {who}: {status} {raw[:300]!r}")
    run.cleanup.clear()  # (bob's job with the secret stays for the reading attack)
    await asyncio.sleep(1)


async def phase(run: Run, name: str, prepare: Attack | None, attack: Attack) -> dict[str, Any]:
    progress(f"attack {name} ({run.size.phase_s:g} s)")
    if run.service.exited() is not None:
        progress(f"the service had exited ({run.service.exited()}): restarting it")
        run.service.start()
        await run.service.ready()
    began = time.monotonic()
    victim = Victim(run, f"bob/{name}")
    details: dict[str, Any] = {}
    if prepare is not None:
        try:
            details.update(await asyncio.wait_for(prepare(run, victim), TIMEOUT_S))
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as e:
            details["error"] = f"before the attack: {type(e).__name__}: {e}"
    run.errors_500 = 0
    tracebacks = run.service.tracebacks()
    rss_start = rss_max = run.service.rss_mib()

    async def sample() -> None:
        nonlocal rss_max
        while True:
            rss_max = max(rss_max, run.service.rss_mib())
            await asyncio.sleep(0.25)

    sampler = asyncio.create_task(sample())
    try:
        details.update(await victim.during(attack(run, victim), 4 * run.size.phase_s + 120))
    finally:
        sampler.cancel()
    exit_code = run.service.exited()
    if exit_code is not None:
        details["service_exit"] = exit_code
    won = details.pop("succeeded", 0)
    measured = victim.measures()
    result = {**measured, "server_500s": run.errors_500,
              "attacks_succeeded": (measured["victim_refused"] + measured["victim_failed"]
                                    + run.errors_500 + won),
              "attack_won": won, "service_rss_growth_mib": round(max(0.0, rss_max - rss_start), 1),
              "service_rss_mib": round(rss_max), "service_tracebacks": run.service.tracebacks() - tracebacks,
              "details": details}
    await run.cancel_all()
    result["phase_wall_s"] = round(time.monotonic() - began, 1)
    progress(f"  {name}: succeeded {result['attacks_succeeded']}, "
             f"submit p99 {result['victim_submit_p99_ms']} ms, "
             f"health max {result['victim_health_max_s']} s ({result['phase_wall_s']} s)")
    return result


def summary(attacks: dict[str, dict[str, Any]]) -> dict[str, Any]:
    worst_p99 = max(a["victim_submit_p99_ms"] for a in attacks.values())
    worst_health = max(a["victim_health_max_s"] for a in attacks.values())
    rss = attacks["watch"]["service_rss_growth_mib"]
    total = sum(a["attacks_succeeded"] for a in attacks.values())
    met = {"attacks_succeeded_0": total == 0, "victim_submit_p99_le_1s": worst_p99 <= TARGET_MS,
           "victim_health_le_1s": worst_health <= TARGET_HEALTH_S,
           "rss_growth_le_256mib": rss <= TARGET_RSS_MIB}
    return {"attacks_succeeded": total, "victim_submit_p99_ms_worst": worst_p99,
            "victim_health_max_s_worst": worst_health, "service_rss_growth_mib": rss,
            "targets": {"attacks_succeeded": 0, "victim_submit_p99_ms": TARGET_MS,
                        "victim_health_max_s": TARGET_HEALTH_S, "service_rss_growth_mib": TARGET_RSS_MIB},
            "targets_met": {**met, "all": all(met.values())}}


async def measure(size: Size, root: Path) -> dict[str, Any]:
    tokens = secrets(root)
    attacks: dict[str, dict[str, Any]] = {}
    starts = 0
    on_tls: list[tuple[str, Attack | None, Attack]] = [("tls_handshakes", None, tls_handshakes)]
    for name, tls, chosen in (("main", False, ATTACKS), ("tls", True, on_tls)):
        service = ServiceProcess(root, name, size, tokens, tls=tls)
        service.start()
        progress(f"fleetlog run started (pid {service.child.pid if service.child else '?'}) in {service.dir}")
        await service.ready()
        run = Run(service, size)
        try:
            if not tls:  # (the TLS service's victim needs no fleet: a job on a fleet of no nodes is taken)
                await setup(run)
            for attack_name, prepare, attack in chosen:
                attacks[attack_name] = await phase(run, attack_name, prepare, attack)
        finally:
            await run.shared.close()
            assert service.child is not None
            stop(service.child)
            starts += service.starts
    return {"attacks": attacks, **summary(attacks), "service_starts": starts,
            "service_settings": "as shipped"}


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # (SIGTERM: unwind as Ctrl-C does, so that the service is stopped)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, allow_abbrev=False,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quick", action="store_true", help="8 s an attack, smaller sizes (under 3 minutes)")
    add_smoke(parser)
    args = parser.parse_args()
    size = SIZES["smoke" if args.smoke else "quick" if args.quick else "full"]
    signal.signal(signal.SIGTERM, _terminate)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4 * size.tls_connections + 1024)), hard))
    started = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="fleetlog-abuse-"))
    try:
        measured = uvloop.run(measure(size, root))
    finally:
        for child in STARTED:
            stop(child)
        shutil.rmtree(root, ignore_errors=True)
    emit({"benchmark": "abuse", "size": size.name, "machine": machine(), "phase_s": size.phase_s,
          "sizes": {k: v for k, v in dataclasses.asdict(size).items() if k != "name"}, **measured,
          "wall_s": round(time.perf_counter() - started, 1)}, args.json)


if __name__ == "__main__":
    main()
