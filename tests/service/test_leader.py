"""The Kafka election keeps its leader: a stand-by that joins (a restart, a new replica) never
takes the lead from a live leader; the lead moves only when the leader leaves."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from aiokafka import ConsumerRebalanceListener

from fleetlog.log.kafka import KafkaConfig, ensure_topic
from fleetlog.service.leader import KafkaElection, join_group, leave

pytestmark = pytest.mark.kafka

SESSION_MS = 6000


class Watched(KafkaElection):
    """The election as is, with every change of its lead recorded."""

    def __init__(self, config: KafkaConfig, member: str) -> None:
        super().__init__(config, member, SESSION_MS)
        self.changes: list[bool] = []

    def set_leader(self, leading: bool) -> None:
        if leading != self.leader.is_set():
            self.changes.append(leading)
        super().set_leader(leading)


def generation(election: KafkaElection) -> int:
    """The group generation this member last joined (-1 before its first join)."""
    consumer = election._consumer
    assert consumer is not None
    return int(consumer._coordinator.generation)


async def joined(elections: list[KafkaElection], after: int, timeout_s: float = 60) -> int:
    """Wait until every member joined one generation past ``after``: the rebalance is over."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        seen = {generation(e) for e in elections}
        if len(seen) == 1 and (now := seen.pop()) > after:
            return now
        await asyncio.sleep(0.1)
    raise AssertionError(f"no common generation past {after}: {[generation(e) for e in elections]}")


async def test_a_joining_standby_never_takes_the_lead_and_a_leaving_leader_hands_it_over(
    kafka_bootstrap: str,
) -> None:
    """Members join with ids that sort before the leader's (the range assignor would hand the
    partition to the first id at every join)."""
    config = KafkaConfig(bootstrap_servers=kafka_bootstrap, topic_prefix=f"lead-{uuid.uuid4().hex[:8]}")
    leader = Watched(config, "z-leader")
    members = [leader]
    try:
        await leader.start()
        await asyncio.wait_for(leader.leader.wait(), 60)
        at = generation(leader)
        for name in ("m-standby", "a-standby"):
            standby = Watched(config, name)
            members.append(standby)
            await standby.start()
            at = await joined(members, at)
            assert leader.leader.is_set(), f"{name} joining took the lead"
            assert leader.changes == [True], f"{name} joining made the leader step down and back"
            assert not any(m.leader.is_set() or m.changes for m in members[1:])
        await leader.stop()  # a clean leave: the group rebalances at once
        members.remove(leader)
        deadline = time.monotonic() + 60
        while sum(m.leader.is_set() for m in members) != 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        (new,) = [m for m in members if m.leader.is_set()]
        assert new.changes == [True]
        at = generation(new)
        back = Watched(config, "0-former-leader")  # its id sorts first of all
        members.append(back)
        await back.start()
        await joined(members, at)
        assert new.changes == [True], "the former leader coming back took the lead"
        assert not back.changes
    finally:
        for member in members:
            await member.stop()


class Assigned(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self) -> None:
        self.partitions: set[int] = set()
        self.any = asyncio.Event()

    async def on_partitions_revoked(self, revoked: object) -> None:
        self.partitions = set()

    async def on_partitions_assigned(self, assigned: set[object]) -> None:
        self.partitions = {tp.partition for tp in assigned}  # type: ignore[attr-defined]
        if self.partitions:
            self.any.set()


async def test_a_group_whose_topic_appears_after_the_join_is_assigned_it_within_seconds(
    kafka_bootstrap: str,
) -> None:
    """The group's leader member assigns only the partitions its metadata knows.  On a
    three-broker cluster the broker it asks can lag behind the one that created the topic (the
    fault run once waited 120 s for a lead that never came); here the topic does not exist at
    all when the member joins.  It must still be assigned once the topic appears — a refresh of
    the membership's metadata, not the 5-minute default, makes the group rejoin."""
    config = KafkaConfig(bootstrap_servers=kafka_bootstrap, topic_prefix=f"late-{uuid.uuid4().hex[:8]}")
    topic, listener = config.topic("late"), Assigned()
    consumer = await join_group(config, "member", f"{topic}.group", topic, SESSION_MS, listener)

    async def poll() -> None:
        while True:
            await consumer.getmany(timeout_ms=200)

    task = asyncio.create_task(poll())
    try:
        await asyncio.sleep(2)
        assert not listener.partitions, "assigned a topic that does not exist"
        assert topic not in await consumer.topics(), "the membership created its topic itself"
        await ensure_topic(config, topic, 2)
        await asyncio.wait_for(listener.any.wait(), 30)  # (with aiokafka's default: 5 minutes)
        assert listener.partitions == {0, 1}
    finally:
        await leave(task, consumer)
