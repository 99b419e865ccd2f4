"""Appends the backend's observations to the inputs log: deduplicated, in order, in batches."""

from __future__ import annotations

import asyncio

from fleetlog.backends.kubernetes.ledger import Ledger
from fleetlog.events import InputEvent, encode, envelope
from fleetlog.log.base import INPUTS, LogStore, Message


class Emitter:
    """``emit`` queues an observation unless the log already says it; ``flush`` appends the queue."""

    def __init__(self, store: LogStore, ledger: Ledger, producer_id: str) -> None:
        self.store, self.ledger, self.producer_id = store, ledger, producer_id
        self.queue: list[Message] = []
        self.lock = asyncio.Lock()
        self.appended = 0

    def emit(self, event: InputEvent) -> bool:
        """Queue ``event`` if it is news; whether it was."""
        if not self.ledger.novel(event):
            return False
        self.queue.append(Message(encode(envelope(event, self.producer_id))))
        return True

    def repeat(self, event: InputEvent) -> None:
        """Queue ``event`` even if the log already says it (periodic heartbeats)."""
        self.ledger.record(event)
        self.queue.append(Message(encode(envelope(event, self.producer_id))))

    async def flush(self) -> int:
        """Append everything queued, in order; how many records."""
        async with self.lock:
            batch, self.queue = self.queue, []
            if batch:
                await self.store.log(INPUTS).append(batch)
                self.appended += len(batch)
            return len(batch)

    async def run(self, period_ms: int) -> None:
        """Flush every ``period_ms`` until cancelled."""
        while True:
            await asyncio.sleep(period_ms / 1000)
            await self.flush()
