"""Slurm double-booking (issue 47): a pinned job Slurm leaves PENDING is withdrawn and re-decided.

Slurm starts a user's own job on n1 after the backend's last heartbeat and before fleetlog's
4-GPU job is pinned there; Slurm keeps fleetlog's job PENDING (Resources).  Past
``pending_bound_s`` the backend cancels it and withdraws the placement (``TaskFailed`` with
``requeue``): the scheduler requeues the job — not fails it — saying why, holds n1's GPUs for
the user's job at once, and places the job again where Slurm runs it.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from fleetlog.api.detail import job_detail
from fleetlog.core.state import JobState
from fleetlog.events import Event, NodeHeartbeat, TaskFailed, TaskStarted
from fleetlog.replay.explain import explain
from fleetlog.replay.source import Source
from tests.backends.slurm.harness import Harness, job, of_type
from tests.slurm_cluster import SlurmCluster

BOUND_S = 3.0


def user_job(cluster: SlurmCluster, node: str, name: str) -> str:
    """A user's own ``sbatch`` (not fleetlog's) holding all four GPUs of ``node``."""
    return cluster.command(
        "sbatch", "--parsable", f"--job-name={name}", f"--nodelist={node}", "--gres=gpu:4",
        "--cpus-per-task=1", "--mem=100M", "--output=/dev/null", "--wrap", "sleep 300",
    ).strip().split(";")[0]  # fmt: skip


def running(cluster: SlurmCluster, slurm_id: str) -> bool:
    out = cluster.command("squeue", "-h", "-j", slurm_id, "-o", "%T")
    return out.strip() == "RUNNING"


def gpus_booked(h: Harness, node: str) -> int:
    """GPUs of ``node`` the scheduler's books hold: its placed tasks' and the foreign work it holds."""
    state = h.loop.state
    row = state.node_row("slurm", node)
    on_node = state.tasks.view("node") == row
    ours = sum(int(m).bit_count() for m in state.tasks.view("gpu_mask")[on_node].tolist())
    foreign = state.node_foreign.get(row)
    return ours + (foreign[5].bit_count() if foreign is not None else 0)


async def steal(
    h: Harness, cluster: SlurmCluster, user: list[str], busy: tuple[str, ...], stolen: str
) -> None:
    """Users' jobs hold every GPU of ``busy`` (reported to fleetlog), then of ``stolen``, which
    Slurm starts before the backend's next heartbeat: fleetlog still sees ``stolen`` free."""
    user += [user_job(cluster, n, f"user-{h.prefix}") for n in busy]

    def busy_reported(events: list[Event]) -> bool:
        beats = {b.node: b for b in of_type(events, NodeHeartbeat)}
        return all(n in beats and beats[n].foreign_gpus == 4 for n in busy)

    await h.until(busy_reported)
    user.append(user_job(cluster, stolen, f"user-{h.prefix}"))
    deadline = time.monotonic() + 60
    while not running(cluster, user[-1]):
        assert time.monotonic() < deadline, f"Slurm did not start the user's job on {stolen}"
        time.sleep(0.2)


