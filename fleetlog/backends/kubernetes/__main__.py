"""``python -m fleetlog.backends.kubernetes``: run the backend against one cluster until stopped.

    python -m fleetlog.backends.kubernetes --log DIR | --kafka HOST:PORT [--kubeconfig PATH]
        [--cell NAME] [--scheduler-name NAME] [--topic-prefix PREFIX]

Without ``--kubeconfig``, inside a pod it uses the service account; elsewhere ``~/.kube/config``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

from fleetlog.backends.kubernetes.api import KubeApi
from fleetlog.backends.kubernetes.backend import KubernetesBackend
from fleetlog.backends.kubernetes.config import KubeBackendConfig
from fleetlog.log.base import LogStore
from fleetlog.log.file import FileLogStore
from fleetlog.log.kafka import KafkaConfig, KafkaLogStore


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m fleetlog.backends.kubernetes", description=__doc__)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--log", help="directory of the embedded file log")
    where.add_argument("--kafka", help="Kafka bootstrap servers, host:port[,host:port]")
    parser.add_argument("--topic-prefix", default="fleetlog", help="Kafka topic prefix (default fleetlog)")
    parser.add_argument("--kubeconfig", help="kubeconfig path (default: in-cluster, else ~/.kube/config)")
    parser.add_argument("--cell", default="kubernetes", help="the fleetlog cell this cluster is")
    parser.add_argument("--scheduler-name", default="fleetlog", help="pods with this schedulerName are ours")
    return parser.parse_args(argv)


def open_store(args: argparse.Namespace) -> LogStore:
    if args.log:
        return FileLogStore(args.log)
    return KafkaLogStore(KafkaConfig(bootstrap_servers=args.kafka, topic_prefix=args.topic_prefix))


async def serve(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    cfg = KubeBackendConfig(cell=args.cell, scheduler_name=args.scheduler_name)
    async with open_store(args) as store:
        api = await KubeApi.connect(args.kubeconfig)
        backend = KubernetesBackend(store, api, cfg)
        try:
            await backend.start()
            await stop.wait()
        finally:
            await backend.stop()
            await api.close()


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    asyncio.run(serve(arguments(argv)))


if __name__ == "__main__":
    main()
