"""The replay commands and ``fleetlog status`` on a deployment with a ``[cells]`` map.

Without ``--shard`` they work across the shards: ``verify`` checks the dispatcher and every cell
partition, ``status`` and ``explain`` follow the job from the dispatcher to the cell that held it,
``state-at TIME`` summarises every shard. With ``--shard global|cells-<p>`` a command reads that
one shard: a cell partition exactly as the single shard's log (folded with its shard's settings),
the global partition with the dispatcher's replay.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import msgspec

from fleetlog.display import console, describe, log_time, print_sections
from fleetlog.log.base import INPUTS, Shard
from fleetlog.replay.fleet import (
    Opened,
    dispatcher_at,
    dispatcher_tables,
    fleet_state_at,
    inputs_total,
    verify_fleet,
)
from fleetlog.replay.fleet_job import explain_fleet, parked_anywhere, status_fleet
from fleetlog.replay.shards import Place, Topology, shard_of
from fleetlog.replay.source import ReplayError, end_offset
from fleetlog.replay.state_at import resolve
from fleetlog.replay.terminal import parse_point, progress_bar

EXIT_DIVERGED = 1
EXIT_NOTHING_TO_VERIFY = 3
ACROSS = ("verify", "status", "explain", "state-at")
"""The commands that work across the shards; the others read one shard (``--shard``)."""


async def run(name: str, place: Place, args: argparse.Namespace, topology: Topology | None,
              single: Any) -> int:
    """Run ``name`` across the shards, or on the one ``--shard`` names (``single(shard)``: the
    single-shard handler on that shard's logs)."""
    shard = shard_of(args, topology)
    assert topology is not None  # (shard_of refuses --shard without a map)
    if shard is not None and shard.kind == "cell" and name != "verify":
        return int(await single(shard))
    if shard is None and name not in ACROSS:
        raise ReplayError(f"replay {name} reads one shard of this deployment's [cells] map: give --shard "
                          f"{'|'.join(topology.names())}")
    if shard == Shard.GLOBAL and name not in ("verify", "state-at", "explain", "dump"):
        raise ReplayError(f"replay {name} --shard global: the global partition holds the dispatcher's "
                          "inputs and steps, no placements; choose a cell partition (--shard cells-<p>)")
    if name == "dump":
        return int(await single(shard))
    opened = Opened(place, topology, not getattr(args, "no_snapshots", False))
    try:
        return await _ACROSS[name](args, opened, shard)
    finally:
        await opened.close()


def _print_json(data: Any) -> None:
    print(json.dumps(msgspec.to_builtins(data), indent=None))


# --- verify --------------------------------------------------------------------------------------


async def cmd_verify(args: argparse.Namespace, opened: Opened, only: Shard | None) -> int:
    with progress_bar("verify", await inputs_total(opened, only)) as bar:
        report = await verify_fleet(opened, only, bar, args.jobs)
    if args.json:
        _print_json(report)
    else:
        _print_verify(report)
    if report["nothing_to_verify"]:
        return EXIT_NOTHING_TO_VERIFY
    return 0 if report["ok"] else EXIT_DIVERGED


def _print_verify(report: dict[str, Any]) -> None:
    for r in report["shards"]:
        cut = r.get("cut", [])
        status = "OK" if r["ok"] else "CUT" if cut and r["divergence"] is None else "DIVERGED"
        print(f"{r['shard']:<10} {status:<9} {_verified(r)}")
        for note in cut:
            print(f"           the log was cut: {note}")
        d = r["divergence"]
        if d is not None:
            print(f"           at decisions@{d['decisions_offset']} (as_of {d['as_of']}): {d['what']}")
            for key in ("recorded", "replayed"):
                if key in d:
                    print(f"           {key}: {d[key]}")
        out = r.get("outputs")
        if out is not None and not out["ok"]:
            print(f"           outputs differ at output #{out['first_difference']} of {out['written']} "
                  f"in the global partition ({out['rederived']} given again by the cell log)")
            print(f"           recorded: {out['recorded']}")
            print(f"           replayed: {out['replayed']}")
    n = len(report["shards"])
    if report["diverged"] is not None:
        first = next(r for r in report["shards"] if r["shard"] == report["diverged"])
        label = "CUT" if first.get("cut") and first["divergence"] is None else "DIVERGED"
        print(f"{label}: {first['shard']}")
    elif report["nothing_to_verify"]:
        print("NOTHING TO VERIFY: no dispatcher step and no decision batch in any shard yet")
    else:
        print(f"OK: {n} shard{'s' * (n != 1)} replayed bit-exactly")


def _verified(r: dict[str, Any]) -> str:
    digest = f"digest {r['digest'][:16]}…"
    if r["shard"] == "global":
        return f"{r['steps']:,} dispatcher steps, {r['inputs']:,} inputs; {digest}"
    text = f"cells {', '.join(r['cells'])}: {r['batches']:,} batches, {r['decisions']:,} decisions, " \
           f"{r['inputs']:,} inputs; {digest}"
    out = r.get("outputs")
    if out is not None and out.get("checked") and out["ok"]:
        text += f"; its {out['written']:,} outputs in the global partition match"
    return text


# --- status and explain --------------------------------------------------------------------------


async def cmd_status(args: argparse.Namespace, opened: Opened, only: Shard | None) -> int:
    found = await status_fleet(opened, args.job)
    if found is None:
        parked = await parked_anywhere(opened, args.job)
        if parked is not None:
            shard, p = parked
            raise ReplayError(f"job {args.job!r} was refused: its record {p.source} is in the {shard} "
                              f"dead-letter log at offset {p.offset} ({p.reason}: {p.error[:300]})")
        raise ReplayError(f"unknown job {args.job!r}: no JobSubmitted for it in the global partition "
                          "nor in a cell partition")
    if args.json:
        _print_json(found)
    else:
        print("\n".join(describe(found)))
    return 0


async def cmd_explain(args: argparse.Namespace, opened: Opened, only: Shard | None) -> int:
    glob = (await opened.get(Shard.GLOBAL)).store
    with progress_bar("explain", await end_offset(glob, INPUTS)) as bar:
        found = await explain_fleet(opened, args.job, not args.no_why, bar, only_global=only is not None)
    if args.json:
        _print_json(found)
        return 0
    print(f"job {found['job_id']}: {len(found['steps'])} steps across the dispatcher and its cells")
    for step in found["steps"]:
        where = f"{step['log']}@{step['offset']}"
        print(f"  {where:<24} {log_time(step['time_ms'])}  {step['what']}  {step.get('detail', '')}".rstrip())
        why = step.get("why")
        if why and "node" in why:
            print(f"      why {why['node']}: rank {why['rank']} of {why['feasible_nodes']} feasible nodes "
                  f"({why['up_nodes_in_cell']} up in the cell) under policy {why['policy']}")
    return 0


# --- state-at ------------------------------------------------------------------------------------


async def cmd_state_at(args: argparse.Namespace, opened: Opened, only: Shard | None) -> int:
    point = parse_point(args.point)
    if only is None:
        out = await fleet_state_at(opened, point)
        _print_json(out) if args.json else _print_fleet(out)
        return 0
    source = await opened.get(only)
    offset = await resolve(source, point)
    state = await dispatcher_at(source.store, opened.topology, offset)
    out = {"shard": "global", "offset": offset, **dispatcher_tables(state)}
    if args.json:
        _print_json(out)
    else:
        title = f"dispatcher state at global inputs offset {offset}"
        _print_tables(title, out, ("cells", "jobs"), args.limit)
    return 0


def _print_fleet(out: dict[str, Any]) -> None:
    title = f"every shard at log time {log_time(out['time_ms'])}"
    _print_tables(title, out, ("shards",), 1 << 30)
    console().print("totals: " + ", ".join(f"{k} {v:,}" for k, v in out["totals"].items()))


def _print_tables(title: str, out: dict[str, Any], sections: tuple[str, ...], limit: int) -> None:
    screen = console()
    screen.print(title)
    print_sections(screen, out, sections, limit)


_ACROSS = {"verify": cmd_verify, "status": cmd_status, "explain": cmd_explain, "state-at": cmd_state_at}
