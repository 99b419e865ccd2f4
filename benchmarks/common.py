"""Shared helpers for benchmark entry points: argument parsing, medians, machine facts."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any


def parse(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description, allow_abbrev=False)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quick", action="store_true", help="a smaller run (well under a minute)")
    parser.add_argument("--repeats", type=int, default=5, help="repetitions; the median is reported")
    add_smoke(parser)
    return parser.parse_args()


def add_smoke(parser: argparse.ArgumentParser) -> None:
    """``--smoke``: the tiniest run that still takes every code path and prints every key, once
    (CI runs it so that no benchmark rots; its numbers measure nothing)."""
    parser.add_argument(
        "--smoke", action="store_true", help="tiniest run, 1 repeat: a test that it runs (not a measurement)"
    )


def machine() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
    }


def median_rate(work: Callable[[], int], repeats: int) -> float:
    """Run ``work`` (which returns how many items it processed) once to warm up, then ``repeats``
    times; the median items/s."""
    work()
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        n = work()
        rates.append(n / (time.perf_counter() - start))
    return statistics.median(rates)


def emit(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(result))
        return
    for key, value in result.items():
        shown = f"{value:,.0f}" if isinstance(value, float) and value > 100 else value
        print(f"{key:40} {shown}")
