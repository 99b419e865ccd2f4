"""The fleet gauges (issue 21): per tenant, per queue, per cell and GPU model, nodes up and down —
scraped from a running service's ``/metrics`` and held against what its read API answers; the
cap on label values; no stale series; their refresh held to a share of the loop's time."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families

from fleetlog.events import TaskStarted
from fleetlog.service.metrics import MAX_LABEL_VALUES, OTHERS, STATE_GAUGES_SHARE, Metrics
from tests.core.builders import Driver, job, node, quota
from tests.service.test_service import Running, events_body, serving

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    """Every sample of an exposition: (name, labels) → value."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def scrape(running: Running) -> Samples:
    status, body = await running.request("/metrics")
    assert status == 200
    return parse(body.decode())


def series(samples: Samples, name: str, **fixed: str) -> dict[tuple[str, ...], float]:
    """The samples of ``name`` whose labels include ``fixed``, by the values of their other labels
    (in label-name order)."""
    out = {}
    for (found, labels), value in samples.items():
        rest = dict(labels)
        if found != name or any(rest.pop(k, None) != v for k, v in fixed.items()):
            continue
        out[tuple(v for _, v in sorted(rest.items()))] = value
    return out


async def eventually(running: Running, check: Callable[[Samples], Any], timeout_s: float = 15) -> Samples:
    """Scrape until ``check`` passes (gauges refresh once a second); the last scrape."""
    for _ in range(int(timeout_s / 0.2)):
        samples = await scrape(running)
        try:
            check(samples)
            return samples
        except AssertionError:
            await asyncio.sleep(0.2)
    check(samples)
    return samples


async def api(running: Running, path: str) -> list[dict[str, Any]]:
    status, answer = await running.request(path)
    assert status == 200, answer
    items: list[dict[str, Any]] = answer["items"]
    return items


def in_queue(queue: str, submitted: msgspec.Struct) -> Any:
    return msgspec.structs.replace(submitted, queue=queue)


FLEET = (node("a1", cell="c1"), node("a2", cell="c1"), node("h1", gpus=4, model="H100", cell="c2"),
         node("h2", gpus=4, model="H100", cell="c2", healthy=False))
WORK = (quota("t1", gpus=4, cohort="co", borrow=8), quota("t3", gpus=8, cohort="co"),
        in_queue("qa", job("j1", "t1", gpus=8)), in_queue("qa", job("j2", "t1", gpus=2)),
        in_queue("qb", job("j3", "t2", gpus=8)), in_queue("qb", job("j4", "t2", gpus=8, models=("A100",))),
        in_queue("qb", job("j5", "t3", tasks=2, gpus=1, milli=500, models=("H100",))))


def matches_the_api(tenants: list[dict[str, Any]], queues: list[dict[str, Any]],
                    cells: list[dict[str, Any]]) -> Callable[[Samples], None]:
    def check(s: Samples) -> None:
        assert series(s, "fleetlog_tenant_used_gpus") == {
            (t["tenant"],): t["used"]["gpu_milli"] / 1000 for t in tenants}
        assert series(s, "fleetlog_tenant_nominal_gpus") == {
            (t["tenant"],): t["nominal"]["gpu_milli"] / 1000 for t in tenants if t["nominal"]}
        assert series(s, "fleetlog_tenant_borrowed_gpus") == {
            (t["tenant"],): t["borrowed"]["gpu_milli"] / 1000 for t in tenants}
        for state, field in (("pending", "pending"), ("placed", "placed"), ("running", "running")):
            assert series(s, "fleetlog_tenant_jobs", state=state) == {
                (t["tenant"],): t[field] for t in tenants}
            assert series(s, "fleetlog_queue_jobs", state=state) == {(q["queue"],): q[field] for q in queues}
        assert series(s, "fleetlog_queue_pending_gpus") == {
            (q["queue"],): q["pending_gpu_milli"] / 1000 for q in queues}
        assert series(s, "fleetlog_cell_gpus") == {
            (c["cell"], m): a["gpus"] for c in cells for m, a in c["by_model"].items()}
        assert series(s, "fleetlog_cell_allocated_gpus") == {
            (c["cell"], m): a["allocated_milli"] / 1000 for c in cells for m, a in c["by_model"].items()}
        for status in ("up", "down"):
            assert series(s, "fleetlog_nodes", status=status) == {
                (c["cell"],): c[f"nodes_{status}"] for c in cells}
        assert series(s, "fleetlog_capped_label_values") == {
            ("cell",): 0, ("cell_gpu_model",): 0, ("queue",): 0, ("tenant",): 0}
    return check


