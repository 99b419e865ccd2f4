"""The cell partitions one ``fleetlog run`` process steps (``--role cell``, or ``all`` with a
``[cells]`` map): one :class:`CellRunner` per owned partition, each a task of the process's one
asyncio loop stepping its :class:`fleetlog.service.cellshard.CellShardLoop`.

A runner opens its partition's store, recovers (its newest snapshot plus the tail), and steps
while :attr:`CellShards.gate` is open.  :meth:`CellShards.pause` (a rebalance is coming) closes
the gate and commits every shard once its current step is done; :meth:`CellShards.assign` stops
the runners of partitions lost, starts those of partitions won, and opens the gate again.
``FencedError`` means another process owns the partition now: that runner stops (the next
assignment that gives it back starts a new one).  Any other error is logged and the runner
recovers again after a back-off.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

import structlog

from fleetlog.core.cellshard import SummaryRule
from fleetlog.core.policy import Policy
from fleetlog.log.base import LogStore, Shard
from fleetlog.log.kafka import FencedError
from fleetlog.service.cellshard import CellShardLoop, recover_cell_shard, shard_snapshots
from fleetlog.service.config import Config
from fleetlog.service.loop import LoopConfig, keep_recovered
from fleetlog.service.metrics import Metrics
from fleetlog.service.snapshots import Snapshotter
from fleetlog.waiting import event_or_timeout

RETRY_S: Final = (0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0)

log = structlog.get_logger("fleetlog.service")

Opener = Callable[[Shard], Awaitable[LogStore]]
Closer = Callable[[LogStore], Awaitable[None]]


class CellRunner:
    """One owned cell partition: its store, loop, snapshots and stepping task."""

    def __init__(self, shards: CellShards, partition: int) -> None:
        self.shards, self.partition = shards, partition
        self.shard = Shard.cell(partition)
        self.snapshots = shard_snapshots(shards.config, self.shard)
        self.snapshotter = Snapshotter(self.snapshots, shards.config.service, shards.policy.name,
                                       shards.metrics)
        self.store: LogStore | None = None
        self.loop: CellShardLoop | None = None
        self.lock = asyncio.Lock()
        """Held while the loop steps: a pause waits for the step in hand."""
        self.halt = asyncio.Event()
        self.fenced = False
        self.task: asyncio.Task[None] = asyncio.create_task(self._run(), name=f"fleetlog-cell-{partition}")

    def make_loop(self, store: LogStore) -> CellShardLoop:
        s = self.shards.config.service
        return CellShardLoop(
            store, self.shards.policy, self.partition, self.shards.config.cell_map,
            LoopConfig(group=s.group, producer_id=s.producer_id, max_batch=s.max_batch, commit_every=50_000,
                       tick_every_ms=s.tick_every_ms),
            s.core(hold_ms=s.cell_hold_ms),
            SummaryRule(every_ms=s.summary_every_ms, material_milli=s.summary_material_milli))

    @property
    def stepping(self) -> bool:
        return self.loop is not None and not self.halt.is_set()

    async def _run(self) -> None:
        failures = 0
        while not self.halt.is_set():
            try:
                await self._cycle()
                return
            except FencedError as exc:
                self.fenced = True
                log.warning("cell_shard_fenced", partition=self.partition, error=str(exc),
                            action="another process owns the partition: this shard stops")
                return
            except Exception as exc:
                wait = RETRY_S[min(failures, len(RETRY_S) - 1)]
                failures += 1
                log.warning("cell_shard_interrupted", partition=self.partition, error=str(exc)[:2000],
                            error_type=type(exc).__name__, retry_s=wait)
                await self._drop()
                await event_or_timeout(self.halt, wait)

    async def _cycle(self) -> None:
        started = time.monotonic()
        self.store = await self.shards.opener(self.shard)
        loop, used = await recover_cell_shard(self.store, self.snapshots, self.make_loop)
        keep_recovered()
        self.snapshotter.restarted(used)
        self.loop = loop
        log.info("cell_shard_started", partition=self.partition, cells=list(loop.held),
                 inputs_offset=loop.offset, seconds=round(time.monotonic() - started, 3),
                 snapshot=used is not None)
        committed_at = time.monotonic()
        gate, idle = self.shards.gate, self.shards.config.service.idle_wait_ms
        commit_every_s = self.shards.config.service.role_commit_every_ms / 1000
        while not self.halt.is_set():
            await self._wait_open()
            async with self.lock:
                if self.halt.is_set() or not gate.is_set():
                    continue
                result = await loop.step(timeout_ms=idle)
                self.shards.observe(result)
                self.shards.metrics.count_ignored(f"cell-{self.partition}", loop.state.observations.counts)
                loop.observed.flush()
                now = time.monotonic()
                if result.published:
                    committed_at = now  # (the step's transaction committed the offset)
                elif now - committed_at >= commit_every_s:
                    committed_at = now
                    await loop.commit()
                self.snapshotter.maybe(loop, now)

    async def _wait_open(self) -> None:
        """Until the gate opens or the runner is told to stop."""
        if self.shards.gate.is_set():
            return
        waiters = {asyncio.create_task(self.shards.gate.wait()), asyncio.create_task(self.halt.wait())}
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for waiter in waiters:
            waiter.cancel()

    async def commit(self) -> None:
        """Commit what the shard folded (after the step in hand): a rebalance is coming."""
        async with self.lock:
            if self.loop is not None and not self.fenced:
                try:
                    await self.loop.commit()
                except Exception as exc:  # fenced or away: the next owner recovers from the logs
                    log.warning("cell_shard_commit_failed", partition=self.partition, error=str(exc)[:2000])

    async def stop(self, graceful: bool) -> None:
        """End the task; ``graceful`` (the process stops): commit and snapshot first."""
        self.halt.set()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self.task
        loop = self.loop
        if graceful and loop is not None and not self.fenced:
            await self.commit()
            self.snapshotter.maybe(loop, time.monotonic(), force=True)
        await self.snapshotter.finish()
        await self._drop()
        await self.snapshots.close()

    async def _drop(self) -> None:
        store, self.store, self.loop = self.store, None, None
        if store is not None:
            with contextlib.suppress(Exception):
                await self.shards.closer(store)


class CellShards:
    """The cell partitions this process steps, and the gate a rebalance closes."""

    def __init__(self, config: Config, policy: Policy, metrics: Metrics, opener: Opener,
                 closer: Closer) -> None:
        self.config, self.policy, self.metrics = config, policy, metrics
        self.opener, self.closer = opener, closer
        self.named = frozenset(p for _, p in config.cells)
        """The partitions the map gives a cell (an owned partition without one is not stepped)."""
        self.runners: dict[int, CellRunner] = {}
        self.gate = asyncio.Event()

    async def pause(self) -> None:
        """Stop stepping every shard and commit each (a rebalance revokes all first)."""
        self.gate.clear()
        for runner in list(self.runners.values()):
            await runner.commit()

    async def assign(self, partitions: frozenset[int]) -> None:
        """Step exactly ``partitions`` (those the map names) from now on."""
        wanted = partitions & self.named
        for p in sorted(self.runners):
            runner = self.runners[p]
            if p not in wanted or runner.task.done():
                del self.runners[p]
                await runner.stop(graceful=False)
        for p in sorted(wanted - set(self.runners)):
            self.runners[p] = CellRunner(self, p)
        log.info("cell_partitions_assigned", partitions=sorted(wanted),
                 unnamed=sorted(partitions - self.named))
        self.gate.set()

    async def stop(self) -> None:
        """The process stops: every shard commits and snapshots."""
        runners, self.runners = self.runners, {}
        for p in sorted(runners):
            await runners[p].stop(graceful=True)

    def observe(self, result: Any) -> None:
        m = self.metrics
        m.step.observe(result.work_s)
        m.input_events.inc(result.inputs)
        m.dead_letters.inc(result.dead_lettered)
        if result.published:
            m.decisions.inc(result.decisions)
            m.batches.inc()

    def health(self) -> dict[str, Any]:
        return {str(p): {"inputs_offset": r.loop.offset if r.loop is not None else None,
                         "stepping": r.stepping and self.gate.is_set()}
                for p, r in sorted(self.runners.items())}
