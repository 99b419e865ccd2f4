"""What a directory holds before a command writes a fresh file log into it — the one check behind
every deletion fleetlog makes on a user's behalf (``fleetlog demo``, ``fleetlog simulate``).

The rule: a command deletes only what fleetlog itself writes in a file log directory (the three
logs' segments and indexes, snapshots, the lock, ``service.json``, ``truncations.jsonl``), matched
file by file by name; and only when told to (``replace``: ``--force``, or a default directory
under ``.fleetlog/`` that is fleetlog's own scratch space).  A directory holding anything else —
a file of the user's, a symlink, an unknown subdirectory — is never touched, even when told to.
A log another process holds open is never deleted either.

And the one check behind every *use* of a file log directory (:func:`check_trusted`, issue 46):
a directory (or ``service.json``) that another local user may write is refused, as the tokens
file is — such a user could plant a ``service.json`` that sends producers' bearer tokens to an
address of theirs, or forge segments and snapshots the scheduler would fold.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import stat
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from fleetlog.log.base import LOG_NAMES, LogError

SEGMENT_FILE: Final = re.compile(r"\d{20}\.(log|index|index\.tmp)")
SNAPSHOT_FILE: Final = re.compile(r"snapshot-\d{20}\.bin(\.tmp)?")
SUBDIRS: Final = {**dict.fromkeys(LOG_NAMES, SEGMENT_FILE), "snapshots": SNAPSHOT_FILE}
"""Each subdirectory of a file log, and the names of the only files fleetlog writes in it."""
TOP_FILES: Final = frozenset(
    {"LOCK", "LOCK.intent", "LOCK.intent.tmp", "truncations.jsonl", "service.json", "service.json.tmp",
     "high-water.json", "high-water.json.tmp"}
)
"""The files fleetlog writes at the top of a file log directory."""
LOCK_FILE: Final = "LOCK"


class LogDirError(LogError):
    """A directory a command may not write a fresh log into: one line naming it and why."""


class UntrustedError(LogDirError):
    """A log directory or ``service.json`` another local user may write: refused (one line)."""


TRUSTED_OWNERS_ROOT: Final = 0
"""Root may own what fleetlog trusts as well as this process's user (root may write anything)."""


def check_trusted(path: Path, what: str = "file log directory") -> None:
    """Refuse ``path`` (when it exists) if a user other than this process's may write it: group-
    or world-writable (a sticky bit does not help: anyone may still *create* ``service.json``), or
    owned by another user; ``service.json`` must moreover be a plain file, not a symlink."""
    try:
        st = path.lstat() if path.name == "service.json" else path.stat()
    except FileNotFoundError:
        return
    except OSError as exc:
        raise UntrustedError(f"{what} {path}: {exc.strerror or exc}") from None
    if path.name == "service.json" and not stat.S_ISREG(st.st_mode):
        raise UntrustedError(f"{what} {path}: not a plain file (fleetlog writes it with mode 0600); "
                             "remove it")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        fix = "chmod 700" if stat.S_ISDIR(st.st_mode) else "rm"
        raise UntrustedError(f"{what} {path}: mode {stat.filemode(st.st_mode)} lets other users write it "
                             f"(they could redirect producers or forge the log); {fix} {path}")
    if hasattr(os, "getuid") and st.st_uid not in (os.getuid(), TRUSTED_OWNERS_ROOT):
        raise UntrustedError(f"{what} {path}: owned by uid {st.st_uid}, not this process's user "
                             f"(uid {os.getuid()})")


@dataclass(frozen=True)
class Survey:
    """What ``directory`` holds: ``owned`` are fleetlog's files (deepest first, directories after
    their files); ``foreign`` names the first entry that is not fleetlog's (``None``: none)."""

    directory: Path
    owned: tuple[Path, ...]
    foreign: str | None

    @property
    def empty(self) -> bool:
        return not self.owned and self.foreign is None


def survey(directory: Path, nested: Callable[[str], bool] = lambda _: False) -> Survey:
    """What ``directory`` (which must be a directory) holds.  ``nested(name)``: a subdirectory
    of that name is itself a whole log (``fleetlog simulate --seeds N`` writes ``seed-N/``)."""
    owned: list[Path] = []
    for entry in sorted(directory.iterdir()):
        bad = _owned_entry(entry, nested, owned)
        if bad is not None:
            return Survey(directory, (), bad)
    return Survey(directory, tuple(owned), None)


def _owned_entry(entry: Path, nested: Callable[[str], bool], owned: list[Path]) -> str | None:
    """Add ``entry``'s files to ``owned`` if fleetlog wrote them all; else the foreign name."""
    if entry.is_symlink():
        return entry.name
    if entry.is_file() and entry.name in TOP_FILES:
        owned.append(entry)
        return None
    if not entry.is_dir():
        return entry.name
    if entry.name in SUBDIRS:
        pattern = SUBDIRS[entry.name]
        for child in sorted(entry.iterdir()):
            if child.is_symlink() or not child.is_file() or not pattern.fullmatch(child.name):
                return f"{entry.name}/{child.name}"
            owned.append(child)
        owned.append(entry)
        return None
    if nested(entry.name):
        inner = survey(entry)
        if inner.foreign is not None:
            return f"{entry.name}/{inner.foreign}"
        owned.extend((*inner.owned, entry))
        return None
    return entry.name


