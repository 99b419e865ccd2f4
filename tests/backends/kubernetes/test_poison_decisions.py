"""A decision record the Kubernetes backend cannot read (issue 14, the backends): the actuator
stands by at that record, says so once with the log and the offset, stays alive (watches,
heartbeats and all), and binds again once the log is restored — never a dead task, never a
skipped decision."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from fleetlog.backends.kubernetes.config import KubeBackendConfig
from fleetlog.events.codec import CONTENT_TYPE_HEADER, JSON
from fleetlog.log.base import DECISIONS, Message
from fleetlog.log.file import FileLogStore
from tests.backends.helpers import restore, segment
from tests.backends.kubernetes.conftest import Rig, wipe
from tests.backends.kubernetes.manifests import items, node, pod
from tests.kube_apiserver import KubeControlPlane

POISON = b'{"schema_version":1,"producer_id":"x","event":' + b"[" * 1000 + b"]" * 1000 + b"}"


def bound(rig: Rig, name: str) -> bool:
    return bool(rig.snapshot.get(name, {}).get("spec", {}).get("nodeName"))


def said(caplog: pytest.LogCaptureFixture, start: str) -> list[logging.LogRecord]:
    ours = [r for r in caplog.records if r.name == "fleetlog.backends.kubernetes"]
    return [r for r in ours if r.getMessage().startswith(start)]


async def pause(rig: Rig) -> None:
    """Stop the scheduler loop (it writes nothing after the bad record until the restore)."""
    assert rig.driver is not None
    rig.driver.cancel()
    await asyncio.gather(rig.driver, return_exceptions=True)


@pytest.mark.parametrize("when", ["at_start", "while_following"])
async def test_an_unreadable_decision_stalls_the_actuator_at_it_until_the_log_is_restored(
    kube: KubeControlPlane, tmp_path: Path, caplog: pytest.LogCaptureFixture, when: str
) -> None:
    caplog.set_level(logging.DEBUG, logger="fleetlog.backends.kubernetes")
    wipe(kube)
    store = FileLogStore(tmp_path / "log")
    await store.open()
    rig = Rig(kube, store, KubeBackendConfig(heartbeat_ms=2_000))
    await rig.start()
    try:
        rig.apply(items(node("w0", cpu="16", mem="64Gi")))
        rig.apply(items(pod("a-0", run_ms=200)))
        await rig.until("a-0 bound", lambda: bound(rig, "a-0"))
        await pause(rig)
        if when == "at_start":
            await rig.stop_backend()
        offset = await store.log(DECISIONS).end_offset()
        good = segment(tmp_path / "log").read_bytes()
        await store.log(DECISIONS).append([Message(POISON, headers=((CONTENT_TYPE_HEADER, JSON),))])
        if when == "at_start":
            await rig.start_backend()  # starts, and stands by: never raises
        assert rig.backend is not None
        actuator = rig.backend.actuator
        assert actuator is not None
        await rig.until("stalled and re-checked", lambda: actuator.failures >= 2, timeout_s=20)
        assert actuator.offset == offset  # its place kept: the record is not skipped
        assert f"decisions@{offset}" in actuator.stalled
        errors = [r for r in said(caplog, "kubernetes_actuator_stalled") if r.levelno == logging.ERROR]
        assert len(errors) == 1  # one clear line, not one per re-check
        assert f"log=decisions offset={offset} error_type=CorruptDecisionsError" in errors[0].getMessage()
        await store.close()  # the operator restores the decisions log from a backup
        restore(segment(tmp_path / "log"), good)
        await store.open()
        rig.driver = asyncio.create_task(rig._drive())
        rig.apply(items(pod("b-0", run_ms=200)))  # its placement lands where the bad record was
        await rig.until("b-0 bound after the restore", lambda: bound(rig, "b-0"), timeout_s=30)
        # the binding shows in the watch before the actuator's step (bindings, evictions, events
        # flushed) has returned and said it resumed: wait for that, it must come
        await rig.until("the stall cleared", lambda: actuator.stalled == "", timeout_s=10)
        assert said(caplog, "kubernetes_actuator_resumed")
        rig.alive()
    finally:
        await rig.close()
        await store.close()
