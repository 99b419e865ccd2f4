"""Where a backend process reads decisions and writes observations: the shared command-line
options of ``python -m fleetlog.backends.<name>`` and the store they name."""

from __future__ import annotations

import argparse

from fleetlog.log.base import LogStore
from fleetlog.log.file import FileLogStore
from fleetlog.log.kafka import KafkaConfig, KafkaLogStore


def add_store_arguments(parser: argparse.ArgumentParser) -> None:
    """``--log DIR`` or ``--kafka HOST:PORT`` (one is required), and ``--topic-prefix``."""
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--log", help="directory of the embedded file log")
    where.add_argument("--kafka", help="Kafka bootstrap servers, host:port[,host:port]")
    parser.add_argument("--topic-prefix", default="fleetlog", help="Kafka topic prefix (default fleetlog)")


def open_store(args: argparse.Namespace) -> LogStore:
    """The (unopened) store the options of :func:`add_store_arguments` name."""
    if args.log:
        return FileLogStore(args.log)
    return KafkaLogStore(KafkaConfig(bootstrap_servers=args.kafka, topic_prefix=args.topic_prefix))
