"""The bearer token a client sends to the service (fleetlog.service.auth): ``FLEETLOG_TOKEN``, else
the first line of the file ``FLEETLOG_TOKEN_FILE`` names.  Every HTTP client of fleetlog (the
reads, ``top``, ``submit``, the producer's HTTP path, :mod:`fleetlog.reader`) asks here."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final

NEEDS_TOKEN: Final = "the service needs a token: set FLEETLOG_TOKEN (or FLEETLOG_TOKEN_FILE)"


class TokenError(Exception):
    """The token file cannot be read (one line)."""


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
