"""Suite-wide fixtures: a real Kafka broker, started lazily once per session; each test's
logging set up as it found it (a command run in-process sets it up, fleetlog.logsetup)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import structlog

from tests.kafka_broker import KafkaBroker


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[KafkaBroker]:
    """The session's broker (or the one named by ``FLEETLOG_KAFKA``); stopped at session end."""
    broker = KafkaBroker(ephemeral=True)
    broker.start()
    try:
        yield broker
    finally:
        broker.close()


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_broker: KafkaBroker) -> str:
    """``"127.0.0.1:PORT"`` of the session's broker."""
    return kafka_broker.bootstrap


@pytest.fixture(autouse=True)
def _logging_as_found() -> Iterator[None]:
    """Undo what ``fleetlog.cli.main`` run in-process set up: the next test logs as it would alone."""
    root, ours = logging.getLogger(), logging.getLogger("fleetlog")
    handlers, levels, config = list(root.handlers), (root.level, ours.level), structlog.get_config()
    yield
    added = [h for h in root.handlers if h not in handlers]
    for handler in added:
        if type(handler).__module__ == "fleetlog.logsetup":
            root.removeHandler(handler)
    root.setLevel(levels[0])
    ours.setLevel(levels[1])
    structlog.configure(**config)
