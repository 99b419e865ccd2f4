"""``fleetlog submit``, ``fleetlog cancel`` and ``fleetlog send``: the producer client on the
command line (``send``: input events of any kind from a JSON file, e.g. heartbeats and task
events; with a ``[cells]`` map each goes to its partition, task events to ``--cell``'s).

All take the logs from ``--config FILE`` and ``FLEETLOG_<TABLE>_<KEY>`` variables, or from the
shortcuts ``--log DIR`` / ``--kafka HOST:PORT``; each prints the inputs offset every event got.  A bad
flag, a bad JSON file, an event the scheduler would refuse, a file log that does not exist (without
``--create``) or a log that cannot be reached is one line and exit code 2.  A refusal of what the
log already holds — a job id submitted before with another spec, a cancel of a job never submitted
or already ended — is one line and exit code 1 (as ``kubectl create`` of an existing object).  An
identical resubmission (or a repeated cancel) appends nothing, says so, and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from fleetlog import submit_modes as modes
from fleetlog.client import Client, ClientError, Sent, envelope_from_json, keyed
from fleetlog.events.codec import MAX_EVENT_BYTES
from fleetlog.events.features import constraint_terms
from fleetlog.events.model import (
    MAX_PAYLOAD_CHARS,
    SPREAD_LEVELS,
    TAINT_EFFECTS,
    Envelope,
    JobCancelled,
    JobPayload,
    JobSubmitted,
    NodeDrained,
    NodeLabel,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    PreferredTerm,
    TaskGroup,
    Toleration,
)
from fleetlog.log.base import DECISIONS, INPUTS, Shard
from fleetlog.log.discovery import running_service
from fleetlog.log.location import ConfigError
from fleetlog.log.logdir import LogDirError, check_log_place
from fleetlog.logsetup import silence
from fleetlog.service.config import Config, load_config
from fleetlog.usage import add_log_options

CLI_PRODUCER_ID = "fleetlog-cli"
EXIT_REFUSED = 1
REFUSALS = frozenset({"already_exists", "job_id_taken", "unknown_job", "already_ended", "never_fits"})
"""Reasons that refuse what the log holds (exit 1), not the command line (exit 2)."""
MAX_FILE_BYTES = MAX_EVENT_BYTES
"""The most ``submit --file`` reads (one event, a JSON array or JSON lines alike)."""
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
    add_log_options(parser)
    parser.add_argument("--producer-id", default=CLI_PRODUCER_ID, help=f"default {CLI_PRODUCER_ID}")
    parser.add_argument("--json", action="store_true", help="print one JSON object (per event)")
    parser.add_argument(
        "--create",
        action="store_true",
        help="start a new file log in --log DIR if there is none (else: an error)",
    )


def add_client_commands(sub: Any, usage_error: type[Exception]) -> None:
    """Register ``submit`` and ``send`` on the ``fleetlog`` subparsers (``cancel``:
    :mod:`fleetlog.cancel_cli`); their problems are
    raised as ``usage_error``."""
    submit = sub.add_parser(
        "submit",
        help="submit a job to the inputs log",
        description="Submit a gang job: from a JSON file (a JobSubmitted or a full envelope, a JSON array "
        "of them, or JSON lines; - reads stdin), or from flags for one task group.",
    )
    submit.add_argument("job_id", nargs="?", metavar="JOB_ID", help="the job id (with flags)")
    submit.add_argument(
        "--file",
        metavar="JOB.json",
        help="a JobSubmitted or envelope as JSON, a JSON array or JSON lines of them; - for stdin",
    )
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
    _add_placement_flags(submit)
    _add_payload_flags(submit)
    _add_common(submit)
    modes.add_mode_flags(submit)
    submit.set_defaults(func=_reporting(cmd_submit, usage_error))
    send = sub.add_parser(
        "send",
        help="send input events of any kind (heartbeats, task events, quotas, ...)",
        description='Send input events from a JSON file: an envelope or a bare event with its "type", a '
        "JSON array of them, or JSON lines (- reads stdin). With a [cells] map each goes to its partition; "
        "task events to --cell's.",
    )
    send.add_argument("--file", required=True, metavar="EVENTS.json", help="the events; - for stdin")
    send.add_argument(
        "--cell",
        dest="cell_of_producer",
        metavar="CELL",
        help="the producer's cell: where its task events go when the config has a [cells] map",
    )
    _add_common(send)
    send.set_defaults(func=_reporting(cmd_send, usage_error))


def _add_placement_flags(submit: argparse.ArgumentParser) -> None:
    """``fleetlog submit``'s placement constraints: selector, tolerations, Slurm features, soft
    affinity and spread (docs/scheduling.md)."""
    submit.add_argument(
        "--selector",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a node label the tasks need (repeat; docs/scheduling.md)",
    )
    submit.add_argument(
        "--toleration",
        action="append",
        default=[],
        metavar="KEY[=VALUE][:EFFECT]",
        help="a taint the tasks tolerate: without =VALUE any value; '*' every taint (repeat)",
    )
    submit.add_argument(
        "--constraint",
        metavar="EXPR",
        help="Slurm node features, e.g. 'a100&ib|h100' (labels slurm.feature/NAME)",
    )
    submit.add_argument(
        "--prefer",
        action="append",
        default=[],
        metavar="KEY[=VALUE][:WEIGHT]",
        help="a node label the tasks prefer, never need (soft affinity; repeat, weights of the terms "
        "a node meets add up): without =VALUE the label with any value; WEIGHT 1..100, default 1, "
        "after the last ':'",
    )
    submit.add_argument(
        "--spread",
        choices=SPREAD_LEVELS,
        help="host: at most one task of the gang on any node",
    )


def _add_payload_flags(submit: argparse.ArgumentParser) -> None:
    """``fleetlog submit``'s labels, annotations and payload (docs/events.md): carried for the
    backends, never read by the scheduler."""
    for flag, what in (("--label", "a label of the job"), ("--annotation", "an annotation (free text)")):
        submit.add_argument(flag, action="append", default=[], metavar="KEY=VALUE", help=f"{what} (repeat)")
    submit.add_argument(
        "--command",
        dest="run_command",  # (args.command names the fleetlog command)
        metavar="'PROGRAM ARG...'",
        help="what each task runs, split into arguments as a shell would split it, then run without a "
        "shell: nothing is expanded (docs/slurm.md)",
    )
    submit.add_argument("--script", metavar="FILE", help="a batch script each task runs (#! line first)")
    submit.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="an environment variable of the tasks (repeat)")
    submit.add_argument("--image", help="the container image the tasks run in")


# -- the commands -------------------------------------------------------------------------------


def cmd_submit(args: argparse.Namespace) -> int:
    try:
        modes.check_flags(args)
        envelopes = _submission(args)
        if args.dry_run or args.wait:
            config = configured(args)
            check_log_dir(config, args.create and not args.dry_run)
        if args.dry_run:
            return modes.dry_run(args, envelopes, config)
        url = modes.wait_url(args, config) if args.wait else None
        code = _send(args, envelopes)
        return code if url is None or code != 0 else modes.wait(args, envelopes, url)
    except modes.ModeError as exc:
        raise CommandLineError(str(exc)) from None


def cmd_send(args: argparse.Namespace) -> int:
    return _send(args, _from_file(args.file, args.producer_id, None))


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


def check_log_dir(config: Config, create: bool) -> None:
    """A file log must exist unless ``create``: a mistyped ``--log`` is an error, as it is for
    ``fleetlog status``, not a new empty log the scheduler never reads."""
    if config.log.dir is None:
        return
    path = Path(config.log.dir)
    if create:  # a new or empty directory, or a log: never one holding a user's files (/etc)
        try:
            check_log_place(path, create=True)
        except LogDirError as exc:
            raise CommandLineError(str(exc)) from None
        return
    if running_service(path) is not None:
        return  # the service that holds it answers
    # with a [cells] map the logs are in the shards' directories: global/, cells-<p>/
    shards = [path / Shard.GLOBAL.dirname, *sorted(path.glob("cells-*"))] if config.cells else [path]
    if not any((shard / name).is_dir() for shard in shards for name in (INPUTS, DECISIONS)):
        where = f" in {Shard.GLOBAL.dirname}/ or cells-<p>/ (a [cells] map)" if config.cells else ""
        raise CommandLineError(
            f"no file log at {path} (expected {INPUTS}/ and {DECISIONS}/ "
            f"directories{where}; --create starts a new one)"
        )


def _send(args: argparse.Namespace, envelopes: list[Envelope]) -> int:
    config = configured(args)
    check_log_dir(config, args.create)
    silence("aiokafka")  # its errors come back as one line

    async def send() -> tuple[Sent, str]:
        cell = getattr(args, "cell_of_producer", None)  # send's --cell (submit's names allowed cells)
        client: Client = await Client.connect(config, args.producer_id, cell)
        async with client:
            return await client.transport.deliver(envelopes, check=True), client.describe()

    try:
        sent, where = asyncio.run(send())
    except ClientError as exc:
        if exc.reason in REFUSALS:
            print(f"fleetlog {args.command}: error: {exc}", file=sys.stderr)
            return EXIT_REFUSED
        raise CommandLineError(str(exc)) from None
    _report(args, envelopes, sent, where)
    return 0


def _report(args: argparse.Namespace, envelopes: list[Envelope], sent: Sent, where: str) -> None:
    offset = sent.first_offset
    for index, env in enumerate(envelopes):
        event, duplicate = env.event, index in sent.duplicates
        job_id = getattr(event, "job_id", None)
        label = job_id or getattr(event, "node", None) or getattr(event, "tenant", "")
        at = None if duplicate else offset
        offset += 0 if duplicate else 1
        shard = sent.shards[index] if sent.shards else None  # a [cells] map: the event's partition
        if sent.shards:
            at = sent.offsets[index]
        if args.json:
            print(
                json.dumps(
                    {
                        "event": type(event).__name__,
                        "job_id": job_id,
                        "key": env.key,
                        "offset": at,
                        "duplicate": duplicate,
                        "log": where,
                        **({"shard": shard} if shard else {}),
                    }
                )
            )
        elif duplicate:
            what = "cancelled already" if isinstance(event, JobCancelled) else "submitted already, same spec"
            print(f"{type(event).__name__} {label} (key {env.key}) {what}: nothing appended ({where})")
        else:
            inputs = f"the {shard} inputs" if shard else "inputs"
            print(f"{_named(event, str(label))} (key {env.key}) appended at {inputs} offset {at} ({where})")


def _named(event: object, label: str) -> str:
    """The event and what it names, as a person reads what it does: an undrain is a ``NodeDrained``
    with ``drained=false``, and its type alone (``NodeDrained n1``) read as a drain."""
    if isinstance(event, NodeDrained) and not event.drained:
        return f"undrain {label}: NodeDrained drained=false"
    return f"{type(event).__name__} {label}"


# -- what to submit -----------------------------------------------------------------------------

_JOB_FLAGS = ("tenant", "gpu_milli", "topology", "duration_ms", "run_command", "script", "image")
_MAP_FLAGS = ("label", "annotation", "env")


def _submission(args: argparse.Namespace) -> list[Envelope]:
    if args.file is not None:
        if (args.job_id is not None or any(getattr(args, f) is not None for f in _JOB_FLAGS)
                or any(getattr(args, f) for f in _MAP_FLAGS)):
            raise CommandLineError("give either --file or JOB_ID with flags, not both")
        return _from_file(args.file, args.producer_id)
    if args.job_id is None or args.tenant is None:
        raise CommandLineError("submit needs --file JOB.json, or JOB_ID and --tenant")
    return [_from_flags(args)]


def _read(path: str, limit: int = MAX_FILE_BYTES, flag: str = "--file") -> bytes:
    """At most ``limit`` bytes, so ``/dev/zero`` or a huge file is a one-line error, not a
    process that reads until memory runs out."""
    name = "stdin" if path == "-" else path
    try:
        if path == "-":
            data = sys.stdin.buffer.read(limit + 1)
        else:
            with open(path, "rb") as file:
                data = file.read(limit + 1)
    except OSError as exc:
        raise CommandLineError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > limit:
        hint = "split it into several files" if flag == "--file" else "a payload is bounded (docs/events.md)"
        raise CommandLineError(f"{name} is over {limit} bytes, the most submit {flag} reads: {hint}")
    return data


_RAW_LIST = msgspec.json.Decoder(list[msgspec.Raw])


def _documents(data: bytes, name: str) -> list[tuple[str, bytes]]:
    """The JSON documents of a job file, each with where it is (``item 2``, ``line 3``): one
    object, a JSON array of objects, or JSON lines (one object per line; blank lines skipped)."""
    text = data.lstrip()
    if text.startswith(b"["):
        try:
            items = _RAW_LIST.decode(text)
        except (msgspec.DecodeError, RecursionError) as exc:
            raise CommandLineError(f"{name}: not a valid JSON array: {exc} (reason undecodable)") from None
        return [(f"item {i}", bytes(raw)) for i, raw in enumerate(items)]
    lines = [(n, line) for n, line in enumerate(data.splitlines(), 1) if line.strip()]
    if len(lines) <= 1:
        return [("", data)]
    try:
        msgspec.json.decode(data)
        return [("", data)]  # one object over several lines
    except (msgspec.DecodeError, RecursionError):
        return [(f"line {n}", line) for n, line in lines]


def _from_file(path: str, producer_id: str, default_type: str | None = "JobSubmitted") -> list[Envelope]:
    """The envelopes of a job file (``default_type`` ``JobSubmitted``: ``submit``), or of any
    input events, each naming its ``type`` (``None``: ``send``)."""
    name = "stdin" if path == "-" else path
    documents = _documents(_read(path), name)
    what = "job" if default_type else "event"
    if not documents:
        raise CommandLineError(f"{name} holds no {what} (an empty JSON array)")
    out = []
    for where, doc in documents:
        at = f"{name}: {where}" if where else name
        try:
            env = envelope_from_json(doc, producer_id, default_type=default_type)
        except ClientError as exc:
            raise CommandLineError(f"{at}: {exc} (reason {exc.reason})") from None
        if default_type and not isinstance(env.event, JobSubmitted):
            raise CommandLineError(f"{at} holds a {type(env.event).__name__}, not a JobSubmitted")
        out.append(env)
    return out


def _constraint_flags(args: argparse.Namespace) -> dict[str, tuple[object, ...]]:
    """``--selector``, ``--toleration``, ``--constraint`` and ``--prefer`` as a task group's fields."""
    out: dict[str, tuple[object, ...]] = {}
    pairs = [text.partition("=") for text in args.selector]
    if any(not key or not eq for key, eq, _ in pairs):
        raise CommandLineError("--selector takes KEY=VALUE")
    if pairs:
        out["node_selector"] = tuple(NodeLabel(key=k, value=v) for k, _, v in pairs)
    tolerations = [_toleration(text) for text in args.toleration]
    if tolerations:
        out["tolerations"] = tuple(tolerations)
    if args.constraint:
        try:
            out["node_affinity"] = constraint_terms(args.constraint)
        except ValueError as exc:
            raise CommandLineError(str(exc)) from None
    preferred = [_preference(text) for text in args.prefer]
    if preferred:
        out["preferred_affinity"] = tuple(preferred)
    return out


