"""Revisions checked out side by side for a before/after comparison (``benchmarks.compare``,
``benchmarks.shape``): each in a temporary detached git worktree, always removed afterwards.

A tree is a plain checkout of the commit, so the before revision runs with its own
``benchmarks/`` and ``fleetlog/`` (uncommitted changes of the working copy are not in it), and it
gets its own numba cache (``__pycache__`` beside its kernels), removed with it.  That cache starts
as a copy of the working copy's numba cache files when the tree's ``fleetlog/`` sources are
byte for byte the working copy's (same ``*.py`` names and bytes: the same compiled code), so a
revision equal to the working copy (``HEAD`` in CI) loads its kernels instead of compiling them
again for a minute or two; any other revision starts empty and compiles.  numba still checks each
copied index against the tree's sources (``fleetlog/core/kernels/cache.py``'s stamp).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import FrameType

REPO = Path(__file__).resolve().parents[1]
PREFIX = "fleetlog-compare-"


class UsageError(Exception):
    """A revision git does not know: one line for the user, exit code 2."""


def git(*args: str, cwd: Path = REPO) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done.stdout.strip()


def resolve(rev: str) -> str:
    """The full commit id of ``rev``; a :class:`UsageError` naming it if git does not know it."""
    try:
        return git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except RuntimeError:
        raise UsageError(f"unknown revision {rev!r} (not a commit in {REPO})") from None


def worktrees() -> list[Path]:
    """Paths of this repository's worktrees that this module made (and has not yet removed)."""
    listed = git("worktree", "list", "--porcelain").splitlines()
    paths = [Path(line.removeprefix("worktree ")) for line in listed if line.startswith("worktree ")]
    return [p for p in paths if p.parent.name.startswith(PREFIX)]


@contextmanager
def checkout(rev: str) -> Iterator[Path]:
    """A detached worktree of ``rev`` in a fresh temporary directory; removed (``git worktree
    remove --force --force``, then ``prune``) however the block ends: error, Ctrl-C or SIGTERM.
    Twice forced: a Ctrl-C during ``git worktree add`` kills git while its entry is still
    locked ("initializing"), and git removes (or prunes) a locked worktree only so."""
    commit = resolve(rev)
    parent = Path(tempfile.mkdtemp(prefix=PREFIX))
    tree = parent / commit[:12]
    try:
        git("worktree", "add", "--detach", str(tree), commit)
        seed_numba_cache(tree)
        yield tree
    finally:
        remove = ["git", "worktree", "remove", "--force", "--force", str(tree)]
        subprocess.run(remove, cwd=REPO, capture_output=True, check=False)
        shutil.rmtree(parent, ignore_errors=True)
        subprocess.run(["git", "worktree", "prune"], cwd=REPO, capture_output=True, check=False)


def sources(root: Path) -> dict[str, bytes]:
    """Every ``*.py`` file under ``root/fleetlog`` (relative name: bytes)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted((root / "fleetlog").rglob("*.py"))}


def seed_numba_cache(tree: Path, source: Path = REPO) -> int:
    """Copy ``source``'s numba cache files (``__pycache__/*.nbi``, ``*.nbc`` under ``fleetlog/``)
    into ``tree`` when both hold the same ``fleetlog`` sources; the number of files copied."""
    if sources(tree) != sources(source):
        return 0
    copied = 0
    for cached in sorted((source / "fleetlog").rglob("__pycache__/*.nb[ic]")):
        target = tree / cached.relative_to(source)
        target.parent.mkdir(exist_ok=True)
        shutil.copy2(cached, target)
        copied += 1
    return copied


@contextmanager
def checkouts(*revs: str) -> Iterator[list[Path]]:
    """:func:`checkout` of each revision (all resolved first, so a typo costs no checkout); a
    SIGTERM meanwhile is raised as ``KeyboardInterrupt`` so the trees are still removed."""
    for rev in revs:
        resolve(rev)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with ExitStack() as stack:
            yield [stack.enter_context(checkout(rev)) for rev in revs]
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def tree_env(tree: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a child run in ``tree``: its own code first on the path."""
    return {**os.environ, "PYTHONPATH": str(tree), **(extra or {})}
