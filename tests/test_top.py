"""``fleetlog top``: the numbers the running service's API gives, per tenant, queue and cell; the
same frame folded from the logs once the service stopped; a live view on a real terminal that
refreshes, survives the service going away and ends on Ctrl-C with one line and exit code 130;
an unreachable service is one line and exit code 2."""

from __future__ import annotations

import asyncio
import fcntl
import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from rich.console import Console

from fleetlog.api.resources import CellItem, ModelAllocation, QueueItem, TenantItem
from fleetlog.cli import EXIT_INTERRUPTED, EXIT_USAGE, main
from fleetlog.display import duration
from fleetlog.events.model import TaskStarted
from fleetlog.reader import Reader
from fleetlog.top import Frame, fit, render
from tests.core.builders import job, node, quota
from tests.service.test_service import events_body, serving

ROOT = Path(__file__).resolve().parents[1]


def events() -> list[Any]:
    """Two cells (one with a node down), three tenants (t1 with a 4-GPU quota it borrows past
    from t2's in their cohort), a second queue, and jobs that wait for capacity."""
    fleet = [*(node(f"a{i}", gpus=8, model="A100", cell="c1") for i in range(3)),
             node("h1", gpus=8, model="H100", cell="c2"), node("h2", gpus=8, model="H100", cell="c2",
                                                               healthy=False)]
    work = [*(job(f"j{i}", tenant="t1", gpus=4) for i in range(3)), job("k0", tenant="t2", gpus=4),
            *(job(f"m{i}", tenant="t0", gpus=4) for i in range(2))]
    batch = [msgspec.structs.replace(job("b0", tenant="t0", tasks=2, gpus=8), queue="batch")]
    quotas = [quota("t1", 4, cohort="lab", borrow=8), quota("t2", 16, cohort="lab")]
    return [*fleet, *quotas, *work, *batch]


def gpus(milli: int) -> str:
    return f"{milli / 1000:g}"


def waited(ms: int | None) -> str:
    return "-" if ms is None else duration(ms)


def tenant_row(t: TenantItem) -> list[str]:
    nominal = "-" if t.nominal is None else gpus(t.nominal.gpu_milli)
    return [t.tenant, str(t.running), str(t.placed), waited(t.placed_longest_ms), str(t.pending),
            gpus(t.used.gpu_milli), nominal,
            gpus(t.borrowed.gpu_milli), f"{100 * t.dominant_share:.1f}%"]


def queue_row(q: QueueItem) -> list[str]:
    ranked = sorted(q.pending_by_reason.items(), key=lambda kv: (-kv[1], kv[0]))
    why = ", ".join(f"{r} {n}" for r, n in ranked)
    return [q.queue, str(q.pending), str(q.placed), waited(q.placed_longest_ms), str(q.running),
            gpus(q.pending_gpu_milli), *(why or "-").split()]


def cell_row(c: CellItem) -> list[str]:
    models = ", ".join(f"{m} {gpus(a.allocated_milli)}/{a.gpus}" for m, a in sorted(c.by_model.items()))
    percent = f"{100 * c.gpu_allocated_milli / (1000 * c.gpus):.0f}%"
    return [c.cell, str(c.nodes_up), str(c.nodes_down), f"{gpus(c.gpu_allocated_milli)}/{c.gpus}", percent,
            *models.split()]


