"""``fleetlog submit`` and ``fleetlog cancel``: the producer client on the command line.

Both take the logs from ``--config FILE`` and ``FLEETLOG_<TABLE>_<KEY>`` variables, or from the
shortcuts ``--log DIR`` / ``--kafka HOST:PORT``; both print the inputs offset the event got.  Every
problem — a bad flag, a bad JSON file, an event the scheduler would refuse, a log that cannot be
reached — is one line and exit code 2.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleetlog.cli import _add_log_options
from fleetlog.client import Client, ClientError, envelope_from_json, keyed
from fleetlog.events.codec import MAX_EVENT_BYTES
from fleetlog.events.model import Envelope, JobCancelled, JobSubmitted, TaskGroup
from fleetlog.service.config import Config, ConfigError, load_config

CLI_PRODUCER_ID = "fleetlog-cli"
Command = Callable[[argparse.Namespace], int]


class CommandLineError(Exception):
    """A bad argument, file, event or log: ``fleetlog`` prints it in one line and exits with 2."""


def _reporting(command: Command, usage_error: type[Exception]) -> Command:
    """``command`` raising ``usage_error`` (the CLI's own class, passed in so this module works
    under ``python -m fleetlog.cli`` too, where the CLI module is ``__main__``)."""

    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except CommandLineError as exc:
            raise usage_error(str(exc)) from None

    return run


def _count(minimum: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r} must be at least {minimum}")
        return value

    return parse


def _add_common(parser: argparse.ArgumentParser) -> None:
    _add_log_options(parser)
    parser.add_argument("--producer-id", default=CLI_PRODUCER_ID, help=f"default {CLI_PRODUCER_ID}")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def add_client_commands(sub: Any, usage_error: type[Exception]) -> None:
    """Register ``submit`` and ``cancel`` on the ``fleetlog`` subparsers; their problems are
    raised as ``usage_error``."""
    submit = sub.add_parser(
        "submit",
        help="submit a job to the inputs log",
        description="Submit a gang job: from a JSON file (a JobSubmitted, or a full envelope; - reads "
        "stdin), or from flags for one task group.",
    )
    submit.add_argument("job_id", nargs="?", metavar="JOB_ID", help="the job id (with flags)")
    submit.add_argument("--file", metavar="JOB.json", help="a JobSubmitted or envelope as JSON; - for stdin")
    submit.add_argument("--tenant")
    submit.add_argument("--tasks", type=_count(1), default=1, help="tasks in the gang (default 1)")
    submit.add_argument("--cpu-milli", type=_count(0), default=1000, help="per task (default 1000)")
    submit.add_argument("--mem-mib", type=_count(0), default=1024, help="per task (default 1024)")
    submit.add_argument("--gpus", type=_count(0), default=0, help="GPUs per task (default 0)")
    submit.add_argument("--gpu-milli", type=_count(1), help="share of each GPU, 1..1000 (default 1000)")
    submit.add_argument("--gpu-model", action="append", default=[], help="an allowed GPU model (repeat)")
    submit.add_argument("--queue", default="default")
    submit.add_argument("--priority", type=_count(0), default=0)
    submit.add_argument("--topology", choices=("block", "rack", "host"), help="all tasks in one of these")
    submit.add_argument("--cell", action="append", default=[], help="an allowed cell (repeat)")
    submit.add_argument("--duration-ms", type=_count(0), help="expected duration, for backfill")
    _add_common(submit)
    submit.set_defaults(func=_reporting(cmd_submit, usage_error))
    cancel = sub.add_parser("cancel", help="cancel a job, pending or running")
    cancel.add_argument("job_id", metavar="JOB_ID")
    cancel.add_argument("--reason", default="", help="why (kept in the log)")
    _add_common(cancel)
    cancel.set_defaults(func=_reporting(cmd_cancel, usage_error))


# -- the commands -------------------------------------------------------------------------------


def cmd_submit(args: argparse.Namespace) -> int:
    env = _submission(args)
    return _send(args, env)


def cmd_cancel(args: argparse.Namespace) -> int:
    try:
        env = keyed(JobCancelled(job_id=args.job_id, reason=args.reason), args.producer_id)
    except ClientError as exc:
        raise CommandLineError(f"invalid cancel: {exc}") from None
    return _send(args, env)


def configured(args: argparse.Namespace) -> Config:
    """The configuration of ``--config``, the environment and the ``--log``/``--kafka`` shortcuts."""
    try:
        return load_config(
            Path(args.config) if args.config else None, os.environ, log_dir=args.log, kafka=args.kafka
        )
    except ConfigError as exc:
        hint = (
            ""
            if args.config or args.log or args.kafka
            else " (use --log DIR, --kafka HOST:PORT or --config FILE)"
        )
        raise CommandLineError(f"{exc}{hint}") from None


def _send(args: argparse.Namespace, env: Envelope) -> int:
    config = configured(args)
    logging.getLogger("aiokafka").addHandler(logging.NullHandler())  # its errors come back as one line

    async def send() -> tuple[int, str]:
        client: Client = await Client.connect(config, args.producer_id)
        async with client:
            return await client.send([env]), client.describe()

    try:
        offset, where = asyncio.run(send())
    except ClientError as exc:
        raise CommandLineError(str(exc)) from None
    _report(args, env, offset, where)
    return 0


def _report(args: argparse.Namespace, env: Envelope, offset: int, where: str) -> None:
    event = env.event
    job_id = getattr(event, "job_id", None)
    if args.json:
        print(
            json.dumps(
                {
                    "event": type(event).__name__,
                    "job_id": job_id,
                    "key": env.key,
                    "offset": offset,
                    "log": where,
                }
            )
        )
    else:
        print(f"{type(event).__name__} {job_id} (key {env.key}) appended at inputs offset {offset} ({where})")


# -- what to submit -----------------------------------------------------------------------------

_JOB_FLAGS = ("tenant", "gpu_milli", "topology", "duration_ms")


def _submission(args: argparse.Namespace) -> Envelope:
    if args.file is not None:
        if args.job_id is not None or any(getattr(args, f) is not None for f in _JOB_FLAGS):
            raise CommandLineError("give either --file or JOB_ID with flags, not both")
        return _from_file(args.file, args.producer_id)
    if args.job_id is None or args.tenant is None:
        raise CommandLineError("submit needs --file JOB.json, or JOB_ID and --tenant")
    return _from_flags(args)


def _read(path: str) -> bytes:
    """At most :data:`MAX_EVENT_BYTES` (no event is larger), so ``/dev/zero`` or a huge file is a
    one-line error, not a process that reads until memory runs out."""
    name = "stdin" if path == "-" else path
    try:
        if path == "-":
            data = sys.stdin.buffer.read(MAX_EVENT_BYTES + 1)
        else:
            with open(path, "rb") as file:
                data = file.read(MAX_EVENT_BYTES + 1)
    except OSError as exc:
        raise CommandLineError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_EVENT_BYTES:
        raise CommandLineError(f"{name} is over {MAX_EVENT_BYTES} bytes, the largest event the scheduler "
                               "takes: not a job file")
    return data


def _from_file(path: str, producer_id: str) -> Envelope:
    name = "stdin" if path == "-" else path
    try:
        env = envelope_from_json(_read(path), producer_id, default_type="JobSubmitted")
    except ClientError as exc:
        raise CommandLineError(f"{name}: {exc} (reason {exc.reason})") from None
    if not isinstance(env.event, JobSubmitted):
        raise CommandLineError(f"{name} holds a {type(env.event).__name__}, not a JobSubmitted")
    return env


def _from_flags(args: argparse.Namespace) -> Envelope:
    gpu_milli = args.gpu_milli if args.gpu_milli is not None else (1000 if args.gpus else 0)
    try:
        group = TaskGroup(
            count=args.tasks,
            cpu_milli=args.cpu_milli,
            mem_mib=args.mem_mib,
            gpu_count=args.gpus,
            gpu_milli=gpu_milli,
            gpu_models=tuple(args.gpu_model),
        )
        job = JobSubmitted(
            job_id=args.job_id,
            tenant=args.tenant,
            task_groups=(group,),
            queue=args.queue,
            priority=args.priority,
            allowed_cells=tuple(args.cell),
            required_topology=args.topology,
            expected_duration_ms=args.duration_ms,
        )
        return keyed(job, args.producer_id)
    except (ValueError, ClientError) as exc:  # ValueError: TaskGroup's own checks
        raise CommandLineError(f"invalid job: {exc}") from None
