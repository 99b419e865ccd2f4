"""fleetlog on a replicated Kafka cluster under faults (issue 18): nothing lost, nothing
duplicated, and how long decisions stall.

    python -m benchmarks.faults --json [--quick | --smoke] [--rounds N] [--only a,b]

A real three-node KRaft cluster (``infra/kafka/kafka.sh cluster``: replication factor 3,
``min.insync.replicas=2``, no unclean leader election) with Toxiproxy in front of every broker;
``fleetlog run`` with its default settings reaches the brokers through the proxy, a producer of
sustained keyed load (40 inputs every 50 ms, each append awaited, none resent) directly. Each
scenario (``tests/faults/harness.py``) runs ``--rounds`` rounds (5; ``--quick`` 1 of each of the
seven scenarios the issue lists, with 1.5 s of calm instead of 3) on fresh topics: 3 s of calm
load, the fault and its healing, a wait until a decision follows the healing (the service
resumes by itself, or the run fails). Then the load stops, the service catches up
and the checker (``tests/faults/checker.py``) reads every log back through brokers no fault
touched: acknowledged inputs lost, inputs duplicated, decision gaps and duplicates, and ``replay
verify`` over all of it.

Per scenario: ``max_stall_s`` is the longest time without a decision record from a fault's start
until decisions flowed again after its healing; ``p99_fault_ms`` the p99 decision latency (an
input's append time to the append time of the step that folded it) of inputs appended in that
window; ``p99_no_fault_ms`` repeats the ``none`` scenario's: the same run and windows without
faults (the baseline). Totals: ``acked_inputs``, ``lost``,
``duplicated``, ``decision_gaps`` (and ``decision_duplicates``) summed, ``max_stall_s`` the
largest (``max_kill_stall_s`` over the broker kills, ``kill_stall_target_met`` whether each is
at most 10 s). Targets: zero in every loss, duplicate and gap column; a stall of at most 10 s for
broker kills. The exit code is 1 when anything was lost, duplicated or left undecided.

The cluster is started for the run under ``var/`` on free ports and stopped by PID; with
``FLEETLOG_KAFKA_CLUSTER_PORT`` and ``FLEETLOG_KAFKA_CLUSTER_DIR`` naming a cluster that runs,
that one is used and left running. ``--smoke``: the baseline and one cut, one round each.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import add_smoke, emit, machine
from tests.faults.harness import SCENARIOS, run_scenario
from tests.kafka_cluster import KafkaCluster

KILLS = ("kill-inputs-leader", "kill-decisions-leader", "kill-controller", "kill-service-and-broker")
"""The scenarios a stall of at most 10 s is the target for."""
STALL_TARGET_S = 10.0
EXTRA = ("blackhole-broker",)
"""Beyond the seven scenarios of the issue: in the full run and the tests, not in ``--quick``."""


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.faults", description=__doc__.split("\n\n")[0],
                                     allow_abbrev=False)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quick", action="store_true",
                        help="one round of each of the seven scenarios, shorter calm (under 5 minutes)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per scenario (default 5, --quick 1)")
    parser.add_argument("--only", default="", help="comma-separated scenarios (default: all): "
                        + ", ".join(SCENARIOS))
    add_smoke(parser)
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario {unknown[0]!r}: one of {', '.join(SCENARIOS)}")
    if args.rounds is not None and args.rounds < 1:
        parser.error("--rounds must be at least 1")
    return args


def cluster_to_use() -> tuple[KafkaCluster, bool]:
    """The cluster the environment names if it runs (not ours to stop), else a new one."""
    port, where = os.environ.get("FLEETLOG_KAFKA_CLUSTER_PORT"), os.environ.get("FLEETLOG_KAFKA_CLUSTER_DIR")
    if port and where:
        named = KafkaCluster(int(port), Path(where), ephemeral=False)
        if set(named.status().values()) == {"running"}:
            return named, False
    return KafkaCluster(), True


def say(text: str) -> None:
    print(f"faults: {text}", file=sys.stderr, flush=True)


async def measure(names: list[str], rounds: int, quick: bool = False) -> dict[str, Any]:
    cluster, ours = cluster_to_use()
    if ours:
        say(f"starting a three-node cluster on ports {cluster.base}-{cluster.base + 30}")
        await asyncio.to_thread(cluster.start)
    rows: dict[str, dict[str, Any]] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="fleetlog-faults-") as work:
            for i, name in enumerate(names, 1):
                started = time.monotonic()
                say(f"[{i}/{len(names)}] {name}: {rounds} round(s)")
                pace = {"calm_s": 1.5, "warmup_s": 2.0} if quick else {}
                result = await run_scenario(cluster, name, rounds, Path(work), **pace)
                rows[name] = result.row()
                r = result.report
                say(f"[{i}/{len(names)}] {name}: acked {r.acked_inputs}, lost {r.lost}, duplicated "
                    f"{r.duplicated}, gaps {r.decision_gaps}, replay {'ok' if r.replay_ok else 'DIVERGED'}, "
                    f"max stall {result.max_stall_s:.1f} s ({time.monotonic() - started:.0f} s)")
    finally:
        if ours:
            await asyncio.to_thread(cluster.close)
    faults = {n: row for n, row in rows.items() if n != "none"}
    for row in rows.values():  # the same run without faults, for comparison
        row["p99_no_fault_ms"] = rows["none"]["p99_fault_ms"]
    return {
        "scenarios": rows,
        "rounds": rounds,
        "acked_inputs": sum(int(r["acked_inputs"]) for r in rows.values()),
        "lost": sum(int(r["lost"]) for r in rows.values()),
        "duplicated": sum(int(r["duplicated"]) for r in rows.values()),
        "decision_gaps": sum(int(r["decision_gaps"]) for r in rows.values()),
        "decision_duplicates": sum(int(r["decision_duplicates"]) for r in rows.values()),
        "replay_ok": all(bool(r["replay_ok"]) for r in rows.values()),
        "max_stall_s": max((float(r["max_stall_s"]) for r in faults.values()), default=0.0),
        "max_kill_stall_s": max((float(faults[n]["max_stall_s"]) for n in KILLS if n in faults),
                                default=0.0),
        "kill_stall_target_met": all(float(faults[n]["max_stall_s"]) <= STALL_TARGET_S
                                     for n in KILLS if n in faults),
        "machine": machine(),
    }


def table(result: dict[str, Any]) -> str:
    head = ("scenario", "rounds", "acked", "lost", "dup", "gaps", "replay", "stall s", "p99 fault",
            "p99 none")
    lines = ["  ".join(f"{h:>10}" if i else f"{h:24}" for i, h in enumerate(head))]
    for name, r in result["scenarios"].items():
        cells = (r["rounds"], r["acked_inputs"], r["lost"], r["duplicated"], r["decision_gaps"],
                 "ok" if r["replay_ok"] else "DIVERGED", f"{r['max_stall_s']:.1f}",
                 f"{r['p99_fault_ms']:.0f} ms", f"{r['p99_no_fault_ms']:.0f} ms")
        lines.append("  ".join([f"{name:24}", *(f"{c!s:>10}" for c in cells)]))
    return "\n".join(lines)


def main() -> None:
    args = parse()
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)  # a dead broker is expected here
    if args.smoke:
        names, rounds = ["none", "cut-service"], 1
    else:
        chosen = [n for n in args.only.split(",") if n] or [n for n in SCENARIOS if not (
            args.quick and n in EXTRA)]
        names = ["none", *chosen]
        rounds = args.rounds or (1 if args.quick else 5)
    result = asyncio.run(measure(names, rounds, quick=args.quick or args.smoke))
    if args.json:
        emit(result, True)
    else:
        print(table(result))
        emit({k: v for k, v in result.items() if k not in ("scenarios", "machine")}, False)
    clean = result["lost"] == result["duplicated"] == result["decision_gaps"] == 0 and result["replay_ok"]
    sys.exit(0 if clean else 1)


if __name__ == "__main__":
    main()
