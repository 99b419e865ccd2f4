"""``fleetlog submit --dry-run`` and ``fleetlog submit --wait`` (docs/cli.md).

``--dry-run`` appends nothing: it asks the running service (``--url``, or the one a file log's
``service.json`` announces) ``POST /v1/dry-run``, and otherwise folds the logs to their end (as
``fleetlog jobs`` does) and calls the same function (:func:`fleetlog.api.dryrun.dry_run`) with the
configured ``service.policy``.  One line per job (``--json``: one object); exit code 0 when every
job would be placed now, 1 when any would wait, be rejected or refused, or is submitted already.

``--wait`` submits, then follows each job through ``GET /v1/jobs/ID`` of the running service until
it reaches ``--wait-for`` (``placed``, ``running`` — the default — or ``ended``), printing each
change of its state with a timestamp.  Exit code 0 when every job got there; 1 when one ended
otherwise (failed, cancelled, rejected) or ``--timeout`` passed first.  It needs the service:
without one it is a usage error before anything is appended.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from fleetlog.auth_client import auth_headers, refused_why, tls_for, unreachable_why
from fleetlog.events.codec import encode
from fleetlog.events.model import Envelope, JobSubmitted
from fleetlog.log.discovery import announced
from fleetlog.service.config import Config
from fleetlog.usage import url_argument

EXIT_NOT_ALL: Final = 1
WAIT_FOR: Final = ("placed", "running", "ended")
DEFAULT_TIMEOUT_S: Final = 300.0
POLL_S: Final = 0.25
ENDED: Final = frozenset({"succeeded", "failed", "cancelled", "rejected", "retired"})
UNSUCCESSFUL: Final = frozenset({"failed", "cancelled", "rejected"})
_REACHED: Final = {"placed": ENDED | {"placed", "running"}, "running": ENDED | {"running"}, "ended": ENDED}


class ModeError(Exception):
    """A usage error of ``--dry-run`` or ``--wait``: one line, exit code 2."""


def add_mode_flags(submit: argparse.ArgumentParser) -> None:
    submit.add_argument("--dry-run", action="store_true",
                        help="append nothing: say whether the job would be placed now, where, or why not "
                        "(exit 1 if any would not)")
    submit.add_argument("--wait", action="store_true",
                        help="then follow the job until it is running (or --wait-for), printing each change; "
                        "needs the running service")
    submit.add_argument("--wait-for", choices=WAIT_FOR,
                        help="with --wait: placed, running (default) or ended")
    submit.add_argument("--timeout", type=_seconds, metavar="SECONDS",
                        help="with --wait: give up after this long, exit 1 "
                        f"(default {DEFAULT_TIMEOUT_S:.0f})")
    submit.add_argument("--url", metavar="URL", type=url_argument,
                        help="the service's HTTP address for --dry-run and --wait (default: the one the file "
                        "log announces)")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number of seconds")
    return value


def check_flags(args: argparse.Namespace) -> None:
    """The flags' combinations (before anything is read or appended)."""
    if args.dry_run and (args.wait or args.wait_for):
        raise ModeError("give --dry-run or --wait, not both: a dry run appends nothing to wait for")
    if (args.wait_for or args.timeout is not None) and not args.wait:
        raise ModeError(f"{'--wait-for' if args.wait_for else '--timeout'} goes with --wait")
    if args.url is not None and not (args.dry_run or args.wait):
        raise ModeError("--url goes with --dry-run or --wait (submit appends through --log, --kafka or "
                        "--config)")


def service_url(args: argparse.Namespace, config: Config) -> str | None:
    """``--url``, or the service a file log's ``service.json`` announces while its process lives."""
    if args.url:
        return str(args.url).rstrip("/")
    if config.log.dir is None or config.kafka is not None:
        return None
    found = announced(Path(config.log.dir))
    return None if found is None else found.url


# -- --dry-run ----------------------------------------------------------------------------------


def dry_run(args: argparse.Namespace, envelopes: list[Envelope], config: Config) -> int:
    url = service_url(args, config)
    if url is not None:
        body = b"[" + b",".join(encode(env, "json") for env in envelopes) + b"]"
        answer = _call(url + "/v1/dry-run", body)
    else:
        jobs = [env.event for env in envelopes if isinstance(env.event, JobSubmitted)]
        answer = _folded(args, jobs, config)
    items: list[dict[str, Any]] = answer["items"]
    for item in items:
        print(json.dumps(item) if args.json else _line(item), flush=True)
    return 0 if all(item["outcome"] == "placed" for item in items) else EXIT_NOT_ALL


def _folded(args: argparse.Namespace, jobs: list[JobSubmitted], config: Config) -> dict[str, Any]:
    """The dry run on the state at the end of the logs (no service to ask)."""
    if config.cells:
        raise ModeError("with a [cells] map the state is split across shards: --dry-run asks the running "
                        "service (--url)")
    import asyncio

    from fleetlog.core.policy import service_policy
    from fleetlog.replay import handlers
    from fleetlog.replay.source import ReplayError

    place: Any = config.kafka if config.kafka is not None else Path(str(config.log.dir))
    args.dry_jobs, args.dry_policy = jobs, service_policy(config.service.policy)
    args.core = config.service.core()  # fold as the service would
    try:
        asyncio.run(handlers.run("dry-run", place, args))
    except ReplayError as exc:
        raise ModeError(str(exc)) from None
    found: dict[str, Any] = args.dry_answer
    return found


