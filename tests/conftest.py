"""Suite-wide fixtures: a real Kafka broker, started lazily once per session; each test's
logging set up as the session found it (a command run in-process sets it up, fleetlog.logsetup)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Final

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


_PRISTINE: Final = (
    logging.getLogger().level, logging.getLogger("fleetlog").level, structlog.get_config()
)
"""Logging as the session found it, before any command ran in-process."""


def _pristine_logging() -> None:
    root = logging.getLogger()
    for handler in [h for h in root.handlers if type(h).__module__ == "fleetlog.logsetup"]:
        root.removeHandler(handler)
    root.setLevel(_PRISTINE[0])
    logging.getLogger("fleetlog").setLevel(_PRISTINE[1])
    structlog.configure(**_PRISTINE[2])


@pytest.fixture(autouse=True)
def _logging_as_found() -> Iterator[None]:
    """Undo what ``fleetlog.cli.main`` run in-process set up, before and after each test: the
    test logs as it would alone, also after a module-scoped fixture that ran a command (it is
    set up before this fixture, and would otherwise leave its level to the rest of the session)."""
    _pristine_logging()
    yield
    _pristine_logging()
