"""``python -m fleetlog.backends.slurm``: run the Slurm backend against one cluster until stopped.

    python -m fleetlog.backends.slurm [--config FILE] [--log DIR | --kafka HOST:PORT]
        [--topic-prefix PREFIX] [--slurm-conf PATH] [--cell NAME] [--prefix NAME] [--partition NAME]
        [--gpu-type TYPE] [--output PATTERN] [--command SHELL] [--image-option OPTION]
        [--log-format json|console] [--log-level LEVEL]

A task runs its job's payload (``JobSubmitted.payload``: a command or a script, with its env) and
a job without one runs ``--command`` (a shell line), by default a sleep for the job's expected
duration; ``$FLEETLOG_JOB_ID``, ``$FLEETLOG_TASK_INDEX``, ``$FLEETLOG_NODE`` and
``$FLEETLOG_GPU_INDICES`` are set for both.  A payload's image is passed as ``--image-option``
(``--image-option=--container-image`` for pyxis); without it a job that names an image fails.
Where the logs are is configured as for ``fleetlog run`` (the same
``--config`` file and ``FLEETLOG_*`` variables, Kafka security included); next to ``fleetlog run
--log DIR`` it reads the file log and sends its observations to the service.  SIGTERM or SIGINT
stops it; a bad option or configuration exits 2, a failure that stops it exits 1 (one line).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from fleetlog.backends.slurm.backend import SlurmBackend, SlurmConfig
from fleetlog.backends.slurm.mapping import SubmitSettings, Workload, sleep_for_expected_duration
from fleetlog.backends.store_args import add_store_arguments, open_store, run_backend
from fleetlog.events import JobSubmitted
from fleetlog.log.location import Located
from fleetlog.usage import Parser, add_logging_options

PROG = "python -m fleetlog.backends.slurm"


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = Parser(
        prog=PROG, description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_store_arguments(parser)
    add_logging_options(parser, "console", "info")
    parser.add_argument("--slurm-conf", default="", help="SLURM_CONF for the client commands")
    parser.add_argument("--cell", default="slurm", help="the fleetlog cell this cluster is (default slurm)")
    parser.add_argument(
        "--prefix", default="fleetlog", help="Slurm job names start with PREFIX: (default fleetlog)"
    )
    parser.add_argument("--partition", default="", help="submit to this partition (default: Slurm's default)")
    parser.add_argument("--gpu-type", default="", help="request GPUs as gpu:TYPE:N (default gpu:N)")
    parser.add_argument("--output", default="/dev/null", help="sbatch --output pattern (default /dev/null)")
    parser.add_argument("--command", default="", help="the shell line a task of a job without a payload runs")
    parser.add_argument(
        "--image-option", default="", metavar="OPTION",
        help="the sbatch option that runs a payload's image, e.g. =--container-image (default: none; such "
        "jobs fail)",
    )
    parser.add_argument(
        "--pending-bound-s", type=float, default=30.0, metavar="SECONDS",
        help="withdraw a placement whose Slurm job stays PENDING this long, to be decided again (0: never; "
        "default 30)",
    )
    return parser.parse_args(argv)


def workload(command: str) -> Workload:
    if not command:
        return sleep_for_expected_duration

    def run(job: JobSubmitted, task_index: int) -> str:
        return command

    return run


def config(args: argparse.Namespace) -> SlurmConfig:
    submit = SubmitSettings(
        partition=args.partition, gpu_type=args.gpu_type, output=args.output, image_option=args.image_option
    )
    return SlurmConfig(
        cell=args.cell, prefix=args.prefix, slurm_conf=args.slurm_conf, submit=submit,
        pending_bound_s=args.pending_bound_s,
    )


async def serve(args: argparse.Namespace, logs: Located) -> None:
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    async with open_store(logs, args.cell) as store:
        await SlurmBackend(store, config(args), workload(args.command)).run(stop)


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    return run_backend(PROG, lambda logs: serve(args, logs), args)


if __name__ == "__main__":
    sys.exit(main())