def _line(item: dict[str, Any]) -> str:
    job, outcome, reason, message = item["job_id"], item["outcome"], item["reason"], item["message"]
    if outcome == "placed":
        victims = item.get("preempts") or []
        preempting = f", preempting {', '.join(victims)}" if victims else ""
        return f"job {job} would be placed {message}{preempting}"
    if outcome == "duplicate":
        return f"job {job} would not be submitted again ({reason}): {message}"
    verb = {"waits": "wait", "rejected": "be rejected", "refused": "be refused"}.get(outcome, outcome)
    return f"job {job} would {verb}: {reason}: {message}"


def _call(url: str, body: bytes | None = None) -> dict[str, Any]:
    from fleetlog.reads_cli import ReadError, call_api

    try:
        return call_api(url, url, body, verb="reach")
    except ReadError as exc:
        raise ModeError(str(exc)) from None


def _message(body: bytes) -> str:
    try:
        return str(json.loads(body)["message"])
    except (ValueError, KeyError, TypeError):
        return body[:200].decode(errors="replace")


# -- --wait -------------------------------------------------------------------------------------


def wait_url(args: argparse.Namespace, config: Config) -> str:
    """Where ``--wait`` follows the jobs: checked before anything is appended."""
    url = service_url(args, config)
    if url is None:
        raise ModeError("--wait follows the job through the running service's API: give --url, or the --log "
                        "a running service holds")
    return url


def wait(args: argparse.Namespace, envelopes: list[Envelope], url: str) -> int:
    """Follow each submitted job until it reaches ``--wait-for`` (or ends, or the timeout)."""
    target = args.wait_for or "running"
    timeout = args.timeout if args.timeout is not None else DEFAULT_TIMEOUT_S
    jobs = list(dict.fromkeys(e.event.job_id for e in envelopes if isinstance(e.event, JobSubmitted)))
    seen: dict[str, tuple[object, ...]] = {}
    last: dict[str, dict[str, Any]] = {}
    deadline, problem = time.monotonic() + timeout, ""
    while True:
        for job in [j for j in jobs if last.get(j, {}).get("state") not in _REACHED[target]]:
            try:
                status = _status(url, job)
            except ModeError as exc:
                problem = str(exc)
                continue
            if status is None:
                continue  # appended, not folded yet
            last[job] = status
            view = (status["state"], status.get("pending_reason"), status.get("tasks_started"))
            if seen.get(job) != view:
                seen[job] = view
                print(_change(status, args.json), flush=True)
        if all(last.get(j, {}).get("state") in _REACHED[target] for j in jobs):
            return EXIT_NOT_ALL if any(last[j]["state"] in UNSUCCESSFUL for j in jobs) else 0
        if time.monotonic() >= deadline:
            _timed_out(jobs, last, target, timeout, problem)
            return EXIT_NOT_ALL
        time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))


def _status(url: str, job: str) -> dict[str, Any] | None:
    """``GET /v1/jobs/JOB``: ``None`` while the service has not folded it; a retired job as
    ``retired``."""
    where = f"{url}/v1/jobs/{urllib.parse.quote(job, safe='')}"
    try:
        asking = urllib.request.Request(where, headers=auth_headers())
        with urllib.request.urlopen(asking, timeout=10, context=tls_for(where)) as answer:
            found: dict[str, Any] = json.loads(answer.read())
            return found
    except urllib.error.HTTPError as exc:
        body = exc.read()
        try:
            code = json.loads(body).get("code")
        except (ValueError, AttributeError):
            code = None
        if exc.code == 404 and code == "retired":
            return {"job_id": job, "state": "retired", "message": _message(body)}
        if (exc.code == 404 and code == "unknown_job") or exc.code == 503:
            return None
        raise ModeError(f"{where} answered {exc.code}: {refused_why(exc.code, _message(body))}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        why = unreachable_why(where, getattr(exc, "reason", exc))
        raise ModeError(f"cannot read {where}: {why}") from None


def _change(status: dict[str, Any], as_json: bool) -> str:
    at = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    state, reason = status["state"], status.get("pending_reason")
    started, tasks = status.get("tasks_started"), status.get("tasks")
    if as_json:
        return json.dumps({"at": at, "job_id": status["job_id"], "state": state, "reason": reason,
                           "message": status.get("pending_message") or status.get("message"),
                           "tasks_started": started, "tasks": tasks})
    detail = f" ({reason}: {status.get('pending_message', '')})" if reason else ""
    if state in ("placed", "running") and tasks is not None:
        detail = f" ({started}/{tasks} tasks started)"
    return f"{at} job {status['job_id']} {state}{detail}"


def _timed_out(jobs: list[str], last: dict[str, dict[str, Any]], target: str, timeout: float,
               problem: str) -> None:
    late = [j for j in jobs if last.get(j, {}).get("state") not in _REACHED[target]]
    states = ", ".join(f"{j} {last[j]['state']}" if j in last else f"{j} not seen yet" for j in late)
    why = f"; last error: {problem}" if problem and not all(j in last for j in late) else ""
    print(f"fleetlog submit: timed out after {timeout:g} s waiting for {target}: {states}{why}",
          file=sys.stderr)
