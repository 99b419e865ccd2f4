"""Types, constants and the two jit decorators every kernel module shares (their on-disk cache
is keyed on the whole package's source: ``cache.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import numba
import numpy as np
import numpy.typing as npt

from fleetlog.core.kernels.cache import package_cached

I16 = npt.NDArray[np.int16]
I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
# (cpu_free, mem_free, gpu_free, gpu_count, node_model)
NodeArrays = tuple[I64, I64, I16, I32, I32]
# (t_cpu, t_mem, t_gpus, t_milli, t_models)
TaskArrays = tuple[I64, I64, I32, I32, U64]
# (cpu, mem, gpus, milli, models) of one task
Task = tuple[int, int, int, int, np.uint64]
# (feasible, primary score, secondary score)
Eval = tuple[bool, int, int]

BEST_FIT = 0
FGD = 1

MAX_GPUS = 64  # GPUs per node (gpu_free row length)
MAX_MODELS = 64  # GPU model ids 0..63 (bits of a task's models mask)
FULL_GPU = 1000
NO_NODE = -1
NO_DOMAIN = -1

# best-fit score: gpu milli left * GPU_LEFT_UNIT + min(cpu left, CPU_TIEBREAK_CAP), so the cpu
# tie-break never outweighs one milli-GPU; CPU-only tasks pay GPU_NODE_PENALTY on GPU nodes
# that still have a free GPU share.
GPU_LEFT_UNIT = 1 << 30
CPU_TIEBREAK_CAP = GPU_LEFT_UNIT - 1
GPU_NODE_PENALTY = 1 << 46

# columns of the shapes matrix
SHAPE_GPUS = 0
SHAPE_MILLI = 1
SHAPE_CPU = 2
SHAPE_WEIGHT = 3

# columns of a gang's demand prefix sums (place_gang pruning)
DEMAND_CPU = 0
DEMAND_MEM = 1
DEMAND_MILLI = 2
DEMAND_WHOLE_GPUS = 3
DEMAND_WHOLE_TASKS = 4
DEMAND_COLUMNS = 5

# "no limit" for copy counts and score floors (place_gang pruning), far above any real value
UNBOUNDED = 1 << 62
NO_FLOOR = 1 << 62

# domain ids are bucketed directly (counting sort) when they are below this bound
DENSE_DOMAIN_FACTOR = 4
DENSE_DOMAIN_SLACK = 1024

_ZERO = np.uint64(0)
_ONE = np.uint64(1)
_NO_SHAPES = np.zeros((0, 4), dtype=np.int64)
# cpu above this much milli-CPU feeds any node's GPUs (keeps cpu * mean milli within int64)
CPU_FEED_CAP = 1 << 40

_F = TypeVar("_F", bound=Callable[..., Any])


def _jit(fn: _F) -> _F:
    """``numba.njit`` with the package-keyed on-disk cache (``cache.py``: plain ``cache=True``
    would load stale callers), keeping the Python signature for the type checker."""
    return cast(_F, package_cached(numba.njit(fn)))


def _hot(fn: _F) -> _F:
    """Like ``_jit``, inlined into its callers (numba IR): per-node helpers, so that constant
    arguments (the policy) fold away and no call is paid per node."""
    return cast(_F, package_cached(numba.njit(inline="always")(fn)))
