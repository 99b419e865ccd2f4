"""``fleetlog top``: tenants, queues and cells on one screen, refreshed from the service's API.

A frame is the three lists the API answers (``/v1/tenants``, ``/v1/queues``, ``/v1/cells``), read
together and shown as three tables: per tenant the GPUs it uses against its nominal quota, what it
borrows, its jobs running, placed and pending and its DRF share; per queue its jobs pending, placed
(not every task started yet: ``placed for`` is how long the longest-placed has waited to start) and
running and why jobs wait; per
cell the GPU allocation by model and the nodes up and down.  Rows are ranked (busiest first, then
by name: a total order, so a frame never reshuffles equal rows); on a terminal each table gets a
share of its height and says how many rows did not fit.

The live view (:func:`watch`) redraws every ``interval`` seconds on the terminal's alternate
screen; a refresh that fails keeps the last numbers on screen and says why, so a service that
restarts is seen again without restarting ``top``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

import msgspec
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from fleetlog.api.resources import CellItem, CellList, QueueItem, QueueList, TenantItem, TenantList
from fleetlog.display import duration, log_time
from fleetlog.reader import Reader, ReaderError

LISTS: Final = ("/v1/tenants", "/v1/queues", "/v1/cells")
"""The API's lists a frame is made of, in the order the tables show them."""
FRAME_LINES: Final = 2
"""Lines of a frame besides its tables: the title and the totals (and the error of a failed refresh)."""
TABLE_LINES: Final = 3
"""Lines of one table besides its rows: the blank line before it, its title and header (and the
"more" line of a table cut short)."""


class Frame(msgspec.Struct, frozen=True):
    """What one look at the scheduler found, and where and when it looked."""

    source: str
    """The service's address, or the logs a frame was folded from."""
    at_ms: int
    """When it was read (the reader's clock, epoch milliseconds)."""
    tenants: list[TenantItem]
    queues: list[QueueItem]
    cells: list[CellItem]


async def read_frame(api: Reader) -> Frame:
    """The three lists from the service, read at once."""
    tenants, queues, cells = await asyncio.gather(api.tenants(), api.queues(), api.cells())
    return Frame(api.url, int(time.time() * 1000), tenants, queues, cells)


def frame_of(source: str, answers: dict[str, Any]) -> Frame:
    """A frame from the API's answers as JSON objects (by path: what the logs give when folded)."""
    return Frame(
        source, int(time.time() * 1000),
        msgspec.convert(answers["/v1/tenants"], TenantList).items,
        msgspec.convert(answers["/v1/queues"], QueueList).items,
        msgspec.convert(answers["/v1/cells"], CellList).items,
    )


# --- numbers as text ------------------------------------------------------------------------


def gpus(milli: int) -> str:
    """GPU thousandths as GPUs: ``16``, ``12.5``, ``0.25``, ``1,024``."""
    return f"{milli / 1000:,.3f}".rstrip("0").rstrip(".")


def share(fraction: float) -> str:
    """A DRF share (a fraction) as a percentage: ``37.5%``."""
    return f"{fraction * 100:.1f}%"


