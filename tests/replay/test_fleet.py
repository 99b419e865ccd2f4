"""The replay tools across the shards of a deployment with a ``[cells]`` map (docs/replay.md,
"Shards"): the logs are written by the real loops — the dispatcher's and two cell shards' — over
the real file log in one process, and read back by the real CLI: ``replay verify`` checks the
dispatcher, every cell partition and their outputs and names the shard that diverged; ``status``
and ``explain`` follow a job handed back by one cell and placed in the other; ``state-at`` works
per shard and fleet-wide."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import msgspec
import pytest

from fleetlog.cli import main
from fleetlog.core import dispatch_log
from fleetlog.core.cellshard import SummaryRule
from fleetlog.core.dispatch import CellMap
from fleetlog.core.policy import Policy
from fleetlog.core.state import CoreConfig
from fleetlog.events import encode, envelope
from fleetlog.events.codec import CONTENT_TYPE_HEADER, MSGPACK
from fleetlog.events.model import CellSummary, DecisionBatch, Event, JobPlaced, TaskFinished, TaskStarted
from fleetlog.log.base import INPUTS, LogStore, Message, Shard
from fleetlog.log.file import FileLogStore
from fleetlog.service import dispatcher as service_dispatcher
from fleetlog.service.cellshard import CellShardLoop
from fleetlog.service.dispatcher import DispatcherLoop
from fleetlog.service.loop import LoopConfig
from tests.core.builders import job, node

MAP = CellMap((("a", 0), ("b", 1)))
HOLD_MS = 10_000
START = 1_767_225_600_000  # 2026-01-01T00:00:00Z
CONFIG = """[log]
dir = "{dir}"
[service]
cell_hold_ms = {hold}
summary_every_ms = 5000
[cells]
a = 0
b = 1
"""


class Clock:
    def __init__(self) -> None:
        self.ms = START

    def __call__(self) -> int:
        return self.ms


def msg(event: Event) -> Message:
    return Message(encode(envelope(event, "test")), headers=((CONTENT_TYPE_HEADER, MSGPACK),))


def cell_nodes(cell: str) -> list[Event]:
    """Cell a: two 8-GPU nodes on two racks (a rack gang of 2 x 8 GPUs never fits); cell b: two on
    one rack (it does)."""
    racks = ("r0", "r1") if cell == "a" else ("r0", "r0")
    return [node(f"{cell}-n{i}", cell=cell, rack=racks[i]) for i in range(2)]


class Deployment:
    """The global partition and two cell partitions over one file log, and their loops."""

    def __init__(self, directory: Path) -> None:
        self.directory, self.clock = directory, Clock()
        self.root = FileLogStore(directory, shard=Shard.GLOBAL, clock=self.clock, fsync="never")
        self.cells: dict[int, LogStore] = {p: self.root.for_shard(Shard.cell(p)) for p in (0, 1)}

    async def run(self) -> None:
        for store in self.cells.values():
            await store.open()
        await self.root.open()
        try:
            await self._script()
        finally:
            await self.root.close()
            for store in self.cells.values():
                await store.close()

    async def _script(self) -> None:
        core = CoreConfig(hold_ms=HOLD_MS)
        rule = SummaryRule(every_ms=5000)
        loops = [CellShardLoop(self.cells[p], Policy(), p, MAP, LoopConfig(), core, rule) for p in (0, 1)]
        dispatcher = DispatcherLoop(self.root, MAP)
        await dispatcher.recover()
        for loop in loops:
            await loop.recover()

        async def beat(at_s: int, *extra: tuple[int, Event]) -> None:
            self.clock.ms = START + at_s * 1000
            for p, cell in ((0, "a"), (1, "b")):
                more = [e for q, e in extra if q == p]
                await self.cells[p].log(INPUTS).append([msg(e) for e in (*cell_nodes(cell), *more)])
            for loop in loops:
                await loop.step()
            await dispatcher.step()

        await beat(0)  # both cells summarise; the dispatcher has nothing to do
        self.clock.ms = START + 1000
        await self.root.log(INPUTS).append([msg(job("gang", tasks=2, gpus=8, topology="rack")),
                                            msg(job("small", gpus=1, cells=("a",))),
                                            msg(job("nowhere", cells=("zz",)))])
        await dispatcher.step()  # the gang to a (a tie: the smaller id), small to a
        await beat(2)  # a cannot place the gang (it waits), places small
        await beat(2 + HOLD_MS // 1000)  # a hands the gang back; the dispatcher sends it to b (attempt 2)
        await beat(13)  # b places it
        await beat(14, (1, TaskStarted(job_id="gang", task_index=0, node="b-n0")),
                   (0, TaskStarted(job_id="small", task_index=0, node="a-n0")))
        await beat(20, (0, TaskFinished(job_id="small", task_index=0, exit_code=0)))


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The clean sharded log (written once; the tampering tests write their own)."""
    directory = tmp_path_factory.mktemp("fleet") / "log"
    asyncio.run(Deployment(directory).run())
    return directory


