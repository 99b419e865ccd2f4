"""Binds the log contract suite to every implementation: memory, file, Kafka."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from fleetlog.log.base import LogStore
from fleetlog.log.memory import MemoryLogStore

_counter = itertools.count()


class ManualClock:
    """A clock the test moves by hand (milliseconds)."""

    def __init__(self, now_ms: int = 1_700_000_000_000) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


StoreFactory = Callable[[], LogStore]


def _memory_factory(tmp_path: Path, request: pytest.FixtureRequest) -> StoreFactory:
    return MemoryLogStore


def _file_factory(tmp_path: Path, request: pytest.FixtureRequest) -> StoreFactory:
    from fleetlog.log.file import FileLogStore

    directory = tmp_path / "log"
    return lambda: FileLogStore(directory)


def _kafka_factory(tmp_path: Path, request: pytest.FixtureRequest) -> StoreFactory:
    from fleetlog.log.kafka import KafkaConfig, KafkaLogStore

    bootstrap: str = request.getfixturevalue("kafka_bootstrap")
    prefix = f"contract{next(_counter)}-{tmp_path.name}"
    return lambda: KafkaLogStore(KafkaConfig(bootstrap_servers=bootstrap, topic_prefix=prefix))


_FACTORIES = {"memory": _memory_factory, "file": _file_factory, "kafka": _kafka_factory}


@pytest.fixture(params=["memory", "file", pytest.param("kafka", marks=pytest.mark.kafka)])
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    """Makes stores over the same storage, so a test can close one and reopen it."""
    return _FACTORIES[request.param](tmp_path, request)


@pytest.fixture
async def store(store_factory: StoreFactory) -> AsyncIterator[LogStore]:
    s = store_factory()
    await s.open()
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture(params=["file", pytest.param("kafka", marks=pytest.mark.kafka)])
def durable_store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    """Like ``store_factory`` but only for stores whose contents outlive the process."""
    return _FACTORIES[request.param](tmp_path, request)
