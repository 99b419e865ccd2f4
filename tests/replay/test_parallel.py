"""Parallel verify: stretches between snapshots in forked processes give the serial report, and
anything doubtful (a divergence, a snapshot that is not the replayed state) falls back to it."""

from __future__ import annotations

import shutil
from pathlib import Path

import msgspec
import pytest

from fleetlog.core.digest import snapshot
from fleetlog.log.snapshots import (
    DirectorySnapshots,
    Snapshot,
    SnapshotHeader,
    decode_snapshot,
    encode_snapshot,
)
from fleetlog.replay.engine import Start, replay
from fleetlog.replay.parallel import choose_cuts, verify_in_parallel
from fleetlog.replay.source import open_file_source
from fleetlog.replay.verify import verify

DATA = Path(__file__).parent / "data"


async def _reports(log: Path) -> tuple[object, object, object]:
    """(serial report, parallel report with 2 jobs, verify_in_parallel's own answer)."""
    source = await open_file_source(log)
    try:
        serial = await verify(source, jobs=1)
        parallel = await verify(source, jobs=2)
        direct = await verify_in_parallel(source, None, None, 2)
    finally:
        await source.close()
    return serial, parallel, direct


async def _add_snapshot(log: Path, batches: int) -> None:
    """A snapshot of the replayed state after ``batches`` decision batches (and their inputs)."""
    source = await open_file_source(log, snapshots=False)
    try:
        from fleetlog.replay.source import batches as all_batches

        as_of = [b.as_of async for _, _, b in all_batches(source.store)][batches - 1]
        done = await replay(source, Start.fresh(), as_of, decisions_stop=batches)
    finally:
        await source.close()
    header = SnapshotHeader(done.inputs_offset, batches, "default", 0)
    await DirectorySnapshots(log / "snapshots").save(encode_snapshot(Snapshot(header, snapshot(done.state))))


async def test_the_clean_fixture_verifies_in_two_processes_with_the_serial_report(tmp_path: Path) -> None:
    serial, parallel, direct = await _reports(DATA / "clean")
    assert direct is not None  # the parallel path itself answered: no fallback
    assert msgspec.to_builtins(parallel) == msgspec.to_builtins(serial)
    assert msgspec.to_builtins(direct) == msgspec.to_builtins(serial)


async def test_cuts_are_snapshots_spread_over_the_inputs(tmp_path: Path) -> None:
    log = tmp_path / "log"
    shutil.copytree(DATA / "clean", log)
    for batches in (4, 9, 20):
        await _add_snapshot(log, batches)
    source = await open_file_source(log)
    try:
        offsets = [header.inputs_offset for _, header, _ in await choose_cuts(source, 4)]
        assert offsets == sorted(set(offsets))  # ascending, distinct
        assert len(offsets) == 3
        assert await choose_cuts(source, 1) == []
        serial = await verify(source, jobs=1)
        report = await verify_in_parallel(source, None, None, 4)  # four stretches at once
    finally:
        await source.close()
    assert report is not None
    assert msgspec.to_builtins(report) == msgspec.to_builtins(serial)


async def test_a_divergence_is_reported_as_the_serial_run_reports_it(tmp_path: Path) -> None:
    log = tmp_path / "log"
    shutil.copytree(DATA / "divergent", log)
    await _add_snapshot(log, 3)  # a cut before the tampered batch: the child meets it
    serial, parallel, direct = await _reports(log)
    assert direct is None
    assert serial.divergence is not None  # type: ignore[attr-defined]
    assert msgspec.to_builtins(parallel) == msgspec.to_builtins(serial)


async def test_a_snapshot_that_is_not_the_replayed_state_falls_back_to_the_serial_run(tmp_path: Path) -> None:
    log = tmp_path / "log"
    shutil.copytree(DATA / "clean", log)
    (path,) = (log / "snapshots").glob("*")
    snap = decode_snapshot(path.read_bytes())
    from fleetlog.core.digest import restore

    state = restore(snap.state)
    state.ignored += 1  # a well-formed snapshot of a state the log does not lead to
    path.write_bytes(encode_snapshot(Snapshot(snap.header, snapshot(state))))
    serial, parallel, direct = await _reports(log)
    assert direct is None  # the stretch before it ends on another digest
    assert serial.divergence is None  # type: ignore[attr-defined]  (serial verify reads no snapshot)
    assert msgspec.to_builtins(parallel) == msgspec.to_builtins(serial)


@pytest.mark.parametrize("jobs", ["0", "-1", "two"])
def test_jobs_must_be_a_positive_number(jobs: str, capsys: pytest.CaptureFixture[str]) -> None:
    from fleetlog.cli import EXIT_USAGE, main

    with pytest.raises(SystemExit) as exited:
        main(["replay", "verify", "--log", str(DATA / "clean"), "--jobs", jobs])
    assert exited.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"argument --jobs: expected a positive number of processes, got {jobs!r}" in err
    assert "Traceback" not in err
