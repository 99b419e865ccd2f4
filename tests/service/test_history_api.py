"""``GET /v1/history``: ``fleetlog history``'s accounting records through the HTTP API, served by
``fleetlog replay serve`` (a real child process over a real log) — the same records, fields and
order as the command prints, the same filters, paged without repeats; a bad parameter is a 400
naming it; the live service refuses it (404 ``not_served``: it would fold the whole log on its
decision loop); ``/v1/openapi.json`` describes it; ``SyncReader.history`` follows its pages."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import jsonschema
import msgspec
import pytest

from fleetlog.api.detail import JobDetail
from fleetlog.api.history import ENDED, HISTORY_PARAMS, Finished, history_query
from fleetlog.api.resources import ApiError
from fleetlog.api.routes import openapi
from fleetlog.log.base import INPUTS, Shard
from fleetlog.log.file import FileLogStore
from fleetlog.reader import ReaderError, SyncReader
from fleetlog.replay.shards import open_shard
from fleetlog.replay_serve import LogApi, _log_time_ms
from fleetlog.service.http import HttpServer
from tests.replay.test_history import ROUNDS, at, listed, write_log
from tests.service.process import REPO
from tests.service.test_service import serving


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/replay/test_history.py's timeline: 13 jobs end (every way one can), one still runs."""
    directory = tmp_path_factory.mktemp("history_api") / "log"
    asyncio.run(write_log(directory))
    return directory


@pytest.fixture(scope="module")
def url(log_dir: Path) -> Iterator[str]:
    """``fleetlog replay serve`` of the log, a child process on 127.0.0.1, any free port."""
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fleetlog.cli",
            "replay",
            "serve",
            "--log",
            str(log_dir),
            "--json",
            "--http-host",
            "127.0.0.1",
            "--http-port",
            "0",
        ],
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line, child.stderr.read().decode() if child.stderr else ""
        yield json.loads(line)["serving"]
        child.send_signal(signal.SIGINT)
        assert child.wait(60) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def get(
    url: str, path: str, params: list[tuple[str, str]] | dict[str, str] | None = None
) -> tuple[int, Any, dict[str, str]]:
    """(status, the JSON answer, headers) of one GET."""
    query = urllib.parse.urlencode(params or {})
    try:
        with urllib.request.urlopen(url + path + (f"?{query}" if query else ""), timeout=60) as r:
            return r.status, json.loads(r.read()), dict(r.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), dict(exc.headers)


def schema_of(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}", "components": openapi()["components"]}


def inputs_end(log_dir: Path) -> int:
    async def end() -> int:
        store = FileLogStore(log_dir, read_only=True)
        await store.open()
        try:
            return await store.log(INPUTS).end_offset()
        finally:
            await store.close()

    return asyncio.run(end())


def test_the_api_answers_what_the_command_prints(
    capsys: pytest.CaptureFixture[str], url: str, log_dir: Path
) -> None:
    printed = listed(capsys, log_dir)
    assert len(printed) == 13
    status, page, headers = get(url, "/v1/history")
    assert status == 200, page
    assert page == {"items": printed, "total": 13, "next_page_token": None}  # every field, in end order
    assert headers["Fleetlog-Offset"] == str(inputs_end(log_dir))
    jsonschema.validate(page, schema_of("HistoryPage"))


@pytest.mark.parametrize(
    ("argv", "params"),
    [
        (["--tenant", "t2"], [("tenant", "t2")]),
        (["--tenant", "t2", "--tenant", "t1"], [("tenant", "t2"), ("tenant", "t1")]),
        (["--queue", "train", "--queue", "batch"], [("queue", "train"), ("queue", "batch")]),
        (["--state", "failed"], [("state", "failed")]),
        (
            ["--state", "cancelled", "--state", "rejected", "--tenant", "t2"],
            [("state", "cancelled"), ("state", "rejected"), ("tenant", "t2")],
        ),
        (["--since", "2026-01-01T00:00:40Z"], [("since", "2026-01-01T00:00:40Z")]),
        (
            ["--since", f"{at(40)}ms", "--until", "2026-01-01T00:01:25"],
            [("since", f"{at(40)}ms"), ("until", "2026-01-01T00:01:25")],
        ),
        (["--until", f"{at(40) + 1}ms"], [("until", f"{at(40) + 1}ms")]),
        (["--tenant", "nobody"], [("tenant", "nobody")]),
    ],
)
def test_the_filters_keep_what_the_commands_keep(
    capsys: pytest.CaptureFixture[str],
    url: str,
    log_dir: Path,
    argv: list[str],
    params: list[tuple[str, str]],
) -> None:
    printed = listed(capsys, log_dir, *argv)
    status, page, _ = get(url, "/v1/history", params)
    assert status == 200, page
    assert (page["items"], page["total"]) == (printed, len(printed))


