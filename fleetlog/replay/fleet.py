"""``replay verify`` and ``state-at`` over every shard of a deployment with a ``[cells]`` map.

Verify checks the dispatcher (its step records against the global partition:
:func:`~fleetlog.replay.dispatcher.verify_dispatcher`) and every cell partition (its decision
batches, folded with its shard's ``CoreConfig``), and each partition's **outputs**: the summaries
and returns the global partition holds from it against what its own log gives again
(:func:`~fleetlog.service.cellshard.check_outputs`). A partition can decide right and still have
written something its log does not give (a forged or doubled summary): that is a divergence too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from fleetlog.core.dispatch import HELD, PENDING, DispatchState
from fleetlog.core.dispatch_log import state_digest
from fleetlog.core.state import JobState, NodeStatus, State
from fleetlog.log.base import INPUTS, LogStore, Shard
from fleetlog.replay.dispatcher import DispatchReplay, verify_dispatcher
from fleetlog.replay.shards import Place, Topology, open_shard
from fleetlog.replay.source import Progress, ReplayError, Source, end_offset, time_to_offset
from fleetlog.replay.state_at import Point, state_at
from fleetlog.replay.verify import verify


@dataclass
class Opened:
    """The shards' sources, opened once for one command (closed together)."""

    place: Place
    topology: Topology
    snapshots: bool = True
    sources: dict[Shard, Source] | None = None

    async def get(self, shard: Shard) -> Source:
        self.sources = self.sources or {}
        if shard not in self.sources:
            self.sources[shard] = await open_shard(self.place, shard, self.topology, self.snapshots)
        return self.sources[shard]

    async def close(self) -> None:
        for source in (self.sources or {}).values():
            await source.close()


async def inputs_total(opened: Opened, only: Shard | None = None) -> int:
    """The inputs of every shard (of ``only``): what a progress bar counts."""
    shards = opened.topology.shards() if only is None else (only,)
    return sum([await end_offset((await opened.get(s)).store, INPUTS) for s in shards])


# --- verify --------------------------------------------------------------------------------------


async def verify_fleet(opened: Opened, only: Shard | None = None, progress: Progress | None = None,
                       jobs: int = 1) -> dict[str, Any]:
    """One report per shard (the dispatcher first), an overall ``ok``, the first shard that
    ``diverged`` (``None`` when every one replays and its outputs match), and whether there was
    ``nothing_to_verify`` (no dispatcher step, no cell batch: not a pass, as for one shard)."""
    reports = []
    for shard in opened.topology.shards() if only is None else (only,):
        if shard == Shard.GLOBAL:
            reports.append(await _verify_global(opened, progress))
        else:
            reports.append(await _verify_cell(opened, shard, progress, jobs))
        cut = (await opened.get(shard)).cut  # (a torn decisions tail, a log under its high water)
        if cut:  # what is left may replay, but the shard's log is not whole: not a pass (issue 46)
            reports[-1] = {**reports[-1], "ok": False, "cut": list(cut)}
    diverged = next((r["shard"] for r in reports if not r["ok"]), None)
    empty = all(r.get("steps", r.get("batches")) == 0 for r in reports)
    return {"ok": diverged is None and not empty, "diverged": diverged, "nothing_to_verify": empty,
            "shards": reports}


async def _verify_global(opened: Opened, progress: Progress | None) -> dict[str, Any]:
    store = (await opened.get(Shard.GLOBAL)).store
    report = await verify_dispatcher(store, opened.topology.cells)
    if progress is not None:
        progress(report.inputs)
    divergence = None if report.divergence is None else msgspec.to_builtins(report.divergence)
    return {"shard": "global", "ok": divergence is None, "steps": report.steps, "inputs": report.inputs,
            "digest": report.digest, "divergence": divergence}


async def _verify_cell(opened: Opened, shard: Shard, progress: Progress | None, jobs: int) -> dict[str, Any]:
    source = await opened.get(shard)
    report = await verify(source, core=source.core, progress=progress, jobs=jobs)
    out: dict[str, Any] = {
        "shard": str(shard), "cells": list(opened.topology.held(shard.partition)), "ok": report.ok,
        "batches": report.batches, "decisions": report.decisions, "inputs": report.inputs,
        "digest": report.final_digest,
        "divergence": None if report.divergence is None else msgspec.to_builtins(report.divergence),
    }
    if report.ok:  # (a partition that decides otherwise gives other outputs: the first divergence says why)
        outputs = await outputs_of(opened, shard)
        out["outputs"] = outputs
        out["ok"] = outputs["ok"]
    return out


