"""Priority across tenants in recorded logs (issue 46): a log the loop decided with a bare
``default`` (priority preempts any tenant's lower job, as every log before the rule) and one
decided with the service's policy (``default?priority_within_tenant=true``) each verify with
no setting: the batches name the policy, and replay rebuilds it from the name."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from fleetlog.cli import main
from fleetlog.core.policy import Policy, policy_named, service_policy
from fleetlog.events import TaskPreempted, encode, envelope
from fleetlog.log.base import DECISIONS, INPUTS, Message
from fleetlog.log.consumer import decision_batches
from fleetlog.log.file import FileLogStore
from fleetlog.service.loop import LoopConfig, SchedulerLoop
from tests.core.builders import job, node, quota


async def record(directory: Path, policy: Policy) -> list[tuple[str, str]]:
    """b fills a node inside its nominal quota, then a's job at priority 1,000,000 arrives;
    returns (policy name, preempted job) of each eviction decided."""
    store = FileLogStore(directory, fsync="never")
    await store.open()
    try:
        loop = SchedulerLoop(store, policy, LoopConfig())
        rounds = [[node("n1", gpus=8), quota("a", gpus=8, cohort="co"), quota("b", gpus=8, cohort="co"),
                   *[job(f"b{i}", tenant="b") for i in range(8)]],
                  [job("vip", tenant="a", priority=1_000_000)]]
        for events in rounds:
            await store.log(INPUTS).append([Message(encode(envelope(e, "test"))) for e in events])
            await loop.step()
        records = await store.log(DECISIONS).read(0, 1000)
        return [(batch.policy, d.job_id) for _, batch in decision_batches(records)
                for d in batch.decisions if isinstance(d, TaskPreempted)]
    finally:
        await store.close()
        (directory / "LOCK").unlink(missing_ok=True)


def verify(capsys: pytest.CaptureFixture[str], log: Path) -> dict[str, object]:
    assert main(["replay", "verify", "--log", str(log), "--json"]) == 0
    report: dict[str, object] = json.loads(capsys.readouterr().out)
    return report


@pytest.mark.parametrize(("policy", "evicted"), [(policy_named("default"), 1),
                                                 (service_policy("default"), 0)])
def test_a_log_of_either_rule_verifies_without_a_setting(
    policy: Policy, evicted: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    preempted = asyncio.run(record(tmp_path / "log", policy))
    assert len(preempted) == evicted  # (bare default: b's job goes; the service's rule: none)
    assert all(name == policy.name for name, _ in preempted)
    report = verify(capsys, tmp_path / "log")
    assert report["ok"]
    assert report["divergence"] is None
