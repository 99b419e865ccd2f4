"""Policy ``fgd`` (the published FGD rule) end to end: selectable by name, recorded in decision
batches with its typical pods, replay-verifiable, and explained under its own rule."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import msgspec
import pytest

from benchmarks.simulate import typical_pods_of
from fleetlog.cli import main
from fleetlog.core.policy import POLICIES, UnknownPolicyError, batch_policy, policy_named, with_typical_pods
from fleetlog.events import JobPlaced
from fleetlog.events.model import DecisionBatch
from fleetlog.log.base import DECISIONS, LogStore
from fleetlog.log.consumer import decision_batches
from fleetlog.log.file import FileLogStore
from fleetlog.replay.verify import verify
from fleetlog.service.loop import LoopConfig, SchedulerLoop
from fleetlog.simulation import RunConfig, load_cluster, load_workload, parse_mode, run_simulation

CLUSTER = "synthetic?nodes=12&hosts_per_rack=4"
WORKLOAD = "synthetic?jobs=120&load=1.5&max_h=1"


def test_fgd_is_the_published_rule_and_default_keeps_fleetlogs() -> None:
    assert policy_named("fgd").scoring == "fgd-published"
    assert POLICIES["default"].scoring == "fgd"
    assert policy_named("fgd?preemption=false").name == "fgd?preemption=false"


def test_a_batch_carries_the_typical_pods_the_name_leaves_out() -> None:
    policy = with_typical_pods(policy_named("fgd", fail_unplaced=True), ((1, 1000, 8000, 3), (0, 0, 2000, 1)))
    assert policy.name == "fgd?fail_unplaced=true"
    batch = DecisionBatch(as_of=1, digest="d", policy=policy.name, typical_pods=policy.typical_pods)
    again = msgspec.msgpack.decode(msgspec.msgpack.encode(batch), type=DecisionBatch)
    assert batch_policy(again.policy, again.typical_pods) == policy
    with pytest.raises(UnknownPolicyError, match="typical pods"):
        with_typical_pods(policy, ((1, 1000, 8000, 0),))  # (a count of 0: no batch could hold it)
    plain = DecisionBatch(as_of=1, digest="d", policy="default")
    assert b"typical_pods" not in msgspec.msgpack.encode(plain)  # other policies encode as before


async def simulated(log: Path) -> list[DecisionBatch]:
    """An inflate run under ``fgd`` with the workload's typical pods, through a file log."""
    cluster = load_cluster(CLUSTER)
    workload = load_workload(WORKLOAD, cluster, 4)
    policy = with_typical_pods(policy_named("fgd", fail_unplaced=True), typical_pods_of(workload))
    assert policy.typical_pods
    config = RunConfig(cluster, workload, parse_mode("inflate?batch=8"), 4, policy.name, log)

    def make(store: LogStore) -> SchedulerLoop:
        return SchedulerLoop(store, policy, LoopConfig(check_invariants=True))

    await run_simulation(config, make)
    async with FileLogStore(log) as store:
        report = await verify(store)
        batches = [b for _, b in decision_batches(await store.log(DECISIONS).read(0, 1_000_000))]
    assert report.ok, report.divergence
    return batches


def test_a_run_under_fgd_replays_bit_exactly_and_explains_its_placements(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "log"
    batches = asyncio.run(simulated(log))  # (verified: it replays bit-exactly)
    assert batches
    assert {b.policy for b in batches} == {"fgd?fail_unplaced=true"}
    assert all(b.typical_pods for b in batches)
    placed = next(d for b in batches for d in b.decisions if isinstance(d, JobPlaced))
    assert main(["replay", "explain", placed.job_id, "--log", str(log), "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    why = next(s for s in found["steps"] if s["what"] == "placed")["why"]
    assert why["scoring"] == "fgd-published"
    assert why["rank"] == 1
    assert "published FGD score" in why["rule"]
    assert all(0 <= score[0] <= 100 for score in (r["score"] for r in why["best"]))