def test_paging_one_at_a_time_walks_every_record_once_in_order(url: str) -> None:
    _, everything, _ = get(url, "/v1/history")
    seen: list[dict[str, Any]] = []
    token: str | None = None
    while True:
        status, page, _ = get(url, "/v1/history", {"limit": "1", **({"page_token": token} if token else {})})
        assert status == 200, page
        assert len(page["items"]) == 1
        assert page["total"] == everything["total"]
        seen += page["items"]
        token = page["next_page_token"]
        if token is None:
            break
        assert len(seen) < everything["total"]  # (no page past the last)
    assert seen == everything["items"]
    assert len({r["job_id"] for r in seen}) == len(seen)
    status, page, _ = get(url, "/v1/history", [("tenant", "t2"), ("limit", "2")])  # filters and pages
    assert (page["total"], [r["job_id"] for r in page["items"]]) == (5, ["reject", "gangfail"])
    status, rest, _ = get(
        url, "/v1/history", [("tenant", "t2"), ("limit", "2"), ("page_token", page["next_page_token"])]
    )
    assert [r["job_id"] for r in rest["items"]] == ["cancelrun", "cancelwait"]


@pytest.mark.parametrize(
    ("params", "field", "code"),
    [
        ({"state": "running"}, "state", "invalid_value"),  # (not an end state)
        ({"state": "bogus"}, "state", "invalid_value"),
        ({"limit": "0"}, "limit", "invalid_value"),
        ({"limit": "10001"}, "limit", "invalid_value"),
        ({"limit": "x"}, "limit", "invalid_value"),
        ({"page_token": "nope"}, "page_token", "invalid_value"),
        ({"since": "soon"}, "since", "invalid_value"),
        ({"until": "12"}, "until", "invalid_value"),  # (an offset: history takes a log time)
        ({"at": "3"}, "at", "unknown_parameter"),
        ({"tenants": "t1"}, "tenants", "unknown_parameter"),
    ],
)
def test_a_bad_parameter_is_a_400_naming_it(url: str, params: dict[str, str], field: str, code: str) -> None:
    status, answer, _ = get(url, "/v1/history", params)
    assert status == 400
    jsonschema.validate(answer, schema_of("Error"))
    assert (answer["code"], answer["field"]) == (code, field)
    assert field in answer["message"]


def test_a_repeated_single_parameter_is_a_400(url: str) -> None:
    for name, value in (("since", f"{at(0)}ms"), ("limit", "5")):
        status, answer, _ = get(url, "/v1/history", [(name, value), (name, value)])
        assert (status, answer["field"]) == (400, name)


async def test_the_live_service_does_not_serve_it(tmp_path: Path) -> None:
    async with serving(tmp_path / "log") as running, aiohttp.ClientSession() as session:
        async with session.get(running.url + "/v1/history", params={"tenant": "t1"}) as r:
            answer = await r.json()
            assert (r.status, answer["code"]) == (404, "not_served")
        jsonschema.validate(answer, schema_of("Error"))
        assert "replay serve" in answer["message"]
        assert "fleetlog history" in answer["message"]
        assert "whole log" in answer["message"]


def test_the_openapi_describes_it(url: str) -> None:
    status, spec, _ = get(url, "/v1/openapi.json")
    assert status == 200
    operation = spec["paths"]["/v1/history"]["get"]
    params = {p["name"]: p for p in operation["parameters"]}
    assert tuple(params) == HISTORY_PARAMS
    assert params["state"]["schema"] == {"type": "array", "items": {"type": "string", "enum": list(ENDED)}}
    assert params["limit"]["schema"] == {"type": "integer"}
    assert params["since"]["schema"] == params["until"]["schema"] == {"type": "string"}
    ok = operation["responses"]["200"]["content"]["application/json"]["schema"]
    assert ok == {"$ref": "#/components/schemas/HistoryPage"}
    items = spec["components"]["schemas"]["HistoryPage"]["properties"]["items"]
    assert items == {"type": "array", "items": {"$ref": "#/components/schemas/Finished"}}
    assert set(spec["components"]["schemas"]["Finished"]["properties"]) == set(Finished.__struct_fields__)


