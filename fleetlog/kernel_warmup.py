"""Compile (or load from numba's cache) the scheduling kernels before a command's timed work.

The first run on a machine compiles every kernel, which takes a minute or two; a progress bar
stuck at "0/? jobs" meanwhile looks like a hang, and the compile would count in the decisions/s
a run reports.  :func:`warm_kernels` does it up front, says ``compiling kernels (first run
only)`` on stderr the moment numba starts a real compile (never when the cache serves them),
and returns the seconds it took, which callers report apart from the run's own wall time.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Final, TextIO

from numba.core import event

COMPILE_EVENT: Final = "numba:compile"
NOTICE: Final = "fleetlog: compiling kernels (first run only; up to two minutes) ..."


class CompileCounter:
    """How many compiles numba has started (read by another thread: ``fleetlog run``'s health)."""

    def __init__(self) -> None:
        self.compiles = 0


class _Notice(event.Listener):
    """Writes the notice once, at the start of the first compile numba reports."""

    def __init__(self, stream: TextIO, counter: CompileCounter) -> None:
        self.stream = stream
        self.counter = counter

    @property
    def compiles(self) -> int:
        return self.counter.compiles

    def on_start(self, ev: object) -> None:
        self.counter.compiles += 1
        if self.counter.compiles == 1:
            print(NOTICE, file=self.stream, flush=True)

    def on_end(self, ev: object) -> None:
        """Nothing to do when a compile ends."""


def warm_kernels(warm_up: Callable[[], None], stream: TextIO | None = None,
                 counter: CompileCounter | None = None) -> tuple[float, int]:
    """Run ``warm_up`` (which exercises every hot kernel), noticing compiles on ``stream``
    (default stderr) and counting them in ``counter`` as they start.  Returns (seconds taken,
    kernels numba compiled: 0 when all were cached)."""
    notice = _Notice(stream if stream is not None else sys.stderr, counter or CompileCounter())
    started = time.perf_counter()
    with event.install_listener(COMPILE_EVENT, notice):
        warm_up()
    return time.perf_counter() - started, notice.compiles
