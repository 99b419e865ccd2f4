"""``fleetlog_step_seconds`` measures a step's work, never its idle wait for input (issue 15): an
idle service waits ``idle_wait_ms`` in each step and must report steps far shorter than that.
``fleetlog_decide_step_seconds`` (issue 21) counts only the steps that folded input and decided:
an idle loop's empty polls do not dilute its quantiles."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from fleetlog.service.config import Config, LogConfig, ServiceSettings
from tests.core.builders import job, node
from tests.service.test_service import Running, events_body, start

IDLE_WAIT_MS = 200
DECIDE = "fleetlog_decide_step_seconds"


async def step_histogram(running: Running, name: str = "fleetlog_step_seconds") -> tuple[int, float]:
    """(count, sum in seconds) of histogram ``name`` as ``/metrics`` serves it."""
    status, body = await running.request("/metrics")
    assert status == 200
    text = body.decode()
    count = re.search(rf"^{name}_count (\S+)$", text, re.M)
    total = re.search(rf"^{name}_sum (\S+)$", text, re.M)
    assert count is not None, text
    assert total is not None, text
    return int(float(count.group(1))), float(total.group(1))


async def test_an_idle_service_reports_steps_far_below_its_poll_wait_and_a_busy_one_nonzero(
    tmp_path: Path,
) -> None:
    config = Config(
        log=LogConfig(dir=str(tmp_path / "log"), fsync="never"),
        service=ServiceSettings(http_port=0, idle_wait_ms=IDLE_WAIT_MS),
    )
    running = await start(config)
    try:
        await asyncio.sleep(2.0)  # ~10 idle steps, each waiting 200 ms for input
        idle_count, idle_sum = await step_histogram(running)
        assert idle_count >= 4
        assert idle_sum / idle_count < IDLE_WAIT_MS / 1000 / 20  # the wait (200 ms) is not counted
        assert await step_histogram(running, DECIDE) == (0, 0.0)  # nothing was decided

        body = events_body(*[node(f"n{i}") for i in range(4)], *[job(f"j{i}", gpus=2) for i in range(40)])
        assert (await running.request("/v1/events", body))[0] == 200
        loop = running.service.loop
        assert loop is not None
        await running.until(lambda: loop.offset == 44)
        await asyncio.sleep(0.5)
        busy_count, busy_sum = await step_histogram(running)
        assert busy_count > idle_count
        assert busy_sum - idle_sum > 1e-4  # the step that folded, decided and published did measurable work
        decided, decide_sum = await step_histogram(running, DECIDE)
        assert 1 <= decided < busy_count - idle_count  # the empty polls since are not counted
        assert decide_sum == pytest.approx(busy_sum - idle_sum, rel=0.5)  # nearly all the work was deciding
    finally:
        await running.stop()
