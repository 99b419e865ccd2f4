"""A heartbeat round in slices (``KubeBackendConfig.heartbeat_slices``): every node in exactly
one slice, the slices near even, a node's slice independent of the others; and the backend,
over a real kube-apiserver, re-reports each node once per ``heartbeat_ms`` — not the cell at
once."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable

import msgspec
import pytest

from fleetlog.backends.kubernetes import KubeBackendConfig
from fleetlog.backends.kubernetes.observer import heartbeat_slice
from fleetlog.events import NodeHeartbeat
from fleetlog.log.base import LogStore
from tests.backends.kubernetes.conftest import Rig, wipe
from tests.backends.kubernetes.manifests import items, node
from tests.kube_apiserver import KubeControlPlane

pytestmark = pytest.mark.timeout(300)


def test_every_node_in_one_slice_and_the_slices_near_even() -> None:
    names = [f"gpu-node-{i:05d}" for i in range(10_000)]
    for parts in (1, 2, 7, 10, 1_000):
        counts = Counter(heartbeat_slice(n, parts) for n in names)
        assert set(counts) <= set(range(parts))
        assert sum(counts.values()) == len(names)
        if parts <= 10:
            mean = len(names) / parts
            assert all(0.9 * mean <= c <= 1.1 * mean for c in counts.values()), counts
    assert {heartbeat_slice(n, 10) for n in names[:5]} == {heartbeat_slice(n, 10) for n in sorted(names[:5])}
    assert heartbeat_slice("n1", 10) == 6  # CRC-32: the same in every process, not Python's salted hash


def test_the_slices_setting_is_bounded() -> None:
    for bad in (0, -1, 1_001):
        with pytest.raises(msgspec.ValidationError, match="heartbeat_slices"):
            msgspec.convert({"heartbeat_slices": bad}, KubeBackendConfig)
    assert msgspec.convert({"heartbeat_slices": 1}, KubeBackendConfig).heartbeat_slices == 1


async def beats_at(rig: Rig, since_s: float) -> list[tuple[float, str]]:
    """(append time, node) of each heartbeat appended after ``since_s`` (epoch seconds)."""
    return [(at / 1000, e.node) for at, e in await rig.timed_events()
            if isinstance(e, NodeHeartbeat) and at / 1000 >= since_s]


@pytest.mark.parametrize("slices", [1, 4])
async def test_the_backend_sends_each_node_once_a_period_in_slices(
    kube: KubeControlPlane, store_maker: Callable[[], LogStore], slices: int
) -> None:
    """12 nodes, ``heartbeat_ms`` 2 s: over 3 whole periods each node is re-reported 3 times
    (±1 at the window's edges), and with 4 slices no append second holds more than about a
    quarter of the nodes plus the edges; with 1 slice a round is all 12 within one flush."""
    wipe(kube)
    store = store_maker()
    await store.open()
    rig = Rig(kube, store, KubeBackendConfig(heartbeat_ms=2_000, heartbeat_slices=slices))
    names = [f"n{i}" for i in range(12)]
    try:
        rig.apply(items(*(node(n, gpus=1) for n in names)))
        await rig.start()
        await rig.until_async("every node reported", lambda: _reported(rig, set(names)))
        since = time.time() + 0.5
        await asyncio.sleep(0.5 + 6.0)
        beats = [(t, n) for t, n in await beats_at(rig, since) if t < since + 6.0]
    finally:
        await rig.close()
        await store.close()
    per_node = Counter(n for _, n in beats)
    assert set(per_node) == set(names)
    assert all(2 <= c <= 4 for c in per_node.values()), per_node
    # appends 0.2 s apart or closer are one burst
    bursts: list[list[float]] = []
    for t, _ in sorted(beats):
        if bursts and t - bursts[-1][-1] <= 0.2:
            bursts[-1].append(t)
        else:
            bursts.append([t])
    largest = max(len(b) for b in bursts)
    if slices == 1:
        assert largest == len(names)
    else:
        assert largest <= 8, [len(b) for b in bursts]  # a slice of about 3, never a whole round
        assert len(bursts) >= 9


async def _reported(rig: Rig, names: set[str]) -> bool:
    return {e.node for e in await rig.events() if isinstance(e, NodeHeartbeat)} >= names
