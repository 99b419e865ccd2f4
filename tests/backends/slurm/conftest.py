"""One real Slurm cluster per test session (munged, slurmctld, four slurmd), stopped by PID at the end."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.slurm_cluster import SlurmCluster


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """Four nodes n1..n4 with 8 CPUs, 8 GiB and 4 fake GPUs (``gpu:fake:4``) each."""
    cluster = SlurmCluster()
    cluster.start()  # raises SlurmClusterError with the daemons' log tails: never a skip
    try:
        yield cluster
    finally:
        cluster.close()
