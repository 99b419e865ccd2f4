"""Where the real traces are read from (never copied into the repository: research/study terms).

``FLEETLOG_TRACES`` names the openb CSV folder; otherwise it is looked for where the project's
shared folder sits beside a checkout (``../shared/traces/alibaba-gpu-v2023-openb/csv``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

from fleetlog.simulation.spec import SpecError

TRACES_ENV: Final = "FLEETLOG_TRACES"
OPENB_DIR: Final = Path("traces", "alibaba-gpu-v2023-openb", "csv")
PHILLY_FILE: Final = Path("traces", "philly-runtime-via-alibaba", "philly_runtime.csv")


def shared_dir() -> Path:
    """The shared folder beside the checkout this package was installed from."""
    return Path(__file__).resolve().parents[4] / "shared"


def openb_dir() -> Path:
    """The openb CSV folder: ``$FLEETLOG_TRACES``, else ``../shared/traces/...`` beside the checkout."""
    env = os.environ.get(TRACES_ENV)
    return Path(env) if env else shared_dir() / OPENB_DIR


def openb_file(name: str) -> Path:
    """A file of the openb folder; a clear error when the folder is not there."""
    path = openb_dir() / name
    if not path.is_file():
        raise SpecError(f"{path} does not exist: set {TRACES_ENV} to the openb CSV folder, or give a path")
    return path


def philly_file() -> Path:
    """The Philly runtime list beside the openb folder (``../../philly-runtime-via-alibaba``)."""
    path = openb_dir().parent.parent / PHILLY_FILE.relative_to("traces")
    if not path.is_file():
        raise SpecError(f"{path} does not exist: give durations=PATH to a runtime CSV")
    return path
