"""The placement kernels in plain Python: the readable definition the ``kernels`` package
must match.

Same functions, same arguments, same results as ``fleetlog.core.kernels`` (see its docstring
for the data layout and the score format), written for clarity, not speed: no caching, no
pruning, full copies of the state per domain.  One module, in the sections of the package's
modules (``gpus``, ``frag``, ``node``, ``floor``, ``summary``, ``memo``, then the gang modules),
so that a kernel's twin is found under the same heading; ``tests/core/test_kernels.py`` checks
every public kernel has one, with the same parameters, and that the two agree.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from fleetlog.core.kernels import (
    BEST_FIT,
    CPU_BOUND_MARK,
    CPU_FEED_CAP,
    CPU_TIEBREAK_CAP,
    FGD,
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
    FULL_GPU,
    GPU_LEFT_UNIT,
    GPU_NODE_PENALTY,
    I16,
    I32,
    I64,
    MAX_GPUS,
    MEMO_COLUMNS,
    NO_DOMAIN,
    NO_NODE,
    PUBLISHED_LOGITS,
    PUBLISHED_MARK,
    PUBLISHED_MAX_SCORE,
    RUN_COLUMNS,
    RUN_SKIP,
    RUN_SLOT,
    U64,
)

__all__ = [
    "BEST_FIT",
    "FGD",
    "MEMO_COLUMNS",
    "RUN_COLUMNS",
    "RUN_SKIP",
    "RUN_SLOT",
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

Score = tuple[int, int]


# ---------------------------------------------------------------- GPUs of one node


def _frees(row: I16, count: int) -> list[int]:
    return [int(row[i]) for i in range(int(count))]


def _pick(frees: list[int], gpus: int, milli: int) -> int:
    """``pick_gpus`` over a list of free shares."""
    if gpus <= 0 or gpus > len(frees):
        return 0
    if milli == FULL_GPU:
        chosen = [i for i, free in enumerate(frees) if free == FULL_GPU][:gpus]
    else:
        tightest_first = sorted((free, i) for i, free in enumerate(frees) if free >= milli)
        chosen = [i for _, i in tightest_first[:gpus]]
    if len(chosen) < gpus:
        return 0
    return sum(1 << i for i in chosen)


def pick_gpus(gpu_free_row: I16, count: int, gpus: int, milli: int) -> np.uint64:
    """Bitmask of the GPUs the task takes (0: does not fit, or a CPU-only task)."""
    return np.uint64(_pick(_frees(gpu_free_row, count), int(gpus), int(milli)))


def _model_ok(models: int, model: int) -> bool:
    return bool(models == 0 or (model >= 0 and (models >> model) & 1 == 1))


# ---------------------------------------------------------------- fragmentation (FGD)


def _shape_frag(frees: list[int], cpu_avail: int, gpus: int, milli: int, cpu: int) -> int:
    """Free GPU milli on the node that a task of this (GPU) shape could not use."""
    shape_fits = cpu <= cpu_avail and _pick(frees, gpus, milli) != 0
    if not shape_fits:
        return sum(frees)
    if milli == FULL_GPU:
        return sum(free for free in frees if 0 < free < FULL_GPU)
    return sum(free for free in frees if free < milli)


def _unfed(frees: list[int], cpu_avail: int, cpu: int, milli: int) -> int:
    """Free GPU milli the node's cpu cannot feed at ``cpu`` per ``milli`` GPU milli."""
    if cpu <= 0:
        return 0
    fed = min(cpu_avail, CPU_FEED_CAP) * milli // cpu
    return max(0, sum(frees) - fed)


def _starved(frees: list[int], cpu_avail: int, gpu_shapes: list[list[int]]) -> int:
    """Free GPU milli the node's cpu cannot feed at the GPU shapes' mean cpu per mean GPU milli."""
    weights = sum(weight for _, _, _, weight in gpu_shapes)
    mean_cpu = sum(weight * cpu for _, _, cpu, weight in gpu_shapes) // weights
    mean_milli = sum(weight * gpus * milli for gpus, milli, _, weight in gpu_shapes) // weights
    return _unfed(frees, cpu_avail, mean_cpu, mean_milli)


