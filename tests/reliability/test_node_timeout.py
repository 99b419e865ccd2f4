"""``service.node_timeout_ms`` reaches the fold of the service's loop (the soak runs with 3 s)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from fleetlog.cli import main
from fleetlog.core.fold import fold
from fleetlog.core.policy import Policy
from fleetlog.core.state import CoreConfig, NodeStatus
from fleetlog.events import Event, encode, envelope
from fleetlog.log.base import INPUTS, Message
from fleetlog.log.file import FileLogStore
from fleetlog.log.location import ConfigError
from fleetlog.log.memory import MemoryLogStore
from fleetlog.service.config import load_config
from fleetlog.service.loop import LoopConfig, SchedulerLoop
from fleetlog.service.service import Service
from tests.core.builders import job, node


def test_the_node_timeout_setting_is_the_folds(tmp_path: Path) -> None:
    config = load_config(None, {"FLEETLOG_SERVICE_NODE_TIMEOUT_MS": "3000"}, log_dir=str(tmp_path))
    assert config.service.node_timeout_ms == 3000
    state = Service(config).make_loop(MemoryLogStore()).state
    assert state.config.node_timeout_ms == 3000
    fold(state, node("n1"), 1_000)
    fold(state, node("n2"), 3_900)
    assert int(state.nodes.cols["status"][0]) == NodeStatus.UP  # silent 2.9 s: still up
    fold(state, node("n2"), 4_700)  # the next sweep (every timeout / 4 of log time)
    assert int(state.nodes.cols["status"][0]) == NodeStatus.DOWN  # silent 3.7 s: down
    default = load_config(None, {}, log_dir=str(tmp_path))
    assert Service(default).make_loop(MemoryLogStore()).state.config.node_timeout_ms == 60_000


def test_a_node_timeout_below_one_ms_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="FLEETLOG_SERVICE_NODE_TIMEOUT_MS"):
        load_config(None, {"FLEETLOG_SERVICE_NODE_TIMEOUT_MS": "0"}, log_dir=str(tmp_path))


async def _log_with_a_lost_node(directory: Path) -> None:
    """A service with a 3 s node timeout: two nodes, a job on one of them, then only the other
    keeps beating for 5 s, so the job's node is lost and the job placed again."""
    clock = [1_000]
    store = FileLogStore(directory, clock=lambda: clock[0], fsync="never")
    await store.open()
    try:
        loop = SchedulerLoop(store, Policy(), LoopConfig(), CoreConfig(node_timeout_ms=3_000))
        inputs = store.log(INPUTS)

        def msgs(*events: Event) -> list[Message]:
            return [Message(encode(envelope(e, "t"))) for e in events]

        await inputs.append(msgs(node("n1"), node("n2"), job("j1")))
        await loop.step()
        for second in range(1, 6):
            clock[0] = 1_000 + 1_000 * second
            await inputs.append(msgs(node("n1"), node("n2")) if second == 1 else msgs(node("n2")))
            await loop.step()
    finally:
        await store.close()


async def test_replay_folds_with_the_node_timeout_the_configuration_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``fleetlog replay`` and ``fleetlog status`` read the same configuration as ``fleetlog run``:
    a log written with a 3 s node timeout verifies with it, and diverges at once without it."""
    directory = tmp_path / "log"
    await _log_with_a_lost_node(directory)
    verify_cmd = ["replay", "verify", "--log", str(directory), "--json"]
    monkeypatch.setenv("FLEETLOG_SERVICE_NODE_TIMEOUT_MS", "3000")
    assert await asyncio.to_thread(main, verify_cmd) == 0, capsys.readouterr().out
    monkeypatch.delenv("FLEETLOG_SERVICE_NODE_TIMEOUT_MS")
    assert await asyncio.to_thread(main, verify_cmd) == 1, "the default 60 s must not verify this log"
