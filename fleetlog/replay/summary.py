"""The shared measures of a run's logs (:mod:`fleetlog.measures`), computed by replaying them:
``replay report`` and ``fleetlog simulate`` (after each run, on the log it wrote) both call
this, so the two never disagree."""

from __future__ import annotations

from typing import Any

from fleetlog.core.state import CoreConfig
from fleetlog.log.base import LogStore
from fleetlog.replay.engine import replay
from fleetlog.replay.observe import Measures
from fleetlog.replay.source import Progress, Source
from fleetlog.replay.state_at import first_start


async def measure(source: Source, progress: Progress | None = None) -> Measures:
    """Replay the whole log with a :class:`Measures` observer."""
    measures = Measures()
    done = await replay(source, await first_start(source), observers=(measures,), progress=progress)
    measures.finish(done.state)
    return measures


async def measure_store(store: LogStore, core: CoreConfig | None = None) -> dict[str, Any]:
    """The shared measures of the logs in ``store`` (open), as a summary."""
    return (await measure(Source(store, None, "the run's log", core=core))).summary()
