"""A poison record (JSON or msgpack nested 1,000 deep, ~1 KB) in the inputs log: the service parks
it and keeps deciding, across restarts; ``fleetlog status`` and ``replay dump`` read past it.

Before the fix msgspec's ``RecursionError`` escaped the codec: the service exited 1 on every
restart and both commands crashed on the record.
"""

from __future__ import annotations

import asyncio
import json
import struct
from pathlib import Path

import crc32c
import pytest

from fleetlog.cli import main
from fleetlog.core.digest import SnapshotError, restore
from fleetlog.events import encode, envelope
from fleetlog.events.codec import JSON
from fleetlog.log.base import DEAD_LETTERS, INPUTS, Message
from fleetlog.log.consumer import REASON_HEADER, SOURCE_HEADER
from fleetlog.log.file import FileLogStore
from fleetlog.log.snapshots import MAGIC, CorruptSnapshotError, decode_snapshot
from fleetlog.service.ingest import IngestError, ingest_messages
from tests.core.builders import job, node
from tests.service.test_service import Running, embedded, start

DEEP_JSON = (b'{"schema_version":1,"producer_id":"p","event":{"type":"JobCancelled","job_id":"j","reason":'
             + b"[" * 1000 + b"]" * 1000 + b"}}")
DEEP_MSGPACK = b"\x83\xaeschema_version\x01\xabproducer_id\xa1p\xa5event" + b"\x91" * 1000 + b"\x01"


async def write_poisoned_log(directory: Path) -> None:
    """A node, a job, the two poison records (written straight to the log, as any producer
    with access can), then a second job."""
    async with FileLogStore(directory, fsync="never") as store:
        await store.log(INPUTS).append([
            Message(encode(envelope(node("n1"), "t"))),
            Message(encode(envelope(job("before", gpus=1), "t"))),
            Message(DEEP_JSON, headers=(("content-type", JSON),)),
            Message(DEEP_MSGPACK),
            Message(encode(envelope(job("after", gpus=1), "t"))),
        ])


def _committed(running: Running) -> int:
    loop = running.service.loop
    return -1 if loop is None else loop.committed


async def test_the_service_parks_a_poison_record_and_keeps_deciding_across_restarts(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    await write_poisoned_log(directory)
    for attempt in range(2):  # the second start recovers over the same records
        running = await start(embedded(directory, snapshot_every_events=1000))
        try:
            await running.until(lambda r=running: r.task.done() or _committed(r) == 5)
            assert not running.task.done(), f"the service stopped (start {attempt + 1})"
            for job_id in ("before", "after"):
                status, found = await running.request(f"/v1/jobs/{job_id}")
                assert (status, found["state"]) == (200, "placed")
        finally:
            await running.stop()
    async with FileLogStore(directory, fsync="never") as store:
        parked = await store.log(DEAD_LETTERS).read(0, timeout_ms=100)
    assert [(r.header(REASON_HEADER), r.header(SOURCE_HEADER)) for r in parked] == [
        (b"too_deep", b"inputs@2"),
        (b"too_deep", b"inputs@3"),
    ]  # parked once: recovery skips without parking again


def test_status_reads_past_a_poison_record(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    asyncio.run(write_poisoned_log(tmp_path / "log"))
    assert main(["status", "after", "--log", str(tmp_path / "log"), "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert (found["job_id"], found["state"]) == ("after", "pending")


def test_replay_dump_shows_the_poison_records_as_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    asyncio.run(write_poisoned_log(tmp_path / "log"))
    assert main(["replay", "dump", "--log", str(tmp_path / "log")]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["offset"] for line in lines] == [0, 1, 2, 3, 4]
    reasons = [line.get("error", {}).get("reason") for line in lines]
    assert reasons == [None, None, "too_deep", "too_deep", None]
    assert lines[2]["error"]["bytes"] == len(DEEP_JSON)
    assert lines[4]["event"]["job_id"] == "after"


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"[" * 1000 + b"]" * 1000, "too_deep"),
        (b"[" + b'{"a":' * 1000 + b"1" + b"}" * 1000 + b"]", "too_deep"),
        (DEEP_JSON, "too_deep"),
        (b"[" + DEEP_JSON + b"]", "too_deep"),
        (b'[{"schema_version":1,"producer_id":"p","event":{"type":"JobCancelled","job_id":"a","job_id":"b"}}]',
         "duplicate_key"),
    ],
)
def test_http_ingest_refuses_deep_nesting_and_repeated_keys_by_name(body: bytes, reason: str) -> None:
    """Over HTTP the deep array escaped as ``RecursionError`` (the connection closed with no
    answer); an array's elements were re-encoded, so a repeated key inside one was lost."""
    with pytest.raises(IngestError) as caught:
        ingest_messages(body, "application/json")
    assert caught.value.reason == reason


def test_a_forged_snapshot_nested_deeply_is_refused_as_corrupt() -> None:
    """A snapshot carries a CRC, not a signature: a forged one must be skipped, not crash recovery."""
    with pytest.raises(SnapshotError, match="not a fleetlog snapshot"):
        restore(b"\x81\xa6format" + b"\x91" * 5000 + b"\x01")
    header = b"\x91" * 5000 + b"\x01"
    body = MAGIC + struct.pack(">I", len(header)) + header + b"state"
    with pytest.raises(CorruptSnapshotError, match="bad header"):
        decode_snapshot(body + struct.pack(">I", crc32c.crc32c(body)))
