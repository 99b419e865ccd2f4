"""``python -m benchmarks.compare`` (and its ``--shape`` report) runs end to end on two real
checkouts of this repository, alternates the revisions as its docstring says, and leaves no
worktree behind: not when it ends, not on a bad revision, not on Ctrl-C."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.compare import Run, better, flatten, order, report, verdict
from benchmarks.worktree import PREFIX, checkout, seed_numba_cache, worktrees

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 580


def compare(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "benchmarks.compare", *args]
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)


def left_behind() -> list[Path]:
    """Worktrees the tool made and did not remove, in git's list or on disk."""
    temp = Path(os.environ.get("TMPDIR", "/tmp"))
    return worktrees() + [p for p in temp.glob(f"{PREFIX}*") if p.stat().st_uid == os.getuid()]


def test_head_against_head_at_smoke_size_with_the_shape_report() -> None:
    """Every key of the benchmark on both sides, one warm-up and one timed run per side in the
    order said, the same tree and cycles and identical fixture reports (HEAD is HEAD), and no
    worktree left."""
    before = set(left_behind())
    done = compare(
        "--before",
        "HEAD",
        "--after",
        "HEAD",
        "--smoke",
        "--rounds",
        "1",
        "--bench",
        "core",
        "--shape",
        "--json",
    )
    assert done.returncode == 0, done.stderr[-4000:]
    r: dict[str, Any] = json.loads(done.stdout)
    assert (
        r["before"]["commit"]
        == r["after"]["commit"]
        == subprocess.check_output(["git", "rev-parse", "HEAD"], cwd=REPO, text=True).strip()
    )
    assert [(x["round"], x["side"]) for x in r["runs"]] == [
        (0, "before"),
        (0, "after"),
        (1, "before"),
        (1, "after"),
    ]
    assert all(x["error"] is None and x["result"]["benchmark"] == "core" for x in r["runs"])
    rows = r["results"]["core"]
    for key in (
        "fold_heartbeat_mix_events_per_s",
        "decide_single_best-fit_1k_nodes_per_s",
        "numba_speedup",
        "decide_pending_1k_jobs_s",
        "bytes_per_node",
    ):
        row = rows[key]
        assert row["before"] > 0, (key, row)
        assert row["after"] > 0, (key, row)
        assert row["ratio"] == row["after"] / row["before"]
        assert len(row["before_runs"]) == len(row["after_runs"]) == 1
    assert rows["bytes_per_node"]["verdict"] == "same"  # a size, not a time: equal at HEAD
    assert set(rows) == set(flatten(r["runs"][-1]["result"]))  # every number the benchmark printed
    shape = r["shape"]
    assert shape["tree"]["total"]["before"] == shape["tree"]["total"]["after"] > 10_000
    assert not [f for f, row in shape["tree"]["files"].items() if row["status"]]
    assert shape["graph"]["before"] == shape["graph"]["after"]
    assert shape["graph"]["after"]["modules"] > 50
    assert set(shape["fixtures"]) == {"clean", "divergent"}
    for name, fixture in shape["fixtures"].items():
        assert fixture["same_files"], name
        assert fixture["same_reports"], name
        reports = list(fixture["reports"].values())
        assert len(reports) == 2
        assert reports[0]["ok"] is (name == "clean")
        assert len(reports[0]["final_digest"]) == 64
    assert set(left_behind()) <= before, "the comparison left a worktree"


def test_a_bad_revision_is_a_usage_error_and_checks_nothing_out() -> None:
    before = set(left_behind())
    done = compare("--before", "HEAD", "--after", "no-such-rev-16", "--smoke")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"python -m benchmarks.compare: error: unknown revision 'no-such-rev-16' (not a commit in {REPO})"
    ]
    assert set(left_behind()) <= before
    assert compare("--before", "HEAD", "--after", "HEAD", "--bench", "core,nope").returncode == 2


@contextmanager
def interruptible() -> Iterator[None]:
    """Children started in the block get SIGINT as a terminal would send it: a shell without job
    control (``cmd &`` in a script, ``nohup``) starts its background commands with SIGINT ignored,
    which their children inherit, and Python then installs no ``KeyboardInterrupt`` handler.  A
    handled signal is reset to its default at exec."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def test_ctrl_c_while_running_removes_the_worktrees() -> None:
    """SIGINT (and SIGTERM) while a benchmark runs in a checkout: both trees are removed."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        before = set(left_behind())
        argv = [
            sys.executable,
            "-m",
            "benchmarks.compare",
            "--before",
            "HEAD",
            "--after",
            "HEAD",
            "--smoke",
            "--bench",
            "replay",
        ]
        with interruptible(), subprocess.Popen(
            argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        ) as child:
            deadline = time.monotonic() + 120
            while len(set(worktrees()) - before) < 2 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert len(set(worktrees()) - before) == 2, "the two checkouts never appeared"
            time.sleep(1)  # a benchmark process is running in the first tree
            child.send_signal(signum)
            _, err = child.communicate(timeout=120)
        assert child.returncode == 130, err[-2000:]
        assert err.strip().splitlines()[-1] == "python -m benchmarks.compare: interrupted (worktrees removed)"
        assert set(left_behind()) <= before, signum


