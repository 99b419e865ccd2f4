"""A real three-node Kafka cluster and a real fault-injecting proxy, for fault tests and benchmarks.

``KafkaCluster`` drives ``infra/kafka/kafka.sh cluster ...``: three KRaft nodes (combined
controller + broker) on 127.0.0.1, replication factor 3, ``min.insync.replicas=2``, and
Toxiproxy in front of every broker.  Clients that bootstrap on :attr:`KafkaCluster.proxied`
reach the brokers only through the proxy (each broker advertises its proxy port on that
listener), so :class:`Toxiproxy` can cut, slow or blackhole them; clients on
:attr:`KafkaCluster.direct` (producers of load, the checker) never pass it.  Processes are
stopped by the PIDs in their pid files; a cluster that cannot start raises, never skips.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any, Final

from tests.kafka_broker import REPO, SCRIPT, KafkaBrokerError

NODES = (1, 2, 3)
PORTS_SPAN = 31


BELOW_EPHEMERAL: Final = (20_000, 32_000)
"""Where the cluster's ports are chosen: below Linux's ephemeral range (32768-60999 by default).
A node killed and restarted leaves its ports free for seconds; in the ephemeral range, any
process's "any free port" (a test server bound to port 0, an outgoing connection) may take one
meanwhile, and the node cannot come back ("port ... of node 2 is already in use", seen in a CI
run with the main session's servers starting beside the fault tests)."""


def free_port_range(span: int = PORTS_SPAN) -> int:
    """The first of ``span`` consecutive ports on 127.0.0.1, all free now, at a random place
    below the ephemeral range (:data:`BELOW_EPHEMERAL`)."""
    low, high = BELOW_EPHEMERAL
    for _ in range(200):
        base = random.randrange(low, high - span)
        if all(_free(base + k) for k in range(span)):
            return base
    raise KafkaBrokerError(f"no {span} consecutive free ports found on 127.0.0.1 in {low}..{high}")


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class KafkaCluster:
    """Three nodes and the proxy, in ``data_dir`` (default ``var/kafka-cluster-BASE``) on the
    ports from ``base`` (a free range if ``None``).  ``ephemeral`` removes the directory on
    :meth:`close`."""

    def __init__(self, base: int | None = None, data_dir: Path | None = None, *,
                 ephemeral: bool = True, heap: str = "384m", start_timeout_s: int = 120) -> None:
        self.base = base or free_port_range()
        self.data_dir = data_dir or REPO / "var" / f"kafka-cluster-{self.base}"
        self.ephemeral, self.heap, self.start_timeout_s = ephemeral, heap, start_timeout_s

    def port(self, node: int, k: int) -> int:
        return self.base + 10 * (node - 1) + k

    @property
    def direct(self) -> str:
        return ",".join(f"127.0.0.1:{self.port(n, 0)}" for n in NODES)

    @property
    def proxied(self) -> str:
        return ",".join(f"127.0.0.1:{self.port(n, 3)}" for n in NODES)

    @property
    def proxy(self) -> Toxiproxy:
        return Toxiproxy(f"http://127.0.0.1:{self.base + 30}")

    def _env(self) -> dict[str, str]:
        return {**os.environ, "FLEETLOG_KAFKA_CLUSTER_PORT": str(self.base),
                "FLEETLOG_KAFKA_CLUSTER_DIR": str(self.data_dir), "FLEETLOG_KAFKA_HEAP": self.heap,
                "FLEETLOG_KAFKA_START_TIMEOUT": str(self.start_timeout_s)}

    def run(self, *args: str, timeout_s: float | None = None) -> str:
        """``kafka.sh cluster ARGS``; its output, or :class:`KafkaBrokerError` naming it."""
        done = subprocess.run(["bash", str(SCRIPT), "cluster", *args], env=self._env(),
                              capture_output=True, text=True, check=False,
                              timeout=timeout_s or self.start_timeout_s + 600)
        if done.returncode != 0:
            raise KafkaBrokerError(f"kafka.sh cluster {' '.join(args)} failed (exit {done.returncode}):\n"
                                   f"{done.stdout}{done.stderr}")
        return done.stdout

    def start(self, fresh: bool = True) -> KafkaCluster:
        """Start the three nodes and the proxy; if that fails, stop whatever did start."""
        try:
            self.run("start", *(["--fresh"] if fresh else []))
        except BaseException:
            self.close()
            raise
        return self

    def stop(self) -> None:
        self.run("stop", timeout_s=180)

    def close(self) -> None:
        """Stop; an ``ephemeral`` cluster's nodes are SIGKILLed first (a clean shutdown
        flushes every partition for data about to be deleted) and its directory removed."""
        try:
            if self.ephemeral:
                for node, state in self.status().items():
                    if state != "stopped":
                        self.kill(node)
            self.stop()
        finally:
            if self.ephemeral:
                shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> KafkaCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def kill(self, node: int) -> None:
        self.run("kill", str(node), timeout_s=30)

    def kill_wait(self, node: int) -> None:
        """After a SIGKILL sent by hand (faster than :meth:`kill`'s script): wait until node
        ``node``'s process is gone."""
        pid = self.pid(node)
        deadline = time.monotonic() + 30
        while pid is not None and time.monotonic() < deadline:
            try:
                if "zombie" in Path(f"/proc/{pid}/status").read_text(errors="replace"):
                    return
            except FileNotFoundError:
                return
            time.sleep(0.05)

    def restart(self, node: int) -> None:
        self.run("restart", str(node))

    def pause(self, node: int) -> None:
        self.run("pause", str(node), timeout_s=30)

    def resume(self, node: int) -> None:
        self.run("resume", str(node), timeout_s=30)

    def status(self) -> dict[int, str]:
        """``{node: "running" | "paused" | "stopped"}``."""
        done = subprocess.run(["bash", str(SCRIPT), "cluster", "status"], env=self._env(),
                              capture_output=True, text=True, check=False, timeout=30)
        out = {}
        for line in done.stdout.splitlines():
            words = line.split()
            if words[:1] == ["node"]:
                out[int(words[1])] = words[2]
        return out

    def pid(self, node: int) -> int | None:
        try:
            return int((self.data_dir / f"node-{node}" / "kafka.pid").read_text())
        except (FileNotFoundError, ValueError):
            return None

    def controller(self) -> int:
        """The active KRaft controller: the leader of the newest epoch any node's
        ``quorum-state`` file records (each voter writes it on every election it sees)."""
        best: tuple[int, int] | None = None
        for n in NODES:
            path = self.data_dir / f"node-{n}" / "data" / "__cluster_metadata-0" / "quorum-state"
            try:
                state = json.loads(path.read_text())
            except (FileNotFoundError, ValueError):
                continue
            leader, epoch = int(state.get("leaderId", -1)), int(state.get("leaderEpoch", -1))
            if leader > 0 and (best is None or epoch > best[0]):
                best = (epoch, leader)
        if best is None:
            raise KafkaBrokerError(f"no node of {self.data_dir} has recorded a controller leader")
        return best[1]

    def log_tail(self, node: int, lines: int = 30) -> str:
        try:
            text = (self.data_dir / f"node-{node}" / "kafka.log").read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class Toxiproxy:
    """The proxy's HTTP API (Toxiproxy 2.x): proxies ``kafka-1..3``, one per broker."""

    def __init__(self, url: str) -> None:
        self.url = url

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            raw = response.read()
        return json.loads(raw) if raw else None

    def proxies(self) -> dict[str, Any]:
        found: dict[str, Any] = self._call("GET", "/proxies")
        return found

    def enable(self, node: int, enabled: bool) -> None:
        """``enabled=False`` closes every connection through broker ``node``'s proxy and
        refuses new ones (a cut); ``True`` lets them in again."""
        self._call("POST", f"/proxies/kafka-{node}", {"enabled": enabled})

    def cut(self, nodes: tuple[int, ...] = NODES) -> None:
        for n in nodes:
            self.enable(n, False)

    def latency(self, node: int, ms: int, jitter_ms: int = 0) -> None:
        """Every byte from broker ``node`` to the client waits ``ms`` (± ``jitter_ms``)."""
        self._call("POST", f"/proxies/kafka-{node}/toxics", {
            "name": "latency", "type": "latency", "stream": "downstream", "toxicity": 1.0,
            "attributes": {"latency": ms, "jitter": jitter_ms}})

    def blackhole(self, node: int) -> None:
        """Connections through broker ``node``'s proxy stay open but carry nothing either way
        (Toxiproxy's ``timeout`` toxic with timeout 0), until :meth:`heal`."""
        for stream in ("upstream", "downstream"):
            self._call("POST", f"/proxies/kafka-{node}/toxics", {
                "name": f"blackhole-{stream}", "type": "timeout", "stream": stream, "toxicity": 1.0,
                "attributes": {"timeout": 0}})

    def heal(self) -> None:
        """Every proxy enabled, every toxic removed (Toxiproxy's ``/reset``)."""
        self._call("POST", "/reset")
