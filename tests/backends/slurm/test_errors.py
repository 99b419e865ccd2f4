"""Bad or unreachable Slurm: a clear error, retries with capped backoff, no crash, recovery after."""

from __future__ import annotations

import asyncio
import re
import shutil
from pathlib import Path

import pytest

from fleetlog.backends.slurm import SlurmClient, SlurmRejectedError, SlurmUnavailableError, SubmitSettings
from fleetlog.backends.slurm.client import Submission
from fleetlog.core.state import JobState
from fleetlog.events import NodeHeartbeat, TaskFailed
from tests.backends.slurm.harness import Harness, job, of_type
from tests.kafka_broker import free_port
from tests.slurm_cluster import SlurmCluster


def unreachable_copy(cluster: SlurmCluster, path: Path) -> Path:
    """The cluster's slurm.conf with the controller moved to a port nothing listens on."""
    text = re.sub(r"(?m)^SlurmctldPort=\d+$", f"SlurmctldPort={free_port()}", cluster.conf.read_text())
    path.write_text(text)
    return path


async def test_unreachable_slurm_is_retried_with_capped_backoff_then_recovers(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    conf = unreachable_copy(slurm_cluster, tmp_path / "slurm.conf")
    async with Harness(slurm_cluster, tmp_path) as h:
        h.backend = h.new_backend(
            slurm_conf=str(conf), command_timeout_s=2.0, backoff_initial_ms=100, backoff_max_ms=400
        )
        stop = asyncio.Event()
        task = asyncio.create_task(h.backend.run(stop))
        try:
            for _ in range(300):
                await asyncio.sleep(0.1)
                if h.backend.stats.failures >= 4:
                    break
            stats = h.backend.stats
            assert not task.done()  # the backend keeps going
            assert stats.delays_s[:4] == [0.1, 0.2, 0.4, 0.4]  # doubled, capped
            assert "slurmctld" in stats.last_error or "did not answer" in stats.last_error
            assert await h.inputs() == []  # an unreachable Slurm is never reported as an empty cluster
            shutil.copyfile(slurm_cluster.conf, conf)  # Slurm is back
            for _ in range(300):
                await asyncio.sleep(0.1)
                if len(of_type(await h.inputs(), NodeHeartbeat)) >= 4:
                    break
            assert len(of_type(await h.inputs(), NodeHeartbeat)) >= 4
            assert h.backend.backoff.current_s == 0.0
        finally:
            stop.set()
            await task


async def test_a_missing_slurm_conf_is_a_clear_error(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    async with Harness(slurm_cluster, tmp_path) as h:
        backend = h.new_backend(slurm_conf=str(tmp_path / "nowhere.conf"))
        with pytest.raises(SlurmUnavailableError, match=r"nowhere\.conf, which is not a file"):
            await backend.step()


async def test_sbatch_refusal_is_a_rejection_with_slurms_message(slurm_cluster: SlurmCluster) -> None:
    client = SlurmClient(str(slurm_cluster.conf))
    with pytest.raises(SlurmRejectedError, match="Invalid node name specified"):
        await client.submit(Submission(("--nodelist=nosuchnode", "--output=/dev/null"), "#!/bin/sh\ntrue\n"))


async def test_a_submission_slurm_refuses_fails_the_task_in_the_log(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    async with Harness(slurm_cluster, tmp_path) as h:
        h.backend = h.new_backend(submit=SubmitSettings(partition="nosuchpartition"))
        await h.ready()
        await h.submit(job("refused"))
        inputs = await h.until(lambda events: len(of_type(events, TaskFailed, "refused")) == 1)
        (failed,) = of_type(inputs, TaskFailed, "refused")
        assert "sbatch failed" in failed.reason
        assert "partition" in failed.reason.lower()
        await h.loop.step(20)
        assert h.job_state("refused") == JobState.FAILED
        assert h.slurm_jobs() == []
