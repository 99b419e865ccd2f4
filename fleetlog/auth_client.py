"""What a client presents to the service (fleetlog.service.auth): the bearer token
(``FLEETLOG_TOKEN``, else the first line of the file ``FLEETLOG_TOKEN_FILE`` names) and, for an
``https://`` service, the TLS context (:func:`tls_context`: ``FLEETLOG_CA_FILE`` to verify the
server, ``FLEETLOG_CLIENT_CERT_FILE`` and ``FLEETLOG_CLIENT_KEY_FILE`` for mutual TLS).  Every HTTP
client of fleetlog (the reads, ``top``, ``submit``, the producer's HTTP path,
:mod:`fleetlog.reader`) asks here."""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Final

NEEDS_TOKEN: Final = "the service needs a token: set FLEETLOG_TOKEN (or FLEETLOG_TOKEN_FILE)"


class TokenError(Exception):
    """The token file, or a TLS file, cannot be read (one line)."""


TLS_VARIABLES: Final = ("FLEETLOG_CA_FILE", "FLEETLOG_CLIENT_CERT_FILE", "FLEETLOG_CLIENT_KEY_FILE")


def token(env: Mapping[str, str] | None = None) -> str | None:
    """The token to send, or ``None`` (send none)."""
    env = os.environ if env is None else env
    given = env.get("FLEETLOG_TOKEN", "").strip()
    if given:
        return given
    path = env.get("FLEETLOG_TOKEN_FILE")
    if not path:
        return None
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise TokenError(f"FLEETLOG_TOKEN_FILE {path}: {exc.strerror or exc}") from None
    return lines[0].strip() if lines and lines[0].strip() else None


def auth_headers(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``{"Authorization": "Bearer …"}``, or ``{}`` when there is no token."""
    found = token(env)
    return {"Authorization": f"Bearer {found}"} if found else {}


def refused_why(status: int, message: str) -> str:
    """A 401's one line: what the service said and what to do (never the token)."""
    if status != 401:
        return message
    hint = NEEDS_TOKEN if token() is None else "the service refused FLEETLOG_TOKEN"
    return f"{hint} ({message})"


def tls_context(env: Mapping[str, str] | None = None) -> ssl.SSLContext | None:
    """The context for ``https://`` services: the CA of ``FLEETLOG_CA_FILE`` (else the system's)
    verifies the server, and ``FLEETLOG_CLIENT_CERT_FILE`` (with ``FLEETLOG_CLIENT_KEY_FILE``, or
    the key in the same file) is the client's certificate; ``None`` when none of them is set (the
    default verification).  A file that does not load is a :class:`TokenError` of one line."""
    env = os.environ if env is None else env
    ca, cert, key = (env.get(name, "").strip() or None for name in TLS_VARIABLES)
    if ca is None and cert is None and key is None:
        return None
    return _context(ca, cert, key)


def tls_for(url: str) -> ssl.SSLContext | None:
    """:func:`tls_context` for an ``https://`` ``url``; ``None`` for any other (plain HTTP)."""
    return tls_context() if url.lower().startswith("https://") else None


CLOSED: Final = ("EOF occurred", "without response", "Server disconnected", "Connection reset",
                  "connection reset")
"""How a connection closed at once reads (urllib, aiohttp, ssl)."""


def unreachable_why(url: str, why: object) -> str:
    """Why ``url`` could not be reached, with a hint when an ``https://`` service closed the
    connection at once: that is how it refuses a client certificate it does not accept (the TLS
    handshake fails and asyncio's server closes without sending the alert that would say why)."""
    text = str(why)
    if not url.lower().startswith("https://") or not any(c in text for c in CLOSED):
        return text
    given = os.environ.get("FLEETLOG_CLIENT_CERT_FILE", "").strip() or "none"
    return (f"{text} (the service closed the connection at the TLS handshake: it refuses a client "
            f"certificate its auth.client_ca_file did not sign or that expired; "
            f"FLEETLOG_CLIENT_CERT_FILE: {given})")


def _context(ca: str | None, cert: str | None, key: str | None) -> ssl.SSLContext:
    """Read afresh each time: a client certificate rotated on disk is presented from the next
    connection on."""
    if key is not None and cert is None:
        raise TokenError("FLEETLOG_CLIENT_KEY_FILE needs FLEETLOG_CLIENT_CERT_FILE (the certificate of "
                         "that key)")
    try:
        context = ssl.create_default_context(cafile=ca)
    except (OSError, ssl.SSLError) as exc:
        raise TokenError(f"FLEETLOG_CA_FILE {ca}: {_why(exc)}") from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert is not None:
        try:
            context.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as exc:
            files = cert if key is None else f"{cert} and FLEETLOG_CLIENT_KEY_FILE {key}"
            hint = "" if key is not None else "; its key: FLEETLOG_CLIENT_KEY_FILE (or in the same file)"
            raise TokenError(f"FLEETLOG_CLIENT_CERT_FILE {files}: {_why(exc)}{hint}") from None
    return context


def _why(exc: OSError) -> str:
    reason = getattr(exc, "reason", None) or exc.strerror or str(exc)
    return f"cannot be loaded ({reason})"
