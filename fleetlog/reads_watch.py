"""``fleetlog jobs|nodes|queues|tenants|cells --watch``: the list, then every item that changes,
as ``kubectl get -w`` shows them.

It follows the running service's two logs (``GET /v1/watch`` on the inputs and on the decisions:
a placement is a decision, a task's start an input) and, after each burst of changes, reads the
list again with the same filters and prints the items that are new or differ from what it last
printed — one line each (``-o json``: one JSON object per line).  It needs the running service;
it stops on Ctrl-C.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from typing import Any, Final

from fleetlog.display import human_row
from fleetlog.reader import Reader, ReaderError

SETTLE_S: Final = 0.2
"""After a change, wait this long for the rest of its burst (a step's inputs, then its decisions)."""
KEYS: Final = ("job_id", "node", "tenant", "queue", "cell")
VOLATILE: Final = ("queue_position", "heard_ago_ms", "age_ms", "placed_longest_ms")
"""Fields that move for many items at once (a placement renumbers its queue's waiting jobs; any
input, a tick too, ages every node's ``heard_ago_ms``, every job's ``age_ms`` and every tenant's
and queue's ``placed_longest_ms``): an item whose only change is in them is
not printed again (a line shows them as they are then)."""


def key_of(item: Mapping[str, Any]) -> str:
    """An item's identity: its first name field (job_id, node, tenant, queue or cell)."""
    return next(str(item[k]) for k in KEYS if k in item)


def changed(seen: dict[str, Any], items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The items new or different since ``seen`` (which is updated), in list order."""
    out = []
    for item in items:
        key, steady = key_of(item), {k: v for k, v in item.items() if k not in VOLATILE}
        if seen.get(key) != steady:
            seen[key] = steady
            out.append(item)
    return out


def line(item: Mapping[str, Any], columns: list[str], widths: dict[str, int], as_json: bool) -> str:
    if as_json:
        return json.dumps(item)
    human = human_row({c: item.get(c) for c in columns})
    cells = zip(columns, human.values(), strict=True)
    return "  ".join(str(v).ljust(widths.get(c, 0)) for c, v in cells).rstrip()


async def follow(url: str, read: Callable[[], dict[str, Any]], first: dict[str, Any],
                 emit: Callable[[list[dict[str, Any]]], None]) -> None:
    """Emit what changes in ``read()``'s list after each burst of records in either log, for ever
    (``read`` runs in a thread: it is the blocking reader of the one-shot command)."""
    seen: dict[str, Any] = {}
    changed(seen, first["items"])
    poke = asyncio.Event()
    async with Reader(url) as api:
        async def watch(log: str) -> None:
            async for _ in api.watch(start="end", log=log):
                poke.set()

        watchers = [asyncio.ensure_future(watch(log)) for log in ("inputs", "decisions")]
        await asyncio.sleep(SETTLE_S)
        poke.set()  # read once more when the watches are on: what changed before they began
        try:
            while True:
                waiter = asyncio.ensure_future(poke.wait())
                await asyncio.wait([waiter, *watchers], return_when=asyncio.FIRST_COMPLETED)
                for task in watchers:
                    if task.done():  # a refusal (the service stopped leading…): say so and stop
                        waiter.cancel()
                        task.result()
                await asyncio.sleep(SETTLE_S)
                poke.clear()
                found = await asyncio.to_thread(read)
                emit(changed(seen, found["items"]))
        finally:
            for task in watchers:
                task.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)


__all__ = ["ReaderError", "changed", "follow", "key_of", "line"]
