"""The first run compiles the kernels up front and says so; the compile is kept out of the run's
wall time and decisions/s (``compile_s`` apart); and the warm-up leaves nothing for the run to
compile, whatever the policy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numba
import pytest

from fleetlog.kernel_warmup import NOTICE

ROOT = Path(__file__).resolve().parents[1]
JIT_OFF = bool(numba.config.DISABLE_JIT)  # type: ignore[attr-defined]


COVERAGE = """
import asyncio, json, sys
from numba.core.registry import CPUDispatcher
from fleetlog.simulation import RunConfig, load_cluster, load_workload, parse_mode, run_simulation
import importlib, pkgutil
from fleetlog.core import cellshard, digest, fold_batch, invariants, kernels
from fleetlog.core.policy import policy_named
from fleetlog.service.loop import LoopConfig, SchedulerLoop
from fleetlog.service.warmup import warm_up

# the kernels package's modules, each dispatcher read once, in the module that defines it
MODULES = [importlib.import_module(f"{kernels.__name__}.{i.name}")
           for i in pkgutil.iter_modules(kernels.__path__)]

def compiled():
    return {f"{m.__name__}.{n}": {str(s) for s in f.signatures}
            for m in (*MODULES, digest, invariants, fold_batch, cellshard)
            for n, f in vars(m).items()
            if isinstance(f, CPUDispatcher) and f.py_func.__module__ == m.__name__}

policy, mode = sys.argv[1], sys.argv[2]
chosen = policy_named(policy, **({"fail_unplaced": True} if mode == "inflate" else {}))
warm_up(chosen)
before = compiled()
cluster = load_cluster("synthetic?nodes=6&hosts_per_rack=2&mtbf_h=2&mttr_s=600")
workload = load_workload("synthetic?jobs=80&load=1.5&max_h=1&tenants=3", cluster, 1)
config = RunConfig(cluster, workload, parse_mode(mode), 1, chosen.name, None)
loop = lambda store: SchedulerLoop(store, chosen, LoopConfig(check_invariants=True))
summary = asyncio.run(run_simulation(config, loop))
after = compiled()
new = {k: sorted(v - before.get(k, set())) for k, v in after.items() if v - before.get(k, set())}
print(json.dumps({"warm": sum(map(len, before.values())), "decisions": summary.decisions, "new": new}))
"""


@pytest.mark.parametrize(
    ("policy", "mode"), [("default", "replay"), ("fgd", "inflate"), ("best-fit", "inflate")]
)
def test_the_warm_up_leaves_nothing_for_a_run_to_compile(policy: str, mode: str) -> None:
    """In a fresh process (kernels compiled in this one would hide a gap): after the warm-up, a
    run with several tenants, gangs, preemptions and node failures compiles no new signature."""
    done = subprocess.run(
        [sys.executable, "-c", COVERAGE, policy, mode], cwd=ROOT, capture_output=True, text=True,
        timeout=900, check=False,
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["decisions"] > 0
    assert JIT_OFF or found["warm"] >= 8  # the placement, digest and FGD kernels
    assert found["new"] == {}


def fleetlog(cwd: Path, cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache))
    env.pop("NUMBA_DISABLE_JIT", None)  # this is about the JIT compiling
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "fleetlog.cli", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=900, check=False,
    )


def test_a_cold_cache_says_compiling_and_keeps_the_compile_out_of_decisions_per_s(tmp_path: Path) -> None:
    cache = tmp_path / "numba-cache"  # empty: numba compiles every kernel, as on a first install
    args = ["simulate", "--cluster", "synthetic?nodes=8", "--workload", "synthetic?jobs=40", "--json"]
    first = fleetlog(tmp_path, cache, *args)
    assert first.returncode == 0, first.stderr
    assert first.stderr.splitlines()[0] == NOTICE
    cold = json.loads(first.stdout)
    assert cold["compile_s"] > 3 * cold["wall_s"]  # the compile happened before the run, not in it
    assert cold["jobs_placed"] > 0
    assert cold["decisions_per_s"] >= cold["jobs_placed"] / cold["wall_s"] * 0.99  # per second of the run
    second = fleetlog(tmp_path, cache, *args)
    assert second.returncode == 0, second.stderr
    assert NOTICE not in second.stderr  # served from the cache: nothing to say
    warm = json.loads(second.stdout)
    assert warm["compile_s"] < cold["compile_s"] / 3


def test_demo_compiles_no_kernel(tmp_path: Path) -> None:
    """demo measures the file log alone: its events/s never include a compile."""
    cache = tmp_path / "numba-cache"
    done = fleetlog(tmp_path, cache, "demo", "--nodes", "4", "--jobs", "200", "--json")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert not cache.exists() or not any(cache.rglob("*.nbi"))


CELL_KERNELS = """
import json
from numba.core.registry import CPUDispatcher
from fleetlog.core import cellshard, fold_batch
from fleetlog.core.policy import policy_named
from fleetlog.service.warmup import warm_up
warm_up(policy_named("default"))
print(json.dumps({f"{m.__name__}.{n}": len(f.signatures) for m in (fold_batch, cellshard)
                  for n, f in vars(m).items() if isinstance(f, CPUDispatcher)}))