async def test_the_fleet_gauges_say_what_the_read_api_says(tmp_path: Path) -> None:
    async with serving(tmp_path / "log") as running:
        assert (await running.request("/v1/events", events_body(*FLEET, *WORK)))[0] == 200
        loop = running.service.loop
        assert loop is not None
        await running.until(lambda: loop.offset == len(FLEET) + len(WORK) and loop.committed == loop.offset)
        tenants, queues = await api(running, "/v1/tenants"), await api(running, "/v1/queues")
        cells = await api(running, "/v1/cells")
        samples = await eventually(running, matches_the_api(tenants, queues, cells))
        # what the API said, as a person would read it: some placed (no task started: not running),
        # some waiting, a node down; one vocabulary with GET /v1/jobs (no "admitted")
        assert sum(series(samples, "fleetlog_tenant_jobs", state="placed").values()) >= 2
        assert sum(series(samples, "fleetlog_tenant_jobs", state="running").values()) == 0
        assert series(samples, "fleetlog_queue_jobs", state="admitted") == {}
        assert sum(series(samples, "fleetlog_queue_jobs", state="pending").values()) >= 1
        assert series(samples, "fleetlog_nodes", cell="c2") == {("down",): 1, ("up",): 1}
        assert series(samples, "fleetlog_tenant_nominal_gpus") == {("t1",): 4.0, ("t3",): 8.0}
        assert series(samples, "fleetlog_tenant_borrowed_gpus")[("t1",)] > 0  # from t3's idle quota
        assert series(samples, "fleetlog_fleet_gauges_seconds")[()] > 0


async def test_a_model_gone_from_a_cell_leaves_no_stale_series(tmp_path: Path) -> None:
    async with serving(tmp_path / "log") as running:
        assert (await running.request("/v1/events", events_body(*FLEET)))[0] == 200
        await eventually(running, lambda s: _has(s, "fleetlog_cell_gpus", ("c2", "H100"), 4))
        down = node("h1", gpus=4, model="H100", cell="c2", healthy=False)
        assert (await running.request("/v1/events", events_body(down)))[0] == 200
        samples = await eventually(running, lambda s: _has(s, "fleetlog_nodes", ("c2", "down"), 2))
        assert series(samples, "fleetlog_cell_gpus") == {("c1", "A100"): 16}  # not c2/H100 = 0
        assert series(samples, "fleetlog_cell_allocated_gpus") == {("c1", "A100"): 0}


def _has(samples: Samples, name: str, labels: tuple[str, ...], value: float) -> None:
    assert series(samples, name).get(labels) == value


async def test_tenants_past_the_cap_are_summed_into_one_series(tmp_path: Path) -> None:
    """105 tenants, 64 GPUs: the 100 largest by GPU use (then pending jobs, then name) by name,
    the other 5 in ``(all others)``; every sum still adds up to the API's."""
    count = MAX_LABEL_VALUES + 5
    fleet = [node(f"n{i}") for i in range(8)]
    work = [job(f"j{i:03d}", f"t{i:03d}", gpus=1) for i in range(count)]
    async with serving(tmp_path / "log") as running:
        assert (await running.request("/v1/events", events_body(*fleet, *work)))[0] == 200
        loop = running.service.loop
        assert loop is not None
        await running.until(lambda: loop.offset == len(fleet) + count and loop.committed == loop.offset)
        tenants = await api(running, "/v1/tenants")
        ranked = sorted(tenants, key=lambda t: (-t["used"]["gpu_milli"], -t["pending"], t["tenant"]))
        shown = {(t["tenant"],) for t in ranked[:MAX_LABEL_VALUES]} | {(OTHERS,)}

        def capped(s: Samples) -> None:
            assert set(series(s, "fleetlog_tenant_used_gpus")) == shown
        samples = await eventually(running, capped)
        assert series(samples, "fleetlog_capped_label_values", family="tenant") == {(): 5}
        used = series(samples, "fleetlog_tenant_used_gpus")
        assert sum(used.values()) == sum(t["used"]["gpu_milli"] for t in tenants) / 1000 == 64
        pending = series(samples, "fleetlog_tenant_jobs", state="pending")
        assert sum(pending.values()) == sum(t["pending"] for t in tenants) == count - 64
        assert pending[(OTHERS,)] == 5
        assert used[(OTHERS,)] == 0
        assert (OTHERS,) not in series(samples, "fleetlog_tenant_nominal_gpus")  # none has a quota


async def test_a_process_that_stops_leading_shows_no_state(tmp_path: Path) -> None:
    async with serving(tmp_path / "log") as running:
        assert (await running.request("/v1/events", events_body(*FLEET, *WORK)))[0] == 200
        await eventually(running, lambda s: _has(s, "fleetlog_tenant_jobs", ("pending", "t2"), 1))
        metrics = running.service.metrics
    left = parse(metrics.exposition().decode())
    assert series(left, "fleetlog_leader") == {(): 0}
    for name in ("fleetlog_tenant_used_gpus", "fleetlog_tenant_jobs", "fleetlog_queue_jobs",
                 "fleetlog_cell_gpus", "fleetlog_nodes", "fleetlog_pending_jobs",
                 "fleetlog_shape_mix_regime"):
        assert series(left, name) == {}, name