def test_the_sync_reader_follows_the_pages(
    capsys: pytest.CaptureFixture[str], url: str, log_dir: Path
) -> None:
    with SyncReader(url) as api:
        everything = api.history()
        assert all(isinstance(r, Finished) for r in everything)
        assert [msgspec.to_builtins(r) for r in everything] == listed(capsys, log_dir)
        chosen = api.history(tenant="t2", state=["cancelled", "rejected"])
        assert [r.job_id for r in chosen] == ["reject", "cancelrun", "cancelwait"]
        since = api.history(since=at(40), until="2026-01-01T00:01:25Z")  # (an int: epoch milliseconds)
        assert [r.job_id for r in since] == [
            r["job_id"]
            for r in listed(capsys, log_dir, "--since", f"{at(40)}ms", "--until", "2026-01-01T00:01:25Z")
        ]
        assert [r.job_id for r in api.history(limit=3)] == ["reject", "exit3", "nostart"]
        with pytest.raises(ReaderError) as refused:
            api.history(state="running")
        assert (refused.value.status, refused.value.field) == (400, "state")
        still = api.job("still")  # typed: the API's own JobDetail
        assert isinstance(still, JobDetail)
        assert (still.job_id, still.state, still.tenant) == ("still", "running", "t1")
        with pytest.raises(ReaderError) as unknown:
            api.job("nope")
        assert (unknown.value.status, unknown.value.code) == (404, "unknown_job")


def test_the_query_is_checked_before_any_fold() -> None:
    query = history_query(
        {
            "tenant": ["a", "b"],
            "state": ["failed"],
            "since": ["2026-01-01T00:00:00Z"],
            "limit": ["7"],
            "page_token": ["14"],
        },
        _log_time_ms,
    )
    assert (query.tenants, query.states, query.since_ms, query.until_ms) == (
        frozenset({"a", "b"}),
        frozenset({"failed"}),
        at(0),
        None,
    )
    assert (query.start, query.limit) == (14, 7)
    assert history_query({}, _log_time_ms).limit == 1000
    with pytest.raises(ApiError) as refused:
        history_query({"since": ["1700000000000"]}, _log_time_ms)  # (digits alone: an offset)
    assert (refused.value.field, refused.value.status) == ("since", 400)
    assert "is an offset" in refused.value.message


async def test_paging_folds_once_per_end_offset_and_filters(tmp_path: Path) -> None:
    """The records of one (end offset, filters) are kept: every page of them is cut from one
    fold; other filters, or a log that grew, fold again."""
    log = tmp_path / "log"
    await write_log(log, ROUNDS[:8])  # (up to 40 s: cancelrun and cancelwait just ended)
    source = await open_shard(log, Shard.SINGLE, None, True)
    try:
        api = LogApi(source)
        everything = history_query({}, _log_time_ms)
        end, first = await api.records(everything)
        again = await api.records(history_query({"limit": ["1"], "page_token": ["3"]}, _log_time_ms))
        assert again[1] is first  # (the same list: no second fold)
        t2 = await api.records(history_query({"tenant": ["t2"]}, _log_time_ms))
        assert [r.job_id for r in t2[1]] == ["reject", "gangfail", "cancelrun", "cancelwait"]
        _, refolded = await api.records(everything)
        assert refolded is not first
        assert refolded == first
        assert [r.job_id for r in first][-2:] == ["cancelrun", "cancelwait"]
        await write_log(log, ROUNDS[8:])  # the log grows: the rest of the timeline
        grown_end, grown = await api.records(everything)
        assert grown_end > end
        assert grown[: len(first)] == first
        assert len(grown) == 13
        server = HttpServer(LogApi(source, sharded=True).handle)  # one shard of a [cells] deployment
        await server.start()
        try:
            async with (
                aiohttp.ClientSession() as session,
                session.get(f"http://127.0.0.1:{server.port}/v1/history") as r,
            ):
                answer = await r.json()
                assert (r.status, answer["code"]) == (404, "not_served")
                assert "[cells] map" in answer["message"]
        finally:
            await server.stop()
    finally:
        await source.close()