def _is_cpu_bound(shapes: I64) -> bool:
    return shapes.shape[0] > 0 and int(shapes[0, 0]) == CPU_BOUND_MARK


def _node_frag(frees: list[int], cpu_avail: int, shapes: I64) -> int:
    """F(node) = sum over GPU shapes of weight * frag, plus their total weight times the GPU
    milli the node's cpu cannot feed. CPU-only shapes do not count (see ``kernels.frag._frag_pair``).
    CPU-bound (a first row ``CPU_BOUND_MARK``): instead of that last term, each fractional
    shape's weight times the milli the cpu cannot feed at that shape's own cpu per GPU milli."""
    gpu_shapes: list[list[int]] = [row for row in shapes.tolist() if row[3] != 0 and row[0] > 0]
    if not gpu_shapes:
        return 0
    total = sum(
        weight * _shape_frag(frees, cpu_avail, gpus, milli, cpu) for gpus, milli, cpu, weight in gpu_shapes
    )
    if _is_cpu_bound(shapes):
        fractional = [(g, m, c, w) for g, m, c, w in gpu_shapes if m != FULL_GPU]
        return int(total + sum(w * _unfed(frees, cpu_avail, c, g * m) for g, m, c, w in fractional))
    weights = sum(row[3] for row in gpu_shapes)
    return int(total + weights * _starved(frees, cpu_avail, gpu_shapes))


def fragmentation(cands: I64, cpu_free: I64, gpu_free: I16, gpu_count: I32, shapes: I64) -> int:
    return sum(
        _node_frag(_frees(gpu_free[n], gpu_count[n]), int(cpu_free[n]), shapes) for n in cands.tolist()
    )


def _uses_fgd(policy: int, shapes: I64) -> bool:
    return policy == FGD and shapes.shape[0] > 0 and int(shapes[:, 3].sum()) > 0


# ---------------------------------------------------------------- the published FGD rule (ATC'23)


def _is_published(shapes: I64) -> bool:
    return shapes.shape[0] > 0 and int(shapes[0, 0]) == PUBLISHED_MARK


def _typical_frag(frees: list[int], cpu_avail: int, gpus: int, milli: int, cpu: int) -> int:
    """A typical pod's fragment (utils/frag.go): the free milli of the GPUs it cannot use when
    it fits (cpu, and ``gpus`` GPUs with ``milli`` free), else all free milli; a CPU-only pod's
    is all free milli (its categories XL and XR both count)."""
    fits_here = milli > 0 and gpus > 0 and cpu <= cpu_avail and sum(f >= milli for f in frees) >= gpus
    return sum(f for f in frees if f < milli) if fits_here else sum(frees)


def _typical_f(frees: list[int], cpu_avail: int, shapes: I64) -> int:
    """F of the node: sum over the typical pods (the rows after the marker) of weight * fragment."""
    rows = shapes.tolist()[1:]
    return sum(w * _typical_frag(frees, cpu_avail, g, m, c) for g, m, c, w in rows if w != 0)


def _sigmoid_score(increase: int, weights: int) -> int:
    """The plugin's int64(100 * sigmoid((F before - F after) / 1000)), F in shares of the typical
    pods: the most s with increase <= 1000 * weights * ln((100 - s) / s) (see ``PUBLISHED_LOGITS``)."""
    scale = 1000.0 * weights
    passed = [s for s in range(1, PUBLISHED_MAX_SCORE) if increase <= scale * PUBLISHED_LOGITS[s - 1]]
    return max(passed, default=0)


def _published(
    frees: list[int], cpu_avail: int, cpu: int, gpus: int, milli: int, shapes: I64
) -> tuple[int, int]:
    """(100 - the published score, GPU mask) of a task that fits: a GPU share on each GPU with
    room in turn, the first of the best score; any other task on ``_pick``'s GPUs."""
    weights = int(shapes[:, 3].sum())
    before = _typical_f(frees, cpu_avail, shapes)

    def score(mask: int) -> int:
        after = [f - milli if mask >> i & 1 else f for i, f in enumerate(frees)]
        return _sigmoid_score(_typical_f(after, cpu_avail - cpu, shapes) - before, weights)

    if gpus == 1 and 0 < milli < FULL_GPU:
        options = [(-score(1 << i), i) for i, f in enumerate(frees) if f >= milli]
        best, i = min(options)
        return PUBLISHED_MAX_SCORE + best, 1 << i
    mask = _pick(frees, gpus, milli)
    return PUBLISHED_MAX_SCORE - score(mask), mask


def _tie_key(node: int, seed: int) -> int:
    """splitmix64 of the node's index and the tie seed, its top 40 bits."""
    mask = (1 << 64) - 1
    x = ((node + 1) * 0x9E3779B97F4A7C15 + seed * 0xBF58476D1CE4E5B9) & mask
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
    return (x ^ (x >> 31)) >> 24


def pick_gpus_scored(
    gpu_free_row: I16, count: int, gpus: int, milli: int, cpu_avail: int, cpu: int, policy: int, shapes: I64
) -> np.uint64:
    """``pick_gpus``, but under the published FGD rule a GPU share goes where ``_published`` says."""
    frees = _frees(gpu_free_row, count)
    share = int(gpus) == 1 and 0 < int(milli) < FULL_GPU and any(f >= int(milli) for f in frees)
    if share and _uses_fgd(policy, shapes) and _is_published(shapes):
        return np.uint64(_published(frees, int(cpu_avail), int(cpu), 1, int(milli), shapes)[1])
    return pick_gpus(gpu_free_row, count, gpus, milli)


# ---------------------------------------------------------------- one node, one task


def fits(
    n: int,
    cpu_free: I64,
    mem_free: I64,
    gpu_free: I16,
    gpu_count: I32,
    node_model: I32,
    cpu: int,
    mem: int,
    gpus: int,
    milli: int,
    models: np.uint64,
) -> bool:
    if int(cpu_free[n]) < int(cpu) or int(mem_free[n]) < int(mem):
        return False
    if not _model_ok(int(models), int(node_model[n])):  # (every task: decide's node kinds)
        return False
    if int(gpus) == 0:
        return True
    return bool(pick_gpus(gpu_free[n], int(gpu_count[n]), int(gpus), int(milli)) != 0)


def _best_fit(frees: list[int], cpu_left: int, gpus: int, milli: int) -> int:
    cpu_term = min(cpu_left, CPU_TIEBREAK_CAP)
    if gpus > 0:
        gpu_left = sum(frees) - gpus * milli
        return gpu_left * GPU_LEFT_UNIT + cpu_term
    has_free_gpu = len(frees) > 0 and sum(frees) > 0
    return (GPU_NODE_PENALTY if has_free_gpu else 0) + cpu_term


def node_score(
    n: int,
    cpu_free: I64,
    gpu_free: I16,
    gpu_count: I32,
    cpu: int,
    gpus: int,
    milli: int,
    policy: int,
    shapes: I64,
) -> Score:
    """(primary, secondary): BEST_FIT is (0, best fit); FGD is (F(after) - F(before), best fit)."""
    cpu, gpus, milli = int(cpu), int(gpus), int(milli)
    before = _frees(gpu_free[n], gpu_count[n])
    cpu_avail = int(cpu_free[n])
    secondary = _best_fit(before, cpu_avail - cpu, gpus, milli)
    if not _uses_fgd(policy, shapes):
        return 0, secondary
    if _is_published(shapes):
        primary = _published(before, cpu_avail, cpu, gpus, milli, shapes)[0]
        return primary, _tie_key(int(n), int(shapes[0, 2]))
    mask = _pick(before, gpus, milli)
    after = [free - milli if mask >> i & 1 else free for i, free in enumerate(before)]
    increase = _node_frag(after, cpu_avail - cpu, shapes) - _node_frag(before, cpu_avail, shapes)
    return increase, secondary


def best_node(
    cands: I64,
    cpu_free: I64,
    mem_free: I64,
    gpu_free: I16,
    gpu_count: I32,
    node_model: I32,
    cpu: int,
    mem: int,
    gpus: int,
    milli: int,
    models: np.uint64,
    policy: int,
    shapes: I64,
) -> int:
    """The feasible candidate with the lowest (primary, secondary, node index), or -1."""
    ranked = []
    for n in cands.tolist():
        if fits(n, cpu_free, mem_free, gpu_free, gpu_count, node_model, cpu, mem, gpus, milli, models):
            score = node_score(n, cpu_free, gpu_free, gpu_count, cpu, gpus, milli, policy, shapes)
            ranked.append((*score, n))
    return min(ranked)[2] if ranked else NO_NODE


def preferred_node(
    cands: I64,
    weights: I64,
    node: int,
    cpu_free: I64,
    mem_free: I64,
    gpu_free: I16,
    gpu_count: I32,
    node_model: I32,
    cpu: int,
    mem: int,
    gpus: int,
    milli: int,
    models: np.uint64,
    policy: int,
    shapes: I64,
) -> int:
    """Of the feasible candidates (and ``node``) scoring as ``node`` does, the one with the
    highest weight, then the lowest index; -1 when ``node`` is."""
    if node < 0:
        return node
    free = (cpu_free, mem_free, gpu_free, gpu_count, node_model)
    want = node_score(node, cpu_free, gpu_free, gpu_count, cpu, gpus, milli, policy, shapes)
    tied = [
        (-int(weights[n]), n)
        for n in {*cands.tolist(), node}
        if fits(n, *free, cpu, mem, gpus, milli, models)
        and node_score(n, cpu_free, gpu_free, gpu_count, cpu, gpus, milli, policy, shapes) == want
    ]
    return min(tied, default=(0, node))[1]


# ---------------------------------------------------------------- a floor under the FGD increase


def floor_table(shapes: I64) -> I64:
    """What the FGD floor needs of the shape mix, laid out as ``kernels.floor`` says: over the
    GPU shapes (weight != 0, gpus > 0), for each f the weight of one-GPU shares of more than f
    milli, for each g the weight of whole-GPU shapes of more than g GPUs, the weight of the
    others, of the whole ones and of all, their mean cpu and milli (0 when CPU-bound), whether
    no weight is negative, the weight of the fractional ones when CPU-bound, then their (cpu,
    weight) pairs by descending cpu (in mix order on ties)."""
    gpu_shapes = [(g, m, c, w) for g, m, c, w in shapes.tolist() if w != 0 and g > 0]
    whole = [(g, w) for g, m, _, w in gpu_shapes if m == FULL_GPU]
    shares = [(m, w) for g, m, _, w in gpu_shapes if m != FULL_GPU and g == 1 and 0 < m < FULL_GPU]
    weights = sum(w for *_, w in gpu_shapes)
    table = [0] * FLOOR_CPU
    for f in range(FULL_GPU + 1):
        table[FLOOR_SHARE_OVER + f] = sum(w for m, w in shares if m > f)
    for g in range(MAX_GPUS + 1):
        table[FLOOR_WHOLE_OVER + g] = sum(w for k, w in whole if k > g)
    table[FLOOR_WHOLE] = sum(w for _, w in whole)
    table[FLOOR_OTHER] = weights - table[FLOOR_WHOLE] - sum(w for _, w in shares)
    table[FLOOR_WEIGHTS] = weights
    if _is_cpu_bound(shapes):  # (no starved term at the mean: each fractional shape's own)
        table[FLOOR_ROW_STARVED] = sum(w for _, m, _, w in gpu_shapes if m != FULL_GPU)
    elif weights > 0:
        table[FLOOR_MEAN_CPU] = sum(w * c for _, _, c, w in gpu_shapes) // weights
        table[FLOOR_MEAN_MILLI] = sum(w * g * m for g, m, _, w in gpu_shapes) // weights
    published = any(g == PUBLISHED_MARK for g, *_ in shapes.tolist())  # (no floor under its score)
    table[FLOOR_SOUND] = int(all(w >= 0 for *_, w in gpu_shapes) and not published)
    by_cpu = sorted(((c, w) for _, _, c, w in gpu_shapes), key=lambda pair: -pair[0])
    return np.array(table + [x for pair in by_cpu for x in pair], dtype=np.int64)


