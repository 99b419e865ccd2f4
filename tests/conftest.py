"""Suite-wide fixtures: a real Kafka broker, started lazily once per session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

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
