"""The Slurm backend against a real slurmctld and four slurmd, driven by the real scheduling loop."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from fleetlog.core.state import JobState
from fleetlog.events import (
    Event,
    JobCancelled,
    JobPlaced,
    NodeHeartbeat,
    TaskFailed,
    TaskFinished,
    TaskPreempted,
    TaskStarted,
)
from fleetlog.log.kafka import KafkaConfig, KafkaLogStore
from tests.backends.slurm.harness import Harness, job, of_type
from tests.slurm_cluster import SlurmCluster


def finished(job_id: str, tasks: int) -> Callable[[list[Event]], bool]:
    """Whether ``tasks`` tasks of ``job_id`` ended (finished or failed)."""
    return lambda events: (
        len(of_type(events, TaskFinished, job_id) + of_type(events, TaskFailed, job_id)) >= tasks
    )


async def test_heartbeats_report_every_node_with_its_fake_gpus(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    async with Harness(slurm_cluster, tmp_path) as h:
        await h.ready()
        inputs = await h.inputs()
        beats = {b.node: b for b in of_type(inputs, NodeHeartbeat)}
        assert sorted(beats) == ["n1", "n2", "n3", "n4"]
        assert all(b.cell == "slurm" and b.healthy for b in beats.values())
        assert {(b.cpu_milli, b.mem_mib, b.gpu_count, b.gpu_model) for b in beats.values()} == {
            (8000, 8192, 4, "fake")
        }


async def test_a_gang_across_two_nodes_runs_and_finishes(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    async with Harness(slurm_cluster, tmp_path, {"gang": "sleep $((1 + 2 * FLEETLOG_TASK_INDEX))"}) as h:
        await h.ready()
        await h.submit(job("gang", tasks=2, gpus=4, mem_mib=512))  # 4 GPUs each: one node per task
        inputs = await h.until(finished("gang", 2))
        (placed,) = await h.placements()
        where = {t.task_index: t.node for t in placed.tasks}
        assert len(set(where.values())) == 2
        started = {e.task_index: e.node for e in of_type(inputs, TaskStarted, "gang")}
        assert started == where
        assert sorted((e.task_index, e.exit_code) for e in of_type(inputs, TaskFinished, "gang")) == [
            (0, 0),
            (1, 0),
        ]
        slurm = {j.name.rsplit(":", 2)[1]: j for j in h.slurm_jobs()}
        assert {int(i): j.nodes for i, j in slurm.items()} == where  # pinned to fleetlog's choice
        assert {j.job_state for j in slurm.values()} == {"COMPLETED"}
        assert {j.tres_per_node for j in slurm.values()} == {"gres:gpu:4"}
        await h.loop.step(20)
        assert h.job_state("gang") == JobState.SUCCEEDED


async def test_a_failing_job_reports_its_exit_code(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    scripts = {"exits7": "exit 7", "killed": "kill -9 $$"}
    async with Harness(slurm_cluster, tmp_path, scripts) as h:
        await h.ready()
        await h.submit(job("exits7"), job("killed"))
        inputs = await h.until(lambda events: finished("exits7", 1)(events) and finished("killed", 1)(events))
        assert [(e.task_index, e.exit_code) for e in of_type(inputs, TaskFinished, "exits7")] == [(0, 7)]
        (killed,) = of_type(inputs, TaskFailed, "killed")
        assert killed.exit_code == 128 + 9
        assert "signal 9" in killed.reason
        await h.loop.step(20)
        assert h.job_state("exits7") == h.job_state("killed") == JobState.FAILED


async def test_a_drained_node_has_its_work_requeued_and_placed_elsewhere(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    async with Harness(slurm_cluster, tmp_path, {"long": "sleep 120"}) as h:
        await h.ready()
        await h.submit(job("long", gpus=4))
        inputs = await h.until(lambda events: len(of_type(events, TaskStarted, "long")) >= 1)
        first = of_type(inputs, TaskStarted, "long")[0].node
        slurm_cluster.command(
            "scontrol", "update", f"nodename={first}", "state=drain", "reason=fleetlog-test"
        )
        try:
            inputs = await h.until(lambda events: len(of_type(events, TaskStarted, "long")) >= 2)
        finally:
            slurm_cluster.command("scontrol", "update", f"nodename={first}", "state=resume")
        second = of_type(inputs, TaskStarted, "long")[1].node
        assert second != first
        assert any(isinstance(e, NodeHeartbeat) and e.node == first and not e.healthy for e in inputs)
        placements = [p for p in await h.placements() if p.job_id == "long"]
        assert [p.tasks[0].node for p in placements] == [first, second]
        await h.until(lambda _: {j.job_state for j in h.slurm_jobs()} == {"CANCELLED", "RUNNING"})
        by_state = {j.job_state: j.nodes for j in h.slurm_jobs()}
        assert by_state == {
            "CANCELLED": first,
            "RUNNING": second,
        }  # the first run was stopped, not left running
        assert h.job_state("long") == JobState.RUNNING


async def test_a_restarted_backend_does_not_submit_or_report_twice(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    ids = [f"r{i}" for i in range(4)]
    async with Harness(slurm_cluster, tmp_path, dict.fromkeys(ids, "sleep 3")) as h:
        await h.ready()
        await h.submit(*(job(i, tasks=2, gpus=1) for i in ids))
        await h.until(lambda events: len(of_type(events, TaskStarted)) >= 2)  # mid-run: some started
        assert h.backend.stats.submitted == 8
        h.backend = h.new_backend()  # a crash: a new process with nothing but the logs and Slurm
        inputs = await h.until(lambda events: all(finished(i, 2)(events) for i in ids))
        assert h.backend.stats.submitted == 0  # every placement was found in Slurm by name
        names = Counter(j.name for j in h.slurm_jobs())
        assert len(names) == 8
        assert set(names.values()) == {1}
        reported = Counter(
            (type(e).__name__, e.job_id, e.task_index) for e in inputs if hasattr(e, "task_index")
        )
        assert set(reported.values()) == {1}
        assert len(reported) == 16  # one TaskStarted and one TaskFinished per task
        await h.loop.step(20)
        assert {h.job_state(i) for i in ids} == {JobState.SUCCEEDED}


async def test_a_replayed_placement_after_a_crash_between_sbatch_and_the_next_poll_is_not_resubmitted(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    async with Harness(slurm_cluster, tmp_path, {"once": "sleep 2"}) as h:
        await h.ready()
        await h.submit(job("once"))
        await h.until(lambda _: h.backend.stats.submitted == 1)  # sbatch ran; nothing observed yet
        again = h.new_backend()  # replays the JobPlaced from the decisions log
        await again.step()
        assert again.stats.submitted == 0
        assert len(h.slurm_jobs()) == 1
        assert isinstance((await h.placements())[0], JobPlaced)


async def test_preemption_and_cancellation_scancel_the_slurm_jobs(
    slurm_cluster: SlurmCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "fleetlog.backends.slurm")
    low = [f"low{i}" for i in range(4)]
    async with Harness(
        slurm_cluster, tmp_path, {**dict.fromkeys(low, "sleep 120"), "high": "sleep 120"}
    ) as h:
        await h.ready()
        await h.submit(*(job(i, gpus=4) for i in low))  # every GPU of the cluster
        await h.until(lambda events: len(of_type(events, TaskStarted)) == 4)
        await h.submit(job("high", gpus=4, priority=10))
        inputs = await h.until(lambda events: len(of_type(events, TaskStarted, "high")) == 1)
        preempted = [d for d in await h.decisions() if isinstance(d, TaskPreempted)]
        assert [d.by_job_id for d in preempted] == ["high"]
        victim = preempted[0].job_id
        victim_node = next(e.node for e in of_type(inputs, TaskStarted, victim))
        assert of_type(inputs, TaskStarted, "high")[0].node == victim_node
        await h.until(lambda _: state_of(h, victim) == {"CANCELLED"})
        assert not of_type(await h.inputs(), TaskFailed, victim)  # our own cancel is not a failure
        survivor = next(j for j in low if j != victim)
        await h.submit(JobCancelled(job_id=survivor))
        await h.until(lambda _: state_of(h, survivor) == {"CANCELLED"})
        assert h.job_state(survivor) == JobState.CANCELLED
        assert state_of(h, "high") == {"RUNNING"}
        # each sbatch and scancel is logged with the decision (or input) that caused it
        lines = [r.getMessage() for r in caplog.records if r.name == "fleetlog.backends.slurm"]
        sbatch = [line for line in lines if line.startswith("sbatch: slurm job ")]
        assert len(sbatch) == 5
        assert any(f"runs high task 0 on {victim_node} (JobPlaced at decisions@" in line for line in sbatch)
        scancel = [line for line in lines if line.startswith("scancel ")]
        assert len(scancel) == 2
        assert any(f": {victim} task 0, placed at decisions@" in line and "preempted by high (priority; "
                   "TaskPreempted at decisions@" in line for line in scancel)  # fmt: skip
        assert any(f": {survivor} task 0" in line and "cancelled (JobCancelled at inputs@" in line
                   for line in scancel)  # fmt: skip


def state_of(h: Harness, job_id: str) -> set[str]:
    """The Slurm states of ``job_id``'s jobs (every incarnation)."""
    return {j.job_state for j in h.slurm_jobs() if j.name.endswith(":" + job_id)}


