"""The read API (fleetlog.api) over real HTTP: lists, filters, paging through a changing state,
one error shape naming the bad parameter, and an OpenAPI description that matches what is served."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import jsonschema
import msgspec
import pytest

from fleetlog.api.resources import list_jobs, list_queues, list_tenants
from fleetlog.api.routes import ROUTES, openapi
from fleetlog.core.views import jobs_table
from fleetlog.events.model import Taint, TaskStarted, Toleration
from tests.core.builders import job, node
from tests.service.test_service import Running, events_body, serving


class Api:
    def __init__(self, running: Running, session: aiohttp.ClientSession) -> None:
        self.running, self.session = running, session

    async def get(self, path: str, params: Any = None, method: str = "GET") -> tuple[int, Any]:
        async with self.session.request(method, self.running.url + path, params=params) as r:
            body = await r.read()
            return r.status, msgspec.json.decode(body) if r.content_type == "application/json" else body

    async def settled(self, inputs: int) -> None:
        loop = self.running.service.loop
        assert loop is not None
        await self.running.until(lambda: loop.offset == inputs and loop.committed == inputs)


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    async with serving(tmp_path / "log") as running, aiohttp.ClientSession() as session:
        yield Api(running, session)


def fleet_and_jobs() -> list[Any]:
    """Two cells; t1's jobs fill c1's 8 A100s and more wait; t2 has one job in queue q2."""
    events: list[Any] = [node("a1", gpus=8, model="A100", cell="c1"),
                         node("h1", gpus=4, model="H100", cell="c2")]
    events += [job(f"t1-{i}", tenant="t1", gpus=4, models=("A100",)) for i in range(5)]
    events.append(msgspec.structs.replace(job("t2-0", tenant="t2", gpus=2, models=("H100",)), queue="q2"))
    return events


def schema_of(name: str) -> dict[str, Any]:
    spec = openapi()
    return {"$ref": f"#/components/schemas/{name}", "components": spec["components"]}


async def test_lists_filter_and_match_the_state(api: Api) -> None:
    events = fleet_and_jobs()
    assert (await api.running.request("/v1/events", events_body(*events)))[0] == 200
    await api.settled(len(events))
    status, page = await api.get("/v1/jobs")
    assert status == 200
    jsonschema.validate(page, schema_of("JobPage"))
    state = api.running.service.loop.state  # type: ignore[union-attr]
    table = {row["job_id"]: row for row in jobs_table(state)}
    assert [j["job_id"] for j in page["items"]] == list(table)  # submission order
    assert page["total"] == 6
    assert page["next_page_token"] is None
    for item in page["items"]:
        want = table[item["job_id"]]
        assert (item["state"], item["tenant"], item["queue"], item["reason"], item["cell"]) == (
            want["state"], want["tenant"], want["queue"], want["reason"], want["cell"])
    placed = [j for j in page["items"] if j["state"] == "placed"]
    assert len(placed) == 3
    assert all(j["placed_at_ms"] is not None for j in placed)
    pending = [j for j in page["items"] if j["state"] == "pending"]
    assert len(pending) == 3
    assert all(j["reason"] for j in pending)

    _, mine = await api.get("/v1/jobs", [("tenant", "t1"), ("state", "pending")])
    assert {j["job_id"] for j in mine["items"]} == {j["job_id"] for j in pending if j["tenant"] == "t1"}
    _, either = await api.get("/v1/jobs", [("state", "pending"), ("state", "placed")])
    assert either["total"] == 6
    _, queue = await api.get("/v1/jobs", {"queue": "q2"})
    assert [j["job_id"] for j in queue["items"]] == ["t2-0"]
    _, in_c2 = await api.get("/v1/jobs", {"cell": "c2"})
    assert [j["job_id"] for j in in_c2["items"]] == ["t2-0"]
    reason = pending[0]["reason"]
    _, by_reason = await api.get("/v1/jobs", {"reason": reason})
    assert {j["job_id"] for j in by_reason["items"]} == {
        j["job_id"] for j in pending if j["reason"] == reason}
    _, nobody = await api.get("/v1/jobs", {"tenant": "never-seen"})
    assert (nobody["items"], nobody["total"]) == ([], 0)

    status, nodes = await api.get("/v1/nodes", {"model": "H100"})
    jsonschema.validate(nodes, schema_of("NodePage"))
    assert [(n["node"], n["cell"], n["gpus"], n["gpu_free_milli"]) for n in nodes["items"]] == [
        ("h1", "c2", 4, 2000)]
    _, down = await api.get("/v1/nodes", {"status": "down"})
    assert down["total"] == 0

    _, tenants = await api.get("/v1/tenants")
    jsonschema.validate(tenants, schema_of("TenantList"))
    by_tenant = {t["tenant"]: t for t in tenants["items"]}
    assert (by_tenant["t1"]["running"], by_tenant["t1"]["placed"], by_tenant["t1"]["pending"]) == (0, 2, 3)
    assert by_tenant["t1"]["used"]["gpu_milli"] == 8000
    assert by_tenant["t2"]["used"]["gpu_milli"] == 2000
    assert by_tenant["t1"]["dominant_share"] > by_tenant["t2"]["dominant_share"] > 0

    _, queues = await api.get("/v1/queues")
    jsonschema.validate(queues, schema_of("QueueList"))
    assert sum(sum(q["pending_by_reason"].values()) for q in queues["items"]) == 3

    _, cells = await api.get("/v1/cells")
    jsonschema.validate(cells, schema_of("CellList"))
    by_cell = {c["cell"]: c for c in cells["items"]}
    assert by_cell["c1"]["by_model"] == {"A100": {"gpus": 8, "allocated_milli": 8000}}
    assert (by_cell["c2"]["gpus"], by_cell["c2"]["gpu_allocated_milli"]) == (4, 2000)


async def test_paging_through_a_changing_state_neither_skips_nor_repeats(api: Api) -> None:
    first = [node("a1", gpus=1), *(job(f"j{i:02}", gpus=1) for i in range(25))]
    assert (await api.running.request("/v1/events", events_body(*first)))[0] == 200
    await api.settled(len(first))
    seen: list[str] = []
    token: str | None = None
    pages = 0
    while True:
        status, page = await api.get("/v1/jobs", {"limit": "7", **({"page_token": token} if token else {})})
        assert status == 200
        assert len(page["items"]) <= 7
        seen += [j["job_id"] for j in page["items"]]
        token, pages = page["next_page_token"], pages + 1
        if pages == 2:  # more jobs arrive while the client pages: they come last, once
            more = [job(f"k{i}", gpus=1) for i in range(3)]
            assert (await api.running.request("/v1/events", events_body(*more)))[0] == 200
            await api.settled(len(first) + 3)
        if token is None:
            break
    assert seen == [f"j{i:02}" for i in range(25)] + ["k0", "k1", "k2"]


async def test_ten_thousand_pending_jobs_in_one_page(api: Api) -> None:
    jobs = [job(f"p{i}", gpus=8) for i in range(10_000)]  # no node: every one waits
    for at in range(0, len(jobs), 2_000):
        assert (await api.running.request("/v1/events", events_body(*jobs[at:at + 2_000])))[0] == 200
    await api.settled(len(jobs))
    status, page = await api.get("/v1/jobs", {"state": "pending", "limit": "10000"})
    assert status == 200
    assert (len(page["items"]), page["total"], page["next_page_token"]) == (10_000, 10_000, None)
    assert page["items"][-1]["job_id"] == "p9999"
    # one tenant, one queue, one priority: decide takes them FIFO, and their positions say so
    assert [i["queue_position"] for i in page["items"]] == list(range(1, 10_001))


@pytest.mark.parametrize(
    ("path", "params", "field", "code"),
    [
        ("/v1/jobs", {"limit": "0"}, "limit", "invalid_value"),
        ("/v1/jobs", {"limit": "10001"}, "limit", "invalid_value"),
        ("/v1/jobs", {"limit": "ten"}, "limit", "invalid_value"),
        ("/v1/jobs", [("limit", "5"), ("limit", "6")], "limit", "invalid_value"),
        ("/v1/jobs", {"state": "sleeping"}, "state", "invalid_value"),
        ("/v1/jobs", {"page_token": "-3"}, "page_token", "invalid_value"),
        ("/v1/jobs", {"page_token": "9" * 40}, "page_token", "invalid_value"),
        ("/v1/jobs", {"tenants": "t1"}, "tenants", "unknown_parameter"),
        ("/v1/nodes", {"status": "sick"}, "status", "invalid_value"),
        ("/v1/tenants", {"limit": "5"}, "limit", "unknown_parameter"),
    ],
)
async def test_a_bad_query_parameter_is_a_400_naming_it(
    api: Api, path: str, params: Any, field: str, code: str
) -> None:
    status, answer = await api.get(path, params)
    assert status == 400
    jsonschema.validate(answer, schema_of("Error"))
    assert (answer["code"], answer["field"]) == (code, field)
    assert field in answer["message"]


async def test_openapi_describes_exactly_the_routes_served(api: Api) -> None:
    status, spec = await api.get("/v1/openapi.json")
    assert status == 200
    assert spec == msgspec.json.decode(msgspec.json.encode(openapi()))
    assert spec["openapi"].startswith("3.")
    for route in ROUTES:  # every route it describes is answered (never "no such route")
        path = route.path.replace("{job_id}", "nope")
        if route.content_type == "text/event-stream":  # a stream: its head, then hang up
            async with api.session.get(api.running.url + path) as r:
                assert (r.status, r.content_type) == (200, route.content_type)
            continue
        status, answer = await api.get(path, method=route.method)
        assert status != 405, route
        if status >= 400:
            assert answer["code"] != "no_route", route
            jsonschema.validate(answer, schema_of("Error"))
    described = {(r.method, r.path) for r in ROUTES}
    unrouted = [("GET", "/v1/job"), ("GET", "/v1/jobs/a/b"), ("GET", "/v2/jobs"), ("PUT", "/v1/quota/t1")]
    for method, path in unrouted:
        assert (method, path) not in described
        status, answer = await api.get(path, method=method)
        assert (status, answer["code"]) == (404, "no_route")
    status, answer = await api.get("/v1/jobs", method="DELETE")  # a route, another method
    assert (status, answer["code"]) == (405, "method_not_allowed")


async def test_a_standby_process_answers_503_in_the_error_shape(tmp_path: Path) -> None:
    async with serving(tmp_path / "log") as running, aiohttp.ClientSession() as session:
        running.service.loop = None  # as while another process leads
        api = Api(running, session)
        status, answer = await api.get("/v1/jobs")
        assert (status, answer["code"]) == (503, "standby")
        jsonschema.validate(answer, schema_of("Error"))


async def test_ingest_refuses_in_the_same_shape(api: Api) -> None:
    status, answer = await api.running.request("/v1/events", b'[{"type": "JobSubmitted"}]')
    assert status == 400
    jsonschema.validate(answer, schema_of("Error"))
    assert answer["code"] == answer["reason"]
    assert answer["message"] == answer["error"]
    assert "event 0" in answer["message"]
    bad_gpus = (b'[{"schema_version": 1, "producer_id": "p", "event": {"type": "QuotaSet", "tenant": "t",'
                b' "nominal": {"gpu_milli": "x"}}}]')
    status, answer = await api.running.request("/v1/events", bad_gpus)
    assert (status, answer["field"]) == (400, "event.nominal.gpu_milli")


async def put(api: Api, path: str, body: bytes) -> tuple[int, Any]:
    async with api.session.put(api.running.url + path, data=body,
                               headers={"content-type": "application/json"}) as r:
        return r.status, await r.json()


async def test_put_quota_appends_a_quota_set_the_tenants_list_shows(api: Api) -> None:
    status, answer = await put(api, "/v1/quotas/t1", b'{"nominal": {"gpu_milli": 8000}, "cohort": "ml",'
                                                     b' "borrowing_limit": {"gpu_milli": 2000}}')
    assert (status, answer["appended"]) == (200, 1)
    await api.settled(1)
    _, tenants = await api.get("/v1/tenants")
    (t1,) = tenants["items"]
    assert (t1["tenant"], t1["nominal"]["gpu_milli"], t1["borrowing_limit"]["gpu_milli"], t1["cohort"]) == (
        "t1", 8000, 2000, "ml")
    status, answer = await put(api, "/v1/quotas/a%2Fb", b'{"nominal": {"gpu_milli": 1000}}')  # one segment
    assert status == 200
    await api.settled(2)
    _, tenants = await api.get("/v1/tenants")
    assert [t["tenant"] for t in tenants["items"]] == ["t1", "a/b"]
    status, answer = await put(api, "/v1/quotas/a%20b", b'{"nominal": {"gpu_milli": 1000}}')
    assert status == 400  # no identifier: refused by the event's own checks, naming the field
    assert answer["field"] == "tenant", answer


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b'{"nominal": {"gpu_milli": "lots"}}', "nominal.gpu_milli"),
        (b'{"nominal": {"gpu_milli": -1}}', "nominal.gpu_milli"),
        (b'{"nominal": {}, "colour": "blue"}', "colour"),
        (b'{"weight_milli": 1000}', "nominal"),
        (b'{"tenant": "t2", "nominal": {}}', "tenant"),
        (b'[1, 2]', None),
        (b'{"nominal": ', None),
    ],
)
async def test_a_bad_quota_is_a_400_naming_the_field(api: Api, body: bytes, field: str | None) -> None:
    status, answer = await put(api, "/v1/quotas/t1", body)
    assert status == 400
    jsonschema.validate(answer, schema_of("Error"))
    assert answer["field"] == field, answer
    assert await api.running.inputs_end() == 0  # nothing appended


async def test_placed_is_not_running_in_tenants_queues_and_jobs_and_says_how_long_it_waited(api: Api) -> None:
    """A job placed but not every task started (a pod bound, not started) is ``placed`` in every
    count, not ``running``; ``placed_longest_ms`` is the log time since the longest-placed one was
    placed; a gang with one of its two tasks started is still placed."""
    events = [node("a1", gpus=8, cell="c1"), node("a2", gpus=8, cell="c1"),
              job("s1", tenant="t1", gpus=8), job("p1", tenant="t1", gpus=4),
              msgspec.structs.replace(job("g1", tenant="t2", tasks=2, gpus=2), queue="q2")]
    assert (await api.running.request("/v1/events", events_body(*events)))[0] == 200
    await api.settled(len(events))
    _, page = await api.get("/v1/jobs")
    nodes = {j["job_id"]: j["nodes"] for j in page["items"]}
    assert len(nodes["s1"]) == 1
    assert 1 <= len(nodes["g1"]) <= 2
    started = [TaskStarted(job_id="s1", task_index=0, node=nodes["s1"][0]),
               TaskStarted(job_id="g1", task_index=0, node=nodes["g1"][0])]
    assert (await api.running.request("/v1/events", events_body(*started)))[0] == 200
    await api.settled(len(events) + 2)
    _, page = await api.get("/v1/jobs")
    assert {j["job_id"]: j["state"] for j in page["items"]} == {
        "s1": "running", "p1": "placed", "g1": "placed"}
    placed_at = {j["job_id"]: j["placed_at_ms"] for j in page["items"]}
    _, tenants = await api.get("/v1/tenants")
    by_tenant = {t["tenant"]: t for t in tenants["items"]}
    assert {t: (v["running"], v["placed"], v["pending"]) for t, v in by_tenant.items()} == {
        "t1": (1, 1, 0), "t2": (0, 1, 0)}
    assert min(by_tenant["t1"]["placed_longest_ms"], by_tenant["t2"]["placed_longest_ms"]) >= 0
    state = api.running.service.loop.state  # type: ignore[union-attr]
    exact = {t.tenant: t.placed_longest_ms for t in list_tenants(state, {}).items}  # (no tick between)
    assert exact == {"t1": state.now_ms - placed_at["p1"], "t2": state.now_ms - placed_at["g1"]}
    _, queues = await api.get("/v1/queues")
    by_queue = {q["queue"]: q for q in queues["items"]}
    assert {q: (v["running"], v["placed"]) for q, v in by_queue.items()} == {"default": (1, 1), "q2": (0, 1)}
    assert min(by_queue["default"]["placed_longest_ms"], by_queue["q2"]["placed_longest_ms"]) >= 0
    assert {q.queue: q.placed_longest_ms for q in list_queues(state, {}).items} == {
        "default": exact["t1"], "q2": exact["t2"]}
    jsonschema.validate(tenants, schema_of("TenantList"))
    jsonschema.validate(queues, schema_of("QueueList"))


async def test_jobs_say_their_nodes_and_age_and_filter_by_node(api: Api) -> None:
    """``nodes``: where a job's tasks are now (a gang's each once); ``age_ms``: log time since its
    submission; ``node=N``: the jobs with a task on N (a job pending or on other nodes is not)."""
    events = [node("a1", gpus=8, cell="c1"), node("b1", gpus=8, cell="c2"),
              job("one", gpus=8, cells=("c1",)), job("gang", tasks=2, gpus=4, cells=("c2",)),
              job("waits", gpus=8)]
    assert (await api.running.request("/v1/events", events_body(*events)))[0] == 200
    await api.settled(len(events))
    _, page = await api.get("/v1/jobs")
    jsonschema.validate(page, schema_of("JobPage"))
    items = {j["job_id"]: j for j in page["items"]}
    assert (items["one"]["nodes"], items["gang"]["nodes"]) == (["a1"], ["b1"])
    assert "nodes" not in items["waits"]  # (pending: on no node)
    assert all(isinstance(j["age_ms"], int) and j["age_ms"] >= 0 for j in page["items"])
    state = api.running.service.loop.state  # type: ignore[union-attr]
    now = list_jobs(state, {}).items  # (in one go: no tick moves log time between)
    assert [j.age_ms for j in now] == [state.now_ms - j.submitted_at_ms for j in now]
    _, on_b1 = await api.get("/v1/jobs", {"node": "b1"})
    assert ([j["job_id"] for j in on_b1["items"]], on_b1["total"]) == (["gang"], 1)
    _, on_either = await api.get("/v1/jobs", [("node", "a1"), ("node", "b1")])
    assert [j["job_id"] for j in on_either["items"]] == ["one", "gang"]
    _, nowhere = await api.get("/v1/jobs", {"node": "never-seen"})
    assert (nowhere["items"], nowhere["total"]) == ([], 0)


async def test_one_node_in_detail_with_its_labels_taints_topology_and_jobs(api: Api) -> None:
    tainted = msgspec.structs.replace(
        node("gpu/1", gpus=8, cell="c1", rack="r7", block="b2"), labels={"zone": "a"},
        taints=(Taint(key="dedicated", value="ml", effect="NoSchedule"),))
    j1 = job("j1", gpus=4, cells=("c1",))
    j1 = msgspec.structs.replace(j1, task_groups=(msgspec.structs.replace(
        j1.task_groups[0], tolerations=(Toleration(key="dedicated", operator="Exists"),)),))
    events = [tainted, node("gpu/1", gpus=8, cell="c2"), node("x1", gpus=8, cell="c1", healthy=False),
              j1, job("j2", gpus=4, cells=("c2",))]
    assert (await api.running.request("/v1/events", events_body(*events)))[0] == 200
    await api.settled(len(events))
    status, answer = await api.get("/v1/nodes/gpu%2F1")  # two cells have a "gpu/1": which?
    assert (status, answer["code"], answer["field"]) == (400, "ambiguous_node", "cell")
    status, one = await api.get("/v1/nodes/gpu%2F1", {"cell": "c1"})
    assert status == 200, one
    jsonschema.validate(one, schema_of("NodeDetail"))
    assert (one["node"], one["cell"], one["labels"], one["taints"], one["topology"]) == (
        "gpu/1", "c1", {"zone": "a"}, [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}],
        {"block": "b2", "rack": "r7", "host": "gpu/1"})
    assert [(j["job_id"], j["state"], [t["task"] for t in j["tasks"]]) for j in one["jobs"]] == [
        ("j1", "placed", [0])]
    assert (one["jobs"][0]["tasks"][0]["gpu_milli"], one["gpu_free_milli"]) == (4000, 4000)
    assert (one["other_jobs"], one["drained"], one["cordoned"]) == (0, None, False)
    _, listed = await api.get("/v1/nodes", {"cell": "c1"})
    assert listed["items"][0]["taints"] == one["taints"]  # (-o wide shows them: every field)
    status, answer = await api.get("/v1/nodes/nope")
    assert (status, answer["code"]) == (404, "unknown_node")
    status, answer = await api.get("/v1/nodes/x1", {"tenant": "t1"})
    assert (status, answer["code"], answer["field"]) == (400, "unknown_parameter", "tenant")
