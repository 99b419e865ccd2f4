"""Leadership: whether this process may write the shard's logs, and where producers find the one
that does.  On Kafka the leader group elects (:mod:`fleetlog.service.leader`) and the
transactional producer fences a former leader; in embedded mode the file log's writer lock is
the election, ``LOCK.intent`` asks the producers holding it to hand it over, and
``service.json`` tells them to send to this process's HTTP port instead while it leads."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final

import structlog

from fleetlog.log.base import LogStore
from fleetlog.log.discovery import announce, local, withdraw
from fleetlog.log.file import LockedError, announce_intent, withdraw_intent
from fleetlog.log.location import make_store
from fleetlog.service.config import Config
from fleetlog.service.leader import KafkaElection

LOCK_POLL_S: Final = 0.02
"""How often a service waiting for the file log's lock tries it (producers hand it over)."""

log = structlog.get_logger("fleetlog.service")


class Leadership:
    """The shard's lead as one ``fleetlog run`` process sees it: won, held, lost."""

    def __init__(self, config: Config, stopping: asyncio.Event,
                 sleep: Callable[[float], Awaitable[None]]) -> None:
        self.config, self.settings, self.stopping, self._sleep = config, config.service, stopping, sleep
        self.election = (
            KafkaElection(config.kafka, f"{self.settings.producer_id}-{os.getpid()}",
                          self.settings.leader_session_timeout_ms)
            if config.kafka is not None else None
        )

    async def acquire(self) -> bool:
        """Wait to be elected (Kafka; in embedded mode opening the log takes the lock:
        :meth:`open_store`); ``False`` when stopped first."""
        election = self.election
        if election is None:
            return True
        return await election.elected(self.stopping)

    async def open_store(self) -> LogStore | None:
        """Open the logs; in embedded mode wait while another process holds the file log.

        The wait is bounded by one append of the producers that hold it (``LOCK.intent``, see
        :meth:`want_log` and docs/logs.md), not by how busy they are."""
        announced = False
        self.want_log(True)
        while not self.stopping.is_set():
            store = make_store(self.config)
            try:
                await store.open()
                return store
            except LockedError as exc:
                if not announced:
                    log.info("standing_by", reason=str(exc))
                    announced = True
                await self._sleep(LOCK_POLL_S)
        return None

    def _log_dir(self) -> Path | None:
        return Path(self.config.log.dir) if self.config.kafka is None and self.config.log.dir else None

    def want_log(self, wanted: bool) -> None:
        """Embedded mode: ``LOCK.intent`` names this process whenever it runs but does not lead
        (waiting for the lock, recovering, retrying or stalled).  Producers that append directly
        give the log up at their next append, and new ones wait for ``service.json`` instead of
        taking it: nothing is appended behind the back of a service that stands by (a log that
        went backwards must not grow at offsets the snapshots already count)."""
        directory = self._log_dir()
        if directory is not None:
            (announce_intent if wanted else withdraw_intent)(directory)

    def advertise(self, port: int) -> None:
        """``service.json``: producers send to this process's HTTP ``port`` from now on."""
        if self.config.log.dir:  # 0600: a service.json others could rewrite would redirect producers
            scheme = "http" if self.config.auth.tls_cert_file is None else "https"
            address = f"{local(self.settings.http_host)}:{port}"
            announce(Path(self.config.log.dir), os.getpid(), address, scheme)

    def unadvertise(self) -> None:
        if self.config.log.dir:
            withdraw(Path(self.config.log.dir))

    def lost(self) -> bool:
        """Stop leading: the process stops, or another process was elected."""
        return self.stopping.is_set() or self.fenced_out()

    def fenced_out(self) -> bool:
        return self.election is not None and self.election.lost.is_set()

    @property
    def fenced_wait_s(self) -> float:
        """How long a fenced process waits before opening a producer again: another process leads
        now; the election gets a session to say so (a producer opened sooner would fence the new
        leader in turn)."""
        return self.settings.leader_session_timeout_ms / 1000

    async def stop(self) -> None:
        if self.election is not None:
            await self.election.stop()
