"""A simulated cell: which nodes there are, and how the cell behaves.

Built from a ``--cluster`` spec or a node-list CSV by :mod:`fleetlog.simulation.clusters`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NodeSpec:
    """One node as its cell reports it."""

    name: str
    cpu_milli: int
    mem_mib: int
    gpu_count: int = 0
    gpu_model: str = ""
    topology: tuple[str, ...] = ()


@dataclass(frozen=True)
class CellBehaviour:
    """How the simulated cell acts: all times in milliseconds of virtual time."""

    heartbeat_ms: int = 20_000
    """Every node reports a heartbeat this often (the scheduler's node timeout is 60 s)."""
    max_start_delay_ms: int = 2_000
    """A placed task starts after a seeded delay drawn uniformly from 0..this."""
    mtbf_ms: int = 0
    """Mean time between failures of one node (exponential); 0 = nodes never fail."""
    mttr_ms: int = 600_000
    """Mean time to repair a failed node (exponential, at least one heartbeat period)."""


@dataclass(frozen=True)
class Cluster:
    """The nodes of one cell, and how the cell behaves."""

    cell: str
    nodes: tuple[NodeSpec, ...]
    behaviour: CellBehaviour = CellBehaviour()
    source: str = "synthetic"

    @property
    def gpu_milli(self) -> int:
        """The cell's GPU capacity in milli-GPUs."""
        return sum(n.gpu_count for n in self.nodes) * 1000

    @property
    def cpu_milli(self) -> int:
        return sum(n.cpu_milli for n in self.nodes)

    @property
    def mem_mib(self) -> int:
        return sum(n.mem_mib for n in self.nodes)

    @property
    def gpu_models(self) -> tuple[str, ...]:
        return tuple(sorted({n.gpu_model for n in self.nodes if n.gpu_count}))
