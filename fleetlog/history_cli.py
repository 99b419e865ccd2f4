"""``fleetlog history``: accounting of finished jobs, from the logs (to be built)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any


def add_history_command(
    sub: Any, usage_error: type[Exception], locate: Callable[[argparse.Namespace], Any]
) -> None:
    """Register ``fleetlog history`` (not built yet: registers nothing)."""
