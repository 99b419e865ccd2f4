"""The sharded fleet in one process, without a log (issue 17, docs/scale-out.md "The in-process
sharded driver"): the global dispatcher and the cell shards composed from the pure core only.

- :mod:`.driver` — :class:`ShardedFleet`: one dispatcher state and one cell-shard ``State`` per
  partition, joined in memory the way their partitions join them (``JobDispatched`` into the
  cell's inputs, ``JobReturned`` and ``CellSummary`` into the global partition), stepped in a
  fixed order with log time from a virtual clock the driver owns;
- :mod:`.checks` — the cross-shard invariants (a job is live in at most one cell, the one the
  dispatcher says holds it; a gang never spans cells), checked after every step in tests.

Not ``core/``: it owns a clock. Not ``simulation/``: that harness never imports the core (its
scheduler is injected); ``fleetlog simulate --cells N --shards K`` can inject this one.
"""

from fleetlog.sharded.checks import ShardInvariantError, check_fleet
from fleetlog.sharded.driver import CellShard, FleetConfig, FleetStep, ShardedFleet

__all__ = ["CellShard", "FleetConfig", "FleetStep", "ShardInvariantError", "ShardedFleet", "check_fleet"]
