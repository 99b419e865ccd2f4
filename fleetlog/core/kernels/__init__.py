"""Placement kernels: which node (and which GPUs on it) a task or a gang goes to.

Everything here is ``numba.njit`` over the state's struct of arrays, integer arithmetic only,
no fastmath, no parallel reductions; equal scores always go to the lowest node index.
``fleetlog.core.kernels_ref`` holds the same functions in plain, readable Python; the two must
agree exactly (``tests/core/test_kernels.py`` checks it with hypothesis).

Node arrays (N nodes): ``cpu_free`` int64 (milli-CPU), ``mem_free`` int64 (MiB), ``gpu_free``
int16[N, 64] (free milli-share per GPU, 1000 = fully free; the first ``gpu_count[n]`` are
meaningful), ``gpu_count`` int32, ``node_model`` int32 (GPU model id 0..63, -1 for none).

A task is (cpu, mem, gpus, milli, models): ``milli`` is the per-GPU share (1000 = whole GPUs;
below 1000 only with ``gpus == 1``); ``models`` is a uint64 bitmask of allowed GPU models, 0 = any,
checked for every task (so that decide may pass node kinds in their place: ``fitting.node_kinds``).
``shapes`` is int64[K, 4] of rows (gpus, milli, cpu, weight): the recent task-shape mix used by FGD.
A first row (PUBLISHED_MARK, 0, 0, 0) selects the published FGD rule instead (Weng et al.,
ATC'23; ``frag._published_pick``): the other rows are then the typical pods, CPU-only ones
included, and its cpu column is the tie seed; the primary is 100 - the plugin's integer score,
the secondary the node's tie key (``frag._tie_key``: pseudo-random, from the node's index and
the seed, below 2**40), and a GPU share takes the GPU of the best score (``pick_gpus_scored``).
A first row (CPU_BOUND_MARK, 0, 0, 0) scores the other rows as CPU-bound: no starvation term at
their mean, each fractional row its own at its cpu per GPU milli (``frag._frag_pair``).

Scores are pairs ``(primary, secondary)`` of int64, lower is better, compared lexicographically
(then by node index). BEST_FIT: primary 0, secondary the best-fit score below. FGD: primary the
fragmentation increase ``F(after) - F(before)``, secondary the best-fit score. A gang's score is
the component-wise sum of its tasks' scores. Magnitudes: a secondary is below 2**47, so a sum of
up to 2**16 tasks cannot overflow; a primary is at most ``sum(weights) * 64000`` in absolute value,
so keep ``sum(weights)`` below 2**24 (normalise shape counts) for gangs of up to 2**16 tasks.

Preconditions (the state's invariants; results are unspecified otherwise): 0 <= gpu_free <= 1000,
0 <= gpu_count <= 64, node ids in ``cands`` are valid rows. ``pick_gpus`` also defines the
unusual shapes: ``gpus > 1`` with ``milli < 1000`` takes the ``gpus`` tightest GPUs with enough
free share.

place_gang is the plain procedure of its docstring (``kernels_ref.place_gang`` spells it out);
for speed it (1) ranks a domain's nodes once per run of equal tasks, scoring again only the
node just placed on (a node's score depends on its own state alone); (2) skips a domain when a
sound upper bound on the tasks it could host (free totals, or for equal tasks the sum of
per-node copy counts) can't beat the best result so far; (3) under BEST_FIT, for equal tasks,
skips a domain when T times a floor under any task's score there (a node's best-fit score only
falls as copies land on it) can't beat the best domain found. None of these changes a result.

best_node_memo is best_node for a caller that places many tasks in a row on one working copy
(decide): it keeps each node's evaluation of one task shape, stamped with the node's version,
and evaluates a node again only when the caller has bumped that version (the node's free
resources changed). Under FGD it first gives each stale node a cheap, sound floor under its
fragmentation increase (one pass over its GPUs, O(1) per call-wide table lookup) and scores in
full only the nodes whose floor could still beat the best so far, lowest floor first. The exact
increase itself takes one pass over the GPUs and O(1) per shape (``_frag_increase``). The
reference is plain best_node.

The package follows the sections of the kernels, each module importing only those before it:
``cache`` (numba's cache keyed on the package), ``base`` (types, constants, the jit decorators),
``gpus`` (GPUs of one node), ``frag``
(fragmentation, FGD), ``node`` (one node, one task), ``floor`` (a floor under the FGD increase,
``allocate``), ``summary`` (best fit with a node summary), ``memo`` (one node, one task,
remembered: ``best_node_memo``, ``place_run``), ``domains``, ``domain`` and ``gangs`` (a gang's
domains, one domain, all domains: ``place_gang``). This module re-exports every public name, so
``kernels.best_node`` and ``from fleetlog.core.kernels import best_node`` work as before
(``spread``, a gang spread one task a node over every domain, stands after the gangs); private
helpers are reached through their module (``kernels.floor._fgd_floor``). The plain twins stay one
module, ``fleetlog.core.kernels_ref`` (read as one definition, under the same section headings;
same public names and parameters).

Numba's ``cache=True`` keys each kernel on its own file only, while a kernel embeds the code of
the kernels it calls, so a caller's cache would outlive an edit of its callee's module.  The
kernels' decorators (``base._jit``, ``base._hot``) key it on the whole package's source instead
(``cache.py``): any change to a module of the package compiles every kernel afresh once.
"""

