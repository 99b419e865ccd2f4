"""The API's lists (fleetlog.api.resources: column masks, one read per column for a page) against
the plain per-row views (fleetlog.core.views) on generated states: jobs placed, started, finished,
cancelled, retired, nodes down, quotas; every filter and every page size, down to 1 and past the end."""

from __future__ import annotations

import random
from collections import Counter

import msgspec
import pytest

from fleetlog.api.resources import (
    JOB_STATES,
    ApiError,
    list_cells,
    list_jobs,
    list_nodes,
    list_queues,
    list_tenants,
)
from fleetlog.core.state import CoreConfig, JobState, NodeStatus
from fleetlog.core.views import jobs_table, nodes_table, queues_table, tenants_table
from fleetlog.events import JobCancelled, TaskFinished, TaskStarted
from tests.core.builders import Driver, job, node, quota


def generated(seed: int) -> Driver:
    rng = random.Random(seed)
    driver = Driver(config=CoreConfig(retain_finished_ms=rng.choice([1, 10_000_000])))
    cells, models = ["c1", "c2", "c3"][: rng.randint(1, 3)], ["A100", "H100"]
    driver.feed(*(node(f"n{i}", gpus=rng.choice([0, 4, 8]), model=rng.choice(models), cell=rng.choice(cells))
                  for i in range(rng.randint(0, 12))), check_each=False)
    driver.feed(*(quota(f"t{i}", gpus=rng.randint(0, 16)) for i in range(rng.randint(0, 3))))
    for round_ in range(rng.randint(1, 4)):
        jobs = [msgspec.structs.replace(
            job(f"j{round_}-{i}", tenant=f"t{rng.randint(0, 3)}", tasks=rng.randint(1, 3),
                gpus=rng.choice([0, 1, 4, 8])), queue=rng.choice(["q1", "q2"]))
                for i in range(rng.randint(0, 25))]
        driver.feed(*jobs, check_each=False)
        placed = driver.placed(driver.decide())
        for job_id, decision in placed.items():
            for task in range(len(decision.tasks)):
                if rng.random() < 0.6:
                    where = decision.tasks[task].node
                    driver.feed(TaskStarted(job_id=job_id, task_index=task, node=where))
                    if rng.random() < 0.4:
                        code = rng.choice([0, 1])
                        driver.feed(TaskFinished(job_id=job_id, task_index=task, exit_code=code))
        for spec in jobs:
            if rng.random() < 0.1:
                driver.feed(JobCancelled(job_id=spec.job_id))
        if rng.random() < 0.3 and driver.state.nodes.size:
            driver.feed(msgspec.structs.replace(node("n0"), healthy=False))
        driver.decide()
    return driver


def plain_jobs(state: object) -> list[dict[str, object]]:
    keep = ("job_id", "state", "tenant", "queue", "priority", "tasks", "gpu_milli", "cell", "submitted_at_ms",
            "reason")
    return [{k: row[k] for k in keep} for row in jobs_table(state)]  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", range(40))
