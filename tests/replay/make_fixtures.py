"""Record the replay fixtures under ``tests/replay/data/`` (run it after a change to the core's
decisions makes ``test_fixtures`` fail — that is the regression gate doing its job):

    python -m tests.replay.make_fixtures

``clean/`` is the scenario as the scheduler decided it, with one snapshot; ``divergent/`` is the
same scenario whose log records one placement on a node the scheduler did not choose, and
``divergent.json`` says which (the test asserts verify finds exactly that).
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

from fleetlog.log.file import FileLogStore
from fleetlog.log.snapshots import DirectorySnapshots
from tests.replay.scenario import ClockBox, move_third_placement, record

DATA = Path(__file__).parent / "data"


async def make(
    directory: Path, tampered: dict[str, object] | None = None, snapshot_at: int | None = None
) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    clock = ClockBox()
    store = FileLogStore(directory, clock=clock, fsync="never", segment_bytes=1 << 20)
    snapshots: list[bytes] = []
    await store.open()
    try:
        tamper = None if tampered is None else (lambda n, b: move_third_placement(n, b, tampered))
        await record(store, clock, tamper=tamper, snapshot_at=snapshot_at, snapshots=snapshots)
    finally:
        await store.close()
    for data in snapshots:
        await DirectorySnapshots(directory / "snapshots").save(data)
    (directory / "LOCK").unlink(missing_ok=True)
    for index in directory.glob("*/*.index"):
        index.unlink()


async def main() -> None:
    await make(DATA / "clean", snapshot_at=14)
    tampered: dict[str, object] = {}
    await make(DATA / "divergent", tampered)
    tampered.pop("seen", None)
    tampered.pop("done", None)
    (DATA / "divergent.json").write_text(json.dumps(tampered, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
