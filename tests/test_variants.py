"""The seeded openb variant generator (benchmarks.variants, issue 23) on the real traces."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.simulate import find_traces
from benchmarks.variants import (
    GENERATED,
    VISIBLE,
    Spec,
    SpecError,
    generate,
    group_of,
    halves,
    measures,
    parse_spec,
    read_default,
    read_pods,
)
from fleetlog.simulation.workload import read_pod_list

TRACES = Path(find_traces())
REPO = Path(__file__).resolve().parents[1]


def made(tmp_path: Path, text: str, seed: int = 1) -> tuple[Path, dict[str, object]]:
    path = generate(TRACES, parse_spec(text), seed, tmp_path)
    return path, measures(read_pods(path))


def test_the_same_spec_and_seed_give_the_same_bytes_and_another_seed_another_draw(tmp_path: Path) -> None:
    one, _ = made(tmp_path / "a", "cpu=150+gpushare=90")
    again, _ = made(tmp_path / "b", "gpushare=90+cpu=150")  # (the axes' order in the spec: no matter)
    other, _ = made(tmp_path / "c", "cpu=150+gpushare=90", seed=2)
    assert one.read_bytes() == again.read_bytes()
    assert one.read_bytes() != other.read_bytes()
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [
        "openb_node_list_gpu_node.csv", "openb_pod_list_gen-cpu150-gpushare090-s1.csv"]


@pytest.mark.parametrize("text", ["cpu=0", "cpu=29", "cpu=80", "cpu=400", "cpu=1000", "gpushare=0",
                                  "gpushare=60", "gpushare=100", "cpu=250+gpushare=95"])
def test_each_axis_reaches_its_target_at_and_past_the_published_range(tmp_path: Path, text: str) -> None:
    path, got = made(tmp_path, text)
    base = measures(read_default(TRACES))
    want = dict(parse_spec(text).axes)
    if "cpu" in want:  # at the target, at most one drawn pod past it
        assert want["cpu"] <= got["cpu_pct"] < want["cpu"] + 0.2, got  # type: ignore[operator]
    else:
        assert got["cpu_only_pods"] == base["cpu_only_pods"]
    if "gpushare" in want:
        assert want["gpushare"] <= got["gpushare_pct"] < want["gpushare"] + 0.2 or (
            want["gpushare"] <= base["gpushare_pct"] and got["gpushare_pct"] == base["gpushare_pct"]), got
    workload = read_pod_list(path)  # the simulator takes it: unique names, every row valid
    assert len(workload.jobs) == got["pods"]
    if want.get("cpu") == 0:
        assert got["cpu_only_pods"] == 0
    if want.get("gpushare") == 100:
        groups = [j.event.task_groups[0] for j in workload.jobs]
        assert all(g.gpu_milli < 1000 for g in groups if g.gpu_count)


@pytest.mark.parametrize(("text", "said"), [
    ("", "is not AXIS=PERCENT"), ("cpu", "is not AXIS=PERCENT"), ("mem=50", "'mem=50' is not"),
    ("cpu=-1", "is not AXIS=PERCENT"), ("cpu=1001", "cpu is 0 to 1000"), ("gpushare=101", "0 to 100"),
    ("cpu=10+cpu=20", "once"),
])
def test_a_bad_spec_is_refused_naming_it(text: str, said: str) -> None:
    with pytest.raises(SpecError, match=said):
        parse_spec(text)


def test_the_command_writes_only_into_out_and_gives_usage_errors_exit_code_2(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "benchmarks.variants", *args, "--traces", str(TRACES)],
                              cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                              text=True, timeout=120, check=False)

    done = run("cpu=150", "gpushare=90", "--out", str(tmp_path / "out"), "--seed", "3", "--json")
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)["variants"]
    assert found["gen-cpu150"]["cpu_pct"] >= 150
    assert found["gen-gpushare090"]["gpushare_pct"] >= 90
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    for bad in (["cpu=x", "--out", "o"], ["cpu=10"]):
        done = run(*bad)
        assert done.returncode == 2, done.stderr
        assert "error:" in done.stderr.strip().splitlines()[-1], done.stderr
    assert Spec((("cpu", 5),)).name == "gen-cpu005"


def test_the_hold_out_split_is_fixed_and_covers_every_variant_once() -> None:
    split = halves()
    assert split["tuning"][:7] == ("cpu200", "default", "gpushare60", "gpuspec10", "gpuspec20", "gpuspec25",
                                   "multigpu40")
    assert "cpu=100" in split["check"]
    both = split["tuning"] + split["check"]
    assert sorted(both) == sorted(VISIBLE + GENERATED)
    assert all(parse_spec(s) for s in GENERATED)


def test_each_variant_is_reported_in_its_half() -> None:
    """``group_of``: the halves of ``halves()``, by the names the simulator's rows carry."""
    split = halves()
    for half, names in split.items():
        for name in names:
            row = parse_spec(name).name if "=" in name else name
            assert group_of(row) == f"{'generated' if '=' in name else 'visible'}-{half}"
    assert group_of("cpu300") == group_of("gen-cpu999") == "other"
