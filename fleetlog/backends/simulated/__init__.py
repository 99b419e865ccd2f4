"""The simulated cell: a backend on a virtual clock that acts only through the logs.

- :mod:`.backend` — the simulated cell: decisions in, observations out, only through the logs;
  what it does to each job it tells an :class:`~.backend.Observer` (a simulation's recorder).
- :mod:`.cluster` — the cell's nodes and behaviour (heartbeats, start delays, failures).
- :mod:`.clock` — the virtual clock and the timers the cell's effects wait on.

What drives the cell (workloads, the discrete-event driver, modes, reports, ``fleetlog
simulate``) is the harness, :mod:`fleetlog.simulation`; this package never imports it (the
harness and ``replay what-if`` both run this cell). It never imports the core either.
"""

from fleetlog.backends.simulated.backend import Observer, SimulatedCell
from fleetlog.backends.simulated.clock import Emitted, Timers, VirtualClock
from fleetlog.backends.simulated.cluster import CellBehaviour, Cluster, NodeSpec

__all__ = [
    "CellBehaviour",
    "Cluster",
    "Emitted",
    "NodeSpec",
    "Observer",
    "SimulatedCell",
    "Timers",
    "VirtualClock",
]
