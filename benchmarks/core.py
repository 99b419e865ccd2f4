"""Core speed: fold and decide, against the pure-Python kernel reference in the same run.

    python -m benchmarks.core --json [--quick | --smoke]

``--smoke`` (CI): 1k nodes only, small streams, 200 jobs for the reference; every key family.

- ``fold_heartbeat_mix_events_per_s``: ``fold_many`` of a heartbeat-heavy stream (98% steady
  heartbeats of known nodes, 2% job submissions) on a 10,000-node fleet; also one event at a
  time, and submissions alone;
- ``decide_single_per_s``: single-task placements per second (1-GPU tasks) at N nodes, for
  N in 1k / 10k / 100k (10k / 1k for --quick), with best-fit and FGD scoring;
- ``decide_gang_per_s``: gangs of 8 tasks x 8 GPUs in one rack, placed per second at 10k nodes;
- ``decide_single_*_constrained_per_s``, ``decide_gang_*_constrained_per_s``: the same with
  placement constraints (docs/scheduling.md): every node labelled with one of four zones, one
  node in three tainted ``NoSchedule``, one in 50 cordoned; every task tolerating the taint
  (one constraint class); ``*_4_classes_per_s``: each tenant's tasks also select a zone of
  their own (four classes, a quarter of the fleet each, the tenants' jobs interleaved);
- ``decide_single_*_preferred_per_s``: the constrained measure with soft affinity (single-task,
  best-fit and FGD, at the constrained sizes): every task also *prefers* its tenant's zone with
  weight 10 (``preferred_affinity``, never a requirement); ``preferred_zone_share_*``: the share
  of those placements that landed in the preferred zone (a check that the preference acts);
- ``gangs_spread_per_s``: gangs of 8 one-GPU tasks, ``spread="host"`` (one task a node), no
  required topology, on the plain fleet at the largest constrained size (10k nodes; 1k with
  --smoke); ``gangs_unspread_per_s`` the same gangs without the spread (the baseline);
  ``gangs_spread_rack_per_s`` spread gangs that must also share a rack (every rack tried);
- ``decide_pending_100k_s``: one decide over 100,000 pending jobs on a full 1k-node fleet
  (the failed-shape cache at work);
- ``bytes_per_node``, ``bytes_per_pending_job``: state memory (numpy columns; interned names
  and Python-side dicts are counted separately as ``python_bytes_per_job``);
- ``reference_single_per_s``: the same single-task decide with the pure-Python kernels
  (``fleetlog.core.kernels_ref``) at 1k nodes, and the numba speed-up over it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

import msgspec

from benchmarks.common import emit, machine, parse
from fleetlog.core import decide_fast, explain, fitting, kernels, kernels_ref, memo, scratch
from fleetlog.core.decide import decide
from fleetlog.core.fold import fold
from fleetlog.core.fold_batch import fold_many
from fleetlog.core.policy import Policy
from fleetlog.core.state import State
from fleetlog.events import (
    Event,
    JobPlaced,
    JobSubmitted,
    NodeHeartbeat,
    NodeLabel,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    Taint,
    TaskGroup,
    Toleration,
)
from fleetlog.events.model import PreferredTerm


def fleet(n: int) -> Iterator[NodeHeartbeat]:
    for i in range(n):
        yield NodeHeartbeat(
            cell="c1",
            node=f"n{i:06d}",
            cpu_milli=96_000,
            mem_mib=786_432,
            gpu_count=8,
            gpu_model="A100",
            topology=(f"b{i // 512}", f"r{i // 16}", f"n{i:06d}"),
        )


def jobs(count: int, tasks: int, gpus: int, topology: bool, prefix: str = "j") -> Iterator[JobSubmitted]:
    for i in range(count):
        yield JobSubmitted(
            job_id=f"{prefix}{i}",
            tenant=f"t{i % 4}",
            required_topology="rack" if topology else None,
            task_groups=(
                TaskGroup(
                    count=tasks, cpu_milli=4000 * gpus, mem_mib=8192 * gpus, gpu_count=gpus, gpu_milli=1000
                ),
            ),
        )


ZONES = ("za", "zb", "zc", "zd")
TAINT = Taint(key="nvidia.com/gpu", value="present", effect="NoSchedule")


def constrained_fleet(n: int) -> Iterator[NodeHeartbeat]:
    """:func:`fleet` with zone labels, a taint on one node in three, a cordon on one in 50."""
    for i, hb in enumerate(fleet(n)):
        yield msgspec.structs.replace(
            hb, labels={"zone": ZONES[i % 4]}, taints=(TAINT,) * (i % 3 == 0), unschedulable=i % 50 == 49
        )


def prefers(zone: str, weight: int = 10) -> tuple[PreferredTerm, ...]:
    """Soft affinity for the label ``zone`` = ``zone``."""
    term = NodeSelectorTerm((NodeSelectorRequirement("zone", "In", (zone,)),))
    return (PreferredTerm(weight=weight, preference=term),)


def constrain(j: JobSubmitted, i: int, classes: int, prefer: bool = False) -> JobSubmitted:
    """``j`` tolerating the taint, and with 4 ``classes`` selecting zone ``i % 4``; ``prefer``:
    also preferring zone ``i % 4`` (its tenant's) with weight 10."""
    extra: dict[str, object] = {"tolerations": (Toleration(key=TAINT.key, operator="Exists"),)}
    if classes == 4:
        extra["node_selector"] = (NodeLabel("zone", ZONES[i % 4]),)
    if prefer:
        extra["preferred_affinity"] = prefers(ZONES[i % 4])
    groups = tuple(msgspec.structs.replace(g, **extra) for g in j.task_groups)
    return msgspec.structs.replace(j, task_groups=groups)


def constrained_jobs(stream: Iterator[JobSubmitted], classes: int, prefer: bool = False) -> Iterator[Event]:
    return (constrain(j, i, classes, prefer) for i, j in enumerate(stream)) if classes else stream


def state_with(nodes: int, events: Iterator[Event], constrained: bool = False) -> State:
    state = State()
    t = 1
    for e in (*(constrained_fleet(nodes) if constrained else fleet(nodes)), *events):
        fold(state, e, t)
    return state


def time_decide(state: State, policy: Policy) -> tuple[float, int]:
    start = time.perf_counter()
    decisions = decide(state, policy)
    return time.perf_counter() - start, len(decisions)


def bench_fold(quick: bool, smoke: bool = False) -> dict[str, Any]:
    """A 10,000-node fleet heartbeating every 10 s produces 1,000 heartbeats/s against tens of
    submissions/s: the mix is 98% steady heartbeats and 2% job submissions. Submissions alone
    are measured too, as is fold one event at a time (the baseline)."""
    n = 2_000 if smoke else 200_000 if quick else 1_000_000
    beats = list(fleet(10_000))
    stream: list[Event] = [
        beats[i % 10_000]
        if i % 50
        else JobSubmitted(
            job_id=f"f{i}", tenant="t", task_groups=(TaskGroup(count=1, cpu_milli=1, mem_mib=1),)
        )
        for i in range(n)
    ]
    pairs = [(e, 10 + i // 100) for i, e in enumerate(stream)]
    out = {
        "fold_heartbeat_mix_events_per_s": _fold_rate(pairs, True),
        "fold_one_by_one_events_per_s": _fold_rate(pairs, False),
    }
    subs = [(e, t) for e, t in pairs if isinstance(e, JobSubmitted)]
    out["fold_submissions_only_events_per_s"] = _fold_rate(subs, True)
    return out


def _fold_rate(pairs: list[tuple[Event, int]], batched: bool) -> float:
    state = state_with(10_000, iter(()))
    start = time.perf_counter()
    if batched:
        fold_many(state, pairs)
    else:
        for e, at_ms in pairs:
            fold(state, e, at_ms)
    return len(pairs) / (time.perf_counter() - start)


def bench_single(nodes: int, scoring: str, classes: int = 0) -> float:
    count = min(nodes * 8, 20_000 if nodes <= 10_000 else 2_000)
    if classes:
        count //= 2  # (the eligible capacity: a fleet a little smaller, in four zones)
    state = state_with(nodes, constrained_jobs(jobs(count, 1, 1, False), classes), classes > 0)
    elapsed, made = time_decide(state, Policy(scoring=scoring))  # type: ignore[arg-type]
    assert made >= count, (made, count)
    return count / elapsed


def bench_preferred(nodes: int, scoring: str) -> tuple[float, float]:
    """:func:`bench_single` with one constraint class and each tenant preferring its own zone:
    (placements/s, the share of placements in the preferred zone)."""
    count = min(nodes * 8, 20_000 if nodes <= 10_000 else 2_000) // 2
    stream = jobs(count, 1, 1, False)
    state = state_with(nodes, constrained_jobs(stream, 1, prefer=True), True)
    start = time.perf_counter()
    decisions = decide(state, Policy(scoring=scoring))  # type: ignore[arg-type]
    elapsed = time.perf_counter() - start
    placed = [d for d in decisions if isinstance(d, JobPlaced)]
    assert len(placed) == count, (len(placed), count)
    zone_of = {f"n{i:06d}": ZONES[i % 4] for i in range(nodes)}
    hits = sum(zone_of[p.tasks[0].node] == ZONES[int(p.job_id[1:]) % 4] for p in placed)
    return count / elapsed, hits / count


def bench_spread(nodes: int, spread: bool, rack: bool = False) -> float:
    """Gangs of 8 one-GPU tasks, ``spread="host"`` or none, half the fleet's GPUs, in one rack
    (``rack``: every rack is a domain to try) or anywhere; with the spread, every gang's tasks
    are checked to be on 8 distinct nodes."""
    count = nodes // 2
    stream = (
        msgspec.structs.replace(j, spread="host" if spread else None) for j in jobs(count, 8, 1, rack, "s")
    )
    state = state_with(nodes, stream)
    start = time.perf_counter()
    decisions = decide(state, Policy(scoring="best-fit"))
    elapsed = time.perf_counter() - start
    placed = [d for d in decisions if isinstance(d, JobPlaced)]
    assert len(placed) == count, (len(placed), count)
    if spread:
        assert all(len({t.node for t in p.tasks}) == 8 for p in placed)
    return count / elapsed


def bench_gang(nodes: int, classes: int = 0) -> float:
    count = nodes // 8 // 2 // (2 if classes else 1)
    state = state_with(nodes, constrained_jobs(jobs(count, 8, 8, True), classes), classes > 0)
    elapsed, made = time_decide(state, Policy(scoring="best-fit"))
    assert made == count
    return count / elapsed


def bench_pending(quick: bool, smoke: bool = False) -> dict[str, Any]:
    """One decide over N pending 8-GPU jobs on a 1k-node fleet: 1,000 place, the rest wait."""
    out: dict[str, Any] = {}
    for count in (1_000, 2_000) if smoke else (1_000, 20_000) if quick else (1_000, 100_000):
        state = state_with(1_000, jobs(count, 1, 8, False))
        elapsed, _ = time_decide(state, Policy())
        out[f"decide_pending_{count // 1000}k_jobs_s"] = elapsed
    out["bytes_per_node"] = state.nodes.nbytes() / max(1, state.nodes.size)
    out["bytes_per_pending_job"] = (state.jobs.nbytes() + state.tasks.nbytes()) / max(1, state.jobs.size)
    names = sum(sys.getsizeof(n) for n in state.names["job"].names) + sys.getsizeof(state.names["job"].ids)
    out["python_bytes_per_job"] = names / max(1, state.jobs.size)
    return out


def bench_reference(count: int = 2_000) -> dict[str, Any]:
    """The same single-task best-fit decide with every kernel decide calls swapped for its plain
    twin in ``kernels_ref``; both must take the same decisions (else the ratio compares nothing)."""
    fast = bench_single(1_000, "best-fit")
    policy = Policy(scoring="best-fit")
    expected = decide(state_with(1_000, jobs(count, 1, 1, False)), policy)
    callers = (decide_fast, memo, scratch, fitting, explain)  # the decide modules that call kernels
    for module in callers:
        module.kernels = kernels_ref  # type: ignore[assignment]
    try:
        state = state_with(1_000, jobs(count, 1, 1, False))
        start = time.perf_counter()
        got = decide(state, policy)
        elapsed = time.perf_counter() - start
    finally:
        for module in callers:
            module.kernels = kernels
    if got != expected:
        raise SystemExit("the plain-Python kernels decided otherwise than the numba kernels")
    slow = count / elapsed
    return {"numba_single_1k_per_s": fast, "reference_single_1k_per_s": slow, "numba_speedup": fast / slow}


def main() -> None:
    args = parse(__doc__ or "")
    bench_single(1_000, "fgd")  # warm the JIT caches
    bench_gang(1_024)
    result: dict[str, Any] = {
        "benchmark": "core",
        "quick": args.quick,
        "smoke": args.smoke,
        **machine(),
        "kernels": kernels.__name__,
    }
    result |= bench_fold(args.quick, args.smoke)
    sizes = (1_000,) if args.smoke else (1_000, 10_000) if args.quick else (1_000, 10_000, 100_000)
    for n in sizes:
        for scoring in ("best-fit", "fgd"):
            result[f"decide_single_{scoring}_{n // 1000}k_nodes_per_s"] = bench_single(n, scoring)
    for n in sizes:
        result[f"decide_gang_8x8_rack_{n // 1000}k_nodes_per_s"] = bench_gang(n)
    for n in sizes[:2]:
        for classes, name in ((1, "constrained"), (4, "4_classes")):
            for scoring in ("best-fit", "fgd"):
                key = f"decide_single_{scoring}_{n // 1000}k_nodes_{name}_per_s"
                result[key] = bench_single(n, scoring, classes)
            result[f"decide_gang_8x8_rack_{n // 1000}k_nodes_{name}_per_s"] = bench_gang(n, classes)
        for scoring in ("best-fit", "fgd"):
            rate, share = bench_preferred(n, scoring)
            result[f"decide_single_{scoring}_{n // 1000}k_nodes_preferred_per_s"] = rate
            result[f"preferred_zone_share_{scoring}_{n // 1000}k_nodes"] = share
    result["gangs_spread_per_s"] = bench_spread(sizes[:2][-1], True)
    result["gangs_unspread_per_s"] = bench_spread(sizes[:2][-1], False)
    result["gangs_spread_rack_per_s"] = bench_spread(sizes[:2][-1], True, rack=True)
    result |= bench_pending(args.quick, args.smoke)
    result |= bench_reference(200 if args.smoke else 2_000)
    emit(result, args.json)


if __name__ == "__main__":
    main()
