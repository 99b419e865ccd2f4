"""The ``[cells]`` map (each cell's partition) and the service's role: read by the service and
by every producer's reader, refused in one line naming the file, line and cell."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fleetlog.core.dispatch import CellMap
from fleetlog.log.location import ConfigError
from fleetlog.log.settings import load_location
from fleetlog.service.config import load_config
from tests.service.process import REPO

MAP = """
[log]
dir = "var/x"

[cells]
a100-east = 0
"T4.lab" = 1
a100-west = 1
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fleetlog.toml"
    path.write_text(text)
    return path


def test_the_map_is_read_sorted_by_cell_by_the_service_and_by_producers(tmp_path: Path) -> None:
    path = write(tmp_path, MAP + '\n[service]\nrole = "cell"\ncell_hold_ms = 0\nsummary_every_ms = 1\n')
    config = load_config(path, {})
    expected = (("T4.lab", 1), ("a100-east", 0), ("a100-west", 1))
    assert config.cells == expected
    assert config.cell_map == CellMap(expected)
    service = config.service
    assert (service.role, service.cell_hold_ms, service.summary_every_ms) == ("cell", 0, 1)
    assert load_location(path, {}, others=("service",)).cells == expected
    assert load_config(write(tmp_path, '[log]\ndir = "d"\n'), {}).cells == ()


def test_a_map_with_as_many_cells_as_a_fleet_has(tmp_path: Path) -> None:
    names = [f"cell-{i:05d}" for i in range(10_000)]
    text = '[log]\ndir = "d"\n[cells]\n' + "".join(f'{n} = {i % 64}\n' for i, n in enumerate(names))
    config = load_config(write(tmp_path, text), {})
    assert [c for c, _ in config.cells] == names
    assert config.cell_map.partition_of("cell-09999") == 9999 % 64


BAD = [
    ('[cells]\na = -1\n', ["line 5", "cells.a = -1", ">= 0"]),
    ('[cells]\na = "one"\n', ["line 5", "cells.a = 'one'", "Expected `int`"]),
    ('[cells]\na = 1.5\n', ["line 5", "cells.a"]),
    ('[cells]\na = 2147483648\n', ["cells.a", "<= 2147483647"]),
    ('[cells]\na = { p = 1 }\n', ["cells.a is a table"]),
    ('[cells]\n"a b" = 1\n', ["line 5", "'a b'", "printable characters, no spaces"]),
    ('[cells]\n"" = 1\n', ["line 5", "''", "1 to 253"]),
    ("[cells]\n'x\ty' = 1\n", ["line 5", "printable"]),
    (f'[cells]\n{"x" * 254} = 1\n', ["1 to 253"]),
    ('[service]\nrole = "cell"\n', ["service.role = 'cell' needs the [cells] table"]),
    ('[service]\nrole = "dispatcher"\n', ["line 5", "service.role", "all, dispatch, cell"]),
    ('[service]\nsummary_material_milli = 0\n', ["summary_material_milli", ">= 1"]),
    ('[service]\nrole_commit_every_ms = 0\n', ["role_commit_every_ms", ">= 1"]),
    ('cells = 3\n', ["cells must be a table"]),
]


@pytest.mark.parametrize(("text", "expected"), BAD)
def test_a_bad_map_or_role_is_named_with_file_and_line(
    tmp_path: Path, text: str, expected: list[str]
) -> None:
    path = write(tmp_path, '\n[log]\ndir = "d"\n' + text if not text.startswith("cells") else text)
    with pytest.raises(ConfigError) as caught:
        load_config(path, {})
    for part in expected:
        assert part in str(caught.value), str(caught.value)
    assert str(path) in str(caught.value)


def test_on_kafka_a_partition_past_the_cells_topics_is_refused(tmp_path: Path) -> None:
    text = '[kafka]\nbootstrap_servers = "b:1"\nshards = 4\n[cells]\nok = 3\nfar = 4\n'
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, text), {})
    assert "line 6" in str(caught.value)
    assert "cells.far = 4" in str(caught.value)
    assert "kafka.shards = 4" in str(caught.value)
    with pytest.raises(ConfigError, match=r"cells\.far = 4"):
        load_location(write(tmp_path, text), {})
    on_file = load_config(write(tmp_path, '[log]\ndir = "d"\n[cells]\nfar = 4\n'), {})  # a directory each
    assert on_file.cells == (("far", 4),)


def test_a_variable_cannot_set_the_map_and_says_so(tmp_path: Path) -> None:
    only = r"FLEETLOG_CELLS_A100: the \[cells\] table is read from the config file only"
    with pytest.raises(ConfigError, match=only):
        load_config(None, {"FLEETLOG_LOG_DIR": "d", "FLEETLOG_CELLS_A100": "1"})
    assert load_config(None, {"FLEETLOG_LOG_DIR": "d", "FLEETLOG_SERVICE_ROLE": "all"}).service.role == "all"


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleetlog.cli", *argv], cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=False)


def test_run_refuses_the_roles_apart_on_the_file_log_in_one_line_and_exit_code_2(tmp_path: Path) -> None:
    """On the file log one process holds every partition's directory: ``--role all`` with the map
    runs the roles (tests/service/test_roles.py); ``dispatch`` and ``cell`` alone need Kafka."""
    path = write(tmp_path, MAP)
    for argv in (["--config", str(path), "--role", "cell"], ["--config", str(path), "--role", "dispatch"]):
        done = run("run", *argv)
        assert done.returncode == 2, done
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        assert lines[0].startswith("fleetlog run: error: --role ")
        assert "runs on Kafka" in lines[0]
        assert "--role all with the [cells] map" in lines[0]
    assert "needs the [cells] table" in run("run", "--log", str(tmp_path / "l"), "--role", "cell").stderr
    assert "invalid choice: 'both'" in run("run", "--log", str(tmp_path / "l"), "--role", "both").stderr
