"""Who steps which cell partition: Kafka consumer-group membership (issue 17, "Ownership by
consumer group").

Every ``fleetlog run --role cell`` process joins the group ``<prefix>.cells.owners`` subscribed to
the topic of that name, which has one partition per cell partition
(``kafka.shards``) and never holds a record: the group coordinator spreads its partitions over
the live members, and a member owns the cell partitions it is assigned.  When a member dies its
session times out (``session_timeout_ms``) and its partitions move to the survivors.  A dedicated
topic and not the cells' inputs topic: the membership never fetches a heartbeat.

The assignment is sticky (:func:`fleetlog.service.leader.sticky_assignor`): a member that joins
takes partitions from the others only to even the load, never all of them back.  The protocol
is eager (aiokafka): every rebalance first revokes everything; :class:`Ownership` then pauses
every shard of the process (each commits first) and, on the new assignment, resumes the ones it
keeps, stops the ones it lost and starts the new ones.  Fencing, not the group, keeps a zombie
(a paused process whose session expired) from writing: the new owner's transactional producer
(``<prefix>-cell-<p>``) makes its next step fail with ``FencedError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

import structlog
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
from aiokafka.errors import KafkaError

from fleetlog.log.kafka import KafkaConfig, ensure_topic
from fleetlog.service.leader import join_group, leave

OWNERS_TOPIC: Final = "cells.owners"

log = structlog.get_logger("fleetlog.service")

Revoke = Callable[[], Awaitable[None]]
Assign = Callable[[frozenset[int]], Awaitable[None]]


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, ownership: Ownership) -> None:
        self.ownership = ownership

    async def on_partitions_revoked(self, revoked: Any) -> None:
        """Before the group rejoins: stop stepping (each shard commits first)."""
        await self.ownership.revoke()

    async def on_partitions_assigned(self, assigned: Any) -> None:
        await self.ownership.assign(frozenset(tp.partition for tp in assigned))


class Ownership:
    """This process's membership of the owners group: calls ``on_revoke`` before every
    rebalance and ``on_assign(partitions)`` after it."""

    def __init__(self, config: KafkaConfig, member: str, on_revoke: Revoke, on_assign: Assign,
                 session_timeout_ms: int = 6000) -> None:
        self.config, self.member, self.session_timeout_ms = config, member, session_timeout_ms
        self.on_revoke, self.on_assign = on_revoke, on_assign
        self.assigned: frozenset[int] = frozenset()
        self.rebalances = 0
        self.waiting_since: float | None = None
        """Since when this member has waited for an assignment (joined or revoked)."""
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def group(self) -> str:
        """Named as its topic (groups and topics are apart in Kafka)."""
        return self.config.topic(OWNERS_TOPIC)

    @property
    def topic(self) -> str:
        return self.config.topic(OWNERS_TOPIC)

    async def revoke(self) -> None:
        self.assigned = frozenset()
        if self.waiting_since is None:
            self.waiting_since = time.monotonic()
        await self.on_revoke()

    async def assign(self, partitions: frozenset[int]) -> None:
        self.assigned = partitions
        self.rebalances += 1
        self.waiting_since = None
        await self.on_assign(partitions)

    def stuck(self, limit_s: float) -> bool:
        """Joined (or revoked) ``limit_s`` ago and still no assignment: the membership should
        start again (seen once on a fresh, loaded broker: a member whose assignment never came)."""
        return self.waiting_since is not None and time.monotonic() - self.waiting_since > limit_s

    async def start(self) -> None:
        """Join the group (the topic is created with ``kafka.shards`` partitions if missing)."""
        if self._consumer is not None:
            return
        await ensure_topic(self.config, self.topic, self.config.shards)
        consumer = await join_group(self.config, self.member, self.group, self.topic,
                                    self.session_timeout_ms, _Listener(self))
        self.waiting_since = time.monotonic()
        log.info("owners_group_joining", group=self.group, topic=self.topic)
        self._consumer = consumer
        self._task = asyncio.create_task(self._poll(consumer), name="fleetlog-owners-poll")

    async def _poll(self, consumer: AIOKafkaConsumer) -> None:
        """Keep the membership alive (aiokafka leaves a group it is not polled for); the topic
        holds no records, and one that appears means nothing."""
        while True:
            try:
                await consumer.getmany(timeout_ms=500)
            except KafkaError:
                await asyncio.sleep(0.5)
            except Exception:  # a record aiokafka cannot parse: skip it, keep the membership
                with contextlib.suppress(Exception):
                    await consumer.seek_to_end()

    async def stop(self) -> None:
        """Leave the group at once (the survivors rebalance without waiting for a session)."""
        task, self._task, consumer, self._consumer = self._task, None, self._consumer, None
        await leave(task, consumer)
