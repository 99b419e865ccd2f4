"""A group of cell shards stepped in a child process: the same :class:`CellShard` steps, their
partitions' records sent over a pipe (msgpack, as the logs would carry them) and what each shard
wrote sent back. The driver still orders everything by partition, so a fleet whose shards run in
two processes writes exactly what it writes in one (the same digest: tested).

The child is started with ``spawn`` (a fresh interpreter: no lock or numba thread state copied
from a parent mid-flight); it compiles nothing new, as the kernels are cached on disk.
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection

import msgspec

from fleetlog.events.model import CellSummary, Event, JobReturned
from fleetlog.sharded.driver import CellShard, FleetConfig, LocalShards, Record, ShardGroup, ShardOut

Sent = list[tuple[int, list[tuple[Event, int]]]]
Back = list[tuple[int, int, list[JobReturned | CellSummary]]]
_ENCODER = msgspec.msgpack.Encoder()
_SENT = msgspec.msgpack.Decoder(Sent)
_BACK = msgspec.msgpack.Decoder(Back)


Warm = Callable[[], None]


def _serve(
    conn: Connection, partitions: dict[int, tuple[str, ...]], config: FleetConfig, warm: Warm | None
) -> None:
    """The child: ``warm`` first (its kernels loaded before the first batch, as a role warms up
    before it leads), then step its shards on each batch of records until told to stop
    (``b""``); then send the transcripts."""
    if warm is not None:
        warm()
    group = LocalShards(CellShard(p, cells, config) for p, cells in partitions.items())
    while True:
        raw = conn.recv_bytes()
        if not raw:
            break
        group.send({p: [(e, at) for e, at in records] for p, records in _SENT.decode(raw)})
        outs = group.receive()
        back: Back = [(o.partition, o.placed, o.to_global) for o in outs]  # type: ignore[misc]
        conn.send_bytes(_ENCODER.encode(back))
    conn.send(group.transcripts())
    conn.close()


class ChildShards:
    """Cell shards of ``partitions`` stepped in a child process (``close`` it when done);
    ``warm`` (picklable: a module-level function or a partial of one) runs there first."""

    def __init__(
        self, partitions: dict[int, tuple[str, ...]], config: FleetConfig, warm: Warm | None = None
    ) -> None:
        self.partitions = tuple(sorted(partitions))
        if config.keep_decisions or config.check:
            raise ValueError("shards in a child process send counts only: keep_decisions=False, check=False")
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, partitions, config, warm), daemon=True)
        self._proc.start()
        child.close()
        self._final: dict[int, str] | None = None

    def send(self, records: dict[int, list[Record]]) -> None:
        sent: Sent = [(p, records[p]) for p in sorted(records)]
        self._conn.send_bytes(_ENCODER.encode(sent))

    def receive(self) -> list[ShardOut]:
        back = _BACK.decode(self._conn.recv_bytes())
        return [ShardOut(p, placed, [], list(to_global)) for p, placed, to_global in back]

    def transcripts(self) -> dict[int, str]:
        """Each partition's transcript digest (stops the child: call it last)."""
        if self._final is None:
            self._conn.send_bytes(b"")
            self._final = self._conn.recv()
            self._proc.join(timeout=30)
        return dict(self._final)

    def close(self) -> None:
        """Stop the child (its transcripts are read first, so it exits cleanly)."""
        if self._proc.is_alive():
            self.transcripts()
        self._conn.close()


def split_groups(
    config: FleetConfig, children: int, local_share: float | None = None, warm: Warm | None = None
) -> list[ShardGroup]:
    """The partitions in ``children + 1`` contiguous parts: the first stepped here (while the
    children step theirs), one per child. ``local_share``: the first part's share of the
    partitions (default: an equal part) — smaller when this process also runs the dispatcher
    (pipelined, its work and the children's overlap). ``warm``: what each child runs first."""
    parts = list(config.partitions().items())
    if local_share is None:
        size = -(-len(parts) // (children + 1))
        chunks = [dict(parts[i : i + size]) for i in range(0, len(parts), size)]
    else:
        if not 0 < local_share < 1 or len(parts) < children + 1:
            raise ValueError(f"local share {local_share} of {len(parts)} partitions over {children} children")
        here = min(len(parts) - children, max(1, round(local_share * len(parts))))
        size = -(-(len(parts) - here) // children)
        chunks = [dict(parts[:here])] + [dict(parts[i : i + size]) for i in range(here, len(parts), size)]
    local = LocalShards(CellShard(p, cells, config) for p, cells in chunks[0].items())
    return [local, *(ChildShards(chunk, config, warm) for chunk in chunks[1:])]


def close_all(groups: Sequence[object]) -> None:
    for g in groups:
        if isinstance(g, ChildShards):
            g.close()
