"""Step 2 of decide: quotas. A tenant may use its nominal quota, plus idle quota borrowed
from its cohort up to its borrowing limit; lenders get it back by reclaim (step 4)."""

from __future__ import annotations

from collections.abc import Mapping

from fleetlog.core.state import NO_LIMIT, Quota, State

RESOURCES = ("cpu_milli", "mem_mib", "gpu_milli")
Usage = dict[tuple[int, int], list[int]]
Quotas = Mapping[tuple[int, int], Quota]
"""Quotas by (tenant, cell), cell -1 for every cell, in insertion order."""


def cohort_idle(state: State, usage: Usage, key: tuple[int, int], quota: Quota) -> list[int]:
    """Unused nominal quota of the other members of ``quota``'s cohort, at the same cell key."""
    return cohort_idle_in(state.quotas, usage, key, quota)


def cohort_idle_in(quotas: Quotas, usage: Usage, key: tuple[int, int], quota: Quota) -> list[int]:
    """:func:`cohort_idle` over any table of quotas (the dispatcher keeps its own, fleet-wide)."""
    idle = [0, 0, 0]
    if not quota.cohort:
        return idle
    for other_key, other in quotas.items():
        if other_key == key or other_key[1] != key[1] or other.cohort != quota.cohort:
            continue
        used = usage.get(other_key, [0, 0, 0])
        for i in range(3):
            idle[i] += max(0, other.nominal[i] - used[i])
    return idle


def limit_of(state: State, usage: Usage, key: tuple[int, int], quota: Quota) -> list[int]:
    """The most the tenant may use under ``quota`` right now: nominal plus what it may borrow."""
    return limit_in(state.quotas, usage, key, quota)


def limit_in(quotas: Quotas, usage: Usage, key: tuple[int, int], quota: Quota) -> list[int]:
    """:func:`limit_of` over any table of quotas."""
    idle = cohort_idle_in(quotas, usage, key, quota)
    cap = quota.borrowing_limit or (NO_LIMIT, NO_LIMIT, NO_LIMIT)
    return [quota.nominal[i] + min(cap[i], idle[i]) for i in range(3)]


def job_request(state: State, job: int) -> tuple[int, int, int]:
    """The job's total request: (cpu milli, MiB, GPU milli) over all its tasks."""
    jc = state.jobs.cols
    return (int(jc["req_cpu"][job]), int(jc["req_mem"][job]), int(jc["req_gpu"][job]))


def quota_check(state: State, usage: Usage, job: int, cell: int, require_quota: bool = False) -> str:
    """Empty when ``job`` fits its tenant's quotas in ``cell``; otherwise why not, with numbers."""
    if not state.quotas:
        return "tenant has no quota" if require_quota else ""
    tenant = int(state.jobs.cols["tenant"][job])
    req = job_request(state, job)
    keys = [k for k in ((tenant, cell), (tenant, -1)) if k in state.quotas]
    if not keys:
        return "tenant has no quota" if require_quota else ""
    for key in keys:
        quota = state.quotas[key]
        used = usage.get(key, [0, 0, 0])
        limit = limit_of(state, usage, key, quota)
        for i, name in enumerate(RESOURCES):
            if req[i] and used[i] + req[i] > limit[i]:
                where = "in every cell" if key[1] < 0 else f"in cell {state.names['cell'].names[key[1]]}"
                lend = limit[i] - quota.nominal[i]
                return (
                    f"tenant {state.names['tenant'].names[tenant]} uses {used[i]} of {quota.nominal[i]} "
                    f"{name} nominal {where}, the job needs {req[i]} and the cohort can lend {lend}"
                )
    return ""


def borrowing_tenants(state: State, usage: Usage, job: int) -> set[int]:
    """Tenants of ``job``'s cohort that use more than their nominal quota — when ``job``'s own
    tenant would stay within its nominal quota with the job (so it may reclaim)."""
    tenant = int(state.jobs.cols["tenant"][job])
    mine = state.quotas.get((tenant, -1))
    if mine is None or not mine.cohort:
        return set()
    req = job_request(state, job)
    used = usage.get((tenant, -1), [0, 0, 0])
    if any(req[i] and used[i] + req[i] > mine.nominal[i] for i in range(3)):
        return set()
    out = set()
    for (other, cell), quota in state.quotas.items():
        if cell == -1 and other != tenant and quota.cohort == mine.cohort:
            theirs = usage.get((other, -1), [0, 0, 0])
            if any(theirs[i] > quota.nominal[i] for i in range(3)):
                out.add(other)
    return out