def _preference(text: str) -> PreferredTerm:
    """``KEY[=VALUE][:WEIGHT]``: the label ``KEY`` ``In`` (VALUE) or, without ``=VALUE``,
    ``Exists``; the weight is what follows the last ``:`` (a value holding a colon needs one)."""
    spec, colon, weight = text.rpartition(":")
    if not colon:
        spec, weight = text, "1"
    key, eq, value = spec.partition("=")
    if not key:
        raise CommandLineError(f"--prefer {text!r}: KEY[=VALUE][:WEIGHT]")
    if not (weight.isascii() and weight.isdigit() and 1 <= int(weight) <= 100):
        raise CommandLineError(f"--prefer {text!r}: WEIGHT must be an integer 1..100")
    requirement = (
        NodeSelectorRequirement(key=key, operator="In", values=(value,))
        if eq
        else NodeSelectorRequirement(key=key, operator="Exists")
    )
    return PreferredTerm(weight=int(weight), preference=NodeSelectorTerm(match_expressions=(requirement,)))


def _toleration(text: str) -> Toleration:
    """``KEY[=VALUE][:EFFECT]`` or ``*``."""
    if text == "*":
        return Toleration(operator="Exists")
    spec, _, effect = text.partition(":")
    key, eq, value = spec.partition("=")
    if not key or effect not in ("", *TAINT_EFFECTS):
        raise CommandLineError(
            f"--toleration {text!r}: KEY[=VALUE][:EFFECT], EFFECT one of {', '.join(TAINT_EFFECTS)}"
        )
    return Toleration(key=key, operator="Equal" if eq else "Exists", value=value, effect=effect)  # type: ignore[arg-type]


