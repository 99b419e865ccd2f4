"""The Slurm backend reads a step split over several decision records (issue 14, item 1) as the
whole step: every placement runs once, and a restarted backend submits nothing twice."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from fleetlog.core.policy import policy_named
from fleetlog.core.state import JobState
from fleetlog.events import TaskStarted
from fleetlog.service.loop import LoopConfig
from tests.backends.helpers import OneDecisionPerRecord, split_steps
from tests.backends.slurm.harness import Harness, job, of_type
from tests.backends.slurm.test_backend import finished
from tests.slurm_cluster import SlurmCluster


async def test_a_split_step_runs_every_placement_once_across_a_restart(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    ids = [f"s{i}" for i in range(4)]
    h = Harness(slurm_cluster, tmp_path, dict.fromkeys(ids, "sleep 3"))
    h.loop = OneDecisionPerRecord(h.store, policy_named("default"), LoopConfig(check_invariants=True))
    async with h:
        await h.ready()
        await h.submit(*(job(i, tasks=2, gpus=1) for i in ids))
        await h.until(lambda events: len(of_type(events, TaskStarted)) >= 2)
        assert [(b.part, b.parts) for b in await split_steps(h.store)] == [(i, 4) for i in range(4)]
        assert h.backend.stats.submitted == 8
        h.backend = h.new_backend()  # a crash: a new process with nothing but the logs and Slurm
        inputs = await h.until(lambda events: all(finished(i, 2)(events) for i in ids))
        assert h.backend.stats.submitted == 0
        names = Counter(j.name for j in h.slurm_jobs())
        assert len(names) == 8
        assert set(names.values()) == {1}
        assert len(of_type(inputs, TaskStarted)) == 8
        await h.loop.step(20)
        assert {h.job_state(i) for i in ids} == {JobState.SUCCEEDED}
