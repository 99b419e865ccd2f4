"""A real Kubernetes control plane (etcd + kube-apiserver) for tests and benchmarks.

``KubeControlPlane`` runs ``infra/kubernetes/kube.sh`` with its own directory (so its own
ports, certificates and data), and stops both servers by the PIDs in their pid files.  It can
stop and start the API server alone (etcd keeps the data), to test a server that goes away and
comes back.  A control plane that cannot start raises :class:`KubeControlPlaneError` with the
logs' tails: tests that need it fail loudly, they are never skipped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "infra" / "kubernetes" / "kube.sh"


class KubeControlPlaneError(RuntimeError):
    """etcd or kube-apiserver could not be started or stopped."""


class KubeControlPlane:
    def __init__(self, directory: Path | None = None, start_timeout_s: int = 180) -> None:
        self.dir = directory or REPO / "var" / f"kube-test-{os.getpid()}"
        self.start_timeout_s = start_timeout_s

    @property
    def kubeconfig(self) -> Path:
        """The admin's kubeconfig (system:masters)."""
        return self.dir / "admin.kubeconfig"

    @property
    def scheduler_kubeconfig(self) -> Path:
        """The ``fleetlog-scheduler`` user's kubeconfig: only what RBAC grants it."""
        return self.dir / "scheduler.kubeconfig"

    def _run(self, *args: str, timeout: float, grace_s: int = 30) -> str:
        env = {
            **os.environ,
            "FLEETLOG_KUBE_DIR": str(self.dir),
            "FLEETLOG_KUBE_START_TIMEOUT": str(self.start_timeout_s),
            "FLEETLOG_KUBE_STOP_GRACE": str(grace_s),
        }
        done = subprocess.run(
            ["bash", str(SCRIPT), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise KubeControlPlaneError(
                f"kube.sh {' '.join(args)} failed (exit {done.returncode}).\n"
                f"--- output ---\n{done.stdout}{done.stderr}\n{self.log_tails()}"
            )
        return done.stdout

    def log_tails(self, lines: int = 30) -> str:
        parts = []
        for name in ("etcd.log", "apiserver.log"):
            path = self.dir / name
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {path} (last {len(tail)} lines) ---\n" + "\n".join(tail))
        return "\n".join(parts)

    def start(self, fresh: bool = False) -> Path:
        """Start etcd and the API server (whichever is not running); the admin kubeconfig."""
        self._run("start", *(["--fresh"] if fresh else []), timeout=self.start_timeout_s + 3600)
        return self.kubeconfig

    def stop_apiserver(self, grace_s: int = 30) -> None:
        """SIGTERM the API server, SIGKILL after ``grace_s``: it stops listening at once, but
        waits on open watch streams until it is killed."""
        self._run("stop", "apiserver", timeout=60, grace_s=grace_s)

    def stop(self, grace_s: int = 30) -> None:
        self._run("stop", timeout=90, grace_s=grace_s)

    def close(self) -> None:
        """Stop both servers and remove the directory; SIGKILLed at once, as their data goes
        with the directory (a clean stop took about 4 s)."""
        try:
            self.stop(grace_s=0)
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def kubectl(self, *args: str, stdin: str | None = None, kubeconfig: Path | None = None) -> str:
        """Run ``kubectl`` against this API server; its output, or an error with its message."""
        done = subprocess.run(
            ["kubectl", "--kubeconfig", str(kubeconfig or self.kubeconfig), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if done.returncode != 0:
            raise KubeControlPlaneError(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout
