"""Invariants of the state, as code. Tests and the simulator run ``check`` after every fold."""

from __future__ import annotations

import numpy as np

from fleetlog.core.constraints import NO_ATTRS
from fleetlog.core.state import (
    FULL_GPU,
    SPREAD_HOST,
    JobState,
    NodeStatus,
    State,
    TaskState,
    collection_sums,
    held_bytes,
    shape_key,
)


class InvariantError(AssertionError):
    """The state broke a rule that must always hold: a bug in fold or decide."""


def check(state: State) -> None:
    """Raise :class:`InvariantError` naming the first broken rule."""
    for rule in (
        no_overcommit,
        free_matches_tasks,
        running_tasks_on_live_nodes,
        job_states_consistent,
        usage_matches_allocations,
        pending_count_matches,
        shape_stats_match_window,
        sums_match_collections,
        metadata_bytes_match,
        retired_rows_released,
        constraints_consistent,
        foreign_consistent,
        spread_gangs_spread,
    ):
        problem = rule(state)
        if problem:
            raise InvariantError(f"{rule.__name__}: {problem}")


def no_overcommit(state: State) -> str:
    c = state.nodes.cols
    n = state.nodes.size
    for col in ("cpu_free", "mem_free"):
        bad = np.flatnonzero(c[col][:n] < 0)
        if bad.size:
            return f"node {state.names['node'].names[bad[0]]!r} has {col} {c[col][bad[0]]}"
    gpu = c["gpu_free"][:n]
    if (gpu < 0).any() or (gpu > FULL_GPU).any():
        row = int(np.flatnonzero(((gpu < 0) | (gpu > FULL_GPU)).any(axis=1))[0])
        return f"node row {row} has a GPU share outside 0..1000: {gpu[row, : c['gpu_count'][row]].tolist()}"
    return ""


def free_matches_tasks(state: State) -> str:
    """Each node's free capacity is its allocatable minus what its tasks hold."""
    n, tc = state.nodes.size, state.tasks.cols
    on = state.tasks.view("node")
    placed = np.flatnonzero(on >= 0)
    cpu = np.bincount(on[placed], weights=tc["cpu"][placed], minlength=n).astype(np.int64)
    c = state.nodes.cols
    foreign = np.zeros((3, n), np.int64)  # (cpu, mem, GPU mask held by foreign work)
    for row, held in state.node_foreign.items():
        foreign[:, row] = held[3:]
    for col, used, held in (("cpu", cpu, foreign[0]), ("mem", mem_used(state, on, placed, n), foreign[1])):
        bad = np.flatnonzero(c[f"{col}_alloc"][:n] - used - held != c[f"{col}_free"][:n])
        if bad.size:
            return (f"node row {bad[0]}: {col}_free {c[f'{col}_free'][bad[0]]} but tasks hold {used[bad[0]]} "
                    f"and foreign work {held[bad[0]]}")
    gpu_used = np.zeros_like(c["gpu_free"][:n], dtype=np.int64)
    for row, held in state.node_foreign.items():
        for g in range(int(c["gpu_count"][row])):
            if held[5] >> g & 1:
                gpu_used[row, g] += FULL_GPU
    for t in placed.tolist():
        mask, node = int(tc["gpu_mask"][t]), int(on[t])
        for g in range(int(c["gpu_count"][node])):
            if mask >> g & 1:
                gpu_used[node, g] += int(tc["milli"][t])
    expect = np.where(np.arange(c["gpu_free"].shape[1]) < c["gpu_count"][:n, None], FULL_GPU - gpu_used, 0)
    bad = np.flatnonzero((expect != c["gpu_free"][:n]).any(axis=1))
    return f"node row {bad[0]}: GPU free shares do not match its tasks" if bad.size else ""


def mem_used(state: State, on: np.ndarray, placed: np.ndarray, n: int) -> np.ndarray:
    """Memory the placed tasks hold per node row."""
    return np.bincount(on[placed], weights=state.tasks.cols["mem"][placed], minlength=n).astype(np.int64)


