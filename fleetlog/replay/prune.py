"""``fleetlog log prune --before OFFSET|TIME``: delete the file log's history that a snapshot
makes unnecessary (docs/retention.md).

The newest snapshot at or before the point that restores (its digest checks its contents) and
that the retained logs continue is the new start: inputs segments that end at or before its
inputs offset and decisions segments that end at or before its decisions offset are deleted,
whole, oldest first — never the active segment, never past that snapshot, never a segment that
holds a consumer group's last commit. With no such snapshot nothing is deleted and the command
says why. It runs offline: a running service holds the log's lock, and prune refuses to wait.
Replay then starts from that snapshot (:func:`fleetlog.replay.state_at.first_start`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fleetlog.core.state import State
from fleetlog.log.base import DECISIONS, INPUTS, LogError
from fleetlog.log.file import FileLogStore, LockedError
from fleetlog.log.snapshots import DirectorySnapshots
from fleetlog.replay.engine import Start
from fleetlog.replay.source import ReplayError, Source
from fleetlog.replay.state_at import Point, resolve, start_before


async def prune(directory: Path, point: Point, dry_run: bool = False) -> dict[str, Any]:
    """Prune the single-shard file log in ``directory`` before ``point``; what was (or, with
    ``dry_run``, would be) deleted."""
    if not (directory / INPUTS).is_dir():
        raise ReplayError(f"no file log at {directory} (expected an {INPUTS} directory)")
    store = FileLogStore(directory)
    try:
        await store.open()
    except LockedError as exc:
        raise ReplayError(f"the file log in {directory} is in use ({exc}): prune runs with the service "
                          "stopped") from None
    except LogError as exc:
        raise ReplayError(f"cannot open the file log in {directory}: {exc}") from None
    try:
        source = Source(store, DirectorySnapshots(directory / "snapshots"), f"file log {directory}")
        end = await store.log(INPUTS).end_offset()
        if point.offset is not None and point.offset > end:  # (past the end: as much as there is)
            point = Point(offset=end)
        offset = await resolve(source, point)
        notes: list[str] = []
        try:  # (the snapshot a replay to the point would start from: newest valid, logs continue it)
            keep = await start_before(source, offset, notes)
        except ReplayError:  # (pruned before, and no snapshot at or before the point)
            keep = Start(State())
        if keep.snapshot is None:
            raise ReplayError(
                f"no valid snapshot at or before inputs offset {offset} (the logs start at inputs offset "
                f"{await store.log(INPUTS).start_offset()}): nothing was pruned — a replay needs a snapshot "
                "to start from where history is gone" + "".join(f"; {n}" for n in notes))
        report: dict[str, Any] = {"before": offset, "snapshot": keep.snapshot, "dry_run": dry_run,
                                  "notes": notes}
        for log, bound in ((INPUTS, keep.inputs), (DECISIONS, keep.decisions)):
            gone = store.prune(log, bound, dry_run)
            report[log] = {
                "kept_from": bound,
                "segments_deleted": len(gone),
                "records_deleted": sum(end - base for base, end, _ in gone),
                "bytes_deleted": sum(size for _, _, size in gone),
                "start": gone[-1][1] if gone else await store.log(log).start_offset(),
            }
        return report
    finally:
        await store.close()
