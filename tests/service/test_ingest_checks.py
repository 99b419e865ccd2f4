"""The running service's ingest checks what the log already holds: a job id submitted again with
the same spec is an idempotent duplicate (200, nothing appended), with another spec 409
``already_exists``; a cancel of an unknown job 404 ``unknown_job``, of a finished one 409
``already_ended``; a decision 400 ``not_an_input``.  A record the consumer parks is logged, and
``fleetlog status`` of its job says it was refused and where to look."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Final

import msgspec
import pytest

from fleetlog.events import (
    DecisionBatch,
    JobCancelled,
    JobSubmitted,
    TaskFinished,
    TaskGroup,
    TaskStarted,
    encode,
    envelope,
)
from fleetlog.events.codec import CONTENT_TYPE_HEADER, JSON
from fleetlog.log.base import DEAD_LETTERS, INPUTS, Message
from fleetlog.log.file import FileLogStore
from fleetlog.log.kafka import KafkaConfig
from fleetlog.service.config import Config, ServiceSettings
from tests.core.builders import job, node
from tests.service.process import REPO
from tests.service.test_service import Running, embedded, events_body, serving, start


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[Running]:
    async with serving(tmp_path / "log") as running:
        yield running


async def folded(service: Running, offset: int) -> None:
    await service.until(lambda: service.service.loop is not None and service.service.loop.offset >= offset)


async def test_the_same_spec_again_is_idempotent_folded_or_not(service: Running) -> None:
    first = job("j1", gpus=2)
    assert (await service.request("/v1/events", events_body(node("n1"), first)))[0] == 200
    # at once (appended, maybe not folded yet), and again once folded: the same answer
    for _ in range(2):
        status, answer = await service.request("/v1/events", events_body(first))
        assert (status, answer["appended"], answer["duplicates"]) == (200, 0, [{"index": 0, "job_id": "j1"}])
        assert await service.inputs_end() == 2
        await folded(service, 2)
    # a duplicate inside a batch with a new job: only the new one is appended
    status, answer = await service.request("/v1/events", events_body(job("j2"), first, job("j2")))
    assert (status, answer["appended"], answer["first_offset"]) == (200, 1, 2)
    assert answer["duplicates"] == [{"index": 1, "job_id": "j1"}, {"index": 2, "job_id": "j2"}]
    assert await service.inputs_end() == 3


@pytest.mark.parametrize("wait", [False, True], ids=["unfolded", "folded"])
async def test_another_spec_under_an_existing_id_is_refused_409(service: Running, wait: bool) -> None:
    assert (await service.request("/v1/events", events_body(node("n1"), job("j1", gpus=2))))[0] == 200
    if wait:
        await folded(service, 2)
    status, answer = await service.request("/v1/events", events_body(job("j9"), job("j1", gpus=4)))
    assert (status, answer["reason"], answer["job_id"], answer["index"]) == (409, "already_exists", "j1", 1)
    assert "already exists with another spec" in answer["error"]
    assert "tasks: 1x(cpu_milli=1000, mem_mib=1024, gpu_count=2" in answer["error"]
    assert await service.inputs_end() == 2, "nothing of a refused batch is appended"


RACERS: Final = 12
"""Requests of :func:`race`, all from this one client: each may hold a body slot at once (the
per-client share, ``max_concurrent_requests_per_client``, is another test's: test_http)."""


async def race(service: Running) -> None:
    """Requests racing with one job id: one is appended; the others are refused (another spec)
    or told it is a duplicate (the same spec) — never two appended."""
    bodies = [events_body(job("race", priority=p)) for p in range(RACERS - 4)]
    bodies += [events_body(job("race", priority=0))] * 4
    answers = await asyncio.gather(*(service.request("/v1/events", b) for b in bodies))
    appended = [a for status, a in answers if status == 200 and a["appended"] == 1]
    assert len(appended) == 1
    assert await service.inputs_end() == 1
    for status, answer in answers:
        assert (status, answer.get("reason")) in {(200, None), (409, "already_exists")}


async def test_concurrent_submissions_of_one_id_take_one(tmp_path: Path) -> None:
    async with serving(tmp_path / "log", max_concurrent_requests_per_client=RACERS) as running:
        await race(running)


@pytest.mark.kafka
async def test_concurrent_submissions_of_one_id_take_one_on_kafka(kafka_bootstrap: str) -> None:
    """On Kafka an append awaits the broker: the requests really interleave there."""
    kafka = KafkaConfig(bootstrap_servers=kafka_bootstrap, topic_prefix=f"race-{uuid.uuid4().hex[:8]}")
    config = Config(kafka=kafka, service=ServiceSettings(http_port=0, idle_wait_ms=20,
                                                         max_concurrent_requests_per_client=RACERS))
    running = await start(config)
    try:
        await running.until(lambda: running.service.loop is not None, timeout_s=120)
        await race(running)
    finally:
        await running.stop()


async def test_another_spec_twice_in_one_batch_is_refused(service: Running) -> None:
    status, answer = await service.request("/v1/events", events_body(job("j1"), job("j1", priority=3)))
    assert (status, answer["reason"], answer["index"]) == (409, "already_exists", 1)
    assert "priority: 0 -> 3" in answer["error"]
    # another tenant's: a distinct 409 that says nothing of the job that holds the id (issue 46)
    status, answer = await service.request("/v1/events", events_body(job("j1"), job("j1", tenant="t2")))
    assert (status, answer["reason"], answer["index"]) == (409, "job_id_taken", 1)
    assert "t1" not in answer["error"]
    assert await service.inputs_end() == 0


async def test_cancel_unknown_repeated_and_ended_jobs(service: Running) -> None:
    status, answer = await service.request("/v1/events", events_body(JobCancelled(job_id="ghost")))
    assert (status, answer["reason"], answer["job_id"]) == (404, "unknown_job", "ghost")
    assert await service.inputs_end() == 0
    # a job submitted earlier in the same batch can be cancelled in it
    body = events_body(node("n1"), job("a"), JobCancelled(job_id="a"), job("b", gpus=1))
    assert (await service.request("/v1/events", body))[0] == 200
    await folded(service, 4)
    status, answer = await service.request("/v1/events", events_body(JobCancelled(job_id="a")))
    assert (status, answer["appended"], answer["duplicates"]) == (200, 0, [{"index": 0, "job_id": "a"}])
    loop = service.service.loop
    assert loop is not None
    await service.until(lambda: (service.service.loop is not None
                                 and service.service.loop.state.jobs.cols["placed_at_ms"][1] >= 0))
    done = events_body(TaskStarted(job_id="b", task_index=0, node="n1"),
                       TaskFinished(job_id="b", task_index=0))
    assert (await service.request("/v1/events", done))[0] == 200
    await folded(service, 6)
    status, answer = await service.request("/v1/events", events_body(JobCancelled(job_id="b")))
    assert (status, answer["reason"], answer["state"]) == (409, "already_ended", "succeeded")
    assert await service.inputs_end() == 6


async def test_a_retired_job_is_a_duplicate_to_resubmit_ended_to_cancel_and_retired_to_ask(
    tmp_path: Path
) -> None:
    """Once a job retired from the state (docs/retention.md): its submission again is a duplicate
    (nothing appended), a cancel of it 409 ``already_ended`` (state ``retired``), and
    ``GET /v1/jobs/JOB`` 404 with reason ``retired`` rather than ``unknown_job``."""
    async with serving(tmp_path / "log", retain_finished_ms=0, node_timeout_ms=400) as service:
        body = events_body(node("n1"), job("r", gpus=1))
        assert (await service.request("/v1/events", body))[0] == 200
        await service.until(lambda: (service.service.loop is not None
                                     and service.service.loop.state.jobs.cols["placed_at_ms"][0] >= 0))
        done = events_body(TaskStarted(job_id="r", task_index=0, node="n1"),
                           TaskFinished(job_id="r", task_index=0))
        assert (await service.request("/v1/events", done))[0] == 200
        for _ in range(50):  # heartbeats move log time past a sweep (every 100 ms here)
            await asyncio.sleep(0.05)
            assert (await service.request("/v1/events", events_body(node("n1"))))[0] == 200
            loop = service.service.loop
            if loop is not None and "r" in loop.state.retired:
                break
        loop = service.service.loop
        assert loop is not None
        assert "r" in loop.state.retired
        end = await service.inputs_end()
        status, answer = await service.request("/v1/events", events_body(job("r", gpus=1)))
        assert (status, answer["appended"], answer["duplicates"]) == (200, 0, [{"index": 0, "job_id": "r"}])
        status, answer = await service.request("/v1/events", events_body(JobCancelled(job_id="r")))
        assert (status, answer["reason"], answer["state"]) == (409, "already_ended", "retired")
        assert await service.inputs_end() == end
        status, answer = await service.request("/v1/jobs/r")
        assert (status, answer["reason"]) == (404, "retired")


async def test_a_decision_is_refused_400_and_nothing_appended(service: Running) -> None:
    decision = encode(envelope(DecisionBatch(as_of=0, digest=""), "intruder"), "json")
    for body in (decision, b"[" + encode(envelope(node("n1"), "t"), "json") + b"," + decision + b"]"):
        status, answer = await service.request("/v1/events", body)
        assert (status, answer["reason"]) == (400, "not_an_input")
        assert "DecisionBatch is a decision, not an input" in answer["error"]
    assert await service.inputs_end() == 0


def test_the_folded_spec_is_the_events_spec() -> None:
    """What ingest compares: the spec folded into the state (:func:`folded_spec`) equals the
    submitted event's (:func:`submission_spec`), however its tasks were grouped."""
    from fleetlog.core.fold import fold
    from fleetlog.core.state import State
    from fleetlog.core.views import as_folded, folded_spec
    from fleetlog.events.spec import same_submission, submission_spec

    def half(count: int, *models: str) -> TaskGroup:
        return TaskGroup(count=count, cpu_milli=1, mem_mib=2, gpu_count=1, gpu_milli=500, gpu_models=models)

    groups = (half(2, "B", "A", "A"), half(1, "A", "B"),
              TaskGroup(count=1, cpu_milli=3, mem_mib=2))
    first = JobSubmitted(job_id="x", tenant="t", task_groups=groups, allowed_cells=("c2", "c1", "c2"),
                         required_topology="rack", expected_duration_ms=5, priority=3, queue="q")
    regrouped = JobSubmitted(job_id="x", tenant="t", task_groups=(
        half(3, "A", "B"),
        TaskGroup(count=1, cpu_milli=3, mem_mib=2, name="other")), allowed_cells=("c1", "c2"),
        required_topology="rack", expected_duration_ms=5, priority=3, queue="q")
    state = State()
    fold(state, first, 1000)
    assert folded_spec(state, "x") == as_folded(state, submission_spec(first)) == submission_spec(regrouped)
    assert same_submission(first, regrouped)
    assert not same_submission(first, JobSubmitted(job_id="x", tenant="t", task_groups=groups[:2]))
    assert folded_spec(state, "y") is None


def test_the_folded_spec_keeps_constraints_and_drops_a_cpu_tasks_models() -> None:
    """A resend of a constrained job, or of a CPU task that names GPU models (which constrain
    nothing), is the same submission as folded, not a changed one; a changed constraint is not."""
    from fleetlog.core.fold import fold
    from fleetlog.core.state import State
    from fleetlog.core.views import as_folded, folded_spec
    from fleetlog.events import NodeLabel, NodeSelectorRequirement, NodeSelectorTerm, Toleration
    from fleetlog.events.spec import submission_spec

    term = NodeSelectorTerm(match_expressions=(NodeSelectorRequirement(key="zone", operator="In",
                                                                       values=("b", "a")),))
    gpu = TaskGroup(count=2, cpu_milli=1, mem_mib=2, gpu_count=1, gpu_milli=1000, gpu_models=("H100",),
                    node_selector=(NodeLabel(key="rack", value="r1"),), node_affinity=(term,),
                    tolerations=(Toleration(key="nvidia.com/gpu", operator="Exists"),))
    cpu = TaskGroup(count=1, cpu_milli=3, mem_mib=2, gpu_models=("A100", "H100"))
    event = JobSubmitted(job_id="x", tenant="t", task_groups=(gpu, cpu))
    state = State()
    fold(state, event, 1000)
    assert folded_spec(state, "x") == as_folded(state, submission_spec(event))
    moved = JobSubmitted(job_id="x", tenant="t", task_groups=(
        msgspec.structs.replace(gpu, tolerations=()), cpu))
    assert folded_spec(state, "x") != as_folded(state, submission_spec(moved))


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def fleetlog(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleetlog.cli", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=300, check=False)


async def test_a_parked_record_is_logged_and_status_says_the_job_was_refused(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    bad = {"schema_version": 1, "producer_id": "p", "key": "submit/half",
           "event": {"type": "JobSubmitted", "job_id": "half", "tenant": "t", "task_groups": [
               {"count": 1, "cpu_milli": 1, "mem_mib": 1, "gpu_count": 2, "gpu_milli": 500}]}}
    async with FileLogStore(directory) as store:  # another way into the log than ingest
        await store.log(INPUTS).append([Message(json.dumps(bad).encode(), key=b"submit/half",
                                                headers=((CONTENT_TYPE_HEADER, JSON),))])
    lines = Lines()
    logging.getLogger("fleetlog.dead_letters").addHandler(lines)
    try:
        running = await start(embedded(directory))
        try:
            await running.until(lambda: running.service.loop is not None and running.service.loop.offset == 1)
            assert running.service.store is not None
            await running.until(lambda: bool(lines.lines))
            assert await running.service.store.log(DEAD_LETTERS).end_offset() == 1
        finally:
            await running.stop()
    finally:
        logging.getLogger("fleetlog.dead_letters").removeHandler(lines)
    assert len(lines.lines) == 1
    assert lines.lines[0].startswith("dead-lettered inputs@0 key 'submit/half' to the dead-letters log "
                                     "(invalid_event): invalid JobSubmitted: a task with several GPUs")
    result = await asyncio.to_thread(fleetlog, "status", "half", "--log", str(directory))
    assert result.returncode == 2
    assert result.stderr.startswith("fleetlog status: error: job 'half' was refused: its record inputs@0 is "
                                    "in the dead-letter log at offset 0 (invalid_event: invalid JobSubmitted")
    assert "fleetlog replay dump --from-log dead-letters --start 0" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    result = await asyncio.to_thread(fleetlog, "status", "ghost", "--log", str(directory))
    assert "unknown job 'ghost'" in result.stderr