def test_the_regime_gauge_says_which_resource_the_window_asks_more_of() -> None:
    """Two 96-core 8-GPU nodes (12 cores a GPU): 1-GPU jobs of 4 cores leave the mix GPU-bound,
    then enough of 40 cores make it CPU-bound (the mix is taken at each doubling of the tasks)."""
    driver, metrics = Driver(), Metrics()
    driver.feed(node("n1"), node("n2"), *(job(f"a{i}", cpu=4_000) for i in range(8)))
    metrics.fleet.update(driver.state)
    assert series(parse(metrics.exposition().decode()), "fleetlog_shape_mix_regime") == {
        ("cpu-bound",): 0, ("gpu-bound",): 1}
    driver.feed(*(job(f"b{i}", cpu=40_000) for i in range(24)))
    metrics.fleet.update(driver.state)
    assert series(parse(metrics.exposition().decode()), "fleetlog_shape_mix_regime") == {
        ("cpu-bound",): 1, ("gpu-bound",): 0}


def test_placed_longest_is_how_long_the_oldest_placed_not_started_job_has_waited() -> None:
    """Placed at log time P and not started: at log time P + 90 s the gauge says 90 (not "running",
    not 0); once every placed job started, 0."""
    driver, metrics = Driver(), Metrics()
    driver.feed(node("n1"), job("a", gpus=4), job("b", gpus=4))
    placed = driver.placed(driver.decide())
    assert set(placed) == {"a", "b"}
    at = int(driver.state.jobs.cols["placed_at_ms"][driver.state.job_row("a")])
    driver.feed(node("n1"), TaskStarted(job_id="b", task_index=0, node="n1"), step_ms=45_000)  # (n1 heard)
    metrics.fleet.update(driver.state)
    assert driver.state.now_ms - at >= 90_000
    assert series(parse(metrics.exposition().decode()), "fleetlog_placed_longest_seconds") == {
        (): (driver.state.now_ms - at) / 1000}
    assert series(parse(metrics.exposition().decode()), "fleetlog_tenant_jobs", tenant="t1") == {
        ("pending",): 0, ("placed",): 1, ("running",): 1}
    driver.feed(TaskStarted(job_id="a", task_index=0, node="n1"))
    metrics.fleet.update(driver.state)
    assert series(parse(metrics.exposition().decode()), "fleetlog_placed_longest_seconds") == {(): 0}


def test_the_gauges_wait_a_hundred_times_their_cost_before_the_next_update() -> None:
    driver = Driver()
    driver.feed(*FLEET, *WORK)
    driver.decide()
    metrics = Metrics()
    assert metrics.fleet.maybe_update(driver.state, now=100.0)
    cost = series(parse(metrics.exposition().decode()), "fleetlog_fleet_gauges_seconds")[()]
    wait = cost / STATE_GAUGES_SHARE
    assert wait == cost * 100
    driver.feed(job("late", "t9"))
    assert not metrics.fleet.maybe_update(driver.state, now=100.0 + wait * 0.9)
    assert ("t9",) not in series(parse(metrics.exposition().decode()), "fleetlog_tenant_used_gpus")
    assert metrics.fleet.maybe_update(driver.state, now=100.0 + wait * 1.1)
    assert ("t9",) in series(parse(metrics.exposition().decode()), "fleetlog_tenant_used_gpus")


def test_the_docs_table_lists_every_metric_with_its_type_and_labels() -> None:
    """docs/service.md's metrics table is the exposition's: each metric, its type, its labels."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "service.md").read_text()
    rows = re.findall(r"^\| `(fleetlog_\w+)` \| (\w+) \|([^|]*)\|", text, re.M)
    documented = {name: (kind, tuple(re.findall(r"`(\w+)`", labels))) for name, kind, labels in rows}
    metrics = Metrics()
    fleet = metrics.fleet
    families = (fleet.tenants, fleet.queues, fleet.models, fleet.cells)
    wrappers = [*vars(metrics).values(), *vars(fleet).values(), *(g for f in families for g, _ in f.columns)]
    labels = {w._name: tuple(w._labelnames) for w in wrappers if isinstance(w, MetricWrapperBase)}
    exposed = {f.name + ("_total" if f.type == "counter" else ""): (f.type, labels[f.name])
               for f in metrics.registry.collect()}
    assert documented == exposed
