"""Simulated cells on a virtual clock, driving the real scheduling loop through the logs.

- :mod:`.cluster` — cells from a spec: synthetic shapes in a block/rack/host topology, or an
  openb node-list CSV; the cell's behaviour (heartbeats, start delays, failures).
- :mod:`.workload` — jobs from an openb pod-list CSV or a seeded generator; :mod:`.durations`
  — Philly runtimes.
- :mod:`.modes` — ``inflate`` (the FGD paper's protocol) and ``replay`` (trace times).
- :mod:`.backend` — the simulated cell: decisions in, observations out, only through the logs.
- :mod:`.driver` — the discrete-event loop that drives the injected scheduler; :mod:`.runner` —
  one seeded run end to end; :mod:`.report` — summary JSON and PNG plot.

The scheduler is injected (a ``SchedulerFactory``): this package never imports the core.
"""

from fleetlog.backends.simulated.backend import SimulatedCell
from fleetlog.backends.simulated.clock import Emitted, Timers, VirtualClock
from fleetlog.backends.simulated.cluster import CellBehaviour, Cluster, NodeSpec, load_cluster
from fleetlog.backends.simulated.driver import Scheduler, SchedulerFactory, Simulation
from fleetlog.backends.simulated.metrics import Recorder
from fleetlog.backends.simulated.modes import Mode, arrivals, parse_mode
from fleetlog.backends.simulated.report import RunSummary, aggregate, write_report
from fleetlog.backends.simulated.runner import RunConfig, run_simulation
from fleetlog.backends.simulated.spec import SimulationInputError, SpecError, TraceError
from fleetlog.backends.simulated.workload import JobSpec, Workload, load_workload

__all__ = [
    "CellBehaviour",
    "Cluster",
    "Emitted",
    "JobSpec",
    "Mode",
    "NodeSpec",
    "Recorder",
    "RunConfig",
    "RunSummary",
    "Scheduler",
    "SchedulerFactory",
    "SimulatedCell",
    "Simulation",
    "SimulationInputError",
    "SpecError",
    "Timers",
    "TraceError",
    "VirtualClock",
    "Workload",
    "aggregate",
    "arrivals",
    "load_cluster",
    "load_workload",
    "parse_mode",
    "run_simulation",
    "write_report",
]