def prepare_log_dir(
    directory: Path,
    *,
    replace: bool,
    flag: str = "--log",
    nested: Callable[[str], bool] = lambda _: False,
) -> None:
    """Make ``directory`` ready for a fresh log: missing or empty is fine; a fleetlog log is
    removed (file by file) only when ``replace``; anything else is refused, whatever ``replace``."""
    if not directory.exists() and not directory.is_symlink():
        return
    if not directory.is_dir():
        raise LogDirError(f"{flag} {directory}: not a directory")
    found = survey(directory, nested)
    if found.foreign is not None:
        raise LogDirError(
            f"{flag} {directory}: holds {found.foreign!r}, which is not a fleetlog log; fleetlog never "
            "deletes what it did not write (not even with --force): choose an empty or new directory"
        )
    if found.empty:
        return
    if not replace:
        raise LogDirError(
            f"{flag} {directory}: holds a fleetlog log already; pass --force to replace it, or choose "
            "an empty or new directory"
        )
    with _unused(found):
        for path in found.owned:
            if path.is_dir():
                path.rmdir()
            else:
                path.unlink()


@contextlib.contextmanager
def _unused(found: Survey) -> Iterator[None]:
    """Hold the writer lock of every log in ``found`` while deleting it: a log another process
    has open (a running ``fleetlog run``, a producer) is refused."""
    fds: list[int] = []
    try:
        for lock in (p for p in found.owned if p.name == LOCK_FILE):
            fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
            fds.append(fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
                raise LogDirError(
                    f"{lock.parent}: the log is open in another process (pid {holder}); stop it first"
                ) from None
        yield
    finally:
        for fd in fds:
            os.close(fd)


def check_overwrite(
    files: Mapping[Path, Callable[[Path], bool]], *, replace: bool, flag: str
) -> None:
    """Before writing ``files`` (each with a test that an existing one is fleetlog's own output):
    an existing file of fleetlog's is overwritten only when ``replace``; any other is refused."""
    for path, ours in files.items():
        if not path.exists() and not path.is_symlink():
            continue
        if path.is_symlink() or not path.is_file() or not ours(path):
            raise LogDirError(
                f"{flag} {path.parent}: holds {path.name!r}, which fleetlog did not write; fleetlog never "
                "overwrites it (not even with --force): choose another directory"
            )
        if not replace:
            raise LogDirError(
                f"{flag} {path.parent}: holds the report of an earlier run; pass --force to replace it, "
                "or choose an empty or new directory"
            )


SHARD_DIR: Final = re.compile(r"global|cells-\d+")
"""The sub-directories a ``[cells]`` map's file log keeps a whole log in each (docs/logs.md)."""


def check_log_place(directory: Path, *, create: bool, flag: str = "--log") -> None:
    """Before a command writes into ``directory`` as its file log (``fleetlog run``, ``submit``):
    it must hold a fleetlog log, or be empty or missing and ``create`` given (``--create``: a
    mistyped path is an error, not a new log); a directory holding anything else — ``/etc``, a
    home folder — is refused whatever the flags, so fleetlog never writes its ``LOCK``,
    ``inputs/``… beside a user's files."""
    if not directory.exists() and not directory.is_symlink():
        if create:
            return
        raise LogDirError(f"{flag} {directory}: no file log there (expected {', '.join(LOG_NAMES)} "
                          "directories); --create starts a new one")
    if not directory.is_dir():
        raise LogDirError(f"{flag} {directory}: not a directory")
    foreign, empty = _foreign_name(directory)
    if foreign is not None:
        raise LogDirError(f"{flag} {directory}: holds {foreign!r}, which is not part of a fleetlog "
                          "log; fleetlog writes its log only into a new or empty directory (with --create) "
                          "or one holding a fleetlog log")
    if empty and not create:
        raise LogDirError(f"{flag} {directory}: empty, no file log there; --create starts a new one")


def _foreign_name(directory: Path, shard: str = "") -> tuple[str | None, bool]:
    """(the first entry whose name fleetlog never writes there, whether it is empty).  Names only:
    a log damaged in place (a file where ``dead-letters/`` should be) is still the log's — the
    service reports that itself — while one file of a user's makes the directory not a log."""
    entries = sorted(directory.iterdir())
    for entry in entries:
        if entry.name in SUBDIRS or entry.name in TOP_FILES:
            continue
        if not shard and SHARD_DIR.fullmatch(entry.name) and entry.is_dir() and not entry.is_symlink():
            inner, _ = _foreign_name(entry, entry.name)
            if inner is None:
                continue
            return f"{entry.name}/{inner}", False
        return entry.name, False
    return None, not entries
