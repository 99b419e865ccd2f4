"""Appends the backend's observations to the inputs log: deduplicated, in order, in batches."""

from __future__ import annotations

import asyncio
import logging

from tenacity import RetryCallState

from fleetlog.backends.kubernetes.ledger import Ledger
from fleetlog.events import InputEvent, encode, envelope
from fleetlog.log import errorpolicy
from fleetlog.log.base import INPUTS, LogStore, Message

log = logging.getLogger("fleetlog.backends.kubernetes")


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
        """Append everything queued, in order; how many records.  A batch whose append failed
        is kept for the next flush; one whose append was cancelled (the backend stopping) is not:
        it may have reached the log (a Kafka send in flight), and sending it again would say it
        twice, while what did not arrive is reported again by the next start (its ledger)."""
        async with self.lock:
            batch, self.queue = self.queue, []
            if batch:
                try:
                    await self.store.log(INPUTS).append(batch)
                except Exception:
                    self.queue = batch + self.queue  # kept for the next flush, in order
                    raise
                self.appended += len(batch)
            return len(batch)

    async def run(self, period_ms: int) -> None:
        """Flush every ``period_ms`` until cancelled; a log that is away is retried with the
        shared policy's back-off (:mod:`fleetlog.log.errorpolicy`), never the end of the task."""
        while True:
            await asyncio.sleep(period_ms / 1000)
            await errorpolicy.persist(self.flush, self.failed, stopped=lambda: False)

    def failed(self, state: RetryCallState, status: str, action: str) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        log.warning(
            "kubernetes emitter: appending %d observations failed (%s: %s); %s",
            len(self.queue),
            type(error).__name__,
            error,
            action,
        )
