"""A real Slurm cluster for tests and benchmarks, run with ``infra/slurm/slurm.sh``.

``SlurmCluster`` starts munged, slurmctld and one ``slurmd -N nX`` per node from its own run
directory (free ports picked by the script), and stops every daemon by the PID in its pid files.
A cluster that cannot start raises :class:`SlurmClusterError` with the script's output and the
daemons' log tails: tests that need Slurm fail loudly, they are never skipped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "infra" / "slurm" / "slurm.sh"


class SlurmClusterError(RuntimeError):
    """The cluster could not be started or stopped."""


class SlurmCluster:
    """One isolated cluster of ``nodes`` nodes (n1..nN), each with ``cpus`` CPUs, ``mem_mib`` MiB
    and ``gpus`` fake GPUs.  ``run_dir`` defaults to ``var/slurm-test-<pid>``; ``ephemeral``
    removes it on :meth:`close`."""

    def __init__(
        self,
        run_dir: Path | None = None,
        *,
        nodes: int = 4,
        cpus: int = 8,
        mem_mib: int = 8192,
        gpus: int = 4,
        ephemeral: bool = True,
        start_timeout_s: int = 90,
    ) -> None:
        self.run_dir = run_dir or REPO / "var" / f"slurm-test-{os.getpid()}"
        self.nodes, self.cpus, self.mem_mib, self.gpus = nodes, cpus, mem_mib, gpus
        self.ephemeral = ephemeral
        self.start_timeout_s = start_timeout_s

    @property
    def conf(self) -> Path:
        """The ``slurm.conf`` every client command needs (as ``SLURM_CONF``)."""
        return self.run_dir / "slurm.conf"

    @property
    def node_names(self) -> list[str]:
        return [f"n{i}" for i in range(1, self.nodes + 1)]

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "SLURM_CONF": str(self.conf),
            "FLEETLOG_SLURM_DIR": str(self.run_dir),
            "FLEETLOG_SLURM_NODES": str(self.nodes),
            "FLEETLOG_SLURM_CPUS": str(self.cpus),
            "FLEETLOG_SLURM_MEM_MIB": str(self.mem_mib),
            "FLEETLOG_SLURM_GPUS": str(self.gpus),
            "FLEETLOG_SLURM_START_TIMEOUT": str(self.start_timeout_s),
        }

    def _script(self, *args: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(SCRIPT), *args],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )

    def start(self) -> None:
        """Write a fresh run directory and start every daemon; wait until all nodes are idle."""
        done = self._script("start", "--fresh", timeout_s=self.start_timeout_s + 900)
        if done.returncode != 0:
            raise SlurmClusterError(
                f"Slurm cluster did not start in {self.run_dir} (exit {done.returncode}).\n"
                f"--- slurm.sh output ---\n{done.stdout}{done.stderr}\n{self.log_tails()}"
            )

    def stop(self) -> None:
        """Stop every daemon by its PID (the script checks each PID's command line first)."""
        done = self._script("stop", timeout_s=120)
        if done.returncode != 0:
            raise SlurmClusterError(f"slurm.sh stop failed:\n{done.stdout}{done.stderr}")

    def close(self) -> None:
        self.stop()
        if self.ephemeral:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def command(self, *argv: str) -> str:
        """Run a Slurm client command (``scontrol``, ``sinfo``...) against this cluster; its stdout."""
        done = subprocess.run(argv, env=self.env(), capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            raise SlurmClusterError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
        return done.stdout

    def log_tails(self, lines: int = 20) -> str:
        parts = []
        for path in sorted((self.run_dir / "log").glob("*")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(parts)

    def __enter__(self) -> SlurmCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
