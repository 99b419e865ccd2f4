"""Same log, same decisions, same digest: in a fresh process, under any hash seed, after restore."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from fleetlog.core.digest import _column_hash, _column_hashes, digest, restore, snapshot
from fleetlog.core.fold import fold
from tests.core.builders import Driver, job, node, quota

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import json
from tests.core.test_determinism import scenario
d = scenario()
print(json.dumps([b.digest for b in d.batches] + [len(b.decisions) for b in d.batches]))
"""


def scenario() -> Driver:
    d = Driver()
    d.feed(
        *[
            node(f"n{i}", gpus=8 if i % 3 else 2, rack=f"r{i % 4}", model=("A100", "T4")[i % 2])
            for i in range(24)
        ]
    )
    d.feed(quota("alpha", 40, cohort="co"), quota("beta", 20, cohort="co"), quota("gamma", 8))
    for round_ in range(4):
        for i in range(30):
            tenant = ("alpha", "beta", "gamma", "delta")[i % 4]
            d.feed(
                job(
                    f"j{round_}-{i}",
                    tenant=tenant,
                    tasks=1 + i % 3,
                    gpus=(1, 2, 8)[i % 3],
                    milli=(250, 1000, 1000)[i % 3],
                    priority=i % 2,
                    topology="rack" if i % 5 == 0 else None,
                )
            )
        d.decide()
    return d


def test_same_decisions_under_different_hash_seeds() -> None:
    outputs = []
    for seed in ("0", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, check=True
        )
        outputs.append(json.loads(out.stdout))
    local = scenario()
    assert (
        outputs[0]
        == outputs[1]
        == [b.digest for b in local.batches] + [len(b.decisions) for b in local.batches]
    )
    assert sum(len(b.decisions) for b in local.batches) > 50


def test_snapshot_restore_at_every_batch_gives_the_same_future() -> None:
    d = scenario()
    assert digest(restore(snapshot(d.state))) == digest(d.state)
    d2 = Driver()
    d2.state = restore(snapshot(d.state))
    d2.now_ms = d.now_ms
    for target in (d, d2):
        target.feed(job("late", tasks=2, gpus=2), node("n0", gpus=2))
        target.decide()
    assert d.batches[-1] == d2.batches[-1]
    assert digest(d.state) == digest(d2.state)


def test_corrupt_snapshot_is_refused() -> None:
    import pytest

    from fleetlog.core.digest import SnapshotError

    data = bytearray(snapshot(scenario().state))
    data[len(data) // 2] ^= 0xFF
    with pytest.raises(SnapshotError):
        restore(bytes(data))
    with pytest.raises(SnapshotError):
        restore(b"not a snapshot")


def test_a_snapshot_of_the_previous_format_is_refused_by_name() -> None:
    """Formats 1 to 4 carried digests of older definitions: refused as old, not as corrupt."""
    import msgspec
    import pytest

    from fleetlog.core.digest import SNAPSHOT_FORMAT, SnapshotError

    body = msgspec.msgpack.decode(snapshot(scenario().state))
    assert body["format"] == SNAPSHOT_FORMAT == 5
    for old in (1, 2, 3, 4):
        body["format"] = old
        with pytest.raises(
            SnapshotError, match=f"snapshot format {old} is not 5 \\(taken by an older fleetlog\\)"
        ):
            restore(msgspec.msgpack.encode(body))


def test_fold_digest_changes_with_every_input() -> None:
    d = Driver()
    seen = {digest(d.state)}
    for event in (node("a"), node("b"), job("x"), quota("t", 1)):
        fold(d.state, event, 5)
        seen.add(digest(d.state))
    assert len(seen) == 5


def _padded_words_hash(col: np.ndarray) -> int:
    """The column hash as defined: the column's bytes zero-padded to whole little-endian words,
    word i mixed into lane i % 4, then the four lanes and the word count mixed in order."""
    raw = np.ascontiguousarray(col).view(np.uint8).ravel()
    padded = np.zeros((raw.size + 7) // 8 * 8, dtype=np.uint8)
    padded[: raw.size] = raw
    seed, mask = 0x9E3779B97F4A7C15, 2**64 - 1

    def mix(h: int, word: int) -> int:
        h = ((h ^ word) * 0xBF58476D1CE4E5B9) & mask
        return h ^ (h >> 31)

    words = padded.view(np.uint64).tolist()
    lanes = [(seed + k) & mask for k in (1, 2, 3, 4)]
    for i, word in enumerate(words):
        lanes[i % 4] = mix(lanes[i % 4], word)
    out = seed
    for lane in lanes:
        out = mix(out, lane)
    return mix(out, len(words))


def test_column_hash_is_the_padded_words_hash() -> None:
    """Whole words are hashed in place and only a partial last word is padded: the same value as
    hashing a zero-padded copy, for every dtype and length (the digest of recorded logs)."""
    rng = np.random.default_rng(7)
    for dtype in (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint64):
        for rows in (0, 1, 3, 7, 8, 9, 17):
            for shape in ((rows,), (rows, 3)):
                col = rng.integers(0, 1 << 7, shape).astype(dtype)
                assert _column_hash(col) == _padded_words_hash(col), (dtype, shape)


def test_the_columns_hashed_in_one_call_are_each_the_padded_words_hash() -> None:
    """``_column_hashes`` (every column of a digest in one kernel call, each copied after the
    last one's zero-padded tail): each value is that column's own hash — every dtype, lengths
    of 0 to 17 rows, slices that are not contiguous (the GPU shares up to the widest node: 0, 1
    or 3 of 5 GPUs; 1 is a strided view, not a copy), one column alone, none."""
    rng = np.random.default_rng(11)
    cols = []
    for dtype in (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint64):
        for rows in (0, 1, 3, 7, 8, 9, 17):
            cols.append(rng.integers(0, 1 << 7, (rows,)).astype(dtype))
            cols.append(rng.integers(0, 1 << 7, (rows, 5)).astype(dtype)[:, :3])
            cols.append(rng.integers(0, 1 << 7, (rows, 5)).astype(dtype)[:, :1])  # (a strided 1-D view)
            cols.append(rng.integers(0, 1 << 7, (rows, 5)).astype(dtype)[:, :0])
    rng.shuffle(cols)  # (every dtype after every other: the padding between them varies)
    assert _column_hashes(cols) == [_padded_words_hash(col) for col in cols]
    assert _column_hashes(cols[:1]) == [_padded_words_hash(cols[0])]
    assert _column_hashes([]) == []