def reasons(by_reason: dict[str, int]) -> str:
    """Pending jobs by reason, most first: ``quota 3, no_fit 1`` (``-`` for none)."""
    ranked = sorted(by_reason.items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{reason} {count:,}" for reason, count in ranked) or "-"


def waited(ms: int | None) -> str:
    """How long the longest-placed job has waited to start (``-``: none placed and not started)."""
    return "-" if ms is None else duration(ms)


def by_model(cell: CellItem) -> str:
    """GPUs allocated of the up GPUs, per model: ``A100 12/16, H100 0.5/8``."""
    parts = [f"{model} {gpus(m.allocated_milli)}/{m.gpus:,}" for model, m in sorted(cell.by_model.items())]
    return ", ".join(parts) or "-"


# --- tables ---------------------------------------------------------------------------------


def _table(title: str, columns: Sequence[str]) -> Table:
    table = Table(title=title, title_justify="left", box=None, pad_edge=False, header_style="bold")
    for i, column in enumerate(columns):
        table.add_column(column, justify="left" if i == 0 or column.startswith(("WHY", "BY")) else "right")
    return table


def tenant_table(items: Sequence[TenantItem], rows: int | None) -> Table:
    ranked = sorted(items, key=lambda t: (-t.used.gpu_milli, -t.pending, t.tenant))
    table = _table(f"tenants ({len(items):,})",
                   ("TENANT", "RUNNING", "PLACED", "PLACED FOR", "PENDING", "GPUS USED", "NOMINAL",
                    "BORROWED", "DRF SHARE"))
    for t in ranked[:rows]:
        nominal = t.nominal.gpu_milli if t.nominal is not None else None
        over = nominal is not None and t.used.gpu_milli > nominal
        table.add_row(
            t.tenant, f"{t.running:,}", f"{t.placed:,}", waited(t.placed_longest_ms), f"{t.pending:,}",
            Text(gpus(t.used.gpu_milli), style="yellow" if over else ""),
            "-" if nominal is None else gpus(nominal),
            Text(gpus(t.borrowed.gpu_milli), style="yellow" if t.borrowed.gpu_milli else ""),
            share(t.dominant_share),
        )
    return _more(table, len(ranked), rows, "tenants")


def queue_table(items: Sequence[QueueItem], rows: int | None) -> Table:
    ranked = sorted(items, key=lambda q: (-q.pending, -q.placed - q.running, q.queue))
    table = _table(f"queues ({len(items):,})",
                   ("QUEUE", "PENDING", "PLACED", "PLACED FOR", "RUNNING", "PENDING GPUS", "WHY PENDING"))
    for q in ranked[:rows]:
        table.add_row(q.queue, f"{q.pending:,}", f"{q.placed:,}", waited(q.placed_longest_ms),
                      f"{q.running:,}", gpus(q.pending_gpu_milli), reasons(q.pending_by_reason))
    return _more(table, len(ranked), rows, "queues")


def cell_table(items: Sequence[CellItem], rows: int | None) -> Table:
    ranked = sorted(items, key=lambda c: c.cell)
    table = _table(f"cells ({len(items):,})",
                   ("CELL", "NODES UP", "DOWN", "GPUS ALLOCATED", "ALLOCATED", "BY MODEL"))
    for c in ranked[:rows]:
        used = c.gpu_allocated_milli / (c.gpus * 1000) if c.gpus else 0.0
        table.add_row(
            c.cell, f"{c.nodes_up:,}", Text(f"{c.nodes_down:,}", style="red" if c.nodes_down else ""),
            f"{gpus(c.gpu_allocated_milli)}/{c.gpus:,}", f"{used * 100:.0f}%", by_model(c),
        )
    return _more(table, len(ranked), rows, "cells")


def _more(table: Table, total: int, rows: int | None, name: str) -> Table:
    if rows is not None and total > rows:
        table.caption, table.caption_justify = f"… {total - rows:,} more {name}", "left"
    return table


def fit(sizes: Sequence[int], budget: int) -> list[int]:
    """Rows for tables of ``sizes`` rows in ``budget`` lines: each an equal share (at least one
    row), what a small table leaves over going to the larger ones."""
    rows = [0] * len(sizes)
    left, open_ = max(budget, len(sizes)), sorted(range(len(sizes)), key=lambda i: (sizes[i], i))
    while open_:
        each = max(1, left // len(open_))
        i = open_.pop(0)
        rows[i] = min(sizes[i], each)
        left -= rows[i]
    return rows


# --- frames ---------------------------------------------------------------------------------


def render(frame: Frame, height: int | None = None, note: str = "", error: str = "") -> RenderableType:
    """``frame`` as a title, its totals and the three tables; ``height``: the lines to fit in
    (``None``: every row); ``note``: how it refreshes; ``error``: why the last refresh failed."""
    sizes = (len(frame.tenants), len(frame.queues), len(frame.cells))
    rows: Sequence[int | None] = [None] * len(LISTS) if height is None else _rows(sizes, height, bool(error))
    title = Text.assemble(("fleetlog top", "bold"), f" — {frame.source} — {log_time(frame.at_ms)}",
                          f" — {note}" if note else "")
    parts: list[RenderableType] = [title, _totals(frame)]
    if error:
        parts.append(Text(f"refresh failed ({error}); the numbers are those read at "
                          f"{log_time(frame.at_ms)}", style="bold red"))
    parts += ["", tenant_table(frame.tenants, rows[0]), "", queue_table(frame.queues, rows[1]), "",
              cell_table(frame.cells, rows[2])]
    return Group(*parts)


def _rows(sizes: Sequence[int], height: int, error: bool) -> list[int]:
    """Rows of each table in ``height`` lines, a table cut short taking one for its "more" line."""
    budget, cut = height - FRAME_LINES - int(error) - TABLE_LINES * len(sizes), 0
    while True:
        rows = fit(sizes, budget - cut)
        now = sum(r < size for r, size in zip(rows, sizes, strict=True))
        if now <= cut:
            return rows
        cut = now


def _totals(frame: Frame) -> Text:
    running, placed = sum(t.running for t in frame.tenants), sum(t.placed for t in frame.tenants)
    pending = sum(t.pending for t in frame.tenants)
    allocated = sum(c.gpu_allocated_milli for c in frame.cells)
    total = sum(c.gpus for c in frame.cells)
    up, down = sum(c.nodes_up for c in frame.cells), sum(c.nodes_down for c in frame.cells)
    return Text(f"jobs {running:,} running, {placed:,} placed, {pending:,} pending · GPUs "
                f"{gpus(allocated)}/{total:,} allocated · nodes {up:,} up, {down:,} down")


def show(screen: Console, frame: Frame, note: str = "") -> None:
    """One frame, every row (``--once``, or not on a terminal)."""
    screen.print(render(frame, note=note))


async def watch(api: Reader, first: Frame, interval_s: float, screen: Console) -> None:
    """Redraw every ``interval_s`` seconds until cancelled (Ctrl-C): the live view."""
    note = f"every {interval_s:g}s, Ctrl-C to quit"
    frame, error = first, ""

    def draw() -> RenderableType:
        return render(frame, screen.size.height, note, error)

    with Live(console=screen, screen=True, auto_refresh=False, redirect_stderr=False,
              get_renderable=draw) as live:
        live.refresh()
        while True:
            await asyncio.sleep(interval_s)
            frame, error = await _refreshed(api, frame)
            live.refresh()


async def _refreshed(api: Reader, frame: Frame) -> tuple[Frame, str]:
    """The next frame, or the last one and why it could not be read."""
    try:
        return await read_frame(api), ""
    except ReaderError as exc:
        return frame, str(exc)


def run_live(url: str, interval_s: float, screen: Console, failed: Callable[[str], Exception]) -> None:
    """Read a first frame from ``url`` (unreachable: ``failed(why)`` is raised, before the screen
    is taken), then keep the live view until Ctrl-C.  One task does it all, so that whether
    Ctrl-C lands in it or in the event loop, the screen is given back and the connection closed
    before :func:`fleetlog.cli.main` says "interrupted" (``asyncio.run`` cancels a task it
    leaves)."""

    async def live() -> None:
        async with Reader(url, timeout_s=max(5.0, interval_s)) as api:
            try:
                first = await read_frame(api)
            except ReaderError as exc:
                raise failed(str(exc)) from None
            await watch(api, first, interval_s, screen)

    asyncio.run(live())


def run_once(url: str, screen: Console, failed: Callable[[str], Exception]) -> None:
    """One frame from ``url``, every row."""

    async def once() -> Frame:
        async with Reader(url) as api:
            return await read_frame(api)

    try:
        frame = asyncio.run(once())
    except ReaderError as exc:
        raise failed(str(exc)) from None
    show(screen, frame)