def test_lists_equal_the_plain_views(seed: int) -> None:
    state = generated(seed).state
    rng = random.Random(seed)
    plain = plain_jobs(state)
    keep = list(plain[0]) if plain else []
    page = list_jobs(state, {"limit": ["10000"]})
    assert [{k: msgspec.to_builtins(item)[k] for k in keep} for item in page.items] == plain
    assert (page.total, page.next_page_token) == (len(plain), None)
    for size in (1, 2, rng.randint(1, 9), len(plain) + 1):  # every page size: the pages add up
        got, token = [], None
        while True:
            part = list_jobs(state, {"limit": [str(size)], **({"page_token": [token]} if token else {})})
            assert len(part.items) <= size
            assert part.total == len(plain)
            got += [i.job_id for i in part.items]
            token = part.next_page_token
            if token is None:
                break
        assert got == [row["job_id"] for row in plain]
    reasons = sorted({str(r["reason"]) for r in plain} - {""})
    for name, values in (("tenant", ["t0", "t3", "nobody"]), ("queue", ["q2"]), ("state", list(JOB_STATES)),
                         ("cell", ["c1", "c3"]), ("reason", reasons)):
        for value in values:
            want = [r["job_id"] for r in plain if r[name] == value]
            assert [i.job_id for i in list_jobs(state, {name: [value]}).items] == want, (name, value)
    items = page.items  # a job's nodes are its placed tasks' (a pending or ended job's: none)
    tc = state.tasks.cols
    assert [i.nodes for i in items] == [list(dict.fromkeys(
        state.node_name(int(tc["node"][t])) for t in state.job_tasks(state.job_row(i.job_id))
        if int(tc["node"][t]) >= 0)) for i in items]
    assert all(bool(i.nodes) == (i.state in ("placed", "running")) for i in items)
    assert [i.age_ms for i in items] == [state.now_ms - i.submitted_at_ms for i in items]
    for name in sorted({n for i in items for n in i.nodes} | {"nowhere"}):
        assert [i.job_id for i in list_jobs(state, {"node": [name]}).items] == [
            i.job_id for i in items if name in i.nodes], name
    either = list_jobs(state, {"state": ["pending", "running"], "tenant": ["t0", "t1"]})
    assert [i.job_id for i in either.items] == [
        r["job_id"] for r in plain if r["state"] in ("pending", "running") and r["tenant"] in ("t0", "t1")]

    nodes = nodes_table(state)
    listed = [msgspec.to_builtins(n) for n in list_nodes(state, {}).items]
    assert [(n["node"], n["cell"], n["status"], n["gpus"], n["gpu_free_milli"]) for n in listed] == [
        (n["node"], n["cell"], n["status"], n["gpus"], n["gpu_free_milli"]) for n in nodes]
    down = [n["node"] for n in nodes if n["status"] == "down"]
    assert [n.node for n in list_nodes(state, {"status": ["down"]}).items] == down

    tenants = {t["tenant"]: t for t in tenants_table(state)}
    phases = Counter((r["tenant"], r["queue"], r["state"]) for r in plain)  # (placed apart from running)
    for item in list_tenants(state, {}).items:
        t = tenants[item.tenant]
        assert (item.running + item.placed, item.pending) == (t["running"], t["pending"])
        assert (item.running, item.placed) == tuple(
            sum(n for (tenant, _, s), n in phases.items() if (tenant, s) == (item.tenant, phase))
            for phase in ("running", "placed"))
        assert (item.placed_longest_ms is None) == (item.placed == 0)
        assert item.used.gpu_milli == t["gpu_milli"]
        nominal = t["nominal_gpu_milli"]
        assert (item.nominal.gpu_milli if item.nominal else None) == nominal
        assert item.borrowed.gpu_milli == (0 if nominal is None else max(0, t["gpu_milli"] - nominal))
    queues = {q["queue"]: q for q in queues_table(state)}
    for q in list_queues(state, {}).items:
        assert (q.pending, q.running + q.placed, q.pending_gpu_milli) == (
            queues[q.queue]["pending"], queues[q.queue]["running"], queues[q.queue]["pending_gpu_milli"])
        assert (q.running, q.placed) == tuple(
            sum(n for (_, queue, s), n in phases.items() if (queue, s) == (q.queue, phase))
            for phase in ("running", "placed"))
        assert sum(q.pending_by_reason.values()) == q.pending
    up = [n for n in nodes if n["status"] == "up"]
    for cell in list_cells(state, {}).items:
        mine = [n for n in up if n["cell"] == cell.cell]
        assert cell.gpus == sum(int(n["gpus"]) for n in mine)
        assert cell.gpu_allocated_milli == sum(int(n["gpus"]) * 1000 - int(n["gpu_free_milli"]) for n in mine)
        assert sum(m.gpus for m in cell.by_model.values()) == cell.gpus


def test_no_retired_job_is_listed_and_states_are_named_as_the_views_name_them() -> None:
    driver = Driver(config=CoreConfig(retain_finished_ms=1))
    driver.feed(node("n1", gpus=8), job("done", gpus=1), job("cancelled", gpus=1), job("waits", gpus=64))
    placed = driver.placed(driver.decide())
    driver.feed(TaskStarted(job_id="done", task_index=0, node=placed["done"].tasks[0].node),
                TaskFinished(job_id="done", task_index=0), JobCancelled(job_id="cancelled"))
    driver.feed(node("n1", gpus=8), step_ms=20_000)  # the next sweep, past retain_finished_ms: they retire
    driver.decide()
    state = driver.state
    assert {int(state.jobs.cols["state"][r]) for r in range(state.jobs.size)} >= {int(JobState.RETIRED)}
    assert [i.job_id for i in list_jobs(state, {}).items] == ["waits"]
    assert list_nodes(state, {"status": ["up"]}).items[0].status == NodeStatus.UP.name.lower()


@pytest.mark.parametrize("query", [{"limit": ["0"]}, {"limit": ["10001"]}, {"page_token": ["x"]},
                                   {"state": ["placed", "asleep"]}, {"jobs": ["1"]}])
def test_a_bad_query_names_its_field(query: dict[str, list[str]]) -> None:
    with pytest.raises(ApiError) as refused:
        list_jobs(Driver().state, query)
    assert refused.value.status == 400
    assert refused.value.field == next(iter(query))
