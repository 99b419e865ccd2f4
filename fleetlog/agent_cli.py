"""``fleetlog agent``: a fake node agent (:mod:`fleetlog.backends.agent`) beside ``fleetlog run``,
to try the service on one machine without a cluster.

It reads the logs where ``fleetlog run`` keeps them (``--log DIR``, ``--kafka``, ``--config``:
the same settings) and sends its heartbeats and task observations where a backend does: to the
service that holds the file log (with ``FLEETLOG_TOKEN`` when ``[auth]`` is on: the token's
principal needs ``node-agent:CELL`` or ``backend:CELL``), or to the log itself while no service
runs.  A ``--log DIR`` that holds no file log yet is waited for (the service creates it), never
created: a mistyped directory is said at once and stays empty.  One line per task started and
ended on stdout (``--json``: one JSON object); SIGTERM stops it cleanly with exit code 0, Ctrl-C
with 130.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from fleetlog.backends.agent import AgentConfig, FakeAgent, NotAllowedError
from fleetlog.backends.store_args import OTHER_TABLES, open_store
from fleetlog.client_cli import _count
from fleetlog.events import NodeHeartbeat, decode, encode, envelope
from fleetlog.events.codec import BadEventError
from fleetlog.log.base import DECISIONS, INPUTS, LogError
from fleetlog.log.location import ConfigError, describe
from fleetlog.log.routing import Router, RoutingError
from fleetlog.log.settings import Location, load_location
from fleetlog.usage import add_log_options, print_error
from fleetlog.waiting import event_or_timeout

EXIT_FAILURE: Final = 1
FLAGS: Final = {"cell": "--cell", "node": "--cell", "gpu_model": "--gpu-model", "gpu_count": "--gpus",
                "cpu_milli": "--cpu-milli", "mem_mib": "--mem-mib"}
"""The flag that sets each field of the nodes' heartbeats (the node names: ``CELL-N``)."""
WAIT_NOTE_S: Final = 0.5
"""How often a missing log directory is looked for again."""