@pytest.mark.kafka
async def test_over_kafka_a_gang_runs_and_a_restarted_backend_submits_nothing_twice(
    slurm_cluster: SlurmCluster, kafka_bootstrap: str, tmp_path: Path
) -> None:
    config = KafkaConfig(bootstrap_servers=kafka_bootstrap, topic_prefix=f"slurm-{tmp_path.name}")
    async with Harness(slurm_cluster, tmp_path, {"kgang": "sleep 2"}, KafkaLogStore(config)) as h:
        await h.ready()
        await h.submit(job("kgang", tasks=2, gpus=4))
        await h.until(lambda events: len(of_type(events, TaskStarted, "kgang")) >= 1)
        h.backend = h.new_backend()
        inputs = await h.until(finished("kgang", 2))
        assert h.backend.stats.submitted == 0
        assert sorted((e.task_index, e.exit_code) for e in of_type(inputs, TaskFinished, "kgang")) == [
            (0, 0),
            (1, 0),
        ]
        names = [j.name for j in h.slurm_jobs()]
        assert len(names) == len(set(names)) == 2  # one Slurm job per task, none submitted twice


async def test_a_placement_read_but_not_submitted_before_a_crash_is_submitted_once(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    async with Harness(slurm_cluster, tmp_path, {"late": "sleep 1"}) as h:
        await h.ready()
        await h.submit(job("late"))
        await h.loop.step(1000)  # JobPlaced
        await h.backend.catch_up()  # read, then the process dies before sbatch
        assert list(h.backend.runs) == ["late"]
        assert h.slurm_jobs() == []
        h.backend = h.new_backend()
        inputs = await h.until(finished("late", 1))
        assert h.backend.stats.submitted == 1
        assert [j.job_state for j in h.slurm_jobs()] == ["COMPLETED"]
        assert [e.exit_code for e in of_type(inputs, TaskFinished, "late")] == [0]


async def test_a_job_with_a_constraint_lands_on_nodes_with_those_features(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """slurm.sh gives odd nodes the features ``ib,fast`` and even ones ``slow``: a gang asking
    ``--constraint 'ib&fast'`` runs on n1 and n3 only, one asking for a feature no node has waits
    and says which requirement no node met."""
    from fleetlog.events import JobPending
    from fleetlog.events.features import constraint_terms

    async with Harness(slurm_cluster, tmp_path) as h:
        await h.ready()
        beats = {b.node: b for b in of_type(await h.inputs(), NodeHeartbeat)}
        assert beats["n1"].labels["slurm.feature/ib"] == "true"
        assert "slurm.feature/ib" not in beats["n2"].labels
        assert beats["n2"].labels["slurm.partition/fleet"] == "true"
        base = job("fast", tasks=2, gpus=4, mem_mib=512)
        group = msgspec.structs.replace(base.task_groups[0], node_affinity=constraint_terms("ib&fast"))
        await h.submit(msgspec.structs.replace(base, task_groups=(group,)))
        nowhere = job("gpu-x", tasks=1, gpus=1, mem_mib=512)
        group = msgspec.structs.replace(nowhere.task_groups[0], node_affinity=constraint_terms("x100|y100"))
        await h.submit(msgspec.structs.replace(nowhere, task_groups=(group,)))
        await h.until(finished("fast", 2))
        (placed,) = [p for p in await h.placements() if p.job_id == "fast"]
        assert sorted(t.node for t in placed.tasks) == ["n1", "n3"]
        assert sorted(j.nodes for j in h.slurm_jobs() if j.name.endswith(":fast")) == ["n1", "n3"]
        pending = [d for d in await h.decisions() if isinstance(d, JobPending) and d.job_id == "gpu-x"]
        assert pending[-1].reason == "no_eligible_nodes"
        assert "none of the 2 node affinity terms" in pending[-1].message


async def test_work_submitted_straight_to_slurm_is_routed_around(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """A user's own ``sbatch`` jobs hold all four GPUs of n1 and n2: the backend reports them as
    foreign (allocated, not ours), so fleetlog places its two 4-GPU tasks on n3 and n4, where
    Slurm runs them at once — not on the busy nodes, where Slurm would keep them pending."""
    user = [
        slurm_cluster.command(
            "sbatch", "--parsable", "--job-name=someone-else", f"--nodelist={n}", "--gres=gpu:4",
            "--cpus-per-task=2", "--mem=300M", "--output=/dev/null", "--wrap", "sleep 120",
        ).strip()
        for n in ("n1", "n2")
    ]  # fmt: skip
    try:
        async with Harness(slurm_cluster, tmp_path, {"two": "sleep 30"}) as h:

            def foreign_on_busy_nodes(events: list[Event]) -> bool:
                beats = {b.node: b for b in of_type(events, NodeHeartbeat)}
                return all(n in beats and beats[n].foreign_gpus == 4 for n in ("n1", "n2"))

            inputs = await h.until(foreign_on_busy_nodes)
            beats = {b.node: b for b in of_type(inputs, NodeHeartbeat)}
            assert (beats["n1"].foreign_cpu_milli, beats["n1"].foreign_mem_mib) == (2000, 300)
            assert (beats["n3"].foreign_gpus, beats["n3"].foreign_cpu_milli) == (0, 0)
            await h.submit(job("two", tasks=2, gpus=4, mem_mib=512))
            await h.until(lambda events: len(of_type(events, TaskStarted, "two")) == 2)
            (placed,) = [p for p in await h.placements() if p.job_id == "two"]
            assert sorted(t.node for t in placed.tasks) == ["n3", "n4"]
            assert {j.job_state for j in h.slurm_jobs()} == {"RUNNING"}
            # fleetlog's own running jobs are not foreign to it: n3's heartbeat stays as it was
            await h.until(lambda events: True)
            assert h.backend.beats["n3"].foreign_gpus == 0
            assert h.backend.beats["n1"].foreign_gpus == 4
    finally:
        slurm_cluster.command("scancel", *user)
