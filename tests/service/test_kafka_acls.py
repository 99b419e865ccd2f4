"""Producers that write the inputs topic directly, past the API, on a real broker that
authorizes (SCRAM users over SASL_SSL, StandardAuthorizer ACLs; ``infra/kafka/kafka.sh``):
the broker refuses writes its ACLs do not allow, and the service folds none of the records whose
principal the log's ``PolicySet`` does not allow — it parks them in the dead-letter log with
reason ``unauthorized`` and the rule — while replay re-runs every decision the same way."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAuthorizationFailedError
from aiokafka.helpers import create_ssl_context

from fleetlog.events.codec import encode, envelope
from fleetlog.events.model import Event, JobCancelled, PolicyGrant, PolicySet
from fleetlog.log.base import PRINCIPAL_HEADER
from fleetlog.log.consumer import ERROR_HEADER, REASON_HEADER
from tests.core.builders import job, node, quota
from tests.kafka_broker import KafkaBroker, KafkaBrokerError
from tests.service.process import REPO, ServiceProcess
from tests.service.test_security import wait_for

USERS = ("team-a", "team-b", "agent-1", "viewer")
POLICY = PolicySet(grants=(
    PolicyGrant("team-a", ("tenant:a",)),
    PolicyGrant("team-b", ("tenant:b",)),
    PolicyGrant("agent-1", ("node-agent:cell-1",)),
    PolicyGrant("viewer", ("reader",)),
    PolicyGrant("ops", ("policy-admin", "operator")),
), reason="issue 22: producers past the API")


@pytest.fixture(scope="module")
def acl_broker() -> Iterator[KafkaBroker]:
    with KafkaBroker(use_env=False, ephemeral=True, users=USERS) as broker:
        yield broker


class Producers:
    """One producer per user: the super user on the plaintext listener (the service's own
    side, as the API appends), the others as themselves over SASL_SSL."""

    def __init__(self, broker: KafkaBroker, topic: str) -> None:
        self.broker, self.topic, self.open = broker, topic, {}

    def options(self, user: str | None) -> dict[str, object]:
        if user is None:
            return {"bootstrap_servers": self.broker.bootstrap}
        return {"bootstrap_servers": self.broker.sasl_bootstrap, "security_protocol": "SASL_SSL",
                "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": user,
                "sasl_plain_password": self.broker.password(user),
                "ssl_context": create_ssl_context(cafile=str(self.broker.tls_dir / "ca.pem"))}

    async def send(self, user: str | None, event: Event, principal: str | None = None,
                   topic: str | None = None) -> int:
        """``event`` written by ``user`` naming ``principal`` (default: itself) in its header;
        its offset."""
        if user not in self.open:
            self.open[user] = AIOKafkaProducer(request_timeout_ms=10_000, **self.options(user))
            await self.open[user].start()
        named = principal if principal is not None else user
        headers = [(PRINCIPAL_HEADER, named.encode())] if named is not None else []
        done = await self.open[user].send_and_wait(topic or self.topic, encode(envelope(event, "acl-test")),
                                                   headers=headers)
        return int(done.offset)

    async def close(self) -> None:
        for producer in self.open.values():
            await producer.stop()


async def read_all(options: dict[str, object], topic: str, count: int) -> list[object]:
    consumer = AIOKafkaConsumer(topic, auto_offset_reset="earliest", enable_auto_commit=False,
                                group_id=None, **options)
    await consumer.start()
    try:
        found: list[object] = []
        async with asyncio.timeout(60):
            while len(found) < count:
                batches = await consumer.getmany(timeout_ms=1_000)
                found += [r for records in batches.values() for r in records]
        return found
    finally:
        await consumer.stop()


def cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleetlog.cli", *args, "--config", str(config)],
                          cwd=REPO, capture_output=True, text=True, timeout=300, check=False)


async def test_producers_past_the_api_do_only_what_the_acls_and_the_log_policy_allow(
        acl_broker: KafkaBroker, tmp_path: Path) -> None:
    prefix = f"acl-{tmp_path.name[-10:]}"
    config = tmp_path / "fleetlog.toml"
    config.write_text(f'[kafka]\nbootstrap_servers = "{acl_broker.bootstrap}"\ntopic_prefix = "{prefix}"\n'
                      'request_timeout_ms = 10000\n\n[service]\nleader_session_timeout_ms = 3000\n')
    inputs, decisions = f"{prefix}.inputs", f"{prefix}.decisions"
    service = ServiceProcess(tmp_path / "service.log", ["--config", str(config)], {}).start()
    producers = Producers(acl_broker, inputs)
    try:
        await asyncio.to_thread(service.wait_leading, 120)
        for user, operation, topic in (("team-a", "Write", inputs), ("agent-1", "Write", inputs),
                                       ("viewer", "Read", decisions)):  # (team-a: forced onto the topic)
            acl_broker.acl("--add", "--allow-principal", f"User:{user}", "--operation", operation,
                           "--topic", topic)

        await producers.send(None, POLICY, "ops")
        for name, cell in (("n1", "cell-1"), ("n2", "cell-1")):
            await producers.send(None, node(name, cell=cell))
        await producers.send(None, job("jb", tenant="b", gpus=8), "team-b")  # (as the API appends it)
        await producers.send("team-a", job("ja", tenant="a", gpus=8))
        refused = [
            ("team-a", JobCancelled(job_id="jb"), "may not cancel job 'jb' of tenant 'b'"),
            ("team-a", node("n3", cell="cell-1"), "may not report node 'n3' of cell 'cell-1'"),
            ("team-a", quota("a", 64), "may not set the quota of tenant 'a'"),
            ("agent-1", node("n4", cell="cell-2"), "may not report node 'n4' of cell 'cell-2'"),
        ]
        for user, event, _ in refused:
            await producers.send(user, event)
        await producers.send("agent-1", node("n5", cell="cell-1"))
        last = await producers.send("team-a", JobCancelled(job_id="ja"))

        with pytest.raises(TopicAuthorizationFailedError):  # no ACL: the broker refuses the write
            await producers.send("team-b", JobCancelled(job_id="ja"))
        with pytest.raises(TopicAuthorizationFailedError):  # a reader reads, never writes
            await producers.send("viewer", job("jv", tenant="a"))
        with pytest.raises(TopicAuthorizationFailedError):  # nor writes decisions
            await producers.send("team-a", job("jd", tenant="a"), topic=decisions)

        await asyncio.to_thread(wait_for, lambda: (service.health() or {}).get("inputs_offset", 0) > last, 90)
        parked = await read_all(producers.options(None), f"{prefix}.dead-letters", len(refused))
        assert len(parked) == len(refused)
        for record, (user, _, message) in zip(parked, refused, strict=True):
            headers = dict(record.headers)  # type: ignore[attr-defined]
            assert headers[REASON_HEADER] == b"unauthorized"
            assert headers[PRINCIPAL_HEADER] == user.encode()
            assert message in headers[ERROR_HEADER].decode()
        assert len(await read_all(producers.options("viewer"), decisions, 1)) >= 1  # the viewer reads

        states = {j: json.loads(cli(config, "status", j, "--json").stdout)["state"] for j in ("ja", "jb")}
        assert states == {"ja": "cancelled", "jb": "placed"}
        with urllib.request.urlopen(f"http://{service.address()}/v1/nodes", timeout=30) as answer:
            nodes = json.loads(answer.read())["items"]
        assert sorted(n["node"] for n in nodes) == ["n1", "n2", "n5"]
        with urllib.request.urlopen(f"http://{service.address()}/metrics", timeout=30) as answer:
            assert f"fleetlog_dead_letters_total {float(len(refused))}" in answer.read().decode()
    finally:
        await producers.close()
        assert service.stop() == 0, service.tail()
    verified = cli(config, "replay", "verify", "--json")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    trail = json.loads(cli(config, "history", "--audit", "--all", "-o", "json").stdout)["items"]
    parked = {(e["principal"], e["type"]): e["parked"] for e in trail if e["parked"]}
    assert sorted(parked) == sorted((user, type(event).__name__) for user, event, _ in refused)
    assert all(text.startswith("unauthorized: may not") for text in parked.values())
    assert not any(e["parked"] for e in trail if e["principal"] in ("ops", None))
    assert service.log_path.read_text().count("unauthorized") >= len(refused)  # a warning line each


async def test_a_user_added_to_the_running_broker_writes_once_an_acl_allows_it(
        acl_broker: KafkaBroker) -> None:
    producers = Producers(acl_broker, "acl-late.inputs")
    admin = AIOKafkaAdminClient(bootstrap_servers=acl_broker.bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic("acl-late.inputs", 1, 1)])
    finally:
        await admin.close()
    acl_broker.add_user("late-agent")
    stat = (acl_broker.tls_dir / "users" / "late-agent").stat()
    assert stat.st_mode & 0o077 == 0  # the password is its owner's alone
    try:
        with pytest.raises(TopicAuthorizationFailedError):  # authenticated, but no ACL yet
            await producers.send("late-agent", node("n9", cell="cell-1"))
        acl_broker.acl("--add", "--allow-principal", "User:late-agent", "--operation", "Write",
                       "--topic", "acl-late.inputs")
        assert "User:late-agent" in acl_broker.acl("--list", "--topic", "acl-late.inputs")
        assert await producers.send("late-agent", node("n9", cell="cell-1")) == 0
    finally:
        await producers.close()
    with pytest.raises(KafkaBrokerError, match="must match"):
        acl_broker.add_user("no/slashes")
