"""A real Kubernetes control plane (etcd + kube-apiserver) for tests and benchmarks.

``KubeControlPlane`` runs ``infra/kubernetes/kube.sh`` with its own directory (so its own
ports, certificates and data), and stops both servers by the PIDs in their pid files.  It can
stop and start the API server alone (etcd keeps the data), to test a server that goes away and
comes back.  A control plane that cannot start raises :class:`KubeControlPlaneError` with the
logs' tails: tests that need it fail loudly, they are never skipped.

``KubeScheduler`` runs the stock kube-scheduler, built from the same release, against a running
control plane (``kube.sh start-scheduler``), and stops it by the PID in its pid file.
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

    def _run(self, *args: str, timeout: float, grace_s: int = 30, env: dict[str, str] | None = None) -> str:
        env = {
            **os.environ,
            "FLEETLOG_KUBE_DIR": str(self.dir),
            "FLEETLOG_KUBE_START_TIMEOUT": str(self.start_timeout_s),
            "FLEETLOG_KUBE_STOP_GRACE": str(grace_s),
            **(env or {}),
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
        for name in ("etcd.log", "apiserver.log", "scheduler.log"):
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


class KubeScheduler:
    """The stock kube-scheduler (``k8s.io/kubernetes/cmd/kube-scheduler`` at the release the API
    server is built from: ``kube.sh fetch-scheduler``) against a running :class:`KubeControlPlane`.

    It places the pods whose ``spec.schedulerName`` is ``default-scheduler`` (the default), beside
    fleetlog's. Its configuration (``DIR/kube-scheduler.yaml``): leader election off, the admin
    kubeconfig, client ``qps`` and ``burst`` of ``qps`` (5,000: the client's throttling is not what
    is measured), every other setting kube-scheduler's default; its secure port (``/healthz``) on
    a free port of 127.0.0.1, serving the API server's certificate. Its log is ``DIR/scheduler.log``.
    Stopped by the PID in ``DIR/scheduler.pid`` (SIGTERM, then SIGKILL after ``grace_s``); also as
    a context manager (started on entry, stopped on exit). The binary is built when missing (minutes
    after kube-apiserver's build, from Go's build cache; far longer on a clean machine)."""

    def __init__(self, plane: KubeControlPlane, qps: int = 5_000) -> None:
        self.plane = plane
        self.qps = qps

    @property
    def pid_file(self) -> Path:
        return self.plane.dir / "scheduler.pid"

    @property
    def log(self) -> Path:
        return self.plane.dir / "scheduler.log"

    def start(self, wait: bool = True) -> int:
        """Start it (if not running); its PID. ``wait``: until its ``/healthz`` says ``ok`` (its
        informers may still be filling); else at once, the process just spawned."""
        self.plane._run(
            "start-scheduler",
            *([] if wait else ["--no-wait"]),
            timeout=self.plane.start_timeout_s + 3600,
            env={"FLEETLOG_KUBE_SCHEDULER_QPS": str(self.qps)},
        )
        return int(self.pid_file.read_text())

    def stop(self, grace_s: int = 10) -> None:
        self.plane._run("stop-scheduler", timeout=grace_s + 60, grace_s=grace_s)

    def __enter__(self) -> KubeScheduler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @staticmethod
    def binary() -> Path:
        """Where ``kube.sh fetch-scheduler`` keeps (or would build) the binary."""
        done = subprocess.run(
            ["bash", str(SCRIPT), "scheduler-binary"], capture_output=True, text=True, timeout=30, check=True
        )
        return Path(done.stdout.strip())