"""


def test_the_warm_up_compiles_a_cell_shards_fold_and_summary_kernels() -> None:
    """A cell shard's step folds its dispatches and its placements at once and summarizes its
    cell with kernels a single shard's small run may not reach: the warm-up steps a toy cell
    shard, so each is compiled (in a fresh process) before a process leads."""
    done = subprocess.run([sys.executable, "-c", CELL_KERNELS], cwd=ROOT, capture_output=True, text=True,
                          timeout=900, check=False)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    expected = {"fleetlog.core.fold_batch._take_many", "fleetlog.core.fold_batch._usage_sums",
                "fleetlog.core.cellshard._free_table"}
    assert JIT_OFF or (set(found) >= expected and all(found[k] >= 1 for k in expected)), found


@pytest.mark.parametrize("cells", [False, True], ids=["one-shard", "role-all-with-cells"])
def test_a_cold_start_serves_health_while_warming_and_stops_at_once(tmp_path: Path, cells: bool) -> None:
    """``fleetlog run`` on a cold numba cache printed nothing for minutes, refused connections on
    ``/healthz`` (a liveness probe kills it) and ignored SIGTERM for about 130 s: it warmed the
    kernels on the event loop before binding HTTP.  Now it says it compiles, answers ``warming``
    with progress, and a SIGTERM during the compile ends it in seconds with exit code 0 — in the
    single shard and in ``--role all`` with a ``[cells]`` map alike."""
    import signal
    import time

    from tests.service.process import ServiceProcess, health_at

    args = ["--log", str(tmp_path / "log")]
    if cells:
        config = tmp_path / "fleetlog.toml"
        config.write_text('[cells]\nc1 = 0\nc2 = 1\n')
        args = ["--config", str(config), *args, "--role", "all"]
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "numba-cache"), "NUMBA_DISABLE_JIT": "0"}
    process = ServiceProcess(tmp_path / "run.log", args, env).start()
    try:
        started = time.monotonic()
        address = process.address(timeout_s=60)
        found = health_at(address)
        assert found is not None, process.tail()
        assert found["status"] == "warming", found
        assert set(found["warming"]) == {"kernels_compiled", "seconds"}, found
        while NOTICE not in (tmp_path / "run.log").read_text() and time.monotonic() - started < 60:
            time.sleep(0.2)
        assert NOTICE in (tmp_path / "run.log").read_text(), process.tail()
        compiling = health_at(address)
        assert compiling is not None, process.tail()
        assert compiling["status"] == "warming", compiling
        assert compiling["warming"]["kernels_compiled"] >= 1, compiling
        assert process.proc is not None
        signalled = time.monotonic()
        process.proc.send_signal(signal.SIGTERM)
        assert process.proc.wait(timeout=15) == 0, process.tail()
        assert time.monotonic() - signalled < 15
        assert "kernels_ready" not in (tmp_path / "run.log").read_text()  # stopped while warming
    finally:
        process.stop()
