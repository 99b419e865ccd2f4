"""``fleetlog run``: configuration from the command line, structured logging, the service until a signal."""

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

from fleetlog.service.config import Config, ConfigError, load_config
from fleetlog.service.service import Service


class CommandError(Exception):
    """A usage problem: one line, exit code 2."""


def configure(config_path: str | None, log_dir: str | None, kafka: str | None, **service: Any) -> Config:
    """The configuration of ``--config`` and the environment with the command-line options on top
    (``--log``/``--kafka`` say where the logs are; ``policy=`` is ``--policy``, which sets
    ``service.policy`` and is named in its errors…)."""
    flags = {f"service.{k}": (f"--{k.replace('_', '-')}", v) for k, v in service.items() if v is not None}
    try:
        return load_config(Path(config_path) if config_path else None, os.environ, log_dir=log_dir,
                           kafka=kafka, flags=flags)
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
    # fleetlog's stdlib loggers (the consumer's dead-letter warnings) as JSON lines too
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        processor=structlog.processors.JSONRenderer(sort_keys=True),
        foreign_pre_chain=[structlog.stdlib.add_log_level, structlog.stdlib.add_logger_name,
                           structlog.processors.TimeStamper(fmt="iso", utc=True)]))
    dead_letters = logging.getLogger("fleetlog.dead_letters")
    dead_letters.addHandler(handler)
    dead_letters.propagate = False


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
