"""``python -m fleetlog.backends.kubernetes``: run the backend against one cluster until stopped.

    python -m fleetlog.backends.kubernetes [--config FILE] [--log DIR | --kafka HOST:PORT]
        [--topic-prefix PREFIX] [--kubeconfig PATH] [--cell NAME] [--scheduler-name NAME]
        [--log-format json|console] [--log-level LEVEL]

Where the logs are is configured as for ``fleetlog run`` (the same ``--config`` file and
``FLEETLOG_*`` variables, Kafka security included); next to ``fleetlog run --log DIR`` it reads
the file log and sends its observations to the service.  Without ``--kubeconfig``, inside a pod
it uses the service account; elsewhere ``~/.kube/config``.  SIGTERM or SIGINT stops it; a bad
option or configuration exits 2, a failure that stops it exits 1 (one line on stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from fleetlog.backends.kubernetes.api import KubeApi
from fleetlog.backends.kubernetes.backend import KubernetesBackend
from fleetlog.backends.kubernetes.config import KubeBackendConfig
from fleetlog.backends.store_args import add_store_arguments, open_store, run_backend
from fleetlog.log.location import Located
from fleetlog.usage import Parser, add_logging_options
from fleetlog.waiting import event_or_timeout

PROG = "python -m fleetlog.backends.kubernetes"
FAILURE_CHECK_S = 1.0


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = Parser(
        prog=PROG,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_store_arguments(parser)
    add_logging_options(parser, "console", "info")
    parser.add_argument("--kubeconfig", help="kubeconfig path (default: in-cluster, else ~/.kube/config)")
    parser.add_argument("--cell", default="kubernetes", help="the fleetlog cell this cluster is")
    parser.add_argument("--scheduler-name", default="fleetlog", help="pods with this schedulerName are ours")
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace, config: Located) -> None:
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    cfg = KubeBackendConfig(cell=args.cell, scheduler_name=args.scheduler_name)
    api = await KubeApi.connect(args.kubeconfig)  # first: a bad kubeconfig creates no log
    try:
        async with open_store(config, args.cell) as store:
            backend = KubernetesBackend(store, api, cfg)
            try:
                await backend.start()
                await until_stopped_or_failed(backend, stop)
            finally:
                await backend.stop()
    finally:
        await api.close()


async def until_stopped_or_failed(backend: KubernetesBackend, stop: asyncio.Event) -> None:
    """Wait for a signal; a background task that died (an append the service refused, ...)
    ends the process with its error instead of leaving it running deaf or dumb."""
    while not stop.is_set():
        await event_or_timeout(stop, FAILURE_CHECK_S)
        failed = backend.failed()
        if failed is not None:
            raise failed


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    return run_backend(PROG, lambda config: serve(args, config), args)


if __name__ == "__main__":
    sys.exit(main())