async def test_a_pinned_job_slurm_leaves_pending_is_withdrawn_and_placed_again(
    slurm_cluster: SlurmCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="fleetlog.backends.slurm")
    user: list[str] = []
    try:
        async with Harness(slurm_cluster, tmp_path, {"pinned": "sleep 60"}) as h:
            h.backend = h.new_backend(pending_bound_s=BOUND_S)
            await steal(h, slurm_cluster, user, busy=("n2", "n3", "n4"), stolen="n1")
            await h.submit(job("pinned", gpus=4, mem_mib=256))
            await h.loop.step(20)  # decided before the backend's next heartbeat: pinned to n1
            assert [p.tasks[0].node for p in await h.placements()] == ["n1"]

            withdrawn_at = time.monotonic()
            inputs = await h.until(lambda events: bool(of_type(events, TaskFailed, "pinned")), timeout_s=90)
            assert time.monotonic() - withdrawn_at >= BOUND_S  # not before the bound
            (failed,) = of_type(inputs, TaskFailed, "pinned")
            assert failed.requeue
            assert failed.reason.startswith(f"Slurm left it PENDING for {BOUND_S:g} s: ")
            assert f"(node n1 holds Slurm job {user[-1]})" in failed.reason
            assert not of_type(inputs, TaskStarted, "pinned")
            (ours,) = h.slurm_jobs()
            assert ours.job_state == "CANCELLED"  # scancel'd: it never ran

            await h.loop.step(20)
            assert h.job_state("pinned") == JobState.PENDING  # requeued, not failed
            detail = job_detail(h.loop.state, "pinned")
            assert detail is not None
            assert detail.requeued is not None
            assert detail.requeued.cause == "withdrawn"
            assert detail.requeued.node == "n1"
            assert detail.requeued.message == failed.reason
            assert any(failed.reason in step.detail for step in detail.story)
            timeline = await explain(Source(h.store, None, "test"), "pinned")
            withdrawn = [s.detail for s in timeline.steps if s.what == "placement withdrawn"]
            assert withdrawn == [f"task 0: {failed.reason}"]
            lines = [r.getMessage() for r in caplog.records if r.name == "fleetlog.backends.slurm"]
            (scancel,) = [line for line in lines if line.startswith("scancel ")]
            assert scancel.startswith(f"scancel {ours.job_id}: pinned task 0, placed at decisions@")
            assert scancel.endswith(f": withdrawn: {failed.reason}")
            assert gpus_booked(h, "n1") == 4  # the user's job, held at once: no 8 GPUs on a 4-GPU node
            assert all(p.tasks[0].node == "n1" for p in await h.placements())  # not pinned there again

            slurm_cluster.command("scancel", user[0])  # n2 frees: the job is placed there and runs
            inputs = await h.until(lambda events: bool(of_type(events, TaskStarted, "pinned")), timeout_s=90)
            assert [e.node for e in of_type(inputs, TaskStarted, "pinned")] == ["n2"]
            assert [p.tasks[0].node for p in await h.placements()] == ["n1", "n2"]
            assert h.job_state("pinned") == JobState.RUNNING
            assert gpus_booked(h, "n1") == 4
            assert gpus_booked(h, "n2") == 4
    finally:
        if user:
            slurm_cluster.command("scancel", *user)


async def test_a_gang_with_one_task_left_pending_is_withdrawn_whole(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """One task of a two-node gang lands on the node Slurm gave away, the other runs: the whole
    gang is requeued once, the running task's Slurm job cancelled, and the gang placed again."""
    user: list[str] = []
    try:
        async with Harness(slurm_cluster, tmp_path, {"gang": "sleep 60"}) as h:
            h.backend = h.new_backend(pending_bound_s=BOUND_S)
            await steal(h, slurm_cluster, user, busy=("n3", "n4"), stolen="n1")
            await h.submit(job("gang", tasks=2, gpus=4, mem_mib=256))
            await h.loop.step(20)
            (first,) = await h.placements()
            assert sorted(t.node for t in first.tasks) == ["n1", "n2"]
            on_n1 = next(t.task_index for t in first.tasks if t.node == "n1")

            inputs = await h.until(lambda events: bool(of_type(events, TaskFailed, "gang")), timeout_s=90)
            (failed,) = of_type(inputs, TaskFailed, "gang")  # one withdrawal for the gang
            assert failed.requeue
            assert failed.task_index == on_n1
            assert f"(node n1 holds Slurm job {user[-1]})" in failed.reason
            await h.loop.step(20)
            assert h.job_state("gang") == JobState.PENDING
            assert gpus_booked(h, "n1") == 4
            assert gpus_booked(h, "n2") == 0
            await h.until(lambda _: {j.job_state for j in h.slurm_jobs()} == {"CANCELLED"})  # n2's too

            slurm_cluster.command("scancel", user[0])  # n3 frees: the gang goes to n2 and n3
            await h.until(lambda events: any(e.node == "n3" for e in of_type(events, TaskStarted, "gang")))
            placed = [sorted(t.node for t in p.tasks) for p in await h.placements()]
            assert placed == [["n1", "n2"], ["n2", "n3"]]
            await h.until(lambda _: h.job_state("gang") == JobState.RUNNING)
            assert len(of_type(await h.inputs(), TaskFailed, "gang")) == 1
    finally:
        if user:
            slurm_cluster.command("scancel", *user)
