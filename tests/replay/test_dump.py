"""``fleetlog replay dump`` shows each record's idempotency key (the envelope's, wherever the
producer put it) and decisions as objects with field names, never positional arrays."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from fleetlog.cli import main
from fleetlog.client import keyed, message_of
from fleetlog.events import encode, envelope
from fleetlog.events.codec import CONTENT_TYPE_HEADER, MSGPACK
from fleetlog.events.model import JobPlaced, TaskPlacement
from fleetlog.log.base import DECISIONS, INPUTS, Message
from fleetlog.log.file import FileLogStore
from tests.core.builders import job

CLEAN = str(Path(__file__).parent / "data" / "clean")


def dump(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict[str, Any]]:
    assert main(["replay", "dump", *args]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


async def _write(directory: Path) -> None:
    store = FileLogStore(directory, fsync="never")
    await store.open()
    try:
        by_client = message_of(keyed(job("j1"), "cli"))  # record key = envelope key
        env = keyed(job("j2"), "http")
        by_ingest = Message(encode(env), headers=((CONTENT_TYPE_HEADER, MSGPACK),))  # no record key
        partitioned = Message(encode(keyed(job("j3"), "kafka")), key=b"tenant-t1")  # another record key
        unkeyed = Message(encode(envelope(job("j4"), "sim")))
        broken = Message(b"\xc1 not an event", key=b"submit/j5")
        await store.log(INPUTS).append([by_client, by_ingest, partitioned, unkeyed, broken])
    finally:
        await store.close()


def test_the_key_is_the_envelopes_and_a_different_record_key_is_shown_beside_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    asyncio.run(_write(tmp_path / "log"))
    lines = dump(capsys, "--log", str(tmp_path / "log"))
    assert [line["key"] for line in lines] == ["submit/j1", "submit/j2", "submit/j3", None, "submit/j5"]
    assert [line.get("record_key") for line in lines] == [None, None, "tenant-t1", None, None]
    assert list(lines[2])[:4] == ["offset", "timestamp_ms", "key", "record_key"]
    assert lines[4]["error"]["reason"] == "undecodable"  # the record's own key, when nothing decodes


def test_decisions_show_task_placements_as_objects(capsys: pytest.CaptureFixture[str]) -> None:
    batches = dump(capsys, "--log", CLEAN, "--from-log", DECISIONS)
    placed = [d for b in batches for d in b["event"]["decisions"] if d["type"] == "JobPlaced"]
    assert placed
    for decision in placed:
        for task in decision["tasks"]:
            assert isinstance(task, dict)
            assert list(task) == ["task_index", "node", "gpu_indices"]
            assert isinstance(task["node"], str)
    urgent = next(d for d in placed if d["job_id"] == "urgent")
    assert urgent["tasks"][0] == {"task_index": 0, "node": "n2", "gpu_indices": [0, 1, 2, 3, 4, 5, 6, 7]}


def test_objects_keep_every_field_of_a_placement_with_defaults() -> None:
    from fleetlog.replay.dump import as_objects

    decision = JobPlaced(job_id="j", cell="c", tasks=(TaskPlacement(0, "n0"), TaskPlacement(1, "n1", (3,))))
    assert as_objects(decision) == {
        "type": "JobPlaced",
        "job_id": "j",
        "cell": "c",
        "tasks": [
            {"task_index": 0, "node": "n0", "gpu_indices": []},
            {"task_index": 1, "node": "n1", "gpu_indices": [3]},
        ],
    }