def _pairs(flag: str, texts: list[str]) -> dict[str, str]:
    """``KEY=VALUE`` flags as a map (the value may hold ``=``); a key given twice is an error."""
    found: dict[str, str] = {}
    for text in texts:
        key, eq, value = text.partition("=")
        if not key or not eq:
            raise CommandLineError(f"--{flag} {text!r}: KEY=VALUE")
        if key in found:
            raise CommandLineError(f"--{flag} {key!r} is given twice")
        found[key] = value
    return found


def _payload(args: argparse.Namespace) -> JobPayload | None:
    """``--command``, ``--script``, ``--env`` and ``--image`` as a payload (``None``: none given)."""
    env = _pairs("env", args.env)
    if args.run_command is None and args.script is None and not env and args.image is None:
        return None
    if args.run_command is not None and args.script is not None:
        raise CommandLineError("give either --command or --script, not both")
    try:
        command = tuple(shlex.split(args.run_command)) if args.run_command is not None else ()
    except ValueError as exc:
        raise CommandLineError(f"--command {args.run_command!r}: {exc}") from None
    if args.run_command is not None and not command:
        raise CommandLineError("--command is empty")
    script = _script(args.script) if args.script is not None else ""
    return JobPayload(command=command, script=script, env=env, image=args.image or "")


def _script(path: str) -> str:
    """The text of ``--script FILE``: UTF-8, read up to the payload's bound."""
    data = _read(path, MAX_PAYLOAD_CHARS * 4, "--script")
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        raise CommandLineError(f"--script {path}: not UTF-8 ({exc.reason} at byte {exc.start})") from None


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
            **_constraint_flags(args),  # type: ignore[arg-type]
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
            spread=args.spread,
            labels=_pairs("label", args.label),
            annotations=_pairs("annotation", args.annotation),
            payload=_payload(args),
        )
        return keyed(job, args.producer_id)
    except (ValueError, ClientError) as exc:  # ValueError: TaskGroup's own checks
        raise CommandLineError(f"invalid job: {exc}") from None
