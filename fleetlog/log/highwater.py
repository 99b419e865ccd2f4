"""``DIR/high-water.json``: how long each log of a file log directory has ever been (issue 46).

A snapshot, a decision batch or a commit proves a log once reached an offset (the checks of
:mod:`fleetlog.service.snapshots`); but a deleted last inputs segment that no snapshot covered
(acknowledged direct appends), or the snapshots deleted together with the decisions log, leave
no such proof, and the service would lead on the shorter log as if nothing had been lost —
deciding every job again as if new.  So the file log records, per log, the highest end it has
*made durable*: after each durability barrier (the transactional append, at most a few times a
second) and on close.  It is written after the segments are synced and never fsynced itself, so
a power failure can only leave it older (less is detected), never ahead of the data (no false
alarm).  It only grows.

On open, a log that ends before its recorded high water and whose torn tail was not just
truncated and reported (``truncations.jsonl`` says what that cut) lost records silently: the
writer refuses to open (:class:`LogShorterError`: the service stalls with the reason, a producer
that appends directly gets one line) — a new record would be acknowledged at an offset already
acknowledged once.  An operator restores the log, or accepts the loss by moving
``high-water.json`` away (``docs/service.md``, "What the file log remembers").  Deleting the
file also hides a loss: it is fleetlog's own, in a directory no other user may write.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Final

from fleetlog.log.base import LogError
from fleetlog.log.private import write_private

HIGH_WATER_NAME: Final = "high-water.json"
ACCEPT_LOSS: Final = ("restore the log from a backup; or, to accept the loss, move high-water.json away "
                      "(the next open records the ends as they are); re-checked every few seconds")


class LogShorterError(LogError):
    """A log ends before its recorded high water: records were lost without a trace (a deleted
    segment, a deleted decisions log).  One line naming the log, both ends and the way out."""


def read(directory: Path) -> dict[str, int]:
    """The recorded high water of each log (``{}``: none recorded, or unreadable: detect less)."""
    try:
        found = json.loads((directory / HIGH_WATER_NAME).read_bytes())
    except (OSError, ValueError):
        return {}
    if not isinstance(found, dict):
        return {}
    return {str(k): v for k, v in found.items() if isinstance(v, int) and not isinstance(v, bool) and v >= 0}


def shorter(directory: Path, recorded: Mapping[str, int], ends: Mapping[str, int],
            truncated: Collection[str]) -> LogShorterError | None:
    """The error for the logs of ``ends`` that are shorter than ``recorded`` (``None``: none), but
    for those in ``truncated``, whose cut was reported already."""
    lost = [f"the {name} log ends at {ends[name]} but once held {recorded[name]} records (offsets "
            f"{ends[name]}..{recorded[name] - 1} are gone)"
            for name in sorted(ends) if name not in truncated and ends[name] < recorded.get(name, 0)]
    if not lost:
        return None
    return LogShorterError(f"file log directory {directory}: {'; '.join(lost)}, and no truncation was "
                           "reported for it: records were lost without a trace (a deleted segment or "
                           "log?); restore the log, or accept the loss: move high-water.json away")


def grown(recorded: Mapping[str, int], ends: Mapping[str, int]) -> dict[str, int]:
    """``recorded`` raised to ``ends`` where they pass it (the high water only grows)."""
    return {**recorded, **{name: end for name, end in ends.items() if end > recorded.get(name, -1)}}


def write(directory: Path, high: Mapping[str, int]) -> None:
    """Record ``high`` (by rename, not synced: see the module docstring)."""
    write_private(directory / HIGH_WATER_NAME, json.dumps(dict(high), sort_keys=True).encode())
