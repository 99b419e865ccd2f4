"""A job's tasks as the kernels take them, and topology level names."""

from __future__ import annotations

from typing import Final

import numpy as np

from fleetlog.core.arrays import Array
from fleetlog.core.state import State

LEVELS: Final = {1: "block", 2: "rack", 3: "host"}


def task_arrays(state: State, job: int) -> tuple[Array, ...]:
    """The job's task rows, largest first, with their shape columns."""
    rows = state.job_tasks(job)
    tc = state.tasks.cols
    sl = slice(rows.start, rows.stop)
    if len(rows) == 1:
        idx = np.arange(rows.start, rows.stop, dtype=np.int64)
    else:
        order = np.lexsort((np.arange(len(rows)), -tc["cpu"][sl], -(tc["gpus"][sl] * tc["milli"][sl])))
        idx = np.arange(rows.start, rows.stop, dtype=np.int64)[order]
    return idx, tc["cpu"][idx], tc["mem"][idx], tc["gpus"][idx], tc["milli"][idx], tc["models"][idx]
