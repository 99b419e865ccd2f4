"""One writer per shard: who may publish decisions.

On Kafka two mechanisms work together:

* **Election** — every ``fleetlog run`` process of a shard joins the consumer group
  ``<prefix>.shard<N>.leader`` subscribed to the one-partition topic ``<prefix>.leader``.
  The group coordinator assigns that partition to exactly one live member: the leader.
  Stand-bys stay members; when the leader dies its session times out
  (``session_timeout_ms``) and the partition moves to a stand-by.  The assignment is **sticky**
  (:func:`sticky_assignor`): a stand-by that joins (a restart, a new replica) never takes the
  lead from a live leader — with the range assignor the member whose id sorted first would,
  at every join, for a needless hand-over.
* **Fencing** — the leader's transactional producer uses the shard's transactional id, so
  when a new leader starts its producer, Kafka aborts the old leader's open transaction
  and refuses the old producer from then on (a paused "zombie" cannot publish).

In embedded mode the file log's writer lock is the election: a stand-by retries opening the
directory until the holder exits.

Take-over time on Kafka is bounded by ``session_timeout_ms`` (the dead leader's session
expiring) + one rebalance + recovery from the newest snapshot (docs/service.md).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Final

import structlog
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor
from aiokafka.errors import CorruptRecordException, KafkaError, UnsupportedCodecError

from fleetlog.log.base import LogError
from fleetlog.log.kafka import KafkaConfig, ensure_topic

LEADER_TOPIC: Final = "leader"

MEMBERSHIP_METADATA_MAX_AGE_MS: Final = 2000
"""How often a membership's consumer refreshes its metadata.  The group's leader member assigns
only the partitions its own metadata knows: a topic just created can be missing from it (the
broker it asked had not heard yet), and a fresh metadata response that shows the topic is what
makes the member rejoin and assign it.  aiokafka refreshes every 5 minutes by default: the
lead (or a cell partition) would stay unassigned that long.  A few small requests a second
cluster-wide are the cost."""

log = structlog.get_logger("fleetlog.service")


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, election: KafkaElection) -> None:
        self.election = election

    async def on_partitions_revoked(self, revoked: Any) -> None:
        """Every rebalance revokes first (the eager protocol), also the one a joining stand-by
        causes, after which the sticky assignor gives the lead straight back: the leader goes on
        until the new assignment says otherwise.  Safe: fencing, not the election, keeps a
        former leader from publishing once a new one opened its producer."""

    async def on_partitions_assigned(self, assigned: Any) -> None:
        self.election.set_leader(bool(assigned))


def sticky_assignor() -> type[StickyPartitionAssignor]:
    """A sticky assignor of its own for one election: aiokafka's keeps the member's current
    assignment in class attributes, which two elections of one process would share (each would
    claim the other's lead when it rejoins)."""
    return type("ElectionStickyAssignor", (StickyPartitionAssignor,),
                {"member_assignment": None, "generation": StickyPartitionAssignor.DEFAULT_GENERATION_ID})


class KafkaElection:
    """Membership in the shard's leader group; :attr:`leader` is set while this process leads."""

    def __init__(self, config: KafkaConfig, member: str, session_timeout_ms: int = 6000) -> None:
        self.config, self.member, self.session_timeout_ms = config, member, session_timeout_ms
        self.leader = asyncio.Event()
        self.lost = asyncio.Event()
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def group(self) -> str:
        return f"{self.config.topic_prefix}.shard{self.config.shard}.leader"

    def set_leader(self, leading: bool) -> None:
        if leading:
            self.lost.clear()
            self.leader.set()
        elif self.leader.is_set():
            self.leader.clear()
            self.lost.set()

    async def start(self) -> None:
        """Join the election (again after :meth:`stop`); a no-op while already a member."""
        if self._consumer is not None:
            return
        topic = self.config.topic(LEADER_TOPIC)
        await ensure_topic(self.config, topic, 1)
        consumer = await join_group(self.config, self.member, self.group, topic,
                                    self.session_timeout_ms, _Listener(self))
        self._consumer = consumer
        self._task = asyncio.create_task(self._poll(consumer), name="fleetlog-leader-poll")

    async def _poll(self, consumer: AIOKafkaConsumer) -> None:
        """Keep the membership alive (aiokafka leaves the group if it is not polled).  Records
        on the leader topic mean nothing: one that cannot be read is skipped, never a reason to
        step down (or to end this task, which would lose the membership for good)."""
        while True:
            try:
                await consumer.getmany(timeout_ms=500)
            except (UnsupportedCodecError, CorruptRecordException):
                await consumer.seek_to_end()
            except KafkaError:
                self.set_leader(False)
                await asyncio.sleep(0.5)
            except Exception:  # a record aiokafka cannot parse (a header key not UTF-8, ...)
                await consumer.seek_to_end()

    async def elected(self, stopping: asyncio.Event) -> bool:
        """Join, then wait until this process leads or ``stopping`` is set: whether it leads."""
        await self.start()
        if not self.leader.is_set():
            log.info("standing_by", group=self.group)
        waiter = asyncio.create_task(self.leader.wait())
        stopper = asyncio.create_task(stopping.wait())
        await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
        for task in (waiter, stopper):
            task.cancel()
        return self.leader.is_set() and not stopping.is_set()

    async def stop(self) -> None:
        task, self._task, consumer, self._consumer = self._task, None, self._consumer, None
        await leave(task, consumer)
        self.set_leader(False)


async def join_group(config: KafkaConfig, member: str, group: str, topic: str, session_timeout_ms: int,
                     listener: ConsumerRebalanceListener) -> AIOKafkaConsumer:
    """A started consumer, member ``member`` of ``group``, subscribed to ``topic`` (created by
    the caller) with ``listener``: the membership the election and the cell owners share."""
    consumer = AIOKafkaConsumer(
        **(config.client_options() | {"client_id": member}),
        group_id=group,
        enable_auto_commit=False,
        session_timeout_ms=session_timeout_ms,
        heartbeat_interval_ms=max(100, session_timeout_ms // 6),
        max_poll_interval_ms=max(60_000, session_timeout_ms * 10),
        auto_offset_reset="latest",
        metadata_max_age_ms=MEMBERSHIP_METADATA_MAX_AGE_MS,
        # sticky first; range too, so a process of an older version (range only) still joins
        partition_assignment_strategy=(sticky_assignor(), RangePartitionAssignor),
    )
    try:
        await consumer.start()
        # Assign at the first join where possible: wait until a broker has the topic.  Another
        # broker can still miss it when the group leader asks; the short metadata age above
        # makes the group rejoin once its metadata has the topic.
        for _ in range(100):
            if topic in await consumer.topics():
                break
            await asyncio.sleep(0.1)
    except KafkaError as exc:
        await consumer.stop()
        raise LogError(f"join the group {group}: {exc!r}") from exc
    consumer.subscribe([topic], listener=listener)
    return consumer


async def leave(task: asyncio.Task[None] | None, consumer: AIOKafkaConsumer | None) -> None:
    """End a group membership at once: its polling ``task``, then its ``consumer`` (which leaves
    the group, so the others rebalance without waiting for its session to expire)."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    if consumer is not None:
        with contextlib.suppress(KafkaError):
            await consumer.stop()
