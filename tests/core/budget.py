"""How much generated input the property tests of tests/core run.

Compiled (the main run), all of it: that is where each fast twin is checked against its plain
twin.  With ``NUMBA_DISABLE_JIT=1`` (scripts/test runs tests/core a second time so, the kernels
as plain Python) a third of it: that run checks that the kernel source means the same as Python
(overflow, indexing, dtypes), which the first examples of each property already reach, and it is
the one CPU-bound session of the whole suite on a two-core machine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from numba.core import config

T = TypeVar("T")
PLAIN = bool(config.DISABLE_JIT)


def examples(n: int) -> int:
    """Hypothesis's ``max_examples`` for a property that runs ``n`` compiled."""
    return max(20, n // 3) if PLAIN else n


def seeds(chosen: Sequence[T]) -> list[T]:
    """The seeds of a parametrized test: all compiled, the first third (at least one) plain."""
    return list(chosen[: max(1, len(chosen) // 3)]) if PLAIN else list(chosen)
