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

from fleetlog.api.routes import ROUTES, openapi
from fleetlog.core.views import jobs_table
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
    assert (by_tenant["t1"]["running"], by_tenant["t1"]["pending"]) == (2, 3)
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