from __future__ import annotations

from fleetlog.core.kernels.base import (
    BEST_FIT,
    CPU_BOUND_MARK,
    CPU_FEED_CAP,
    CPU_TIEBREAK_CAP,
    DEMAND_COLUMNS,
    DEMAND_CPU,
    DEMAND_MEM,
    DEMAND_MILLI,
    DEMAND_WHOLE_GPUS,
    DEMAND_WHOLE_TASKS,
    DENSE_DOMAIN_FACTOR,
    DENSE_DOMAIN_SLACK,
    FGD,
    FULL_GPU,
    GPU_LEFT_UNIT,
    GPU_NODE_PENALTY,
    I16,
    I32,
    I64,
    MAX_GPUS,
    MAX_MODELS,
    NO_DOMAIN,
    NO_FLOOR,
    NO_NODE,
    PUBLISHED_LOGITS,
    PUBLISHED_MARK,
    PUBLISHED_MAX_SCORE,
    SHAPE_CPU,
    SHAPE_GPUS,
    SHAPE_MILLI,
    SHAPE_WEIGHT,
    U64,
    UNBOUNDED,
    Eval,
    NodeArrays,
    Task,
    TaskArrays,
)
from fleetlog.core.kernels.domains import (
    FROM_DIRTY,
    FROM_NONE,
    FROM_TOP,
    RANK_COLUMNS,
    RANK_FLAG,
    RANK_LOCAL,
    RANK_PRIMARY,
    RANK_SECONDARY,
    W_DIRTY,
    W_META,
    W_RUN_MASK,
    W_RUN_NODE,
    W_SLOT_CPU,
    W_SLOT_GPU,
    W_SLOT_MEM,
    W_SLOT_NODE,
    W_SLOT_OF,
    W_TOP,
    Slots,
    Work,
)
from fleetlog.core.kernels.floor import (
    FLOOR_CPU,
    FLOOR_MEAN_CPU,
    FLOOR_MEAN_MILLI,
    FLOOR_OTHER,
    FLOOR_ROW_STARVED,
    FLOOR_SHARE_OVER,
    FLOOR_SOUND,
    FLOOR_WEIGHTS,
    FLOOR_WHOLE,
    FLOOR_WHOLE_OVER,
    NO_FLOOR_VALUE,
    allocate,
    floor_table,
)
from fleetlog.core.kernels.frag import (
    fragmentation,
)
from fleetlog.core.kernels.gangs import (
    place_gang,
    place_gang_memo,
)
from fleetlog.core.kernels.gpus import (
    pick_gpus,
)
from fleetlog.core.kernels.memo import (
    MEMO_COLUMNS,
    MEMO_FITS,
    MEMO_FLOOR,
    MEMO_PRIMARY,
    MEMO_SECONDARY,
    MEMO_VERSION,
    RUN_COLUMNS,
    RUN_SKIP,
    RUN_SLOT,
    best_node_memo,
    place_run,
    row_totals,
    versions_after,
)
from fleetlog.core.kernels.node import (
    best_node,
    fits,
    node_score,
    pick_gpus_scored,
    preferred_node,
)
from fleetlog.core.kernels.spread import (
    place_spread,
)
from fleetlog.core.kernels.summary import (
    best_node_summary,
    most_free,
)