async def outputs_of(opened: Opened, shard: Shard) -> dict[str, Any]:
    """What the global partition holds from ``shard`` against what its own log gives again."""
    check = opened.topology.outputs
    if check is None:
        return {"ok": True, "checked": False}
    store = (await opened.get(shard)).store
    glob = (await opened.get(Shard.GLOBAL)).store
    return {"checked": True, **await check(opened.topology, store, glob, shard.partition)}


# --- state-at ------------------------------------------------------------------------------------


async def dispatcher_at(store: LogStore, topology: Topology, offset: int | None = None) -> DispatchState:
    """The dispatcher's state at global inputs ``offset`` (the end when ``None``): every input
    before it folded and every recorded step at or before it computed again."""
    end = await end_offset(store, INPUTS)
    stop = end if offset is None else offset
    if not 0 <= stop <= end:
        raise ReplayError(f"offset {stop} is out of range: the global inputs log has offsets 0 to {end}")
    replay = DispatchReplay(store, topology.cells)
    async for _, recorded in replay.steps():
        if recorded.as_of > stop:
            break
        await replay.redo(recorded)
    await (replay.fold_to_end() if stop == end else replay.fold_until(stop))
    return replay.state


def dispatcher_tables(state: DispatchState) -> dict[str, list[dict[str, Any]]]:
    """The dispatcher's view: each cell's latest summary and what was dispatched since; each job."""
    cells = []
    for cell, partition in state.cells.partitions:
        s = state.summaries.get(cell)
        cells.append({"cell": cell, "shard": str(Shard.cell(partition)),
                      "summary_seq": None if s is None else s.seq,
                      "summary_at_ms": None if s is None else s.at_ms,
                      "pending": None if s is None else s.pending,
                      "free_gpus": None if s is None else sum(r.slots for r in s.free if r.gpus == 1),
                      "dispatched_seq": state.dispatch_seq.get(cell, 0)})
    jobs = [{"job_id": j, "status": job.status, "cell": job.cell, "attempt": job.attempt,
             "returned_by": sorted(job.returned), "reason": job.reason}
            for j, job in state.jobs.items()]
    return {"cells": cells, "jobs": jobs}


async def fleet_state_at(opened: Opened, point: Point) -> dict[str, Any]:
    """Every shard at log time ``point``: one summary row per shard (offsets are per partition,
    so a fleet-wide point is a time)."""
    if point.time_ms is None:
        raise ReplayError("an offset names a point of one partition: give --shard global|cells-<p>, or a "
                          "log time for the fleet-wide state")
    rows = []
    for shard in opened.topology.shards():
        source = await opened.get(shard)
        offset = await _offset_at(source.store, point.time_ms)
        if shard == Shard.GLOBAL:
            rows.append(_global_row(await dispatcher_at(source.store, opened.topology, offset), offset))
        else:
            found = await state_at(source, Point(offset=offset))
            rows.append(_cell_row(shard, found.state, offset, found.digest))
    return {"time_ms": point.time_ms, "shards": rows, "totals": _totals(rows)}


async def _offset_at(store: LogStore, time_ms: int) -> int:
    """The shard's inputs offset at ``time_ms`` (0 before its first input: nothing folded yet)."""
    try:
        return await time_to_offset(store, time_ms)
    except ReplayError:  # empty, or the time is before this shard's first input
        return 0


def _global_row(state: DispatchState, offset: int) -> dict[str, Any]:
    count: Callable[[str], int] = lambda s: sum(j.status == s for j in state.jobs.values())  # noqa: E731
    return {"shard": "global", "offset": offset, "digest": state_digest(state), "nodes_up": None,
            "nodes": None, "jobs_known": len(state.jobs), "waiting": count(PENDING), "held": count(HELD),
            "pending": None, "running": None, "cells_with_summary": len(state.summaries)}


def _cell_row(shard: Shard, state: State, offset: int, digest: str) -> dict[str, Any]:
    n, jobs = state.nodes.size, state.jobs.size
    status = state.nodes.cols["status"][:n]
    job_states = state.jobs.cols["state"][:jobs]
    return {"shard": str(shard), "offset": offset, "digest": digest,
            "nodes_up": int((status == NodeStatus.UP).sum()), "nodes": n, "jobs_known": state.live_jobs(),
            "waiting": None, "held": None,
            "pending": int((job_states == JobState.PENDING).sum()),
            "running": int((job_states == JobState.RUNNING).sum()), "cells_with_summary": None}


def _totals(rows: list[dict[str, Any]]) -> dict[str, int]:
    keys = ("nodes_up", "nodes", "pending", "running", "waiting", "held")
    return {k: sum(r[k] for r in rows if r[k] is not None) for k in keys}
