"""``service.node_timeout_ms`` reaches the fold of the service's loop (the soak runs with 3 s)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetlog.core.fold import fold
from fleetlog.core.state import NodeStatus
from fleetlog.log.memory import MemoryLogStore
from fleetlog.service.config import ConfigError, load_config
from fleetlog.service.service import Service
from tests.core.builders import node


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
