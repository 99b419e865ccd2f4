"""Which shards a deployment's logs hold, and opening one of them for replay.

A deployment with a ``[cells]`` map (docs/scale-out.md) writes one log per shard: the global
partition (the dispatcher's: ``global``) and one per cell partition (``cells-<p>``). Every replay
command finds its logs here: :class:`Topology` says which shards there are and how each was
folded (a cell partition with its shard's ``CoreConfig``: the map's cells of the partition, the
hold time, the node timeout), :func:`parse_shard` reads ``--shard``, and :func:`open_shard` opens
one shard's logs and snapshots read-only, on the file log or on Kafka.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from fleetlog.core.cellshard import SummaryRule
from fleetlog.core.dispatch import CellMap
from fleetlog.core.state import CoreConfig
from fleetlog.log.base import LogStore, Shard
from fleetlog.log.kafka import KafkaConfig
from fleetlog.replay.source import ReplayError, Source, open_file_source, open_kafka_source

Place = Path | KafkaConfig
OutputsCheck = Callable[["Topology", LogStore, LogStore, int], Awaitable[dict[str, Any]]]
"""(topology, a cell partition's store, the global partition's store, the partition) -> what the
global partition holds from that partition against what its own log gives again (the service's
``check_outputs``, which replay may not import: the CLI passes it in)."""


@dataclass(frozen=True)
class Topology:
    """The shards of a deployment with a ``[cells]`` map, and the settings they were folded with
    (the configuration the service ran with: replay must fold as it did)."""

    cells: CellMap
    hold_ms: int = 30_000
    producer_id: str = "fleetlog-scheduler"
    rule: SummaryRule = field(default_factory=SummaryRule)
    outputs: OutputsCheck | None = None
    """How to check a partition's outputs (``None``: not checked)."""
    base: CoreConfig = field(default_factory=CoreConfig)
    """The fold's settings (node timeout, retirement) as the service ran with them; a cell
    shard's adds its hold and its cells."""

    @property
    def partitions(self) -> tuple[int, ...]:
        return tuple(sorted({p for _, p in self.cells.partitions}))

    def shards(self) -> tuple[Shard, ...]:
        """The global partition first, then every cell partition of the map in order."""
        return (Shard.GLOBAL, *(Shard.cell(p) for p in self.partitions))

    def held(self, partition: int) -> tuple[str, ...]:
        return tuple(c for c, p in self.cells.partitions if p == partition)

    def core(self, shard: Shard) -> CoreConfig | None:
        """The ``CoreConfig`` of a cell partition's shard (``None`` for the global partition)."""
        if shard.kind != "cell":
            return None
        return msgspec.structs.replace(self.base, hold_ms=self.hold_ms, cells=self.held(shard.partition))

    def names(self) -> list[str]:
        return [str(s) for s in self.shards()]


def parse_shard(text: str, topology: Topology | None) -> Shard:
    """``global`` or ``cells-<p>`` of a partition the map names; anything else is a
    :class:`ReplayError` naming the choices."""
    if topology is None:
        raise ReplayError(f"--shard {text}: this deployment has no [cells] map, so its log is one shard "
                          "(leave --shard out)")
    if text == "global":
        return Shard.GLOBAL
    m = re.fullmatch(r"cells-(\d{1,9})", text)
    if m is not None and int(m.group(1)) in topology.partitions:
        return Shard.cell(int(m.group(1)))
    raise ReplayError(f"--shard {text!r}: choose one of {', '.join(topology.names())} (the [cells] map's "
                      "partitions)")


async def open_shard(place: Place, shard: Shard, topology: Topology | None = None,
                     snapshots: bool = True) -> Source:
    """One shard's logs and snapshots, read-only, with the settings it was folded with."""
    if isinstance(place, Path):
        source = await open_file_source(place, snapshots, shard)
    else:
        source = await open_kafka_source(place, snapshots, shard)
    if topology is not None:
        source.core = topology.core(shard)
    return source


def shard_of(args: Any, topology: Topology | None) -> Shard | None:
    """The ``--shard`` of a command (``None``: not given)."""
    text = getattr(args, "shard", None)
    return None if text is None else parse_shard(text, topology)
