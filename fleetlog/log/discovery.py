"""``DIR/service.json``: how producers of an embedded file log find the service that holds it.

The service writes ``{"pid": ..., "http": "host:port"}`` (with ``"scheme": "https"`` when it
serves TLS; mode 0600: a file others could rewrite would redirect producers) once it leads, and
removes it when it stops; the client and the backends' shared log read it and send to that
address while the process is alive, a backend with the :data:`ACCEPT_NEVER_FITS` header.
They read it only from a directory no other user may write, and only a ``service.json`` no other
user may write (:func:`~fleetlog.log.logdir.check_trusted`): else a planted file would receive
their events and their bearer token (issue 46); that is a
:class:`~fleetlog.log.logdir.UntrustedError`, not a fallback.
"""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path
from typing import Final, NamedTuple

from fleetlog.log.file import process_alive
from fleetlog.log.logdir import check_trusted
from fleetlog.log.private import write_private
from fleetlog.numerals import whole

SERVICE_FILE: Final = "service.json"
ACCEPT_NEVER_FITS: Final = ("fleetlog-never-fits", "accept")
"""The request header (name, value) of a producer that reports what a cluster holds rather than
asking for a job to be run — a backend's pod groups: a job no node shape can hold is taken and
then explained as ``never_fits`` (Kubernetes keeps an unschedulable pod and says why), instead of
refused at submit (as ``sbatch`` does, and ``fleetlog submit`` gets)."""


class Announced(NamedTuple):
    """Where the service that holds a file log listens."""

    host: str
    port: int
    scheme: str = "http"
    """``https`` when it serves TLS (``[auth] tls_cert_file``)."""

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


def local(host: str) -> str:
    """The address a producer on this machine reaches a service bound to ``host`` at: a wildcard
    bind (``0.0.0.0``, ``::``) is reached on loopback — the address a TLS certificate names."""
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return host
    if not address.is_unspecified:
        return host
    return "127.0.0.1" if address.version == 4 else "::1"


def announce(directory: Path, pid: int, address: str, scheme: str = "http") -> None:
    """Tell producers of the log in ``directory`` to send to ``address`` (``host:port``), over
    ``scheme`` (``http`` or ``https``)."""
    info: dict[str, object] = {"pid": pid, "http": address}
    if scheme != "http":
        info["scheme"] = scheme
    write_private(directory / SERVICE_FILE, json.dumps(info).encode())


def withdraw(directory: Path) -> None:
    """The service stopped: producers go back to the log itself."""
    (directory / SERVICE_FILE).unlink(missing_ok=True)


def running_service(directory: Path) -> tuple[str, int] | None:
    """``(host, port)`` of the service announced in ``directory/service.json`` if its process is
    alive; ``None`` when there is no such file or it is stale."""
    found = announced(directory)
    return None if found is None else (found.host, found.port)


def announced(directory: Path) -> Announced | None:
    """Host, port and scheme of the service announced in ``directory/service.json`` if its
    process is alive; ``None`` when there is no such file or it is stale; an
    :class:`~fleetlog.log.logdir.UntrustedError` when another user may write the directory or the file."""
    check_trusted(directory)
    check_trusted(directory / SERVICE_FILE, "the service's address file")
    try:
        info = json.loads((directory / SERVICE_FILE).read_text())
        pid, address, scheme = int(info["pid"]), str(info["http"]), str(info.get("scheme", "http"))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not process_alive(pid) or scheme not in ("http", "https"):
        return None
    host, _, port = address.rpartition(":")
    number = whole(port, 5)
    return Announced(host or "127.0.0.1", number, scheme) if number is not None else None