def allocate(
    n: int,
    mask: np.uint64,
    cpu: int,
    mem: int,
    milli: int,
    cpu_free: I64,
    mem_free: I64,
    gpu_free: I16,
    sign: int,
) -> None:
    cpu_free[n] += sign * int(cpu)
    mem_free[n] += sign * int(mem)
    for i in range(MAX_GPUS):
        if int(mask) >> i & 1:
            gpu_free[n, i] += sign * int(milli)


# ---------------------------------------------------------------- best-fit with a node summary


def best_node_summary(
    cands: I64,
    gpu_total: I64,
    cpu_free: I64,
    mem_free: I64,
    gpu_free: I16,
    gpu_count: I32,
    node_model: I32,
    cpu: int,
    mem: int,
    gpus: int,
    milli: int,
    models: np.uint64,
) -> int:
    """Reference: the summary only prunes, so the answer is plain best-fit ``best_node``."""
    return best_node(
        cands,
        cpu_free,
        mem_free,
        gpu_free,
        gpu_count,
        node_model,
        cpu,
        mem,
        gpus,
        milli,
        models,
        BEST_FIT,
        np.zeros((0, 4), dtype=np.int64),
    )


def most_free(nodes: I64, cpu_free: I64, mem_free: I64, gpu_free: I16) -> tuple[int, int, int, int]:
    """Over ``nodes`` (0 for each when there is none): the most fully free GPUs on one node, the
    most free share on one GPU, the most free CPU and the most free memory, each at least 0."""
    rows = [gpu_free[n].tolist() for n in nodes.tolist()]
    return (
        max([0] + [row.count(FULL_GPU) for row in rows]),
        max([0] + [free for row in rows for free in row]),
        max([0] + [int(cpu_free[n]) for n in nodes.tolist()]),
        max([0] + [int(mem_free[n]) for n in nodes.tolist()]),
    )


# ---------------------------------------------------------------- one node, one task, remembered


def best_node_memo(
    cands: I64,
    cpu_free: I64,
    mem_free: I64,
    gpu_free: I16,
    gpu_count: I32,
    node_model: I32,
    cpu: int,
    mem: int,
    gpus: int,
    milli: int,
    models: np.uint64,
    policy: int,
    shapes: I64,
    node_version: I64,
    memo: I64,
) -> int:
    """``best_node``: the memo only saves work (the kernel re-evaluates a node whose version
    changed), so the reference ignores it."""
    del node_version, memo
    free = (cpu_free, mem_free, gpu_free, gpu_count, node_model)
    return best_node(cands, *free, cpu, mem, gpus, milli, models, policy, shapes)


def row_totals(gpu_free: I16) -> I64:
    """Each node's free GPU milli in all: the plain sum of its row."""
    return np.array([sum(int(free) for free in row) for row in gpu_free], dtype=np.int64)


def versions_after(
    version: I64,
    cpu_was: I64,
    cpu: I64,
    mem_was: I64,
    mem: I64,
    gpu_was: I16,
    gpu: I16,
    count_was: I32,
    count: I32,
    model_was: I32,
    model: I32,
) -> I64:
    """Each node's version, plus one if anything of its free capacity, GPU count or model changed."""
    before = zip(cpu_was, mem_was, gpu_was.tolist(), count_was, model_was, strict=True)
    after = zip(cpu, mem, gpu.tolist(), count, model, strict=True)
    changed = [int(was != now) for was, now in zip(before, after, strict=True)]
    return np.array([int(v) + c for v, c in zip(version, changed, strict=True)], dtype=np.int64)