def config_for(directory: Path, tmp: Path) -> str:
    path = tmp / "fleetlog.toml"
    path.write_text(CONFIG.format(dir=directory, hold=HOLD_MS))
    return str(path)


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


# --- verify --------------------------------------------------------------------------------------


def test_verify_passes_on_a_clean_sharded_log(recorded: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    config = config_for(recorded, tmp_path)
    code, out, _ = cli(capsys, "replay", "verify", "--config", config, "--json")
    assert code == 0, out
    report = json.loads(out)
    assert report["ok"]
    assert report["diverged"] is None
    assert not report["nothing_to_verify"]
    by = {r["shard"]: r for r in report["shards"]}
    assert list(by) == ["global", "cells-0", "cells-1"]
    assert by["global"]["steps"] >= 2  # the first dispatch and the re-dispatch
    assert by["cells-1"]["batches"] >= 2
    assert by["cells-0"]["batches"] >= 1
    for p in ("cells-0", "cells-1"):
        assert by[p]["outputs"]["checked"]
        assert by[p]["outputs"]["ok"]
        assert by[p]["outputs"]["written"] >= 1
    assert any(r["outputs"]["written"] > 1 for r in report["shards"][1:])  # a summary and the return
    code, text, _ = cli(capsys, "replay", "verify", "--config", config)
    assert code == 0
    assert text.splitlines()[-1] == "OK: 3 shards replayed bit-exactly"
    assert text.startswith("global     OK")
    code, text, _ = cli(capsys, "replay", "verify", "--config", config, "--shard", "cells-1", "--json")
    assert code == 0
    assert [r["shard"] for r in json.loads(text)["shards"]] == ["cells-1"]


def record_with(directory: Path, monkeypatch: pytest.MonkeyPatch, target: object, name: str,
                wrap: object) -> Path:
    """The scenario recorded with ``target.name`` replaced by ``wrap(original)`` (a loop that
    writes something its log does not give)."""
    monkeypatch.setattr(target, name, wrap(getattr(target, name)))  # type: ignore[operator]
    asyncio.run(Deployment(directory).run())
    monkeypatch.undo()
    return directory


def test_verify_names_the_cell_partition_whose_decisions_changed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def wrap(original):  # type: ignore[no-untyped-def]
        def batch(self: CellShardLoop, decisions: list[object]) -> DecisionBatch:
            found = original(self, decisions)
            placed = any(isinstance(d, JobPlaced) and d.job_id == "gang" for d in decisions)
            if self.partition == 1 and placed:
                return msgspec.structs.replace(found, digest="0" * len(found.digest))  # re-encoded
            return found
        return batch

    directory = record_with(tmp_path / "log", monkeypatch, CellShardLoop, "batch", wrap)
    code, out, _ = cli(capsys, "replay", "verify", "--config", config_for(directory, tmp_path), "--json")
    report = json.loads(out)
    assert code == 1
    assert not report["ok"]
    assert report["diverged"] == "cells-1"
    by = {r["shard"]: r for r in report["shards"]}
    assert by["global"]["ok"]
    assert by["cells-0"]["ok"]
    assert by["cells-1"]["divergence"]["what"] == "state digest"
    code, text, _ = cli(capsys, "replay", "verify", "--config", config_for(directory, tmp_path))
    assert code == 1
    assert text.splitlines()[-1] == "DIVERGED: cells-1"
    assert "cells-1    DIVERGED" in text
    assert "state digest" in text


def test_verify_names_the_global_partition_when_a_step_record_is_tampered(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def wrap(original):  # type: ignore[no-untyped-def]
        def record_of(*args: object) -> dispatch_log.StepRecord:
            found: dispatch_log.StepRecord = original(*args)
            moved = tuple(msgspec.structs.replace(s, attempt=s.attempt + 7) for s in found.dispatched
                          if s.job_id == "gang" and s.cell == "b")
            return msgspec.structs.replace(found, dispatched=moved) if moved else found
        return record_of

    directory = record_with(tmp_path / "log", monkeypatch, service_dispatcher, "record_of", wrap)
    code, out, _ = cli(capsys, "replay", "verify", "--config", config_for(directory, tmp_path), "--json")
    report = json.loads(out)
    assert code == 1
    assert report["diverged"] == "global"
    glob = report["shards"][0]
    assert glob["divergence"]["what"].startswith("dispatched differ at entry 0")
    assert "attempt=9" in glob["divergence"]["what"]


def test_verify_names_an_output_the_cell_log_does_not_give(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    def wrap(original):  # type: ignore[no-untyped-def]
        def global_messages(self: CellShardLoop, out: list[object]) -> list[Message]:
            altered = [msgspec.structs.replace(e, pending=e.pending + 5)
                       if isinstance(e, CellSummary) and self.partition == 0 and e.pending else e
                       for e in out]
            return original(self, altered)  # type: ignore[no-any-return]
        return global_messages

    directory = record_with(tmp_path / "log", monkeypatch, CellShardLoop, "global_messages", wrap)
    code, out, _ = cli(capsys, "replay", "verify", "--config", config_for(directory, tmp_path), "--json")
    report = json.loads(out)
    assert code == 1
    assert report["diverged"] == "cells-0"
    cell = report["shards"][1]
    assert cell["divergence"] is None  # its decisions replay: what it wrote to the global partition does not
    outputs = cell["outputs"]
    assert not outputs["ok"]
    assert outputs["first_difference"] is not None
    assert "pending=6" in outputs["recorded"]
    assert "pending=1" in outputs["replayed"]
    code, text, _ = cli(capsys, "replay", "verify", "--config", config_for(directory, tmp_path))
    assert "outputs differ at output #" in text
    assert text.splitlines()[-1] == "DIVERGED: cells-0"


# --- status and explain --------------------------------------------------------------------------


def test_status_finds_the_job_in_the_cell_that_placed_it_after_another_returned_it(
        recorded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = config_for(recorded, tmp_path)
    code, out, _ = cli(capsys, "status", "gang", "--config", config, "--json")
    assert code == 0
    found = json.loads(out)
    held = (found["dispatcher"], found["held_by"], found["shard"], found["attempt"])
    assert held == ("held", "b", "cells-1", 2)
    assert found["state"] == "placed"
    assert {t["node"] for t in found["task_nodes"]} == {"b-n0", "b-n1"}
    assert [(d["dispatched"], d["attempt"]) for d in found["dispatches"]] == [("a", 1), ("b", 2)]
    assert [(r["returned"], r["attempt"], r["reason"]) for r in found["returns"]] == [("a", 1, "never_fits")]
    assert found["submitted_at_ms"] == START + 1000
    code, text, _ = cli(capsys, "status", "gang", "--config", config)
    assert re.search(r"^held by +b$", text, re.M)
    assert re.search(r"^shard +cells-1$", text, re.M)
    assert re.search(r"^returned a +attempt 1, reason never_fits", text, re.M)
    # a job the cell placed at once; an unknown one is one line and exit code 2
    code, out, _ = cli(capsys, "status", "small", "--config", config, "--json")
    small = json.loads(out)
    assert (small["held_by"], small["state"], small["returns"]) == ("a", "succeeded", [])
    assert (small["ended_at_ms"], small["exit_code"], small["elapsed_ms"]) == (START + 20_000, 0, 7000)
    code, out, _ = cli(capsys, "status", "nowhere", "--config", config, "--json")
    nowhere = json.loads(out)
    assert (nowhere["dispatcher"], nowhere["state"], nowhere["pending_reason"]) == (
        "pending", "waiting", "no_allowed_cell_in_map")
    assert "held_by" not in nowhere
    assert nowhere["dispatches"] == []
    code, _, err = cli(capsys, "status", "nobody", "--config", config)
    assert code == 2
    assert "unknown job 'nobody'" in err


def test_explain_tells_the_story_across_the_dispatcher_and_both_cells(
        recorded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = config_for(recorded, tmp_path)
    code, out, _ = cli(capsys, "replay", "explain", "gang", "--config", config, "--json")
    assert code == 0
    steps = json.loads(out)["steps"]
    story = [(s["log"], s["what"]) for s in steps]
    assert story == [
        ("global/inputs", "submitted"),
        ("global/decisions", "dispatched to cell a"),
        ("cells-0/inputs", "dispatched here"),
        ("cells-0/decisions", "pending: never_fits"),
        ("global/inputs", "returned by cell a"),
        ("global/decisions", "dispatched to cell b"),
        ("cells-1/inputs", "dispatched here"),
        ("cells-1/decisions", "placed"),
        ("cells-1/inputs", "task started"),
    ]
    times = [s["time_ms"] for s in steps]
    assert times == sorted(times)
    first, second = steps[1], steps[5]
    assert "attempt 1" in first["detail"]
    tie = "(a: tenant's share 0.0%, room 2 (2 left); b: tenant's share 0.0%, room 2 (2 left))"
    assert tie in first["detail"]
    assert "attempt 2" in second["detail"]
    assert "not asked again until a newer summary: a" in second["detail"]
    assert steps[4]["detail"].startswith("attempt 1: never_fits")
    assert "b-n0" in steps[7]["detail"]
    assert steps[7]["why"]["node"] == "b-n0"
    code, text, _ = cli(capsys, "replay", "explain", "gang", "--config", config)
    assert text.splitlines()[0] == "job gang: 9 steps across the dispatcher and its cells"
    assert re.search(r"global/decisions@\d+ +\S+ +dispatched to cell b +attempt 2", text)
    # one shard: the cell partition alone, as the single shard's explain
    code, out, _ = cli(capsys, "replay", "explain", "gang", "--config", config, "--shard", "cells-1",
                       "--json")
    assert [s["what"] for s in json.loads(out)["steps"]] == ["dispatched here", "placed", "task started"]
    code, out, _ = cli(capsys, "replay", "explain", "gang", "--config", config, "--shard", "global", "--json")
    assert all(s["log"].startswith("global/") for s in json.loads(out)["steps"])


# --- state-at --------------------------------------------------------------------------------------


def test_state_at_per_shard_and_fleet_wide(recorded: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    config = config_for(recorded, tmp_path)
    code, out, _ = cli(capsys, "replay", "state-at", "2026-01-01T00:00:05Z", "--config", config, "--json")
    assert code == 0
    fleet = json.loads(out)
    rows = {r["shard"]: r for r in fleet["shards"]}
    assert list(rows) == ["global", "cells-0", "cells-1"]
    assert (rows["global"]["held"], rows["global"]["waiting"], rows["global"]["jobs_known"]) == (1, 2, 3)
    assert (rows["cells-0"]["pending"], rows["cells-0"]["running"], rows["cells-0"]["nodes_up"]) == (1, 0, 2)
    assert (rows["cells-1"]["pending"], rows["cells-1"]["running"]) == (0, 0)
    assert fleet["totals"]["nodes_up"] == 4
    code, out, _ = cli(capsys, "replay", "state-at", "2026-01-01T00:00:15Z", "--config", config, "--json")
    later = {r["shard"]: r for r in json.loads(out)["shards"]}
    assert later["cells-1"]["running"] == 1
    assert later["cells-0"]["running"] == 1
    code, out, _ = cli(capsys, "replay", "state-at", "2026-01-01T00:00:15Z", "--config", config,
                       "--shard", "global", "--json")
    glob = json.loads(out)
    jobs = {j["job_id"]: j for j in glob["jobs"]}
    assert (jobs["gang"]["cell"], jobs["gang"]["attempt"], jobs["gang"]["returned_by"]) == ("b", 2, ["a"])
    assert [(c["cell"], c["free_gpus"]) for c in glob["cells"]] == [("a", 15), ("b", 0)]
    code, out, _ = cli(capsys, "replay", "state-at", "2026-01-01T00:00:15Z", "--config", config,
                       "--shard", "cells-1", "--json", "--show", "jobs")
    assert [j["job_id"] for j in json.loads(out)["jobs"]] == ["gang"]
    code, _, err = cli(capsys, "replay", "state-at", "3", "--config", config)
    assert code == 2
    assert "a log time for the fleet-wide state" in err
    code, text, _ = cli(capsys, "replay", "state-at", "2026-01-01T00:00:15Z", "--config", config)
    assert code == 0
    assert "every shard at log time" in text
    assert "cells-1" in text


def test_shard_choices_are_checked(recorded: Path, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    config = config_for(recorded, tmp_path)
    code, _, err = cli(capsys, "replay", "verify", "--config", config, "--shard", "cells-7")
    assert code == 2
    assert "choose one of global, cells-0, cells-1" in err
    code, _, err = cli(capsys, "replay", "timeline", "--out", str(tmp_path / "t.json"), "--config", config)
    assert code == 2
    assert "--shard global|cells-0|cells-1" in err
    code, _, err = cli(capsys, "replay", "report", "--out", str(tmp_path / "r"), "--config", config,
                       "--shard", "global")
    assert code == 2
    assert "no placements" in err
    code, out, _ = cli(capsys, "replay", "dump", "--config", config, "--shard", "cells-0", "--start", "2",
                       "--stop", "3")
    assert json.loads(out)["event"]["type"] == "JobDispatched"
    # without a map, --shard is refused (the single shard's log is one shard)
    code, _, err = cli(capsys, "replay", "verify", "--log", str(recorded / "cells-0"), "--shard", "global")
    assert code == 2
    assert "no [cells] map" in err


def test_a_deployment_that_decided_nothing_yet_has_nothing_to_verify(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    async def heartbeats_only() -> None:
        root = FileLogStore(tmp_path / "log", shard=Shard.GLOBAL, fsync="never")
        cells = [root.for_shard(Shard.cell(p)) for p in (0, 1)]
        for store in (*cells, root):
            await store.open()
        for p, store in enumerate(cells):
            await store.log(INPUTS).append([msg(e) for e in cell_nodes("ab"[p])])
        for store in (root, *cells):
            await store.close()

    asyncio.run(heartbeats_only())
    code, out, _ = cli(capsys, "replay", "verify", "--config", config_for(tmp_path / "log", tmp_path))
    assert code == 3
    assert out.splitlines()[-1].startswith("NOTHING TO VERIFY")


# --- Kafka -----------------------------------------------------------------------------------------


@pytest.mark.kafka
def test_the_tools_read_every_shard_on_kafka(kafka_bootstrap: str, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """The same loops over a real broker (log time is the broker's): the tools find the global
    topics and each cell's partition of the cells topics, verify all three and find the job."""
    import uuid

    from fleetlog.log.kafka import KafkaConfig, KafkaLogStore

    prefix = f"tf-{uuid.uuid4().hex[:8]}"
    kafka = KafkaConfig(bootstrap_servers=kafka_bootstrap, topic_prefix=prefix, shards=2)

    async def run() -> None:
        stores = {s: KafkaLogStore(kafka, s) for s in (Shard.cell(0), Shard.cell(1), Shard.GLOBAL)}
        for store in stores.values():
            await store.open()
        core, rule = CoreConfig(hold_ms=HOLD_MS), SummaryRule(every_ms=5000)
        loops = [CellShardLoop(stores[Shard.cell(p)], Policy(), p, MAP, LoopConfig(), core, rule)
                 for p in (0, 1)]
        dispatcher = DispatcherLoop(stores[Shard.GLOBAL], MAP)
        try:
            await dispatcher.recover()
            for loop in loops:
                await loop.recover()
            for p, cell in ((0, "a"), (1, "b")):
                await stores[Shard.cell(p)].log(INPUTS).append([msg(e) for e in cell_nodes(cell)])
            for loop in loops:
                await loop.step(timeout_ms=5000)  # the first summaries
            await stores[Shard.GLOBAL].log(INPUTS).append([msg(job("one", gpus=1))])
            while not dispatcher.state.jobs or dispatcher.state.jobs["one"].status != "held":
                await dispatcher.step(timeout_ms=5000)
            held = loops[MAP.partition_of(dispatcher.state.jobs["one"].cell) or 0]
            while held.state.job_row("one") < 0:
                await held.step(timeout_ms=5000)
        finally:
            for store in stores.values():
                await store.close()

    asyncio.run(run())
    config = tmp_path / "kafka.toml"
    config.write_text(f'[kafka]\nbootstrap_servers = "{kafka_bootstrap}"\ntopic_prefix = "{prefix}"\n'
                      f'shards = 2\n[service]\ncell_hold_ms = {HOLD_MS}\nsummary_every_ms = 5000\n'
                      '[cells]\na = 0\nb = 1\n')
    code, out, _ = cli(capsys, "replay", "verify", "--config", str(config), "--json", "--jobs", "1")
    report = json.loads(out)
    assert code == 0, out
    assert [(r["shard"], r["ok"]) for r in report["shards"]] == [("global", True), ("cells-0", True),
                                                                  ("cells-1", True)]
    assert report["shards"][0]["steps"] >= 1
    code, out, err = cli(capsys, "status", "one", "--config", str(config), "--json")
    assert code == 0, err
    found = json.loads(out)
    assert found["dispatcher"] == "held"
    assert found["held_by"] in ("a", "b")
    assert found["state"] == "placed"
    code, out, _ = cli(capsys, "replay", "explain", "one", "--config", str(config), "--json")
    whats = [s["what"] for s in json.loads(out)["steps"]]
    assert whats[:3] == ["submitted", f"dispatched to cell {found['held_by']}", "dispatched here"]
    assert "placed" in whats


def test_dump_shows_the_dispatchers_step_records(recorded: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    config = config_for(recorded, tmp_path)
    code, out, _ = cli(capsys, "replay", "dump", "--config", config, "--shard", "global", "--from-log",
                       "decisions")
    steps = [json.loads(line)["step"] for line in out.splitlines()]
    assert code == 0
    assert steps[0]["dispatched"][0] == {"job_id": "gang", "cell": "a", "attempt": 1, "seq": 1}
    assert {"job_id": "gang", "cell": "b", "attempt": 2, "seq": 1} in steps[1]["dispatched"]
    assert [w["code"] for w in steps[0]["waiting"]] == ["no_cell_has_room", "no_allowed_cell_in_map"]
