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

# The published FGD rule (Weng et al., ATC'23; the authors' simulator, fgd_score.go): a node's
# score is int64(100 * sigmoid(x)) with x = (F before - F after) / 1000, F over the typical pods'
# shares. score >= s iff x >= ln(s / (100 - s)), i.e. iff the weighted increase D (weights W)
# satisfies D <= 1000 * W * ln((100 - s) / s); these are ln((100 - s) / s) for s = 1..99, as
# float literals (the only floats of a score: one IEEE product and a comparison, the same on
# every machine).
PUBLISHED_MARK = -1
"""SHAPE_GPUS of the first row of a shape matrix that selects the published FGD rule."""
CPU_BOUND_MARK = -2
"""SHAPE_GPUS of the first row (weight 0) of a shape matrix scored as CPU-bound: no starvation
term at the rows' mean; each fractional row (milli below a whole GPU) adds its weight times the
free GPU milli the node's cpu cannot feed at that row's own cpu per GPU milli (issue 23,
docs/scheduling.md "When CPU runs out first")."""
PUBLISHED_LOGITS = np.array(
    [
        4.59511985013459, 3.8918202981106265, 3.4760986898352733, 3.1780538303479458, 2.9444389791664403,
        2.751535313041949, 2.586689344097943, 2.4423470353692043, 2.3136349291806306, 2.1972245773362196,
        2.0907410969337694, 1.992430164690206, 1.900958761193047, 1.8152899666382492, 1.7346010553881064,
        1.6582280766035324, 1.5856272637403819, 1.5163474893680884, 1.4500101755059984,
        1.3862943611198906, 1.3249254147435985, 1.2656663733312759, 1.2083112059245342,
        1.1526795099383853, 1.0986122886681098, 1.0459685551826878, 0.994622575144062,
        0.9444616088408515, 0.8953840470548413, 0.8472978603872037, 0.8001193001121131,
        0.7537718023763802, 0.7081850579244858, 0.6632942174102642, 0.6190392084062235,
        0.5753641449035618, 0.5322168137473082, 0.4895482253187058, 0.44731221804366483,
        0.4054651081081644, 0.3639653772014116, 0.322773392263051, 0.28185115214098766,
        0.24116205681688804, 0.20067069546215124, 0.16034265007517948, 0.12014431184206321,
        0.08004270767353636, 0.040005334613699206, 0.0, -0.04000533461369913, -0.08004270767353637,
        -0.12014431184206321, -0.16034265007517937, -0.2006706954621511, -0.2411620568168881,
        -0.2818511521409877, -0.322773392263051, -0.3639653772014116, -0.40546510810816444,
        -0.4473122180436648, -0.4895482253187058, -0.5322168137473082, -0.5753641449035618,
        -0.6190392084062235, -0.6632942174102642, -0.7081850579244858, -0.7537718023763802,
        -0.8001193001121132, -0.8472978603872037, -0.8953840470548413, -0.9444616088408514,
        -0.9946225751440622, -1.0459685551826876, -1.0986122886681098, -1.1526795099383855,
        -1.2083112059245342, -1.2656663733312759, -1.3249254147435987, -1.3862943611198906,
        -1.4500101755059984, -1.5163474893680884, -1.5856272637403819, -1.6582280766035324,
        -1.7346010553881064, -1.8152899666382492, -1.900958761193047, -1.9924301646902063,
        -2.0907410969337694, -2.1972245773362196, -2.3136349291806306, -2.4423470353692043,
        -2.5866893440979424, -2.751535313041949, -2.9444389791664407, -3.1780538303479458,
        -3.4760986898352733, -3.891820298110627, -4.59511985013459,
    ],
    dtype=np.float64,
)
PUBLISHED_MAX_SCORE = 100  # the framework's MaxNodeScore: a published primary is 100 - score

_F = TypeVar("_F", bound=Callable[..., Any])


def _jit(fn: _F) -> _F:
    """``numba.njit`` with the package-keyed on-disk cache (``cache.py``: plain ``cache=True``
    would load stale callers), keeping the Python signature for the type checker."""
    return cast(_F, package_cached(numba.njit(fn)))


def _hot(fn: _F) -> _F:
    """Like ``_jit``, inlined into its callers (numba IR): per-node helpers, so that constant
    arguments (the policy) fold away and no call is paid per node."""
    return cast(_F, package_cached(numba.njit(inline="always")(fn)))
