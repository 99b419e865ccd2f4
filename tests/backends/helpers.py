"""Builders for simulation tests: trace files in the openb format, schedulers, log readers."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import msgspec

from fleetlog.core.policy import policy_named
from fleetlog.events import DecisionBatch, Event, encode, envelope
from fleetlog.events.codec import CONTENT_TYPE_HEADER, MSGPACK, decode
from fleetlog.log.base import DECISIONS, INPUTS, LogStore, Message
from fleetlog.log.consumer import decision_batches
from fleetlog.service.loop import LoopConfig, SchedulerLoop
from fleetlog.simulation import SchedulerFactory

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model"
POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time"
)


def write_csv(path: Path, header: str, rows: Sequence[str]) -> Path:
    path.write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")
    return path


def nodes_csv(
    path: Path, rows: Sequence[str] = ("n0,32000,131072,2,T4", "n1,32000,131072,2,T4", "n2,96000,393216,8,G2")
) -> Path:
    return write_csv(path, NODE_HEADER, rows)


def pod(
    name: str,
    cpu: int = 4000,
    gpus: int = 1,
    milli: int = 1000,
    spec: str = "",
    created: int = 0,
    deleted: int = 600,
    scheduled: int | None = 0,
) -> str:
    """One openb pod line; ``scheduled=None`` is a pod the trace never scheduled."""
    started = "" if scheduled is None else str(scheduled)
    return f"{name},{cpu},8192,{gpus},{milli if gpus else 0},{spec},LS,Running,{created},{deleted},{started}"


def scheduler(policy: str = "default", **overrides: object) -> SchedulerFactory:
    """The real service loop with ``policy`` and every invariant checked after each fold."""
    chosen = policy_named(policy, **overrides)
    return lambda store: SchedulerLoop(store, chosen, LoopConfig(check_invariants=True))


async def inputs(store: LogStore) -> list[tuple[int, Event]]:
    """(log timestamp, event) of every record of the inputs log."""
    records = await store.log(INPUTS).read(0, 10_000_000)
    return [(r.timestamp_ms, decode(r.value, r.header(CONTENT_TYPE_HEADER)).event) for r in records]


async def decisions(store: LogStore) -> list[object]:
    """Every decision of the decisions log, in order."""
    records = await store.log(DECISIONS).read(0, 10_000_000)
    return [d for _, batch in decision_batches(records) for d in batch.decisions]


def log_files(directory: Path) -> dict[str, bytes]:
    """Every file of a file log except its LOCK (which names the writer's PID), by relative path."""
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != "LOCK"
    }


class OneDecisionPerRecord(SchedulerLoop):
    """Writes every step of several decisions as that many parts (one transaction), as the
    scheduler does for a step too large for one record — here with small steps, so backend
    tests meet split steps without megabytes of decisions."""

    def batch_messages(self, batch: DecisionBatch) -> list[Message]:
        n = len(batch.decisions)
        if n < 2:
            return super().batch_messages(batch)
        parts = [
            msgspec.structs.replace(batch, decisions=(d,), part=i, parts=n)
            for i, d in enumerate(batch.decisions)
        ]
        headers = ((CONTENT_TYPE_HEADER, MSGPACK),)
        return [Message(encode(envelope(p, self.config.producer_id)), headers=headers) for p in parts]


async def split_steps(store: LogStore) -> list[DecisionBatch]:
    """The parts of split steps in the decisions log."""
    records = await store.log(DECISIONS).read(0, 100_000)
    return [b for _, b in decision_batches(records) if b.parts > 1]


def segment(directory: Path) -> Path:
    """The newest segment of a file log's decisions log (the one a poison test tampers with)."""
    return sorted((directory / DECISIONS).glob("*.log"))[-1]


def restore(path: Path, data: bytes) -> None:
    """What an operator does: put the good copy back (atomically)."""
    tmp = path.with_name(path.name + ".restore")
    tmp.write_bytes(data)
    os.replace(tmp, path)
