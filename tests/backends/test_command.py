"""``fleetlog simulate``: the default run, the report, every bad input (exit 2, one line, no traceback)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fleetlog.cli import EXIT_USAGE, main
from fleetlog.measures import KEYS
from tests.backends.helpers import NODE_HEADER, POD_HEADER, nodes_csv, pod, write_csv

REQUIRED = (
    *KEYS,
    "gpu_alloc_at_target_pct",
    "failed",
    "pending",
    "decisions_per_s",
    "events",
    "wall_s",
    "seed",
    "policy",
)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def simulate(tmp_path: Path, *args: str) -> list[str]:
    return ["simulate", "--log", str(tmp_path / "log"), "--report", str(tmp_path / "report"), *args]


def test_the_default_run_prints_a_real_result_and_writes_log_and_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(simulate(tmp_path, "--json")) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(REQUIRED) <= result.keys()
    assert result["jobs_placed"] > 0
    assert 0 < result["gpu_allocation_pct"] <= 100
    assert result["gpu_alloc_at_target_pct"] is None  # inflate only
    assert (result["seed"], result["policy"], result["mode"].split("?")[0]) == (1, "default", "replay")
    assert {p.name for p in (tmp_path / "log").iterdir()} >= {"inputs", "decisions", "dead-letters"}
    assert (tmp_path / "report" / "plot.png").read_bytes().startswith(PNG_MAGIC)
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["summary"]["jobs_placed"] == result["jobs_placed"]
    assert summary["runs"][0]["timeline"]


def test_inflate_over_several_seeds_prints_a_table_and_the_mean(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = nodes_csv(tmp_path / "nodes.csv")
    pods = write_csv(
        tmp_path / "pods.csv", POD_HEADER, [pod("a", milli=300), pod("b", gpus=2), pod("c", gpus=0)]
    )
    args = [
        "--cluster",
        str(nodes),
        "--workload",
        str(pods),
        "--mode",
        "inflate",
        "--policy",
        "best-fit",
        "--seeds",
        "2",
    ]
    assert main(simulate(tmp_path, *args)) == 0
    out = capsys.readouterr().out
    assert "best-fit?fail_unplaced=true" in out
    assert "seed 2" in out
    assert "mean" in out
    assert sorted(p.name for p in (tmp_path / "log").iterdir()) == ["seed-1", "seed-2"]
    assert main(simulate(tmp_path, *args, "--json", "--force")) == 0  # --force: replaces the first run
    result = json.loads(capsys.readouterr().out)
    assert result["seeds"] == [1, 2]
    assert len(result["runs"]) == 2
    assert result["gpu_alloc_at_target_pct"] > 50
    assert result["pending"] == 0
    assert json.loads((tmp_path / "report" / "summary.json").read_text())["runs"][1]["curve"]


def bad_files(tmp_path: Path) -> dict[str, Path]:
    return {
        "nodes": write_csv(tmp_path / "bad-nodes.csv", NODE_HEADER, ["n0,1,1,0,", "n1,1,x,0,"]),
        "pods": write_csv(
            tmp_path / "bad-pods.csv", POD_HEADER, [pod("a"), pod("b"), pod("c", gpus=4, milli=10)]
        ),
        "good-nodes": nodes_csv(tmp_path / "nodes.csv"),
        "long-trace": write_csv(
            tmp_path / "long.csv", POD_HEADER, [pod("a"), pod("b", created=10**9, deleted=10**9)]
        ),
    }


BAD = [  # (id, arguments, what the message must say)
    ("node-line", ["--cluster", "{nodes}"], "bad-nodes.csv:3: column 'memory_mib': 'x' is not an integer"),
    (
        "pod-line",
        ["--cluster", "{good-nodes}", "--workload", "{pods}"],
        "bad-pods.csv:4: num_gpu 4 with gpu_milli 10",
    ),
    ("missing-file", ["--cluster", "{tmp}/none.csv"], "none.csv: cannot read"),
    ("cluster-spec", ["--cluster", "synthetic?nodes=-1"], "nodes=-1 is outside"),
    ("workload-spec", ["--workload", "synthetic?jobs=x"], "jobs='x' is not an integer"),
    ("mode", ["--mode", "fast"], "--mode 'fast': choose inflate or replay"),
    ("mode-param", ["--mode", "inflate?ratio=-1"], "ratio=-1 is outside"),
    ("policy", ["--policy", "greedy"], "--policy: unknown policy 'greedy'"),
    ("policy-override", ["--policy", "fgd?colour=blue"], "is not field=value of a Policy field"),
    ("log-not-ours", ["--log", "{tmp}"], "which is not a fleetlog log"),
    ("report-is-a-file", ["--report", "{good-nodes}", "--workload", "synthetic?jobs=5"], "nodes.csv:"),
    (
        "replay-span",
        ["--cluster", "{good-nodes}", "--workload", "{long-trace}"],
        "compress the arrivals with",
    ),
]


@pytest.mark.parametrize(("args", "want"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_input_is_one_line_naming_the_problem_and_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], want: str
) -> None:
    files = {k: str(v) for k, v in bad_files(tmp_path).items()} | {"tmp": str(tmp_path)}
    filled = [a.format(**files) for a in args]
    base = (
        [a for a in simulate(tmp_path) if a not in ("--log", str(tmp_path / "log"))]
        if "--log" in args
        else simulate(tmp_path)
    )
    assert main([*base, *filled]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert want in err
    assert err.startswith("fleetlog simulate: error: ")
    assert err.count("\n") == 1


@pytest.mark.parametrize("args", [["--seeds", "0"], ["--seed", "one"], ["--colour", "blue"]])
def test_bad_arguments_are_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        main(simulate(tmp_path, *args))
    assert caught.value.code == EXIT_USAGE
    assert "error:" in capsys.readouterr().err


def test_a_malformed_trace_gives_no_traceback_from_the_installed_command(tmp_path: Path) -> None:
    files = bad_files(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "fleetlog.cli", *simulate(tmp_path, "--cluster", str(files["nodes"]))],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == EXIT_USAGE
    assert "Traceback" not in done.stderr
    assert f"{files['nodes']}:3:" in done.stderr
