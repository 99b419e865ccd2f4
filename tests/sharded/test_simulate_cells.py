"""``fleetlog simulate --cells N --shards K`` (fleetlog/simulate_cells.py, fleetlog/sharded/world.py):
a run end to end, its JSON keys and numbers, determinism (another hash seed, another process),
and every usage error in one line with exit code 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetlog.cli import main
from fleetlog.sharded.world import World, WorldSpec, cell_map

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["simulate", "--cells", "4", "--shards", "2", "--jobs", "240", "--nodes-per-cell", "6", "--json"]
KEYS = {"cells", "shards", "nodes_per_cell", "jobs", "seed", "placed", "finished", "dispatched", "returned",
        "waiting", "refused", "gpu_allocation_pct", "tenant_share_pct", "virtual_s", "steps", "digest",
        "per_cell"}
CELL_KEYS = {"cell", "shard", "placed", "returned", "gpu_allocation_pct", "tenant_share_pct"}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_a_run_prints_every_cell_and_the_fleet_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, *SMALL)
    assert (code, err) == (0, "")
    result = json.loads(out)
    assert result.keys() == KEYS
    assert (result["cells"], result["shards"], result["jobs"]) == (4, 2, 240)
    assert result["placed"] == result["finished"] == 240  # every job ran and ended
    assert result["dispatched"] == 240 + result["returned"]  # a returned job is sent again
    assert (result["waiting"], result["refused"]) == (0, 0)
    cells = result["per_cell"]
    assert [c.keys() == CELL_KEYS for c in cells] == [True] * 4
    assert [(c["cell"], c["shard"]) for c in cells] == [("cell000", 0), ("cell001", 1), ("cell002", 0),
                                                         ("cell003", 1)]
    assert sum(c["placed"] for c in cells) == 240
    assert min(c["placed"] for c in cells) > 240 // 8  # spread: no cell idle
    assert sorted(result["tenant_share_pct"]) == ["t0", "t1", "t2", "t3"]
    assert sum(result["tenant_share_pct"].values()) == pytest.approx(100, abs=0.05)
    assert 0 < result["gpu_allocation_pct"] <= 100
    for c in cells:
        assert 0 < c["gpu_allocation_pct"] <= 100


def test_the_table_names_each_cell_and_the_fleet(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, *SMALL[:-1])
    assert code == 0
    assert [line.split()[1] for line in out.splitlines() if line.startswith("│ ")] == [
        "cell000", "cell001", "cell002", "cell003", "fleet"]
    assert "240 jobs ended" in out


def test_the_same_arguments_give_the_same_run_in_another_process_and_hash_seed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, out, _ = run(capsys, *SMALL)
    here = json.loads(out)
    script = "import sys; from fleetlog.cli import main; sys.exit(main(sys.argv[1:]))"
    env = {**os.environ, "PYTHONHASHSEED": "977", "PYTHONPATH": str(ROOT)}
    there = subprocess.run([sys.executable, "-c", script, *SMALL], env=env, capture_output=True, text=True,
                           check=True, timeout=300)
    assert json.loads(there.stdout) == here
    _, other, _ = run(capsys, *SMALL, "--seed", "2")
    assert json.loads(other)["digest"] != here["digest"]  # (the digest does see the run)


def test_one_shard_holds_every_cell() -> None:
    spec = WorldSpec(cells=3, shards=1, nodes=4, jobs=60)
    assert cell_map(spec).partitions == (("cell000", 0), ("cell001", 0), ("cell002", 0))
    result = World(spec).run()
    assert result["finished"] == 60
    assert {c["shard"] for c in result["per_cell"]} == {0}


@pytest.mark.parametrize(("argv", "message"), [
    (["--cells", "2", "--shards", "3"], "--shards 3 is more than --cells 2: every shard holds at least one"),
    (["--cells", "0"], "--cells must be at least 1 (got 0)"),
    (["--cells", "-3"], "--cells must be at least 1 (got -3)"),
    (["--cells", "2", "--shards", "0"], "--shards must be at least 1 (got 0)"),
    (["--cells", "2", "--jobs", "0"], "--jobs must be at least 1 (got 0)"),
    (["--cells", "2", "--nodes-per-cell", "0"], "--nodes-per-cell must be at least 1 (got 0)"),
    (["--cells", "1025"], "--cells 1025: at most 1,024 cells (a job names at most 1,024 allowed cells)"),
    (["--cells", "1000", "--nodes-per-cell", "101"], "--cells x --nodes-per-cell is 101,000 nodes: at most"),
    (["--shards", "2"], "--shards only with --cells N (the sharded simulation)"),
    (["--jobs", "5"], "--jobs only with --cells N (the sharded simulation)"),
    (["--cells", "2", "--mode", "inflate"], "--mode: not with --cells"),
    (["--cells", "2", "--log", "x", "--policy", "fgd"], "--policy, --log: not with --cells"),
    (["--cells", "two"], "argument --cells: invalid int value: 'two'"),
])
def test_bad_usage_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str],
                                          message: str) -> None:
    code, out, err = run(capsys, "simulate", *argv)
    assert (code, out) == (2, "")
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("fleetlog simulate: error: ")
    assert message in err
