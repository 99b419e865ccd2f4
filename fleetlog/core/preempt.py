"""Step 4 of decide: when a job does not fit, a higher priority may evict lower ones (of the
same tenant alone under ``Policy.priority_within_tenant``) and a tenant within its nominal
quota may evict cohort borrowers (the fewest whole gangs, lowest priority and youngest first,
never twice for one cause within a window).
"""

from __future__ import annotations

import numpy as np

from fleetlog.core.place import add_usage, allowed_cells, commit, try_place
from fleetlog.core.quota import borrowing_tenants
from fleetlog.core.scratch import Outcome, Placement, Scratch, job_name
from fleetlog.events.model import TaskPreempted


def preempt_for(sc: Scratch, job: int, failure: Outcome) -> bool:
    """Try priority preemption, then quota reclaim; on success emit evictions and the placement."""
    if failure.reason not in ("insufficient_capacity", "gang_does_not_fit", "gang_does_not_fit_topology"):
        return False
    for cause, enabled in (("priority", sc.policy.preemption), ("reclaim", sc.policy.reclaim)):
        if not enabled:
            continue
        victims = victim_candidates(sc, job, cause)
        chosen = minimal_victims(sc, job, victims) if victims else None
        if chosen is not None:
            evict(sc, job, chosen[0], cause)
            commit(sc, job, chosen[1])
            sc.failed.clear()  # capacity was freed: earlier failures may fit now
            return True
    return False


def victim_candidates(sc: Scratch, job: int, cause: str) -> list[int]:
    """Running jobs ``job`` may evict for ``cause``, in eviction order, at most ``max_victims``."""
    state = sc.state
    jc = state.jobs.cols
    prio = int(jc["priority"][job])
    if cause == "priority" and prio <= sc.lowest_running_priority():
        return []
    tenants = borrowing_tenants(state, sc.usage, job) if cause == "reclaim" else set()
    if cause == "reclaim" and not tenants:
        return []
    running = sc.running()
    if cause == "priority":
        running = running[jc["priority"][running] < prio]
        if sc.policy.priority_within_tenant:  # (across tenants: reclaim alone, below)
            running = running[jc["tenant"][running] == jc["tenant"][job]]
    else:
        running = running[np.isin(jc["tenant"][running], np.array(sorted(tenants), dtype=np.int32))]
    cells = set(allowed_cells(sc, job))
    recent = (jc["preempted_at_ms"][running] >= 0) & (
        jc["preempted_at_ms"][running] > state.now_ms - sc.policy.thrash_window_ms
    )
    same_cause = jc["preempt_cause"][running] == (1 if cause == "priority" else 2)
    running = running[~(recent & same_cause)]
    order = np.lexsort((-running, -jc["placed_at_ms"][running], jc["priority"][running]))
    out = [
        int(v) for v in running[order].tolist() if int(jc["cell"][v]) in cells and int(v) not in sc.victims
    ]
    return out[: sc.policy.max_victims]


def minimal_victims(sc: Scratch, job: int, victims: list[int]) -> tuple[list[int], Placement] | None:
    """The smallest prefix of ``victims`` that makes room, then drop any that are not needed."""
    chosen: list[int] = []
    for v in victims:
        chosen.append(v)
        if trial_place(sc, job, chosen) is not None:
            break
    else:
        return None
    for v in list(chosen[:-1]):
        fewer = [x for x in chosen if x != v]
        if trial_place(sc, job, fewer) is not None:
            chosen = fewer
    placement = trial_place(sc, job, chosen)
    return (chosen, placement) if placement is not None else None


def trial_place(sc: Scratch, job: int, victims: list[int]) -> Placement | None:
    """Where ``job`` would go if ``victims`` were evicted (a what-if on a copy)."""
    current = (sc.cpu_free, sc.mem_free, sc.gpu_free, sc.gpu_total)
    saved = sc.swap_free((current[0].copy(), current[1].copy(), current[2].copy(), current[3].copy()))
    try:
        for v in victims:
            release_in_scratch(sc, v)
        found = try_place(sc, job)
    finally:
        sc.swap_free(saved)
    return found if isinstance(found, Placement) else None


def release_in_scratch(sc: Scratch, victim: int) -> None:
    tc = sc.state.tasks.cols
    for t in sc.state.job_tasks(victim):
        node = int(tc["node"][t])
        if node >= 0:
            sc.take(node, tc["gpu_mask"][t], int(tc["cpu"][t]), int(tc["mem"][t]), int(tc["milli"][t]), 1)


def evict(sc: Scratch, job: int, victims: list[int], cause: str) -> None:
    state = sc.state
    by = job_name(state, job)
    for v in victims:
        release_in_scratch(sc, v)
        add_usage(sc, v, int(state.jobs.cols["cell"][v]), -1)
        sc.victims.add(v)
        first = int(state.jobs.cols["first_task"][v])
        for t in state.job_tasks(v):
            sc.decisions.append(
                TaskPreempted(
                    job_id=job_name(state, v),
                    task_index=t - first,
                    by_job_id=by,
                    cause=cause,
                    message=f"{cause} preemption for job {by}",
                )
            )
