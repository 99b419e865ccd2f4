"""Replay verification: fold the inputs, decide again at every recorded ``as_of``, compare.

The first batch whose digest or decisions differ is reported as a structured diff: the decision
recorded and the one recomputed, how the state after the batch differs (the recorded batch folded
against the recomputed one), and the inputs folded since the previous batch — so an incident
responder sees at once where a run stopped being reproducible, and what it had just read.
"""

from __future__ import annotations

from fleetlog.core.state import CoreConfig, State
from fleetlog.log.base import LogStore
from fleetlog.replay.engine import Start
from fleetlog.replay.parallel import verify_in_parallel
from fleetlog.replay.source import Progress, Source
from fleetlog.replay.state_at import first_start
from fleetlog.replay.stretch import (
    SHOWN_INPUTS,
    Divergence,
    InputSeen,
    Stretch,
    VerifyReport,
    verify_stretch,
)
from fleetlog.simulation.driver import long_lived_frozen

__all__ = [
    "SHOWN_INPUTS",
    "Divergence",
    "InputSeen",
    "Stretch",
    "VerifyReport",
    "verify",
    "verify_stretch",
]


async def verify(
    store: LogStore | Source,
    core: CoreConfig | None = None,
    limit_batches: int | None = None,
    progress: Progress | None = None,
    jobs: int = 1,
) -> VerifyReport:
    """Replay the inputs against the decisions log; stop at the first divergence.

    With ``jobs`` > 1 and a source with snapshots, the log is cut at snapshots into up to
    ``jobs`` stretches verified at once by forked processes (:mod:`fleetlog.replay.parallel`);
    any divergence, or a snapshot that differs from the replayed state, is then reported by
    the plain serial run, so the report is the same either way."""
    if core is None and isinstance(store, Source):
        core = store.core  # the settings the log was written with (--config, FLEETLOG_SERVICE_*)
    with long_lived_frozen():  # what exists is not re-scanned by the GC (nor copied by a fork)
        if jobs > 1 and isinstance(store, Source) and limit_batches is None:
            report = await verify_in_parallel(store, core, progress, jobs)
            if report is not None:
                return report
        log_store = store.store if isinstance(store, Source) else store
        start = await first_start(store, core=core) if isinstance(store, Source) else Start(State(core))
        found = await verify_stretch(log_store, start, None, limit_batches, progress)
        return found.report
