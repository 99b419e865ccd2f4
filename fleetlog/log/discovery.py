"""``DIR/service.json``: how producers of an embedded file log find the service that holds it.

The service writes ``{"pid": ..., "http": "host:port"}`` (mode 0600: a file others could
rewrite would redirect producers) once it leads, and removes it when it stops; the client and
the backends' shared log read it and send to that address while the process is alive, a backend
with the :data:`ACCEPT_NEVER_FITS` header.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Final

from fleetlog.log.file import process_alive
from fleetlog.log.private import write_private

SERVICE_FILE: Final = "service.json"
ACCEPT_NEVER_FITS: Final = ("fleetlog-never-fits", "accept")
"""The request header (name, value) of a producer that reports what a cluster holds rather than
asking for a job to be run — a backend's pod groups: a job no node shape can hold is taken and
then explained as ``never_fits`` (Kubernetes keeps an unschedulable pod and says why), instead of
refused at submit (as ``sbatch`` does, and ``fleetlog submit`` gets)."""


def announce(directory: Path, pid: int, address: str) -> None:
    """Tell producers of the log in ``directory`` to send to ``address`` (``host:port``)."""
    write_private(directory / SERVICE_FILE, json.dumps({"pid": pid, "http": address}).encode())


def withdraw(directory: Path) -> None:
    """The service stopped: producers go back to the log itself."""
    (directory / SERVICE_FILE).unlink(missing_ok=True)


def running_service(directory: Path) -> tuple[str, int] | None:
    """``(host, port)`` of the service announced in ``directory/service.json`` if its process is
    alive; ``None`` when there is no such file or it is stale."""
    try:
        info = json.loads((directory / SERVICE_FILE).read_text())
        pid, address = int(info["pid"]), str(info["http"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not process_alive(pid):
        return None
    host, _, port = address.rpartition(":")
    return (host or "127.0.0.1", int(port)) if port.isdigit() else None
