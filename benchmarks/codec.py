"""Codec throughput: msgpack and JSON encode/decode of envelopes, events/s.

Data: a seeded mix shaped like a busy fleet — 70% node heartbeats, 20% task
lifecycle events, 10% gang job submissions.  Decode is batched as the consumer
does it: ``decode_many`` over polls of 10,000 records, each poll's events dropped before
the next.  Baseline in the same run: the stdlib ``json`` module decoding the same JSON
bytes into dicts (no validation).

    python -m benchmarks.codec --json [--quick | --smoke]
"""

from __future__ import annotations

import gc
import json
import random

from benchmarks.common import emit, machine, median_rate, parse
from fleetlog.events import Event, NodeHeartbeat, TaskFinished, TaskStarted, decode, encode, envelope
from fleetlog.events.codec import JSON, Format, decode_many
from fleetlog.events.model import Envelope
from tests.events.samples import job

BATCH = 10_000


def workload(n: int, seed: int = 7) -> list[Envelope]:
    rng = random.Random(seed)
    out: list[Envelope] = []
    for i in range(n):
        roll = rng.random()
        event: Event
        if roll < 0.7:
            event = NodeHeartbeat(
                cell="cell-a",
                node=f"node-{i % 10_000:05d}",
                cpu_milli=96_000,
                mem_mib=786_432,
                gpu_count=8,
                gpu_model="A100",
                topology=("b1", f"r{i % 64}", f"node-{i % 10_000:05d}"),
            )
        elif roll < 0.8:
            event = TaskStarted(job_id=f"job-{i}", task_index=0, node=f"node-{i % 10_000:05d}")
        elif roll < 0.9:
            event = TaskFinished(job_id=f"job-{i}", task_index=0, exit_code=0)
        else:
            event = job(f"job-{i}")
        out.append(envelope(event, "bench"))
    return out


def measure(envs: list[Envelope], fmt: Format, repeats: int) -> dict[str, float]:
    encoded = [encode(e, fmt) for e in envs]
    ctype = JSON if fmt == "json" else None
    pairs = [(b, ctype) for b in encoded]
    enc = median_rate(lambda: len([encode(e, fmt) for e in envs]), repeats)
    dec = median_rate(
        lambda: sum(len(decode_many(pairs[i : i + BATCH])) for i in range(0, len(pairs), BATCH)), repeats
    )
    assert decode(encoded[0], ctype) == envs[0]
    return {
        f"{fmt}_encode_events_per_s": enc,
        f"{fmt}_decode_events_per_s": dec,
        f"{fmt}_mean_bytes": sum(map(len, encoded)) / len(encoded),
    }


def main() -> None:
    args = parse(__doc__ or "")
    n = 2_000 if args.smoke else 100_000 if args.quick else 1_000_000
    repeats = 1 if args.smoke else 3 if args.quick else args.repeats
    envs = workload(n)
    gc.freeze()  # the input data is not what is measured: keep the collector from rescanning it
    result: dict[str, object] = {"benchmark": "codec", "events": n, "repeats": repeats, **machine()}
    result |= measure(envs, "msgpack", repeats)
    result |= measure(envs, "json", repeats)
    raw = [encode(e, "json") for e in envs]
    baseline = median_rate(lambda: len([json.loads(b) for b in raw]), repeats)
    result["stdlib_json_loads_events_per_s"] = baseline
    result["msgpack_decode_vs_stdlib_json"] = round(result["msgpack_decode_events_per_s"] / baseline, 2)  # type: ignore[operator]
    emit(result, args.json)


if __name__ == "__main__":
    main()
