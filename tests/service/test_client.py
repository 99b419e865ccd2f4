"""The producer client on every log store, through a running service's ingest endpoint, and a
JSON producer written in Java on a real broker."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import jsonschema
import pytest

from fleetlog.client import Client, ClientError, envelope_from_json, key_of, running_service
from fleetlog.core.policy import Policy
from fleetlog.events import (
    DecisionBatch,
    Envelope,
    JobCancelled,
    JobPlaced,
    JobSubmitted,
    NodeHeartbeat,
    NodeRemoved,
    QuotaSet,
    Resources,
    TaskFailed,
    TaskFinished,
    TaskGroup,
    TaskStarted,
    decode,
    encode,
    envelope,
)
from fleetlog.events.codec import CONTENT_TYPE_HEADER, MSGPACK
from fleetlog.events.model import MAX_TASKS_PER_JOB
from fleetlog.events.schema import json_schema
from fleetlog.log.base import DECISIONS, INPUTS, LogStore, Record
from fleetlog.log.consumer import EventConsumer, decision_batches
from fleetlog.log.file import FileLogStore
from fleetlog.log.kafka import KafkaConfig, KafkaLogStore
from fleetlog.service.config import load_config
from fleetlog.service.loop import SchedulerLoop
from tests.kafka_broker import REPO, free_port
from tests.service.ingest_server import SERVICE_FILE, IngestService

GPU8 = TaskGroup(count=2, cpu_milli=8000, mem_mib=32_768, gpu_count=8, gpu_milli=1000)
NODE = NodeHeartbeat(
    cell="c1",
    node="n1",
    cpu_milli=96_000,
    mem_mib=1 << 20,
    gpu_count=8,
    gpu_model="A100",
    topology=("b1", "r1", "n1"),
)


async def inputs(store: LogStore) -> list[Record]:
    return await store.log(INPUTS).read(0, 1000, timeout_ms=2000)


def envelopes(records: list[Record]) -> list[Envelope]:
    return [decode(r.value, r.header(CONTENT_TYPE_HEADER)) for r in records]


# -- on every store ------------------------------------------------------------------------------


async def test_submit_builds_a_checked_keyed_envelope(store: LogStore) -> None:
    client = Client(store, producer_id="billing")
    offset = await client.submit(
        "train-1", "vision", [GPU8], queue="gpu", priority=7, required_topology="rack", spread="host"
    )
    (record,) = await inputs(store)
    assert record.offset == offset
    assert record.header(CONTENT_TYPE_HEADER) == MSGPACK
    assert record.key == b"submit/train-1"
    expected = JobSubmitted(
        job_id="train-1",
        tenant="vision",
        task_groups=(GPU8,),
        queue="gpu",
        priority=7,
        required_topology="rack",
        spread="host",
    )
    assert decode(record.value) == envelope(expected, "billing", "submit/train-1")


async def test_every_kind_of_event_gets_a_content_key(store: LogStore) -> None:
    client = Client(store)
    quota = QuotaSet(tenant="vision", nominal=Resources(gpu_milli=16_000))
    await client.submit(JobSubmitted(job_id="j", tenant="t", task_groups=(GPU8,)))
    await client.cancel("j", "user asked")
    await client.heartbeat(NODE, seq=41)
    await client.heartbeat(NODE)
    await client.quota(quota)
    got = envelopes(await inputs(store))
    assert [e.key for e in got] == [
        "submit/j",
        "cancel/j",
        "heartbeat/c1/n1/41",
        key_of(NODE),
        key_of(quota),
    ]
    assert key_of(NODE).startswith("heartbeat/c1/n1/")
    assert key_of(quota).startswith("quota/vision/*/")
    assert got[1].event == JobCancelled(job_id="j", reason="user asked")
    assert {e.producer_id for e in got} == {"fleetlog-client"}


async def test_send_appends_a_batch_in_order(store: LogStore) -> None:
    client = Client(store)
    events = [
        NODE,
        JobSubmitted(job_id="a", tenant="t", task_groups=(GPU8,)),
        TaskFinished(job_id="a", task_index=0),
    ]
    first = await client.send(events)
    records = await inputs(store)
    assert records[0].offset == first
    assert [e.event for e in envelopes(records)] == events
    assert [e.key for e in envelopes(records)][2] == "finished/a/0"


async def test_a_bad_event_in_a_batch_sends_nothing(store: LogStore) -> None:
    client = Client(store)
    bad = JobSubmitted(job_id="b", tenant="t", task_groups=(TaskGroup(count=1, cpu_milli=-1, mem_mib=1),))
    with pytest.raises(ClientError) as caught:
        await client.send([NODE, bad])
    assert caught.value.reason == "invalid_event"
    assert "$.event.task_groups[0].cpu_milli" in str(caught.value)
    assert await store.log(INPUTS).end_offset() == 0


# -- bad input: each case names what was wrong, nothing is appended ------------------------------

BAD_SUBMITS = [
    ({"job_id": "", "tenant": "t", "task_groups": (GPU8,)}, "invalid_event", "$.event.job_id"),
    ({"job_id": "j", "tenant": "t", "task_groups": ()}, "invalid_event", "$.event.task_groups"),
    (
        {"job_id": "j", "tenant": "t", "task_groups": (GPU8,), "priority": -1},
        "invalid_event",
        "$.event.priority",
    ),
    ({"job_id": "j", "tenant": "t", "task_groups": (GPU8,), "queue": 5}, "invalid_event", "$.event.queue"),
    ({"job_id": "j", "tenant": None, "task_groups": (GPU8,)}, "invalid_event", "submit needs a tenant"),
    (
        {"job_id": "j", "tenant": "t", "task_groups": (GPU8,), "required_topology": "zone"},
        "invalid_event",
        "$.event.required_topology",
    ),
    (
        {"job_id": "j", "tenant": "t", "task_groups": (TaskGroup(count=6_000, cpu_milli=1, mem_mib=1),) * 2},
        "invalid_event",
        f"at most {MAX_TASKS_PER_JOB} tasks, not 12000",
    ),
]


@pytest.mark.parametrize(("fields", "reason", "says"), BAD_SUBMITS)
async def test_bad_submissions_are_refused_before_sending(
    tmp_path: Path, fields: dict[str, object], reason: str, says: str
) -> None:
    async with FileLogStore(tmp_path / "log") as store:
        client = Client(store)
        job_id = fields.pop("job_id")
        with pytest.raises(ClientError) as caught:
            await client.submit(job_id, **fields)  # type: ignore[arg-type]
        assert caught.value.reason == reason
        assert says in str(caught.value)
        assert await store.log(INPUTS).end_offset() == 0


async def test_decisions_unknown_versions_and_unencodable_values_are_refused(tmp_path: Path) -> None:
    async with FileLogStore(tmp_path / "log") as store:
        client = Client(store)
        with pytest.raises(ClientError, match="decision, not an input") as decision:
            await client.send([DecisionBatch(as_of=0, digest="")])  # type: ignore[list-item]
        assert decision.value.reason == "invalid_event"
        future = Envelope(schema_version=2, producer_id="p", event=NODE)
        with pytest.raises(ClientError) as version:
            await client.send([future])
        assert version.value.reason == "unsupported_schema_version"
        odd = NodeHeartbeat(cell="c", node="n", cpu_milli=1, mem_mib=1, labels={"a": object()})  # type: ignore[dict-item]
        with pytest.raises(ClientError, match="cannot encode NodeHeartbeat"):
            await client.heartbeat(odd)
        with pytest.raises(ClientError, match="nothing to send"):
            await client.send([])
        assert await store.log(INPUTS).end_offset() == 0


def test_keys_are_stable_and_bounded() -> None:
    long_id = "j" * 253
    job = JobSubmitted(job_id=long_id, tenant="t", task_groups=(GPU8,))
    key = key_of(job)
    assert len(key) == 253
    assert key == key_of(JobSubmitted(job_id=long_id, tenant="other", task_groups=(GPU8,)))
    assert key != key_of(JobSubmitted(job_id=long_id[:-1] + "k", tenant="t", task_groups=(GPU8,)))
    assert key_of(NODE) == key_of(NodeHeartbeat(**{f: getattr(NODE, f) for f in NODE.__struct_fields__}))
    assert key_of(NODE) != key_of(NodeHeartbeat(cell="c1", node="n1", cpu_milli=1, mem_mib=1))
    assert key_of(TaskStarted(job_id="j", task_index=3, node="n1"), seq=2) == "started/j/3/2"
    assert key_of(TaskFailed(job_id="j", task_index=3), seq=1) == "failed/j/3/1"
    assert key_of(NodeRemoved(cell="c1", node="n1")).startswith("removed/c1/n1/")
    assert key_of(TaskFinished(job_id="j", task_index=3)) == "finished/j/3"


async def test_a_retried_submission_is_a_counted_no_op_in_the_fold(tmp_path: Path) -> None:
    async with FileLogStore(tmp_path / "log") as store:
        client = Client(store)
        await client.heartbeat(NODE, seq=1)
        one = TaskGroup(count=1, cpu_milli=8000, mem_mib=32_768, gpu_count=8, gpu_milli=1000)
        await client.submit("train-2", "vision", [one])
        await client.submit("train-2", "vision", [one])  # the retry after a timeout: same key
        keys = [e.key for e in envelopes(await inputs(store))]
        assert keys.count("submit/train-2") == 2
        loop = SchedulerLoop(store, Policy())
        await loop.step()
        assert loop.state.duplicates == 1
        placed = [
            d
            for _, b in decision_batches(await store.log(DECISIONS).read(0))
            for d in b.decisions
            if isinstance(d, JobPlaced)
        ]
        assert [p.job_id for p in placed] == ["train-2"]


def test_json_from_a_file_is_a_bare_event_or_a_full_envelope() -> None:
    bare = b'{"job_id": "j", "tenant": "t", "task_groups": [{"count": 1, "cpu_milli": 1, "mem_mib": 1}]}'
    env = envelope_from_json(bare, "cli", default_type="JobSubmitted")
    assert env.producer_id == "cli"
    assert env.key == "submit/j"
    assert isinstance(env.event, JobSubmitted)
    full = encode(envelope(JobCancelled(job_id="j"), "go-svc", "my-key"), "json")
    assert envelope_from_json(full, "cli") == envelope(JobCancelled(job_id="j"), "go-svc", "my-key")
    for text, reason, says in [
        (b"{nope", "undecodable", "not valid JSON"),
        (b"[1, 2]", "invalid_event", "expected a JSON object, got list"),
        (
            bare.replace(b'{"job_id"', b'{"type": "JobSubmitted", "job_id"').replace(b": 1,", b': "1",'),
            "invalid_event",
            "$.event.task_groups[0].count",
        ),
        (b'{"type": "JobTeleported", "job_id": "j"}', "unknown_event_type", "JobTeleported"),
        (b'{"schema_version": 9, "producer_id": "p", "event": {}}', "unsupported_schema_version", "9"),
        (bare, "invalid_event", "no string `type`"),
    ]:
        with pytest.raises(ClientError) as caught:
            envelope_from_json(text, "cli")
        assert caught.value.reason == reason
        assert says in str(caught.value)


# -- embedded mode: the running service holds the file log --------------------------------------


async def test_while_the_service_runs_the_client_posts_to_it(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    with IngestService(directory) as service:
        config = load_config(None, {}, log_dir=str(directory))
        assert running_service(directory) == ("127.0.0.1", service.port)
        async with await Client.connect(config) as client:
            assert client.describe() == f"the running service at http://127.0.0.1:{service.port}/v1/events"
            first = await client.send([NODE, JobSubmitted(job_id="h", tenant="t", task_groups=(GPU8,))])
            assert await client.cancel("h") == first + 2
            with pytest.raises(ClientError) as refused:
                await client.send([Envelope(schema_version=1, producer_id="p", event=NODE, key="x" * 300)])
            assert refused.value.reason == "invalid_event"
        assert service.requests == [200, 200]  # the bad one never left the client
    async with FileLogStore(directory, read_only=True) as store:
        got = envelopes(await inputs(store))
    assert [e.key for e in got] == [key_of(NODE), "submit/h", "cancel/h"]


async def test_the_services_own_refusal_is_reported_with_its_reason(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    with IngestService(directory) as service:
        async with await Client.connect(load_config(None, {}, log_dir=str(directory))) as client:
            transport = client.transport
            with pytest.raises(ClientError) as caught:
                # bypass the client's own check: what the service answers for an event it refuses
                await transport.append([Envelope(schema_version=3, producer_id="p", event=NODE)])
        assert caught.value.reason == "unsupported_schema_version"
        assert "HTTP 400" in str(caught.value)
        assert service.requests == [400]


async def test_a_stale_service_file_means_append_directly(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    directory.mkdir()
    gone = subprocess.Popen(["true"])
    gone.wait()
    (directory / SERVICE_FILE).write_text(json.dumps({"pid": gone.pid, "http": "127.0.0.1:1"}))
    assert running_service(directory) is None
    async with await Client.connect(load_config(None, {}, log_dir=str(directory))) as client:
        assert client.describe() == f"the file log at {directory}"
        assert await client.cancel("x") == 0


async def test_an_unreachable_service_or_a_locked_log_is_a_client_error(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    directory.mkdir()
    port = free_port()
    (directory / SERVICE_FILE).write_text(json.dumps({"pid": 1, "http": f"127.0.0.1:{port}"}))
    async with await Client.connect(load_config(None, {}, log_dir=str(directory))) as client:
        with pytest.raises(
            ClientError, match=f"cannot reach the running service at http://127.0.0.1:{port}"
        ) as c:
            await client.cancel("x")
        assert c.value.reason == "unreachable"
    (directory / SERVICE_FILE).unlink()
    async with FileLogStore(directory):
        with pytest.raises(
            ClientError, match=r"cannot open the file log .* already open for writing"
        ) as locked:
            await Client.connect(load_config(None, {}, log_dir=str(directory)))
        assert locked.value.reason == "unreachable"


# -- Kafka -------------------------------------------------------------------------------------


@pytest.mark.kafka
async def test_connect_to_kafka_and_submit(kafka_bootstrap: str, tmp_path: Path) -> None:
    env = {"FLEETLOG_KAFKA_TOPIC_PREFIX": f"client-{tmp_path.name}"}
    config = load_config(None, env, kafka=kafka_bootstrap)
    async with await Client.connect(config, producer_id="svc") as client:
        offset = await client.submit("k1", "t", [GPU8])
    assert config.kafka is not None
    async with KafkaLogStore(config.kafka) as store:
        polled = await EventConsumer(store).poll(offset, timeout_ms=5000)
    assert [d.envelope.key for d in polled.events] == ["submit/k1"]


@pytest.mark.kafka
async def test_unreachable_kafka_is_a_client_error(tmp_path: Path) -> None:
    config = load_config(
        None, {"FLEETLOG_KAFKA_REQUEST_TIMEOUT_MS": "2000"}, kafka=f"127.0.0.1:{free_port()}"
    )
    with pytest.raises(ClientError, match=r"cannot open Kafka at 127\.0\.0\.1") as caught:
        await Client.connect(config)
    assert caught.value.reason == "unreachable"


JAVA_EVENTS = [
    {
        "schema_version": 1,
        "producer_id": "java-agent",
        "key": "hb/n1/1",
        "event": {
            "type": "NodeHeartbeat",
            "cell": "c1",
            "node": "n1",
            "cpu_milli": 96000,
            "mem_mib": 1048576,
            "gpu_count": 8,
            "gpu_model": "A100",
            "topology": ["b1", "r1", "n1"],
        },
    },
    {
        "schema_version": 1,
        "producer_id": "java-billing",
        "key": "submit/java-1",
        "event": {
            "type": "JobSubmitted",
            "job_id": "java-1",
            "tenant": "vision",
            "task_groups": [
                {"count": 2, "cpu_milli": 8000, "mem_mib": 32768, "gpu_count": 4, "gpu_milli": 1000}
            ],
        },
    },
]


def java_produce(bootstrap: str, topic: str, header: str, lines: list[str]) -> list[int]:
    """Run the Java producer (Kafka's own client, from the broker's distribution)."""
    done = subprocess.run(
        [
            "java",
            "-cp",
            str(REPO / "infra" / "kafka" / "dist" / "lib" / "*"),
            str(Path(__file__).parent / "java" / "JsonProducer.java"),
            bootstrap,
            topic,
            header,
        ],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [int(line) for line in done.stdout.split()]


@pytest.mark.kafka
async def test_json_from_a_java_producer_is_folded_and_decided(kafka_bootstrap: str, tmp_path: Path) -> None:
    validator = jsonschema.Draft202012Validator(json_schema())
    for doc in JAVA_EVENTS:
        validator.validate(doc)
    config = KafkaConfig(bootstrap_servers=kafka_bootstrap, topic_prefix=f"java-{tmp_path.name}")
    async with KafkaLogStore(config) as store:  # creates the topics with LogAppendTime
        lines = [json.dumps(doc) for doc in JAVA_EVENTS]
        with_header = java_produce(kafka_bootstrap, config.topic(INPUTS), "application/json", lines[:1])
        without_header = java_produce(kafka_bootstrap, config.topic(INPUTS), "-", lines[1:])
        records = await store.log(INPUTS).read(0, 10, timeout_ms=5000)
        assert [r.offset for r in records] == with_header + without_header
        assert records[0].header(CONTENT_TYPE_HEADER) == b"application/json"
        assert records[1].header(CONTENT_TYPE_HEADER) is None
        loop = SchedulerLoop(store, Policy())
        result = await loop.step(timeout_ms=1000)
        assert (result.inputs, result.dead_lettered) == (2, 0)
        batches = [b for _, b in decision_batches(await store.log(DECISIONS).read(0, 10, timeout_ms=5000))]
    placed = [d for b in batches for d in b.decisions if isinstance(d, JobPlaced)]
    assert [(p.job_id, len(p.tasks), {t.node for t in p.tasks}) for p in placed] == [("java-1", 2, {"n1"})]
