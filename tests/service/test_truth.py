"""The running service tells the truth: a job no node shape can ever hold is refused at submit
(422 ``never_fits``, nothing appended), and a preempted job's status says so at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from fleetlog.cli import main
from fleetlog.events.schema import json_schema
from tests.core.builders import job, node
from tests.service.process import REPO, ServiceProcess
from tests.service.test_service import Running, events_body, serving


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[Running]:
    async with serving(tmp_path / "log") as running:
        yield running


async def _folded(running: Running) -> None:
    loop = running.service.loop
    assert loop is not None
    end = await running.inputs_end()
    await running.until(lambda: loop.offset == end)


async def test_a_gang_no_host_can_hold_is_refused_at_submit_once_the_fleet_is_known(running: Running) -> None:
    big = job("big", tasks=16, topology="host")
    status, answer = await running.request("/v1/events", events_body(big))
    assert status == 200, "no node known yet: no judgement (the fleet may still report)"
    status, answer = await running.request("/v1/events", events_body(node("n1"), node("n2")))
    assert status == 200
    await _folded(running)
    before = await running.inputs_end()
    status, answer = await running.request("/v1/events", events_body(job("ok", tasks=8, topology="host"),
                                                                      job("big2", tasks=16, topology="host")))
    assert status == 422, answer
    assert answer["reason"] == "never_fits"
    assert answer["job_id"] == "big2"
    assert answer["error"] == (
        "job 'big2' can never fit on the current fleet: no host can hold "
        "all 16 tasks even when empty (the best holds 8)"
    )
    assert await running.inputs_end() == before, "a refused request appends nothing"
    status, answer = await running.request("/v1/events", events_body(job("ok", tasks=8, topology="host")))
    assert status == 200, "a gang one host can hold is taken"
    await _folded(running)
    status, found = await running.request("/v1/jobs/big")  # the one taken before the fleet was known
    assert status == 200
    assert found["pending_reason"] == "never_fits", found


async def test_a_producer_reporting_a_cluster_may_ask_to_keep_a_never_fitting_job(running: Running) -> None:
    """A backend's pod group is a fact, not a request: with ``fleetlog-never-fits: accept`` the
    service takes it (and explains it as never fitting), as Kubernetes keeps an unschedulable pod."""
    from fleetlog.client import HttpTransport
    from fleetlog.events import envelope
    from fleetlog.log.discovery import ACCEPT_NEVER_FITS

    status, _ = await running.request("/v1/events", events_body(node("n1"), node("n2")))
    assert status == 200
    await _folded(running)
    big = envelope(job("pods", tasks=16, topology="host"), "test-backend")
    plain = HttpTransport("127.0.0.1", running.service.http.port)
    keeping = HttpTransport("127.0.0.1", running.service.http.port, headers=dict([ACCEPT_NEVER_FITS]))
    try:
        with pytest.raises(Exception, match="never fit"):
            await plain.append([big])
        first = await keeping.append([big])
    finally:
        await plain.close()
        await keeping.close()
    assert first == await running.inputs_end() - 1
    await _folded(running)
    status, found = await running.request("/v1/jobs/pods")
    assert (status, found["pending_reason"]) == (200, "never_fits"), found


async def test_submit_through_the_service_reports_never_fits_in_one_line(
    running: Running, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _ = await running.request("/v1/events", events_body(node("n1"), node("n2")))
    assert status == 200
    await _folded(running)
    argv = ["submit", "big", "--log", str(tmp_path / "log"), "--tenant", "t1",
            "--gpus", "1", "--tasks", "16", "--topology", "host"]
    code = await asyncio.to_thread(main, argv)
    err = capsys.readouterr().err
    assert code == 1, err  # a refusal of what the log holds, like sbatch
    assert len(err.strip().splitlines()) == 1
    assert "never fit on the current fleet" in err


async def test_a_preempted_jobs_status_says_so_at_once_in_a_quiet_service(running: Running) -> None:
    status, _ = await running.request("/v1/events", events_body(node("n1"), job("low", gpus=8)))
    assert status == 200
    await _folded(running)
    await running.until(lambda: (running.service.loop is not None
                                 and int(running.service.loop.state.jobs.cols["state"][0]) == 1))
    status, _ = await running.request("/v1/events", events_body(job("high", gpus=8, priority=10)))
    assert status == 200
    await _folded(running)
    status, found = await running.request("/v1/jobs/low")  # no other input arrives
    assert status == 200
    assert (found["state"], found["pending_reason"]) == ("pending", "preempted"), found
    assert found["pending_message"] == "preempted by job high (priority)"
    assert found["requeued"]["by_job_id"] == "high"
    assert "placed_at_ms" not in found


def test_fleetlog_run_takes_the_node_timeout_in_seconds(tmp_path: Path) -> None:
    service = ServiceProcess(tmp_path / "run.log", ["--log", str(tmp_path / "log"), "--node-timeout", "2.5"],
                             {"PYTHONPATH": str(REPO)}).start()
    try:
        service.address()
        (started,) = [x for x in service.lines() if x.get("event") == "service_started"]
        assert started["config"]["service"]["node_timeout_ms"] == 2_500
    finally:
        assert service.stop() == 0, service.tail()


def test_the_schema_tells_producers_to_keep_sending_heartbeats() -> None:
    description = json_schema()["$defs"]["NodeHeartbeat"]["description"]
    assert "Keep sending it, for every node, well within the scheduler's node timeout" in description
    assert "--node-timeout" in description
