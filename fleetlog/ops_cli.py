"""``fleetlog top`` and ``fleetlog completion`` (to be built)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any


def add_ops_commands(
    sub: Any, usage_error: type[Exception], locate: Callable[[argparse.Namespace], Any],
    parser: Callable[[], argparse.ArgumentParser],
) -> None:
    """Register ``fleetlog top`` and ``fleetlog completion`` (not built yet: registers nothing)."""