def running_tasks_on_live_nodes(state: State) -> str:
    on = state.tasks.view("node")
    placed = on[on >= 0]
    down = state.nodes.view("status")[placed] != NodeStatus.UP
    return f"{int(down.sum())} tasks hold resources on nodes that are not up" if down.any() else ""


def job_states_consistent(state: State) -> str:
    """Pending jobs hold nothing; running jobs have every task placed or finished."""
    js, ts = state.jobs.view("state"), state.tasks.view("state")
    job_of = state.tasks.view("job")
    job_state = js[job_of]
    if ((job_state == JobState.PENDING) & (ts != TaskState.PENDING)).any():
        return "a pending job has a task that is not pending"
    if ((job_state == JobState.RUNNING) & (ts == TaskState.PENDING)).any():
        return "a running job has an unplaced task"
    if ((job_state != JobState.RUNNING) & (state.tasks.view("node") >= 0)).any():
        return "a job that is not running holds a node"
    return ""


def usage_matches_allocations(state: State) -> str:
    """Each tenant's usage (in total and per cell) equals the sum of its placed tasks."""
    expect: dict[tuple[int, int], list[int]] = {}
    tc, jc = state.tasks.cols, state.jobs.cols
    for t in np.flatnonzero(state.tasks.view("node") >= 0).tolist():
        job = int(tc["job"][t])
        res = (int(tc["cpu"][t]), int(tc["mem"][t]), int(tc["milli"][t]) * int(tc["gpus"][t]))
        for key in ((int(jc["tenant"][job]), -1), (int(jc["tenant"][job]), int(jc["cell"][job]))):
            row = expect.setdefault(key, [0, 0, 0])
            for i in range(3):
                row[i] += res[i]
    for key in sorted(set(expect) | set(state.usage)):
        if expect.get(key, [0, 0, 0]) != state.usage.get(key, [0, 0, 0]):
            return f"tenant/cell {key}: usage {state.usage.get(key)} but allocations sum to {expect.get(key)}"
    return ""


def pending_count_matches(state: State) -> str:
    actual = int((state.jobs.view("state") == JobState.PENDING).sum())
    return (
        "" if actual == state.pending_count else f"pending_count {state.pending_count} but {actual} pending"
    )


def shape_stats_match_window(state: State) -> str:
    """The shape counts the FGD score reads equal a recount of the shape window."""
    expect: dict[tuple[int, int, int], list[int]] = {}
    for shape in state.recent_shapes:
        row = expect.setdefault(shape_key(shape), [0, 0])
        row[0] += 1
        row[1] += shape[2]
    live = {k: v for k, v in state.shape_stats.items() if v[0] != 0 or v[1] != 0}
    return (
        ""
        if live == expect
        else f"shape counts {sorted(live.items())[:3]} but the window has {sorted(expect.items())[:3]}"
    )


def sums_match_collections(state: State) -> str:
    """The running entry sums the digest reads equal sums computed afresh."""
    fresh = collection_sums(state)
    return "" if state.sums == fresh else f"running sums {state.sums} != {fresh} computed afresh"


def metadata_bytes_match(state: State) -> str:
    """Each tenant's metadata bytes fold keeps (once the service asked for them) equal a count
    afresh over ``job_meta``: the per-tenant bound reads what is really held."""
    kept = state.derived.meta_bytes
    if kept is None:
        return ""
    fresh: dict[int, int] = {}
    tenants = state.jobs.cols["tenant"]
    for row, (labels, notes) in state.job_meta.items():
        tenant = int(tenants[row])
        fresh[tenant] = fresh.get(tenant, 0) + held_bytes(labels, notes)
    if kept == fresh:
        return ""
    return f"metadata bytes by tenant {sorted(kept.items())[:3]} != {sorted(fresh.items())[:3]} afresh"


