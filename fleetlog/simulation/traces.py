"""Where the real traces are read from (never copied into the repository: research/study terms).

``FLEETLOG_TRACES`` names where the traces are: the openb CSV folder itself
(``…/alibaba-gpu-v2023-openb/csv``), or any folder above it a user would name — the openb
folder, ``../shared/traces`` or ``../shared``.  Without it they are looked for in the shared
folder beside the checkout this package runs from (``../shared/traces/alibaba-gpu-v2023-openb/csv``
seen from the checkout's root), then beside the working directory (``./scripts/demo`` runs
from the checkout's root, whatever was installed).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

from fleetlog.simulation.spec import SpecError

TRACES_ENV: Final = "FLEETLOG_TRACES"
OPENB_DIR: Final = Path("traces", "alibaba-gpu-v2023-openb", "csv")
PHILLY_FILE: Final = Path("traces", "philly-runtime-via-alibaba", "philly_runtime.csv")
NODE_LIST: Final = "openb_node_list_gpu_node.csv"
"""A file every openb CSV folder holds: how a folder is recognised as one."""


def shared_dir() -> Path:
    """The shared folder beside the checkout this package was installed from (``fleetlog/`` is at
    the checkout's root, so the checkout is ``parents[2]`` of this file and ``shared`` its sibling)."""
    return Path(__file__).resolve().parents[3] / "shared"


def _openb_under(root: Path) -> Path | None:
    """The openb CSV folder at or under ``root`` (``root`` itself, ``csv``, or the openb folder
    under ``traces`` or the shared folder), or ``None``."""
    for tail in (Path(), Path("csv"), OPENB_DIR.relative_to("traces"), OPENB_DIR):
        if (root / tail / NODE_LIST).is_file():
            return root / tail
    return None


def openb_dir() -> Path:
    """The openb CSV folder: under ``$FLEETLOG_TRACES``, else beside the checkout or the working
    directory; a :class:`SpecError` saying what was looked for when none holds it."""
    env = os.environ.get(TRACES_ENV)
    places = [Path(env)] if env else [shared_dir(), Path.cwd().resolve().parent / "shared"]
    for place in places:
        found = _openb_under(place)
        if found is not None:
            return found
    where = " or ".join(str(p) for p in dict.fromkeys(places))
    expected = (f"the openb CSV folder ({OPENB_DIR.relative_to('traces')}, holding {NODE_LIST}) "
                "or a folder above it")
    if env:
        raise SpecError(f"{TRACES_ENV}={env}: no openb traces there: set it to {expected}")
    raise SpecError(f"no openb traces in {where}: set {TRACES_ENV} to {expected}, or give a path")


def openb_file(name: str) -> Path:
    """A file of the openb folder; a clear error when the folder or the file is not there."""
    path = openb_dir() / name
    if not path.is_file():
        raise SpecError(f"{path} does not exist: not a file of the openb trace")
    return path


def philly_file() -> Path:
    """The Philly runtime list beside the openb folder (``../../philly-runtime-via-alibaba``)."""
    path = openb_dir().parent.parent / PHILLY_FILE.relative_to("traces")
    if not path.is_file():
        raise SpecError(f"{path} does not exist: give durations=PATH to a runtime CSV")
    return path
