"""``core/never_fits.py``: can a submission ever fit on the fleet the state knows (the service's
ingest asks before appending)?"""

from __future__ import annotations

from fleetlog.core.never_fits import Fleet, never_fits_submitted
from fleetlog.core.state import State
from tests.core.builders import Driver, job, node


def test_never_fits_submitted_judges_only_a_known_fleet() -> None:
    state = State()
    big = job("big", tasks=16, topology="host")
    assert never_fits_submitted(state, big) is None  # no node known: no judgement
    d = Driver()
    d.feed(node("n1"), node("n2", cell="c2"))
    why = "no host can hold all 16 tasks even when empty (the best holds 8)"
    assert never_fits_submitted(d.state, big) == why
    assert never_fits_submitted(d.state, job("ok", tasks=8, topology="host")) is None
    assert never_fits_submitted(d.state, job("c3", tasks=16, topology="host", cells=("c3",))) is None
    assert never_fits_submitted(d.state, job("h100", gpus=16, models=("H100",))) is None
    assert never_fits_submitted(d.state, job("a100", gpus=16, models=("A100",))) is not None
    assert never_fits_submitted(d.state, job("cell", tasks=9, gpus=1, cells=("c2",))) is not None
    # a gang never spans cells
    assert never_fits_submitted(d.state, job("cells", tasks=16, gpus=1)) is not None
    assert Fleet(d.state).never_fits([], 0, None) is None