def _number(what: str, low: float, high: float, rule: str) -> Callable[[str], float]:
    """An argparse type: a float in ``[low, high]`` (``rule`` says so in the error)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text!r} must be {rule}")
        return value

    return parse


_seconds = _number("a number of seconds", 0, 10**9 - 1, "a number of seconds, 0 or more")
_share = _number("a number", 0, 1, "between 0 and 1")


def add_agent_command(sub: Any, usage_error: type[Exception]) -> None:
    """Register ``fleetlog agent``; its problems are raised as ``usage_error``."""
    agent = sub.add_parser(
        "agent", help="a fake node agent: N nodes that heartbeat and run placed tasks for their duration",
        description="Pretend to be the nodes of one cell beside `fleetlog run`: every node's heartbeat every "
        "--heartbeat-s, and each task placed on them started at once and finished after its job's expected "
        "duration (--default-duration-s without one). For trying fleetlog without a cluster "
        "(README, 'Try the service on one machine').")
    add_log_options(agent)
    agent.add_argument("--nodes", type=_count(1), default=4, metavar="N", help="how many nodes (default 4)")
    agent.add_argument("--gpus", type=_count(0), default=8, metavar="N", help="GPUs per node (default 8)")
    agent.add_argument("--gpu-model", default="A100", metavar="MODEL", help="their model (default A100)")
    agent.add_argument("--cpu-milli", type=_count(1), default=64_000, metavar="MILLI",
                       help="per node (default 64000)")
    agent.add_argument("--mem-mib", type=_count(1), default=524_288, metavar="MIB",
                       help="per node (default 524288)")
    agent.add_argument("--cell", default="local", metavar="CELL",
                       help="the cell the nodes are in; they are named CELL-1 … CELL-N (default local)")
    agent.add_argument("--heartbeat-s", type=_seconds, default=5.0, metavar="SECONDS",
                       help="seconds between heartbeats, well within the service's node timeout (default 5)")
    agent.add_argument("--default-duration-s", type=_seconds, default=30.0, metavar="SECONDS",
                       help="how long a task of a job without an expected duration runs (default 30)")
    agent.add_argument("--fail-rate", type=_share, default=0.0, metavar="SHARE",
                       help="the share of tasks that fail instead of finishing, 0..1 (default 0)")
    agent.add_argument("--json", action="store_true", help="print one JSON object per task started or ended")
    agent.set_defaults(func=lambda args: cmd_agent(args, usage_error))


def cmd_agent(args: argparse.Namespace, usage_error: type[Exception]) -> int:
    if args.heartbeat_s <= 0:
        raise usage_error("--heartbeat-s must be more than 0")
    config = AgentConfig(
        cell=args.cell, nodes=args.nodes, gpus=args.gpus, gpu_model=args.gpu_model, cpu_milli=args.cpu_milli,
        mem_mib=args.mem_mib, heartbeat_ms=max(1, round(args.heartbeat_s * 1000)),
        default_duration_ms=round(args.default_duration_s * 1000), fail_rate=args.fail_rate,
    )
    _check_names(config, usage_error)
    logs = _location(args, config.cell, usage_error)
    try:
        interrupted = asyncio.run(_serve(args, logs, config))
    except (LogError, OSError, NotAllowedError) as exc:  # a store it cannot open, a refusal: exit code 1
        print_error("fleetlog agent", str(exc))
        return EXIT_FAILURE
    if interrupted:
        raise KeyboardInterrupt  # fleetlog's one line and exit code 130, after a clean stop
    return 0


def _check_names(config: AgentConfig, usage_error: type[Exception]) -> None:
    """The cell, node and GPU model names as the service checks them (before anything is sent)."""
    if config.gpus and not config.gpu_model:
        raise usage_error("--gpu-model: nodes with GPUs must name their model")
    beat = NodeHeartbeat(cell=config.cell, node=config.node_names()[-1], cpu_milli=config.cpu_milli,
                         mem_mib=config.mem_mib, gpu_count=config.gpus,
                         gpu_model=config.gpu_model if config.gpus else "")
    try:
        decode(encode(envelope(beat, config.producer_id)))
    except BadEventError as exc:
        field = str(exc).rsplit("$.event.", 1)[-1].strip("`")
        flag = FLAGS.get(field, "a flag")
        raise usage_error(f"{flag}: the service would refuse the nodes' heartbeats: {exc}") from None


def _location(args: argparse.Namespace, cell: str, usage_error: type[Exception]) -> Location:
    """Where the logs are: ``--config`` and ``FLEETLOG_*`` with ``--log``/``--kafka`` on top."""
    path = Path(args.config) if args.config else None
    try:
        logs = load_location(path, os.environ, others=OTHER_TABLES, log_dir=args.log, kafka=args.kafka)
        Router(logs.cells, cell)  # a cell the [cells] map does not name
    except (ConfigError, RoutingError) as exc:
        given = args.config or args.log or args.kafka
        hint = "" if given else " (use --log DIR, --kafka HOST:PORT or --config FILE)"
        raise usage_error(f"{exc}{hint}") from None
    return logs


async def _serve(args: argparse.Namespace, logs: Location, config: AgentConfig) -> bool:
    """Run the agent until SIGTERM or SIGINT; whether it was SIGINT."""
    stop, signals = asyncio.Event(), list[int]()
    loop = asyncio.get_running_loop()

    def stopping(sig: int) -> None:
        signals.append(sig)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping, sig)
    try:
        if await _log_found(logs, stop):
            async with open_store(logs, config.cell) as store:
                agent = FakeAgent(store, config, say=_printer(args.json), ready=lambda: _banner(config, logs))
                await agent.run(stop)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    return bool(signals) and signals[0] == signal.SIGINT


async def _log_found(logs: Location, stop: asyncio.Event) -> bool:
    """Wait until the file log exists (``fleetlog run`` creates it; the agent never does), saying
    so once; ``False`` if stopped first.  Kafka's topics are the service's to create."""
    directory = None if logs.kafka is not None or logs.log.dir is None else Path(logs.log.dir)
    if directory is None or _holds_log(directory, bool(logs.cells)):
        return True
    print(f"fleetlog agent: waiting for a file log at {directory} (`fleetlog run --log {directory} --create` "
          "starts one)", file=sys.stderr, flush=True)
    while not stop.is_set():
        await event_or_timeout(stop, WAIT_NOTE_S)
        if _holds_log(directory, bool(logs.cells)):
            return True
    return False


def _holds_log(directory: Path, cells: bool) -> bool:
    """Whether ``directory`` holds a file log (with a ``[cells]`` map: the shards' directories)."""
    shards = [directory / "global", *sorted(directory.glob("cells-*"))] if cells else [directory]
    return any((shard / name).is_dir() for shard in shards for name in (INPUTS, DECISIONS))


def _banner(config: AgentConfig, logs: Location) -> None:
    names = config.node_names()
    gpus = f"{config.gpus} {config.gpu_model} GPUs, " if config.gpus else ""
    print(f"fleetlog agent: {len(names)} nodes up in cell {config.cell}, {names[0]} .. {names[-1]} ({gpus}"
          f"{config.cpu_milli / 1000:g} cores, {config.mem_mib / 1024:g} GiB each), heartbeats every "
          f"{config.heartbeat_ms / 1000:g} s; logs: {describe(logs)}", file=sys.stderr, flush=True)


def _printer(as_json: bool) -> Any:
    """One line per observation on stdout, flushed (a pipe or a file sees it at once)."""

    def say(kind: str, job_id: str, index: int, node: str, exit_code: int | None) -> None:
        at = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        if as_json:
            line = json.dumps({"at": at, "event": kind, "job_id": job_id, "task_index": index, "node": node,
                               "exit_code": exit_code})
        else:
            line = f"{at} {kind} {job_id} task {index} on {node}"
            line += "" if exit_code is None else f" (exit code {exit_code})"
        print(line, flush=True)

    return say