def retired_rows_released(state: State) -> str:
    """The retired rows are counted, their ids released and remembered (for the dedup window
    or not at all); every other row's id maps to it; no collection keyed by job row keeps a
    retired row."""
    js = state.jobs.view("state")
    retired = np.flatnonzero(js == JobState.RETIRED)
    if retired.size != state.retired_rows:
        return f"{retired.size} retired rows but retired_rows {state.retired_rows}"
    names = state.names["job"]
    if len(names) != state.jobs.size:
        return f"{len(names)} job ids interned for {state.jobs.size} job rows"
    if len(names.ids) != state.jobs.size - retired.size:
        return f"{len(names.ids)} job ids known for {state.jobs.size - retired.size} live jobs"
    wrong = [n for n, row in names.ids.items() if names.names[row] != n or js[row] == JobState.RETIRED]
    if wrong:
        return f"job id {wrong[0]!r} maps to a row not its own or retired"
    gone = set(retired.tolist())
    for what in ("job_cells", "reason_text", "requeues", "job_meta", "dispatches", "held"):
        kept = gone.intersection(getattr(state, what))
        if kept:
            return f"{what} keeps retired job row {min(kept)}"
    if len(state.retired) > len(state.retired_order):
        return f"{len(state.retired)} retired ids but {len(state.retired_order)} in retirement order"
    return ""


def constraints_consistent(state: State) -> str:
    """Every task's constraint class exists; class ids index their keys; node attributes are
    kept only for node rows, and only when there are some (``NO_ATTRS`` has no entry)."""
    cls = state.tasks.view("cls")
    if cls.size and (cls.min() < 0 or cls.max() >= len(state.classes)):
        return f"a task of class {int(cls.max())} but {len(state.classes)} classes"
    if any(state.class_ids.get(key) != i for i, key in enumerate(state.classes)):
        return "class_ids do not index classes"
    if len(state.class_ids) != len(state.classes):
        return f"{len(state.class_ids)} class ids for {len(state.classes)} classes"
    size = state.nodes.size
    bad = [row for row, attrs in state.node_attrs.items() if not 0 <= row < size or attrs == NO_ATTRS]
    if bad:
        return f"node_attrs has an entry for row {bad[0]}"
    loose = [row for row in state.drained if not state.node_attrs.get(row, NO_ATTRS)[2]]
    return f"node row {loose[0]} is drained but not cordoned" if loose else ""


def spread_gangs_spread(state: State) -> str:
    """No two placed tasks of a job spread one task a node (``JobSubmitted.spread``) share a node."""
    spread = np.flatnonzero(state.jobs.view("topology") & SPREAD_HOST)
    if not spread.size:
        return ""
    tc = state.tasks.cols
    on = state.tasks.view("node")
    mine = np.flatnonzero(np.isin(state.tasks.view("job"), spread) & (on >= 0))
    pairs = np.unique(np.stack([tc["job"][mine].astype(np.int64), on[mine].astype(np.int64)]), axis=1)
    if pairs.shape[1] == mine.size:
        return ""
    return "a job spread one task a node has two tasks on one node"


def foreign_consistent(state: State) -> str:
    """Foreign work holds at most what it wants, on GPUs the node has and no task of ours holds,
    and an entry is kept only while it wants something."""
    c, size = state.nodes.cols, state.nodes.size
    for row, (cpu, mem, gpus, held_cpu, held_mem, mask) in sorted(state.node_foreign.items()):
        if not 0 <= row < size or not (cpu or mem or gpus):
            return f"node_foreign has an entry for row {row} wanting {(cpu, mem, gpus)}"
        if not (0 <= held_cpu <= cpu and 0 <= held_mem <= mem and mask.bit_count() <= gpus):
            return f"node row {row}: foreign work holds {(held_cpu, held_mem, mask)} of {(cpu, mem, gpus)}"
        if mask >> int(c["gpu_count"][row]):
            return f"node row {row}: foreign work holds GPUs past its {int(c['gpu_count'][row])}"
    tc = state.tasks.cols
    placed = np.flatnonzero(state.tasks.view("node") >= 0)
    for t in placed.tolist():
        held = state.node_foreign.get(int(tc["node"][t]))
        if held is not None and int(tc["gpu_mask"][t]) & held[5]:
            return f"task row {t} holds a GPU that foreign work holds"
    return ""
