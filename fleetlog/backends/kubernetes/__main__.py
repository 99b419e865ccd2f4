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
from fleetlog.backends.store_args import add_store_arguments, open_store
from fleetlog.usage import Parser


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = Parser(prog="python -m fleetlog.backends.kubernetes", description=__doc__)
    add_store_arguments(parser)
    parser.add_argument("--kubeconfig", help="kubeconfig path (default: in-cluster, else ~/.kube/config)")
    parser.add_argument("--cell", default="kubernetes", help="the fleetlog cell this cluster is")
    parser.add_argument("--scheduler-name", default="fleetlog", help="pods with this schedulerName are ours")
    return parser.parse_args(argv)


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
