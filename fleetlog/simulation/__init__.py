"""The simulation harness: what drives simulated cells through the real scheduling loop.

Not a backend: a backend turns decisions into effects and reports observations (the simulated
cell, :mod:`fleetlog.backends.simulated`, does that on a virtual clock). The harness is the
experiment around it: inputs, the discrete-event loop, measures and reports.

- :mod:`.clusters` — cells from a ``--cluster`` spec: synthetic shapes in a block/rack/host
  topology, or an openb node-list CSV; :mod:`.spec`, :mod:`.csvfile`, :mod:`.traces` — the
  ``KIND?key=value`` specs and trace files behind both inputs.
- :mod:`.workload` — jobs from an openb pod-list CSV or a seeded generator; :mod:`.durations`
  — Philly runtimes.
- :mod:`.modes` — ``inflate`` (the FGD paper's protocol) and ``replay`` (trace times).
- :mod:`.driver` — the discrete-event loop that drives the injected scheduler; :mod:`.runner` —
  one seeded run end to end; :mod:`.report` — summary JSON and PNG plot; :mod:`.command` —
  ``fleetlog simulate``; :mod:`.metrics` — the recorder: what the simulated world saw happen to
  each job.

The scheduler is injected (a ``SchedulerFactory``): this package never imports the core, nor a
real backend. ``replay`` uses it (and the simulated cell), not the other way round.
"""

from fleetlog.simulation.clusters import load_cluster
from fleetlog.simulation.driver import Scheduler, SchedulerFactory, Simulation
from fleetlog.simulation.metrics import Recorder
from fleetlog.simulation.modes import Mode, arrivals, parse_mode
from fleetlog.simulation.report import RunSummary, aggregate, write_report
from fleetlog.simulation.runner import RunConfig, run_simulation
from fleetlog.simulation.spec import SimulationInputError, SpecError, TraceError
from fleetlog.simulation.workload import JobSpec, Workload, load_workload

__all__ = [
    "JobSpec",
    "Mode",
    "Recorder",
    "RunConfig",
    "RunSummary",
    "Scheduler",
    "SchedulerFactory",
    "Simulation",
    "SimulationInputError",
    "SpecError",
    "TraceError",
    "Workload",
    "aggregate",
    "arrivals",
    "load_cluster",
    "load_workload",
    "parse_mode",
    "run_simulation",
    "write_report",
]
