"""Files only the owner may read or write, whatever the umask.

The logs, snapshots, the lock and ``service.json`` decide what the scheduler folds and where
producers send events: under ``umask 000`` a world-writable snapshot could be forged and a
rewritten ``service.json`` could redirect producers.  Everything fleetlog creates on disk goes
through these helpers: directories ``0700``, files ``0600`` (set explicitly, since ``open``'s
mode is only an upper bound the umask narrows, and an existing file keeps its old mode).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

DIR_MODE: Final = 0o700
FILE_MODE: Final = 0o600


def private_dir(path: Path) -> None:
    """Create ``path`` and any missing parent as ``0700`` directories (existing ones are kept)."""
    missing = []
    at = path
    while not at.exists():
        missing.append(at)
        if at.parent == at:
            break
        at = at.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, DIR_MODE)
        except FileExistsError:
            continue  # created meanwhile by another process
        os.chmod(directory, DIR_MODE)  # the umask may have narrowed it further: make it exact


def open_private(path: Path, flags: int) -> int:
    """``os.open`` with ``O_CREAT`` and the file made ``0600`` (also when it already existed)."""
    fd = os.open(path, flags | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
    except OSError:
        os.close(fd)
        raise
    return fd


def write_private(path: Path, data: bytes, *, sync: bool = False) -> None:
    """Replace ``path`` atomically with ``data`` in a ``0600`` file (temporary file, rename)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = open_private(tmp, os.O_WRONLY | os.O_TRUNC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def append_private(path: Path, data: bytes) -> None:
    """Append ``data`` to the ``0600`` file ``path`` and sync it (a report that must survive)."""
    fd = open_private(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
