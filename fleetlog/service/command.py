"""``fleetlog run`` and ``fleetlog status``: the service and a read-only look at a job."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import structlog
import uvloop

from fleetlog.core.policy import policy_named
from fleetlog.core.state import State
from fleetlog.log.base import LogError, LogStore
from fleetlog.log.file import FileLogStore
from fleetlog.service.config import Config, ConfigError, load_config, make_store
from fleetlog.service.loop import LoopConfig, SchedulerLoop
from fleetlog.service.service import Service, recover, snapshot_store
from fleetlog.service.status import job_status


class CommandError(Exception):
    """A usage problem: one line, exit code 2."""


def configure(config_path: str | None, log_dir: str | None, kafka: str | None, **service: Any) -> Config:
    """The configuration of ``--config`` and the environment with the command-line options on top
    (``--log``/``--kafka`` say where the logs are; ``--policy`` acts as ``FLEETLOG_SERVICE_POLICY``…)."""
    env = dict(os.environ)
    env.update({f"FLEETLOG_SERVICE_{k.upper()}": str(v) for k, v in service.items() if v is not None})
    try:
        return load_config(Path(config_path) if config_path else None, env, log_dir=log_dir, kafka=kafka)
    except ConfigError as exc:
        raise CommandError(str(exc)) from None


def configure_logging(level: str = "info") -> None:
    """structlog JSON lines on stderr: one per decision batch, never one per event."""
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.JSONRenderer(sort_keys=True),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )


def run_service(config: Config) -> None:
    """Run until SIGTERM or SIGINT, on uvloop when it is installed."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):  # first: a signal during start-up still stops cleanly
            loop.add_signal_handler(sig, stop.set)
        service = Service(config, stop)
        await service.run()

    uvloop.run(main())


async def read_state(config: Config) -> State:
    """The state at the end of the logs, read-only: the newest snapshot, the decisions after it,
    then every input after the last decision (folded, nothing decided)."""
    store: LogStore = (
        FileLogStore(config.log.dir, read_only=True) if config.log.dir is not None else make_store(config)
    )
    snapshots = snapshot_store(config)
    await store.open()
    try:
        settings = config.service
        loop, _ = await recover(store, snapshots, lambda s: SchedulerLoop(s, policy_named(settings.policy),
                                                                        LoopConfig(group=settings.group)))
        await loop.catch_up()
        return loop.state
    finally:
        await snapshots.close()
        await store.close()


def status(config: Config, job_id: str) -> dict[str, Any]:
    if config.log.dir is not None and not (Path(config.log.dir)).is_dir():
        raise CommandError(f"no file log at {config.log.dir}")
    try:
        state = asyncio.run(read_state(config))
    except LogError as exc:
        raise CommandError(f"cannot read the logs: {exc}") from None
    found = job_status(state, job_id)
    if found is None:
        raise CommandError(f"unknown job {job_id!r}: no JobSubmitted for it in the inputs log")
    return found
