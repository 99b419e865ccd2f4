"""Long fuzzing (issue 22): every target of ``tests/fuzzing.py`` — the envelope decoder, the
ingest body decoder, the config, tokens and policy parsers, and raw HTTP requests against a real
embedded service — for a time budget each (``--seconds``, default 120; ``--quick`` 15,
``--smoke`` 1).  Any exception but the documented errors, a 500, a server that stops answering
``/healthz`` or an error the server logs is a failure: hypothesis shrinks it, and it is printed
and counted.

JSON keys: ``targets`` (per target: ``examples``, ``seconds``, ``examples_per_s``, ``failure``),
and the totals ``examples`` and ``failures`` (target: 0).  The exit code is 1 when any failed.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.common import add_smoke, emit, machine
from tests.fuzzing import REQUESTS, TARGETS, ServerErrors, check_http, healthy
from tests.service.test_service import serving

ROUND = 200
"""Examples per hypothesis run; runs repeat until the budget is spent."""


def fuzz(check: Callable[[Any], None], inputs: st.SearchStrategy[Any], seconds: float) -> dict[str, Any]:
    """Run ``check`` over ``inputs`` for about ``seconds``: examples run, and the first failure."""
    count = [0]

    @settings(max_examples=ROUND, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(value=inputs)
    def run(value: Any) -> None:
        count[0] += 1
        check(value)

    started = time.perf_counter()
    failure = None
    while time.perf_counter() - started < seconds:
        try:
            run()
        except Exception as exc:  # (any: the failure is the measurement)
            failure = "".join(traceback.format_exception_only(exc)).strip()[-2000:]
            break
    took = time.perf_counter() - started
    return {"examples": count[0], "seconds": round(took, 2), "examples_per_s": round(count[0] / took, 1),
            "failure": failure}


async def fuzz_http(seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="fleetlog-fuzz-bench-") as tmp:
        async with serving(Path(tmp) / "log") as running:
            port = running.service.http.port
            with ServerErrors() as errors:
                found = await asyncio.to_thread(fuzz, lambda raw: check_http(port, raw), REQUESTS, seconds)
            if found["failure"] is None and not await asyncio.to_thread(healthy, port):
                found["failure"] = "the service stopped answering /healthz 200"
            if found["failure"] is None and errors.seen:
                found["failure"] = f"the server logged {len(errors.seen)} errors, first: {errors.seen[0]}"
    return found


def measure(seconds: float) -> dict[str, Any]:
    targets = {target.name: fuzz(target.check, target.inputs, seconds) for target in TARGETS}
    targets["http"] = asyncio.run(fuzz_http(seconds))
    return {"benchmark": "fuzz", "machine": machine(), "seconds_per_target": seconds, "targets": targets,
            "examples": sum(t["examples"] for t in targets.values()),
            "failures": sum(t["failure"] is not None for t in targets.values())}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fuzz", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quick", action="store_true", help="15 s a target")
    parser.add_argument("--seconds", type=float, default=120.0, help="the budget of each target")
    add_smoke(parser)
    args = parser.parse_args()
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr),
                        wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    result = measure(1.0 if args.smoke else 15.0 if args.quick else args.seconds)
    emit(result, args.json)
    sys.exit(1 if result["failures"] else 0)


if __name__ == "__main__":
    main()