def section(out: str, title: str) -> list[list[str]]:
    """The rows of one table of a frame (by its title, e.g. ``tenants``), each split in words."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{title} ("))
    rows = []
    for line in lines[start + 2:]:  # (past the title and the header)
        if not line.strip():
            break
        rows.append(line.split())
    return rows


async def top(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """``fleetlog top ARGV`` beside the in-process service (whose loop must go on answering):
    its frame, from the title on (the service logs to stdout too)."""
    capsys.readouterr()
    assert await asyncio.to_thread(main, ["top", *argv]) == 0
    out = capsys.readouterr().out
    return out[out.index("fleetlog top — "):]


async def test_the_frame_shows_what_the_api_gives_then_the_same_from_the_logs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "log"
    async with serving(log) as running:
        body = events()
        assert (await running.request("/v1/events", events_body(*body)))[0] == 200
        loop = running.service.loop
        assert loop is not None
        await running.until(lambda: loop.offset == len(body) and loop.committed == len(body))
        # t1's three jobs start; the others stay placed (a pod bound, not started): not "running"
        status, page = await running.request("/v1/jobs?tenant=t1")
        assert status == 200, page
        starts = [TaskStarted(job_id=j["job_id"], task_index=0, node=j["nodes"][0]) for j in page["items"]]
        assert len(starts) == 3
        assert (await running.request("/v1/events", events_body(*starts)))[0] == 200
        await running.until(lambda: loop.offset == len(body) + 3 and loop.committed == loop.offset)
        async with Reader(running.url) as api:
            tenants, queues, cells = await api.tenants(), await api.queues(), await api.cells()
        live = await top(capsys, "--url", running.url, "--once")
        announced = await top(capsys, "--log", str(log))  # not a terminal: one frame, as --once
    assert live.splitlines()[0].startswith(f"fleetlog top — {running.url} — ")
    assert sorted(section(live, "tenants")) == sorted(tenant_row(t) for t in tenants)
    assert sorted(section(live, "queues")) == sorted(queue_row(q) for q in queues)
    assert sorted(section(live, "cells")) == sorted(cell_row(c) for c in cells)
    # what the scenario holds, as the API gave it: t1 borrows past its quota, h2 is down, b0 waits
    assert {c.cell: (c.nodes_up, c.nodes_down, c.gpus) for c in cells} == {"c1": (3, 0, 24), "c2": (1, 1, 8)}
    assert {c.cell: c.by_model for c in cells} == {"c1": {"A100": ModelAllocation(24, 16_000)},
                                                    "c2": {"H100": ModelAllocation(8, 8_000)}}
    t1 = next(t for t in tenants if t.tenant == "t1")
    assert (t1.used.gpu_milli, t1.borrowed.gpu_milli, t1.nominal is not None) == (12_000, 8_000, True)
    assert {q.queue: (q.pending, q.placed, q.running) for q in queues} == {"default": (0, 3, 3),
                                                                           "batch": (1, 0, 0)}
    assert {t.tenant: (t.running, t.placed) for t in tenants} == {"t0": (0, 2), "t1": (3, 0), "t2": (0, 1)}
    t0 = next(t for t in tenants if t.tenant == "t0")  # (placed at log time 0 or later, not started since)
    assert t1.placed_longest_ms is None
    assert t0.placed_longest_ms is not None
    assert t0.placed_longest_ms >= 0
    line = "jobs 3 running, 3 placed, 1 pending · GPUs 24/32 allocated · nodes 4 up, 1 down"
    assert live.splitlines()[1] == line
    assert section(live, "tenants")[0][0] == "t1"  # the most GPUs first
    assert announced.splitlines()[0].startswith(f"fleetlog top — {running.url} — ")  # its service.json
    assert announced.splitlines()[1:] == live.splitlines()[1:]
    assert not (log / "service.json").exists()
    folded = await top(capsys, "--log", str(log))  # the service stopped: the logs, folded once
    assert folded.splitlines()[0].startswith(f"fleetlog top — the logs in {log} — ")
    assert folded.splitlines()[1:] == live.splitlines()[1:]


def test_an_unreachable_service_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for once in ([], ["--once"]):
        assert main(["top", "--url", "http://127.0.0.1:9", *once]) == EXIT_USAGE
        captured = capsys.readouterr()
        assert captured.out == ""
        err = captured.err
        assert err.startswith("fleetlog top: error: cannot read http://127.0.0.1:9/v1/"), err
        assert len(captured.err.splitlines()) == 1


def test_a_bad_interval_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for bad in ("0", "-1", "nan", "inf", "2s"):
        with pytest.raises(SystemExit) as exited:
            main(["top", "--interval", bad])
        assert exited.value.code == EXIT_USAGE
        err = capsys.readouterr().err
        assert err.startswith("fleetlog top: error: argument --interval: "), err
        assert len(err.splitlines()) == 1


# --- a frame on a small terminal -----------------------------------------------------------


def test_fit_shares_the_lines_and_gives_what_a_small_table_leaves_to_the_others() -> None:
    assert fit([3, 100, 2], 30) == [3, 25, 2]
    assert fit([100, 100, 100], 30) == [10, 10, 10]
    assert fit([100, 100, 100], 31) == [10, 10, 11]
    assert fit([0, 0, 0], 30) == [0, 0, 0]
    assert fit([5, 5, 5], 0) == [1, 1, 1]  # a terminal too small still shows a row of each


def test_a_frame_fits_the_height_it_is_given_and_says_what_is_left_out() -> None:
    tenants = [TenantItem(f"t{i:03d}", 1, i, *_usage(i)) for i in range(200)]
    queues = [QueueItem(f"q{i:03d}", i % 7, 1, 1000 * (i % 7), {"quota_exhausted": i % 7}) for i in range(50)]
    cells = [CellItem("c1", 4, 0, 32, 8000, 384_000, 1000, {"A100": ModelAllocation(32, 8000)})]
    frame = Frame("http://service", 1_767_225_640_000, tenants, queues, cells)
    screen = Console(width=160, record=True, color_system=None)
    screen.print(render(frame, height=40, note="every 2s, Ctrl-C to quit"))
    lines = screen.export_text().splitlines()
    assert len(lines) == 40  # the whole screen, not a line more
    assert lines[0] == "fleetlog top — http://service — 2026-01-01T00:00:40Z — every 2s, Ctrl-C to quit"
    tenant_rows = section("\n".join(lines), "tenants")
    assert tenant_rows[0][0] == "t199"  # the busiest first
    shown = len(tenant_rows) - 1  # (the last line says what did not fit)
    assert tenant_rows[-1] == ["…", f"{200 - shown}", "more", "tenants"]
    assert section("\n".join(lines), "queues")[-1][-2:] == ["more", "queues"]
    assert section("\n".join(lines), "cells") == [["c1", "4", "0", "8/32", "25%", "A100", "8/32"]]


def _usage(i: int) -> tuple[Any, ...]:
    from fleetlog.api.resources import Resources

    zero = Resources(0, 0, 0)
    return Resources(0, 0, 1000 * i), None, None, zero, "", 1000, i / 1000


# --- live, on a real terminal --------------------------------------------------------------


def totals(screen: str) -> str:
    """The jobs of the last frame drawn on ``screen`` (``""``: none yet)."""
    found = re.findall(r"jobs \d+ running, \d+ placed, \d+ pending", screen)
    return found[-1] if found else ""


class Terminal:
    """A child process whose stdout is a real terminal (a pty of ``rows`` x ``columns``); its
    stderr a pipe."""

    def __init__(self, argv: list[str], rows: int = 50, columns: int = 160) -> None:
        self.leader, follower = pty.openpty()
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
        os.set_blocking(self.leader, False)
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
        env |= {"PYTHONPATH": str(ROOT), "TERM": "xterm-256color"}
        self.proc = subprocess.Popen([sys.executable, "-m", "fleetlog.cli", *argv], stdin=subprocess.DEVNULL,
                                     stdout=follower, stderr=subprocess.PIPE, env=env)
        os.close(follower)
        self.screen = b""

    def read(self) -> str:
        try:
            while chunk := os.read(self.leader, 65536):
                self.screen += chunk
        except (BlockingIOError, OSError):  # nothing more now (EIO: the child closed it)
            pass
        return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", self.screen.decode(errors="replace"))

    async def until(self, seen: Callable[[str], bool], timeout_s: float = 120) -> str:
        for _ in range(int(timeout_s / 0.05)):
            text = self.read()
            if seen(text):
                return text
            assert self.proc.poll() is None, (text, self.proc.communicate())
            await asyncio.sleep(0.05)
        raise AssertionError(f"not seen in time: {self.read()[-2000:]}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate()
        os.close(self.leader)


async def test_live_it_refreshes_keeps_the_last_numbers_when_the_service_goes_and_ends_on_ctrl_c(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path / "log") as running:
        body = events()
        assert (await running.request("/v1/events", events_body(*body)))[0] == 200
        terminal = Terminal(["top", "--url", running.url, "--interval", "0.2"])
        try:
            await terminal.until(lambda text: totals(text) == "jobs 0 running, 6 placed, 1 pending")
            more = [job(f"late{i}", tenant="t2", gpus=8) for i in range(3)]
            assert (await running.request("/v1/events", events_body(*more)))[0] == 200  # a refresh shows them
            await terminal.until(lambda text: totals(text) not in ("", "jobs 0 running, 6 placed, 1 pending"))
            await running.stop()
            text = await terminal.until(lambda text: "refresh failed (cannot read" in text)
            assert "the numbers are those read at" in text
            start = len(terminal.screen)
            terminal.proc.send_signal(signal.SIGINT)
            _, err = await asyncio.to_thread(terminal.proc.communicate, timeout=60)
            assert terminal.proc.returncode == EXIT_INTERRUPTED
            assert err.decode() == "fleetlog top: interrupted\n"
            terminal.read()
            assert b"\x1b[?1049l" in terminal.screen[start:]  # the alternate screen was left
        finally:
            terminal.close()