def place_run(
    cands: I64,
    cpu_free: I64,
    mem_free: I64,
    gpu_free: I16,
    gpu_total: I64,
    gpu_count: I32,
    node_model: I32,
    policy: int,
    shapes: I64,
    table: I64,
    node_version: I64,
    memos: I64,
    tasks: I64,
    out: I64,
    stale: I64,
) -> int:
    """One-task jobs in order, each on ``best_node``'s node with ``pick_gpus``'s GPUs, taking
    their resources (and bumping the node's version) as it goes; stops at the first job marked
    to skip or that fits nowhere and returns how many it placed, their (node, mask) in ``out``.
    The floor table, the memos and the work buffer only save work: the reference ignores them."""
    del table, memos, stale
    free = (cpu_free, mem_free, gpu_free, gpu_count, node_model)
    for j, row in enumerate(tasks.tolist()):
        cpu, mem, gpus, milli, models = row[:5]
        if row[RUN_SKIP] != 0:
            return j
        models_mask = np.uint64(models % (1 << 64))  # (the int64 column holds the uint64's bits)
        n = best_node(cands, *free, cpu, mem, gpus, milli, models_mask, policy, shapes)
        if n == NO_NODE:
            return j
        cpu_avail = int(cpu_free[n])
        mask = pick_gpus_scored(gpu_free[n], int(gpu_count[n]), gpus, milli, cpu_avail, cpu, policy, shapes)
        allocate(n, mask, cpu, mem, milli, cpu_free, mem_free, gpu_free, -1)
        gpu_total[n] -= milli * bin(int(mask)).count("1")
        node_version[n] += 1
        out[j, 0], out[j, 1] = n, np.int64(mask)
    return len(tasks)


# ---------------------------------------------------------------- gangs


def _place_in_domain(
    members: list[int],
    state: tuple[I64, I64, I16, I32, I32],
    tasks: list[tuple[int, int, int, int, int]],
    policy: int,
    shapes: I64,
) -> tuple[int, Score, list[tuple[int, int]]]:
    """Place tasks in order on copies of the state: (placed, summed score, [(node, mask)])."""
    cpu_free, mem_free, gpu_free = state[0].copy(), state[1].copy(), state[2].copy()
    gpu_count, node_model = state[3], state[4]
    cands = np.array(members, dtype=np.int64)
    placement: list[tuple[int, int]] = []
    total_p = total_s = 0
    for cpu, mem, gpus, milli, models in tasks:
        n = best_node(
            cands,
            cpu_free,
            mem_free,
            gpu_free,
            gpu_count,
            node_model,
            cpu,
            mem,
            gpus,
            milli,
            np.uint64(models),
            policy,
            shapes,
        )
        if n == NO_NODE:
            break
        primary, secondary = node_score(n, cpu_free, gpu_free, gpu_count, cpu, gpus, milli, policy, shapes)
        total_p, total_s = total_p + primary, total_s + secondary
        mask = pick_gpus(gpu_free[n], int(gpu_count[n]), gpus, milli)
        allocate(n, mask, cpu, mem, milli, cpu_free, mem_free, gpu_free, -1)
        placement.append((n, int(mask)))
    return len(placement), (total_p, total_s), placement


