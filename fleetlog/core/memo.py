"""decide's memo caches: node scores remembered per task shape, within a call and from one call
to the next. A memo only saves work: a kernel reads a node's remembered score only while the
node's version is the one it was taken at, and a call adopts the last call's memos only for
the nodes whose free capacity is still what they were learned on
(:meth:`fleetlog.core.scratch.Scratch.adopt`). Kept between calls in ``state.derived``
(droppable: ``tests/core/test_decide_fast.py`` decides with them dropped before every call).
"""

from __future__ import annotations

from typing import Final

import numpy as np

from fleetlog.core import kernels
from fleetlog.core.arrays import Array

MEMO_ROWS: Final = 1 << 20  # node rows of remembered scores kept at most (32 bytes each: 32 MiB)

MAX_MEMOS: Final = 512  # task shapes whose node scores are remembered at once, at most



Shape = tuple[int, int, int, int, int]  # a task's (cpu, mem, gpus, milli, models)


class Memos:
    """``kernels.best_node_memo`` rows per task shape, in one int64[slots, N, MEMO_COLUMNS]
    store (so that ``kernels.place_run`` takes them all at once); past ``limit`` shapes, the
    least recently used one gives up its slot (bounded memory: a memo only saves work)."""

    __slots__ = ("limit", "slots", "store")

    def __init__(self, nodes: int, limit: int) -> None:
        self.limit = limit
        self.slots: dict[Shape, int] = {}  # in order of use, the most recent last
        self.store = np.full((0, nodes, kernels.MEMO_COLUMNS), -1, np.int64)  # (grows on first use)

    def slot(self, shape: Shape) -> int:
        slot = self.slots.pop(shape, None)
        if slot is None:
            if len(self.slots) >= self.limit:
                slot = self.slots.pop(next(iter(self.slots)))
                self.store[slot] = -1
            else:
                slot = len(self.slots)  # (slots 0 .. len - 1 are in use)
                if slot == self.store.shape[0]:
                    grown = np.full((min(self.limit, max(16, 2 * slot)), *self.store.shape[1:]), -1, np.int64)
                    grown[:slot] = self.store
                    self.store = grown
        self.slots[shape] = slot
        return slot

    def rows(self, shape: Shape) -> Array:
        """The memo of ``shape`` (a view into the store: use it before the next ``slot``)."""
        slot = self.slot(shape)  # (first: it may grow the store)
        rows: Array = self.store[slot]
        return rows

    def clear(self) -> None:
        self.slots.clear()
        self.store.fill(-1)


class MemoCache:
    """Node scores one ``decide`` call remembered (per task shape), the node versions they
    were taken at, and the free capacity those versions stand for at the end of the call."""

    __slots__ = ("cpu_free", "gpu_count", "gpu_free", "key", "mem_free", "memos", "model", "node_version")

    def __init__(
        self, key: tuple[object, ...], memos: Memos, node_version: Array, free: tuple[Array, ...]
    ) -> None:
        """``free``: the call's (cpu_free, mem_free, gpu_free, gpu_count, model) at its end."""
        self.key, self.memos, self.node_version = key, memos, node_version
        self.cpu_free, self.mem_free, self.gpu_free = free[0], free[1], free[2]
        self.gpu_count, self.model = free[3].copy(), free[4].copy()  # (views of the state)
