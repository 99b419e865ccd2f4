"""The Slurm backend: fleetlog decides placement, a real Slurm cluster runs the work.

- :mod:`.client` — Slurm's client commands (``sinfo``/``squeue`` JSON, ``sbatch``, ``scancel``) as
  asyncio subprocesses, with clear errors (unavailable: retry; rejected: report).
- :mod:`.mapping` — pure translations: job names, node health, job states, sbatch options, the
  batch script (a job's payload, quoted).
- :mod:`.backend` — the backend: decisions log in, Slurm effects out, observations to the inputs log.

See ``docs/slurm.md``.
"""

from fleetlog.backends.slurm.backend import Backoff, SlurmBackend, SlurmConfig, Stats
from fleetlog.backends.slurm.client import (
    SlurmClient,
    SlurmError,
    SlurmRejectedError,
    SlurmUnavailableError,
)
from fleetlog.backends.slurm.mapping import (
    PayloadError,
    SubmitSettings,
    Workload,
    sleep_for_expected_duration,
)

__all__ = [
    "Backoff",
    "PayloadError",
    "SlurmBackend",
    "SlurmClient",
    "SlurmConfig",
    "SlurmError",
    "SlurmRejectedError",
    "SlurmUnavailableError",
    "Stats",
    "SubmitSettings",
    "Workload",
    "sleep_for_expected_duration",
]
