"""``fleetlog simulate --cells N --shards K``: the global layer in one process, no server, no log.

The dispatcher and K cell shards (``fleetlog.sharded``, the pure core joined in memory as the
partitions would join them) under a simulated world (``fleetlog.sharded.world``): N cells of
8-GPU nodes, jobs of a few tenants arriving over virtual time, tasks that run and end. Prints
a summary per cell and fleet-wide (placements, GPU allocation, returns, per-tenant share), or
one JSON object with ``--json``.
"""

from __future__ import annotations

import json
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from fleetlog.display import console
from fleetlog.sharded.world import World, WorldSpec


class CellsUsageError(ValueError):
    """A bad combination of ``--cells`` arguments (the command exits 2 with its one line)."""


def run_cells(spec: WorldSpec, as_json: bool) -> dict[str, Any]:
    """Run the world of ``spec`` (a progress bar on a terminal unless ``as_json``) and print it."""
    wrong = spec.check()
    if wrong:
        raise CellsUsageError(wrong)
    world = World(spec)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("jobs ended"),
               TimeElapsedColumn())
    err = console(stderr=True)
    with Progress(*columns, console=err, transient=True, disable=as_json or not err.is_terminal) as bar:
        task = bar.add_task(f"{spec.cells} cells, {spec.shards} shards", total=spec.jobs)
        shown = [-1]

        def progress(done: int, total: int) -> None:
            if done - shown[0] >= max(1, total // 200) or done == total:
                shown[0] = done
                bar.update(task, completed=done, total=total)

        result = world.run(progress)
    if as_json:
        print(json.dumps(result))
    else:
        print_cells(result)
    return result


def print_cells(result: dict[str, Any]) -> None:
    """One row per cell, then the fleet."""
    tenants = sorted(result["tenant_share_pct"])
    table = Table(
        title=f"fleetlog simulate — {result['cells']} cells over {result['shards']} shards "
        "(dispatcher + cell shards in one process, no log)",
        caption=f"{result['jobs']:,} jobs, {result['nodes_per_cell']} nodes of 8 GPUs per cell, seed "
        f"{result['seed']}; {result['virtual_s']:,} s virtual; digest {result['digest'][:16]}",
    )
    for name in ("cell", "shard", "placed", "returned", "GPU alloc %", *[f"{t} %" for t in tenants]):
        table.add_column(name, justify="left" if name == "cell" else "right")
    for c in result["per_cell"]:
        shares = [f"{c['tenant_share_pct'].get(t, 0.0):.1f}" for t in tenants]
        table.add_row(c["cell"], str(c["shard"]), f"{c['placed']:,}", f"{c['returned']:,}",
                      f"{c['gpu_allocation_pct']:.1f}", *shares)
    shares = [f"{result['tenant_share_pct'][t]:.1f}" for t in tenants]
    table.add_row("fleet", "", f"{result['placed']:,}", f"{result['returned']:,}",
                  f"{result['gpu_allocation_pct']:.1f}", *shares, style="bold")
    console().print(table)
    print(f"dispatched {result['dispatched']:,} times; {result['finished']:,} jobs ended, "
          f"{result['waiting']:,} waiting in the dispatcher, {result['refused']:,} inputs refused")
