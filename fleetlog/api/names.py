"""The API's closed sets and bounds, importable without the core (the CLI builds its parser
from them before any command runs)."""

from __future__ import annotations

from typing import Final

DEFAULT_LIMIT: Final = 1000
MAX_LIMIT: Final = 10_000
JOB_STATES: Final = (
    "pending", "placed", "running", "succeeded", "failed", "cancelled", "rejected", "returned",
)
"""A job's ``state`` as listed: ``placed`` until a backend saw every task start, then ``running``."""
NODE_STATUSES: Final = ("up", "down", "removed")
