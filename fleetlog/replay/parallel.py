"""Verify a long log on several cores: cut it at snapshots, verify the stretches at once.

A snapshot holds the state at a known (inputs, decisions) point, so the stretch after it can be
verified without the stretch before it. The stretches run in forked processes (the parent takes
the first one itself); each reports its counts, the digest of the state it started from and the
digest of the replayed state where it stopped. The run is clean only if every stretch is clean
*and* each stretch ended on exactly the state the next one started from (the snapshot equals the
replay). Anything else — a divergence, a snapshot that differs, a process that failed — returns
``None`` and the caller verifies serially, so the report (and its first divergence) is always the
serial one.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import os
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import msgspec

from fleetlog.core.digest import SnapshotError, restore
from fleetlog.core.state import CoreConfig
from fleetlog.log.base import DECISIONS, INPUTS, LogError
from fleetlog.log.snapshots import SnapshotHeader, decode_snapshot
from fleetlog.replay.engine import Start
from fleetlog.replay.source import Progress, ReplayError, Source, end_offset
from fleetlog.replay.state_at import first_start
from fleetlog.replay.stretch import Stretch, VerifyReport, verify_stretch
from fleetlog.retry import Backoff, poll

Cut = tuple[str, SnapshotHeader, Callable[[], bytes]]
"""(name, header, load) of a snapshot the log is cut at."""
POLL_S = 0.1


async def verify_in_parallel(
    source: Source, core: CoreConfig | None, progress: Progress | None, jobs: int
) -> VerifyReport | None:
    """The clean report, or ``None``: verify serially (see the module docstring)."""
    if source.snapshots is None or source.reopen is None:
        return None
    start = await first_start(source, core=core)  # (a fresh state, or the oldest snapshot after a prune)
    cuts = [cut for cut in await choose_cuts(source, jobs)
            if cut[1].inputs_offset > start.inputs and cut[1].decisions_offset > start.decisions]
    if not cuts:
        return None
    context = multiprocessing.get_context("fork")
    done = context.Array("q", len(cuts), lock=False)  # inputs folded per child, for the progress bar
    children: list[tuple[Any, Connection]] = []
    for i, (name, header, load) in enumerate(cuts):
        stop = _stop(cuts[i + 1][1]) if i + 1 < len(cuts) else None
        receive, send = context.Pipe(duplex=False)
        child = context.Process(
            target=_child, args=(source.reopen, name, header, load, stop, send, done, i), daemon=True
        )
        child.start()
        send.close()
        children.append((child, receive))
    seen = [0]

    def with_children(n: int) -> None:
        total = sum(done)
        if progress is not None:
            progress(n + total - seen[0])
        seen[0] = total

    try:
        first = await verify_stretch(source.store, start, _stop(cuts[0][1]), None, with_children)
        results = await _collect(children, with_children)
    finally:
        for child, receive in children:
            receive.close()
            child.join(timeout=5)
            if child.is_alive():
                child.kill()
    stretches = [first, *(r for r in results if r is not None)]
    return _combine(stretches) if len(stretches) == len(cuts) + 1 else None


async def choose_cuts(source: Source, jobs: int) -> list[Cut]:
    """Up to ``jobs - 1`` snapshots that cut the inputs most evenly, each followed by at least
    one decision batch; none if the snapshots cannot be read."""
    assert source.snapshots is not None
    try:
        candidates = await source.snapshots.candidates()
        inputs_end = await end_offset(source.store, INPUTS)
        decisions_end = await end_offset(source.store, DECISIONS)
    except (LogError, ReplayError):
        return []
    usable: list[Cut] = []
    for name, load in candidates:
        try:
            header = decode_snapshot(load()).header
        except (LogError, OSError):
            continue
        if 0 < header.inputs_offset < inputs_end and header.decisions_offset < decisions_end:
            usable.append((name, header, load))
    usable.sort(key=lambda cut: (cut[1].inputs_offset, cut[0]))
    chosen: list[Cut] = []
    for k in range(1, jobs):
        target = inputs_end * k // jobs
        later = [cut for cut in usable if not chosen or cut[1].inputs_offset > chosen[-1][1].inputs_offset]
        if later:
            chosen.append(min(later, key=lambda cut: abs(cut[1].inputs_offset - target)))
    return chosen


def _stop(header: SnapshotHeader) -> tuple[int, int]:
    return header.inputs_offset, header.decisions_offset


async def _collect(
    children: list[tuple[Any, Connection]], progress: Callable[[int], None]
) -> list[Stretch | None]:
    """Each child's stretch (``None`` for one that failed), polling so the progress bar moves."""
    results: list[Stretch | bool | None] = [False] * len(children)

    async def gather() -> bool:
        for i, (child, receive) in enumerate(children):
            if results[i] is not False:
                continue
            if receive.poll():
                try:
                    results[i] = msgspec.msgpack.decode(receive.recv_bytes(), type=Stretch | None)
                except (EOFError, OSError, msgspec.DecodeError):
                    results[i] = None
            elif not child.is_alive() and not receive.poll():
                results[i] = None  # died without a word
        progress(0)
        return False not in results

    await poll(gather, bool, within_s=None, backoff=Backoff(POLL_S, factor=1))
    return [r if isinstance(r, Stretch) else None for r in results]


def _child(
    reopen: Callable[[], Any],
    name: str,
    header: SnapshotHeader,
    load: Callable[[], bytes],
    stop: tuple[int, int] | None,
    send: Connection,
    done: Any,
    index: int,
) -> None:
    """A forked process: verify one stretch, send it back, exit without the parent's cleanups."""
    result: Stretch | None = None
    try:
        asyncio.events._set_running_loop(None)  # forked from inside the parent's running loop
        result = asyncio.run(_stretch(reopen, name, header, load, stop, done, index))
    except BaseException:  # any failure: the parent verifies serially
        result = None
    finally:
        try:
            send.send_bytes(msgspec.msgpack.encode(result))
            send.close()
        finally:
            os._exit(0)


async def _stretch(
    reopen: Callable[[], Any],
    name: str,
    header: SnapshotHeader,
    load: Callable[[], bytes],
    stop: tuple[int, int] | None,
    done: Any,
    index: int,
) -> Stretch | None:
    source: Source = await reopen()
    try:
        try:
            state = restore(decode_snapshot(load()).state)
        except (SnapshotError, LogError, OSError):
            return None

        def count(n: int) -> None:
            done[index] += n

        start = Start(state, header.inputs_offset, header.decisions_offset, name)
        return await verify_stretch(source.store, start, stop, None, count)
    finally:
        await source.close()


def _combine(stretches: list[Stretch]) -> VerifyReport | None:
    """One report for the stretches in order, if each is clean and starts where the previous
    ended; else ``None``."""
    for before, after in itertools.pairwise(stretches):
        if before.report.divergence is not None or before.report.final_digest != after.start_digest:
            return None
    last = stretches[-1].report
    if last.divergence is not None:
        return None
    return VerifyReport(
        batches=sum(s.report.batches for s in stretches),
        decisions=sum(s.report.decisions for s in stretches),
        inputs=last.inputs,
        final_digest=last.final_digest,
    )