def test_a_locked_worktree_is_removed_too() -> None:
    """A Ctrl-C while ``git worktree add`` runs leaves the entry locked ("initializing"); the
    checkout is still removed, from git's list and from disk."""
    before = set(left_behind())
    with checkout("HEAD") as tree:
        lock = ["git", "worktree", "lock", "--reason", "initializing", str(tree)]
        subprocess.run(lock, cwd=REPO, check=True)
    assert set(left_behind()) <= before


def test_the_order_alternates_abba() -> None:
    assert [order(r) for r in (1, 2, 3, 4)] == [(0, 1), (1, 0), (0, 1), (1, 0)]


def test_flatten_keeps_every_number_and_only_numbers() -> None:
    result = {"a": 1, "b": {"c": 2.5, "d": "text", "e": [1, 2], "f": True, "g": {"h": 3}}, "i": float("nan")}
    assert flatten(result) == {"a": 1.0, "b.c": 2.5, "b.g.h": 3.0}


def test_which_way_is_better_and_the_verdict() -> None:
    assert better("decide_single_fgd_1k_nodes_per_s") == "higher"
    assert better("throughput.batch64.decisions_per_cpu_s") == "higher"
    assert better("numba_speedup") == "higher"
    assert better("state_at_snapshot_s") == "lower"
    assert better("step_cost.ms_per_step.decide (total)") == "lower"
    assert better("step_cost_batch64.us_per_pod_total") == "lower"
    assert better("bytes_per_node") == "lower"
    assert better("step_cost.percent_of_wall.state digest") is None
    assert better("events") is None
    up = "verify_events_per_s"
    assert verdict(up, [10, 11, 12], [13, 14, 15]) == "better"
    assert verdict(up, [13, 14, 15], [10, 11, 12]) == "worse"
    assert verdict(up, [10, 12, 14], [11, 13, 15]) == "~"  # the rounds overlap: noise
    assert verdict(up, [100, 101, 102], [103, 104, 105]) == "~"  # apart, but by 3%: noise
    assert verdict("decide_pending_1k_jobs_s", [1.0, 1.1], [0.5, 0.6]) == "better"
    assert verdict("events", [5, 5], [5, 5]) == "same"
    assert verdict("events", [5, 5], [6, 6]) == "~"


def test_medians_ratios_and_failures_of_fabricated_runs() -> None:
    """Per key the median of each side's timed rounds (the warm-up is not one of them); a failed
    warm-up is shown apart and not counted as a failure, a failed round is."""
    runs = [
        Run("core", "before", 0, 1.0, 0.0, None, "benchmarks.core exited 2: no --smoke"),
        Run("core", "after", 0, 1.0, 0.0, {"x_per_s": 1e9}),
        *(
            Run("core", "before", i, 1.0, 0.0, {"x_per_s": v, "n": 5})
            for i, v in ((1, 100), (2, 300), (3, 200))
        ),
        *(
            Run("core", "after", i, 1.0, 0.0, {"x_per_s": v, "n": 5})
            for i, v in ((1, 400), (2, 500), (3, 450))
        ),
        Run("core", "after", 4, 1.0, 0.0, None, "benchmarks.core exited 1: boom"),
    ]
    args = argparse.Namespace(before="A", after="B", rounds=4, no_warmup=False, smoke=False, benches=["core"])
    r = report(args, ["a" * 40, "b" * 40], runs)
    row = r["results"]["core"]["x_per_s"]
    assert (row["before"], row["after"], row["ratio"], row["verdict"]) == (200, 450, 2.25, "better")
    assert r["results"]["core"]["n"]["verdict"] == "same"
    assert r["failures"] == ["core after round 4: benchmarks.core exited 1: boom"]
    assert r["warmup_failures"] == ["core before: benchmarks.core exited 2: no --smoke"]


def test_a_tree_gets_the_numba_cache_only_with_the_same_sources(tmp_path: Path) -> None:
    """The working copy's numba cache files are copied into a tree whose ``fleetlog`` sources are
    the same bytes, and into no other (a changed, added or removed file: the tree compiles)."""
    source, tree = tmp_path / "source", tmp_path / "tree"
    for root in (source, tree):
        (root / "fleetlog" / "core").mkdir(parents=True)
        (root / "fleetlog" / "core" / "k.py").write_text("x = 1\n")
    cache = source / "fleetlog" / "core" / "__pycache__"
    cache.mkdir()
    for name in ("k.f-3.py311.nbi", "k.f-3.py311.1.nbc", "k.cpython-311.pyc"):
        (cache / name).write_bytes(b"compiled")
    assert seed_numba_cache(tree, source) == 2
    assert sorted(p.name for p in (tree / "fleetlog" / "core" / "__pycache__").iterdir()) == [
        "k.f-3.py311.1.nbc",
        "k.f-3.py311.nbi",
    ]
    for change in ("edit", "add", "remove"):
        other = tmp_path / change
        (other / "fleetlog" / "core").mkdir(parents=True)
        if change != "remove":
            (other / "fleetlog" / "core" / "k.py").write_text("x = 2\n" if change == "edit" else "x = 1\n")
        if change == "add":
            (other / "fleetlog" / "new.py").write_text("")
        assert seed_numba_cache(other, source) == 0, change
        assert not (other / "fleetlog" / "core" / "__pycache__").exists(), change