def place_gang(
    cands: I64,
    domain: I32,
    cpu_free: I64,
    mem_free: I64,
    gpu_free: I16,
    gpu_count: I32,
    node_model: I32,
    t_cpu: I64,
    t_mem: I64,
    t_gpus: I32,
    t_milli: I32,
    t_models: U64,
    policy: int,
    shapes: I64,
    out_node: I32,
    out_mask: U64,
) -> tuple[int, int]:
    """All tasks in one domain or none: (domain id, T) or (-1, most leading tasks any domain fits)."""
    out_node[:] = NO_NODE
    out_mask[:] = 0
    state = (cpu_free, mem_free, gpu_free, gpu_count, node_model)
    tasks = list(
        zip(t_cpu.tolist(), t_mem.tolist(), t_gpus.tolist(), t_milli.tolist(), t_models.tolist(), strict=True)
    )
    domain_of = {n: int(domain[n]) for n in cands.tolist() if int(domain[n]) >= 0}
    best: tuple[Score, int, list[tuple[int, int]]] | None = None
    best_partial = 0
    for d in sorted(set(domain_of.values())):
        members = sorted(n for n, dom in domain_of.items() if dom == d)
        placed, score, placement = _place_in_domain(members, state, tasks, policy, shapes)
        best_partial = max(best_partial, placed)
        if placed == len(tasks) and (best is None or score < best[0]):
            best = (score, d, placement)
    if best is None:
        return NO_DOMAIN, best_partial
    for t, (n, mask) in enumerate(best[2]):
        out_node[t] = n
        out_mask[t] = mask
    return best[1], len(tasks)


def place_gang_memo(
    cands: I64,
    domain: I32,
    cpu_free: I64,
    mem_free: I64,
    gpu_free: I16,
    gpu_count: I32,
    node_model: I32,
    t_cpu: I64,
    t_mem: I64,
    t_gpus: I32,
    t_milli: I32,
    t_models: U64,
    policy: int,
    shapes: I64,
    out_node: I32,
    out_mask: U64,
    node_version: I64,
    memo: I64,
) -> tuple[int, int]:
    """``place_gang``: the memo only saves work, so the reference ignores it."""
    del node_version, memo
    free = (cpu_free, mem_free, gpu_free, gpu_count, node_model)
    tasks = (t_cpu, t_mem, t_gpus, t_milli, t_models)
    return place_gang(cands, domain, *free, *tasks, policy, shapes, out_node, out_mask)


# ---------------------------------------------------------------- gangs spread one task a node


def place_spread(
    cands: I64,
    starts: I64,
    cpu_free: I64,
    mem_free: I64,
    gpu_free: I16,
    gpu_count: I32,
    node_model: I32,
    t_cpu: I64,
    t_mem: I64,
    t_gpus: I32,
    t_milli: I32,
    t_models: U64,
    t_class: I64,
    allowed: npt.NDArray[np.bool_],
    weight: I64,
    policy: int,
    shapes: I64,
    out_pos: I64,
) -> tuple[int, int]:
    """Each run of ``cands`` (a domain) in turn; in it the tasks in order, each on the best
    allowed candidate whose node no earlier task took: every such candidate ranked by (score,
    -weight, node). The run whose full placement has the lowest summed score, then the earliest."""
    out_pos[:] = -1
    free = (cpu_free, mem_free, gpu_free, gpu_count, node_model)
    best: tuple[Score, int, list[int]] | None = None
    most = 0
    for k in range(len(starts) - 1):
        taken: set[int] = set()
        chosen: list[int] = []
        total = (0, 0)
        for i in range(len(t_cpu)):
            task = (int(t_cpu[i]), int(t_mem[i]), int(t_gpus[i]), int(t_milli[i]), np.uint64(t_models[i]))
            c = int(t_class[i])
            ranked = []
            for j in range(int(starts[k]), int(starts[k + 1])):
                n = int(cands[j])
                if n in taken or not allowed[c, j] or not fits(n, *free, *task):
                    continue
                p, s = node_score(n, cpu_free, gpu_free, gpu_count, task[0], task[2], task[3], policy, shapes)
                ranked.append((p, s, -int(weight[c, j]), n, j))
            if not ranked:
                break
            p, s, _, n, j = min(ranked)
            taken.add(n)
            chosen.append(j)
            total = (total[0] + p, total[1] + s)
        most = max(most, len(chosen))
        if len(chosen) == len(t_cpu) and (best is None or total < best[0]):
            best = (total, k, chosen)
    if best is None:
        return -1, most
    out_pos[:] = best[2]
    return best[1], most
