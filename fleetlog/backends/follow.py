"""Following the decisions log in the scheduler's fold order — what a backend that acts on
placements reads (the Slurm backend, the fake node agent): each decision batch after the
inputs it was decided on (up to its ``as_of``), then the inputs to the end."""

from __future__ import annotations

from typing import Final

from fleetlog.events import DecisionBatch
from fleetlog.log.base import DECISIONS, INPUTS, LogStore
from fleetlog.log.consumer import Delivered, EventConsumer, decision_batches

READ_BATCH: Final = 1000


class DecisionFollower:
    """A mixin: :meth:`catch_up` feeds :meth:`apply_input` and :meth:`apply_batch` in fold order
    from ``inputs_offset`` and ``decisions_offset`` (the subclass's), moving both on."""

    store: LogStore
    consumer: EventConsumer
    inputs_offset: int
    decisions_offset: int

    def apply_input(self, d: Delivered) -> None:
        raise NotImplementedError

    def apply_batch(self, offset: int, batch: DecisionBatch) -> None:
        raise NotImplementedError

    async def catch_up(self) -> None:
        decisions = self.store.log(DECISIONS)
        end = await decisions.end_offset()
        while self.decisions_offset < end:
            records = await decisions.read(self.decisions_offset, READ_BATCH)
            if not records:
                break
            for offset, batch in decision_batches(records):
                await self.read_inputs(batch.as_of)
                self.apply_batch(offset, batch)
                self.decisions_offset = offset + 1
        await self.read_inputs(await self.store.log(INPUTS).end_offset())

    async def read_inputs(self, until: int) -> None:
        while self.inputs_offset < until:
            polled = await self.consumer.poll(
                self.inputs_offset, min(READ_BATCH, until - self.inputs_offset), park=False
            )
            if polled.next_offset == self.inputs_offset:
                break
            for delivered in polled.events:
                self.apply_input(delivered)
            self.inputs_offset = polled.next_offset
