"""Where a backend process reads decisions and writes observations: the shared command-line
options of ``python -m fleetlog.backends.<name>``, the location they make (the ``[log]`` and
``[kafka]`` tables of the same ``--config`` file and the same ``FLEETLOG_LOG_*``/``FLEETLOG_KAFKA_*``
variables as ``fleetlog run``, read by :func:`fleetlog.log.settings.load_location`), the store it
names, and the exit codes of the command."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, Final

import msgspec

from fleetlog.backends.cell_store import backend_store
from fleetlog.backends.shared_log import SharedFileStore
from fleetlog.log.base import LogStore, Shard
from fleetlog.log.kafka import KafkaLogStore
from fleetlog.log.location import ConfigError, Located, describe
from fleetlog.log.routing import Router, RoutingError
from fleetlog.log.settings import Location, load_location
from fleetlog.logsetup import configure_logging

EXIT_OPERATIONAL: Final = 1
EXIT_USAGE: Final = 2
OTHER_TABLES: Final = ("service", "auth")
"""Tables of the file that are not the backend's: ``fleetlog run`` reads (and checks) them."""
log = logging.getLogger("fleetlog.backends")


class UsageError(Exception):
    """Options that cannot work together: one line, exit code 2."""


def add_store_arguments(parser: argparse.ArgumentParser) -> None:
    """``--config FILE`` and ``--log DIR`` or ``--kafka HOST:PORT`` (on top of the file), and
    ``--topic-prefix``: the options of ``fleetlog run`` that say where the logs are."""
    parser.add_argument(
        "--config", metavar="FILE", help="the service's TOML configuration file ([log] or [kafka])"
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--log", metavar="DIR", help="directory of the embedded file log (shared with `fleetlog run --log`)"
    )
    where.add_argument("--kafka", metavar="HOST:PORT", help="Kafka bootstrap servers, host:port[,host:port]")
    parser.add_argument("--topic-prefix", metavar="PREFIX", help="Kafka topic prefix (default fleetlog)")


def store_config(args: argparse.Namespace) -> Location:
    """Where the logs are, from ``--config`` and ``FLEETLOG_*`` with ``--log``/``--kafka`` on top;
    a :class:`ConfigError` or :class:`UsageError` saying what is wrong."""
    path = Path(args.config) if args.config else None
    config = load_location(path, os.environ, others=OTHER_TABLES, log_dir=args.log, kafka=args.kafka)
    if args.topic_prefix is not None:
        if config.kafka is None:
            raise UsageError("--topic-prefix applies to Kafka only (--kafka or a [kafka] table)")
        kafka = msgspec.structs.replace(config.kafka, topic_prefix=args.topic_prefix)
        config = msgspec.structs.replace(config, kafka=kafka)
    return config


def open_store(config: Located, cell: str | None = None) -> LogStore:
    """The (unopened) store a backend of ``cell`` uses: Kafka, or the file log shared with the
    service; with a ``[cells]`` map, its cell's partition with its appends routed by cell
    (:func:`fleetlog.backends.cell_store.backend_store`; a cell the map does not name: a
    :class:`~fleetlog.log.routing.RoutingError`, which :func:`run_backend` checks first)."""

    def make(shard: Shard) -> LogStore:
        if config.kafka is not None:
            return KafkaLogStore(config.kafka, shard)
        return SharedFileStore(config, shard, cell if shard != Shard.SINGLE else None)

    if cell is None:
        return make(Shard.SINGLE)
    return backend_store(config, cell, make)


def run_backend(prog: str, serve: Callable[[Location], Coroutine[Any, Any, None]],
                args: argparse.Namespace) -> int:
    """Run ``serve`` until it returns; the exit code.  Never a traceback: a configuration or
    usage problem is one line and 2, anything that stops the backend one line and 1."""
    configure_logging(args.log_format, args.log_level)
    try:
        config = store_config(args)
        Router(config.cells, getattr(args, "cell", None))  # a cell the [cells] map does not name
    except (ConfigError, UsageError, RoutingError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    log.info("logs: %s", describe(config))
    try:
        asyncio.run(serve(config))
    except KeyboardInterrupt:
        return EXIT_OPERATIONAL
    except Exception as exc:  # the one place the backend stops: say why in one line
        print(f"{prog}: error: {type(exc).__name__}: {_one_line(exc)}", file=sys.stderr)
        return EXIT_OPERATIONAL
    return 0


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or repr(exc)