__all__ = [
    "BEST_FIT",
    "CPU_BOUND_MARK",
    "CPU_FEED_CAP",
    "CPU_TIEBREAK_CAP",
    "DEMAND_COLUMNS",
    "DEMAND_CPU",
    "DEMAND_MEM",
    "DEMAND_MILLI",
    "DEMAND_WHOLE_GPUS",
    "DEMAND_WHOLE_TASKS",
    "DENSE_DOMAIN_FACTOR",
    "DENSE_DOMAIN_SLACK",
    "FGD",
    "FLOOR_CPU",
    "FLOOR_MEAN_CPU",
    "FLOOR_MEAN_MILLI",
    "FLOOR_OTHER",
    "FLOOR_ROW_STARVED",
    "FLOOR_SHARE_OVER",
    "FLOOR_SOUND",
    "FLOOR_WEIGHTS",
    "FLOOR_WHOLE",
    "FLOOR_WHOLE_OVER",
    "FROM_DIRTY",
    "FROM_NONE",
    "FROM_TOP",
    "FULL_GPU",
    "GPU_LEFT_UNIT",
    "GPU_NODE_PENALTY",
    "I16",
    "I32",
    "I64",
    "MAX_GPUS",
    "MAX_MODELS",
    "MEMO_COLUMNS",
    "MEMO_FITS",
    "MEMO_FLOOR",
    "MEMO_PRIMARY",
    "MEMO_SECONDARY",
    "MEMO_VERSION",
    "NO_DOMAIN",
    "NO_FLOOR",
    "NO_FLOOR_VALUE",
    "NO_NODE",
    "PUBLISHED_LOGITS",
    "PUBLISHED_MARK",
    "PUBLISHED_MAX_SCORE",
    "RANK_COLUMNS",
    "RANK_FLAG",
    "RANK_LOCAL",
    "RANK_PRIMARY",
    "RANK_SECONDARY",
    "RUN_COLUMNS",
    "RUN_SKIP",
    "RUN_SLOT",
    "SHAPE_CPU",
    "SHAPE_GPUS",
    "SHAPE_MILLI",
    "SHAPE_WEIGHT",
    "U64",
    "UNBOUNDED",
    "W_DIRTY",
    "W_META",
    "W_RUN_MASK",
    "W_RUN_NODE",
    "W_SLOT_CPU",
    "W_SLOT_GPU",
    "W_SLOT_MEM",
    "W_SLOT_NODE",
    "W_SLOT_OF",
    "W_TOP",
    "Eval",
    "NodeArrays",
    "Slots",
    "Task",
    "TaskArrays",
    "Work",
    "allocate",
    "best_node",
    "best_node_memo",
    "best_node_summary",
    "fits",
    "floor_table",
    "fragmentation",
    "most_free",
    "node_score",
    "pick_gpus",
    "pick_gpus_scored",
    "place_gang",
    "place_gang_memo",
    "place_run",
    "place_spread",
    "preferred_node",
    "row_totals",
    "versions_after",
]
