"""``fleetlog run``: configuration from the command line, the service until a signal (its log
lines: :mod:`fleetlog.logsetup`)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import uvloop

from fleetlog.log.location import ConfigError
from fleetlog.log.logdir import LogDirError, check_log_place, check_trusted
from fleetlog.service.auth import AuthError, security
from fleetlog.service.authz import Authorizer, authenticates
from fleetlog.service.config import Config, load_config
from fleetlog.service.roles import RoleService
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


def check_role(config: Config, create: bool = True) -> None:
    """What ``fleetlog run`` cannot run: the roles apart on the file log (one process holds every
    partition's directory: ``--role all`` with the map)."""
    if config.kafka is None and config.service.role != "all":
        raise CommandError(f"--role {config.service.role} runs on Kafka (processes share the partitions); "
                           "on the file log one process runs every role: --role all with the [cells] map")
    auth = config.auth
    if auth.policy_file is not None and not authenticates(auth):
        raise CommandError("auth.policy_file names the roles of the principals of auth.tokens_file or of "
                           "the client certificates of auth.client_ca_file: set [auth] tokens_file "
                           "(FLEETLOG_AUTH_TOKENS_FILE) or client_ca_file (FLEETLOG_AUTH_CLIENT_CA_FILE) too")
    try:  # the TLS files, the bind rule and the files' modes, before anything starts
        security(auth, config.service.http_host)
        Authorizer(auth.policy_file)
        if config.log.dir is not None:  # (issue 46: a directory others may write is not the log's)
            check_trusted(Path(config.log.dir))
            check_log_place(Path(config.log.dir), create=create)  # (issue 47: never into /etc)
    except (AuthError, LogDirError) as exc:
        raise CommandError(str(exc)) from None


def run_service(config: Config) -> None:
    """Run until SIGTERM or SIGINT, on uvloop when it is installed: today's single shard, or the
    roles of a ``[cells]`` map (:mod:`fleetlog.service.roles`)."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):  # first: a signal during start-up still stops cleanly
            loop.add_signal_handler(sig, stop.set)
        if config.service.role == "all" and not config.cells:
            await Service(config, stop).run()
        else:
            await RoleService(config, stop).run()

    uvloop.run(main())
