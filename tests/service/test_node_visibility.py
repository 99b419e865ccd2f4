"""``GET /v1/nodes/NODE`` and ``GET /v1/jobs?node=`` as each principal may read them (issue 47, with
issue 46's rules): a tenant sees its own jobs on a node and only a count of the others; the
node's backend and node agent, an operator and a reader see every job on it."""

from __future__ import annotations

import json

from tests.service.test_read_visibility import BOB_KEY, fleet, get
from tests.service.test_service import Running

__all__ = ["fleet"]  # (the fixture: alice's a1 on n1 in c1, bob's b1 on n2 in c2)


async def test_a_tenant_sees_its_jobs_on_a_node_and_only_a_count_of_the_others(fleet: Running) -> None:
    status, seen = await get(fleet, "alice", "/v1/nodes/n2")
    assert status == 200, seen
    assert (seen["node"], seen["jobs"], seen["other_jobs"], seen["other_tasks"]) == ("n2", [], 1, 1)
    assert "b1" not in json.dumps(seen)
    assert BOB_KEY not in json.dumps(seen)
    assert seen["gpu_free_milli"] == 7000  # (that n2 is busy shows anyway: its free GPUs)
    status, own = await get(fleet, "bob", "/v1/nodes/n2")
    assert [j["job_id"] for j in own["jobs"]] == ["b1"]
    assert (own["jobs"][0]["tenant"], own["other_jobs"]) == ("b", 0)
    for who in ("agent2", "ops", "reader"):  # (n2's cell's backend; an operator; a reader)
        status, whole = await get(fleet, who, "/v1/nodes/n2")
        assert (status, [j["job_id"] for j in whole["jobs"]], whole["other_jobs"]) == (200, ["b1"], 0), who
    _, agent = await get(fleet, "agent1", "/v1/nodes/n2")  # (c1's node agent: not c2's jobs)
    assert (agent["jobs"], agent["other_jobs"]) == ([], 1)
    status, mine = await get(fleet, "alice", "/v1/nodes/n1")
    assert ([j["job_id"] for j in mine["jobs"]], mine["other_jobs"]) == (["a1"], 0)
    _, by_node = await get(fleet, "alice", "/v1/jobs?node=n2")
    assert by_node == {"items": [], "total": 0, "next_page_token": None}
    _, by_node = await get(fleet, "bob", "/v1/jobs?node=n2")
    assert [j["job_id"] for j in by_node["items"]] == ["b1"]
