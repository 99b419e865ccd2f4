"""A stable digest of the whole state, and snapshots to bytes and back.

The digest hashes the used rows of every table, the interned names, quotas,
usage, the shape window and the clock — the same log gives the same digest in
any process, whatever its hash seed.  Snapshots also carry ``State.requeues`` (why waiting
jobs were requeued), a cell shard's ``State.summaries`` (the last summary written per cell),
the jobs' labels and annotations, the last ``PolicySet`` (the API's authorization policy) and why
task reports were ignored (``State.observations``), which the digest leaves out: no decision reads them.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any, Final

import msgspec
import numba
import numpy as np
import numpy.typing as npt

from fleetlog.core.arrays import Interner, Table
from fleetlog.core.constraints import ClassKey, NodeAttrs
from fleetlog.core.fold import count_shape, rebuild_held
from fleetlog.core.observations import Observations
from fleetlog.core.state import (
    BEFORE_FIELDS,
    SUM_CLASSES,
    SUM_DISPATCHES,
    SUM_JOB_CELLS,
    SUM_NODE_ATTRS,
    SUM_NODE_FOREIGN,
    SUM_REASON_TEXT,
    SUM_RECENT_SHAPES,
    SUM_RETIRED,
    SUM_RETURNED,
    CoreConfig,
    Derived,
    JobMeta,
    JobState,
    Quota,
    Requeue,
    State,
    collection_sums,
)
from fleetlog.events.model import CellSummary, JobReturned, PolicySet
from fleetlog.events.spec import Requirement

SNAPSHOT_FORMAT: Final = 5
"""2 since the digest became fold-kept entry sums and four-lane column hashes (2026-11-30), 3
since the state holds the shape mix fold takes at intervals (2026-11-30), 4 since jobs retire
(2026-12-03: the ``ended_at_ms`` column, the retired ids and counters, the retirement settings
in the config), 5 since placement constraints (2026-12-03: the tasks' ``cls`` column, the
constraint classes, the nodes' labels, taints and cordons; a class's soft affinity terms and a
job's spread, in the same development round): an older snapshot carries a digest of an older
definition. (The shape mix's view by CPU, 2026-12-06, kept the format: a snapshot without it
restores with ``CoreConfig.shape_cpu_rows`` 0, see ``BEFORE_FIELDS``.)"""
_TABLES: Final = ("nodes", "jobs", "tasks")


class SnapshotError(ValueError):
    """Bytes that are not a valid snapshot of this format."""


def _small_scalars(state: State, full: bool = True) -> dict[str, Any]:
    """The scalars but the big collections; a cell shard's dispatched jobs in full, or (not
    ``full``: the digest's) by size and running sum."""
    return {
        "config": _config(state.config),
        "now_ms": state.now_ms,
        "offset": state.offset,
        "next_sweep_ms": state.next_sweep_ms,
        "usage": sorted(state.usage.items()),
        "quotas": sorted([list(k), msgspec.to_builtins(q)] for k, q in state.quotas.items()),
        "recent_next": state.recent_next,
        "shape_mix": [list(row) for row in state.shape_mix],
        "shape_mix_due": [state.shapes_seen, state.mix_due],
        "counters": [state.pending_count, state.duplicates, state.ignored, state.retired_rows],
        "retired_counts": sorted(state.retired_counts.items()),
    } | _cell_shard(state, full) | _constraints(state, full) | _foreign(state, full) | _drained(state) | (
        _cpu_view(state)
    )


def _cpu_view(state: State) -> dict[str, Any]:
    """The shape mix's view by CPU, once it has a row (a state without one snapshots and digests
    as before the view existed)."""
    return {"shape_mix_cpu": [list(row) for row in state.shape_mix_cpu]} if state.shape_mix_cpu else {}


def _drained(state: State) -> dict[str, Any]:
    """The nodes an operator drained, in full (a few; only when any is: a log without drains
    digests as before)."""
    return {"drained": sorted([row, list(d)] for row, d in state.drained.items())} if state.drained else {}


def _foreign(state: State, full: bool) -> dict[str, Any]:
    """What foreign work holds on the nodes, in full or by size and running sum (only when
    any does: a log without it digests as before)."""
    if not state.node_foreign:
        return {}
    if not full:
        return {"node_foreign": [len(state.node_foreign), state.sums[SUM_NODE_FOREIGN]]}
    return {"node_foreign": sorted(state.node_foreign.items())}


def _constraints(state: State, full: bool) -> dict[str, Any]:
    """The nodes' labels, taints and cordons and the constraint classes, in full or by size
    and running sum (only when there are any: a log without them digests as before)."""
    if not state.node_attrs and len(state.classes) == 1:
        return {}
    if not full:
        return {
            "node_attrs": [len(state.node_attrs), state.sums[SUM_NODE_ATTRS]],
            "classes": [len(state.classes), state.sums[SUM_CLASSES]],
        }
    return {"node_attrs": sorted(state.node_attrs.items()), "classes": state.classes[1:]}


def _config(config: CoreConfig) -> dict[str, Any]:
    """The config, less the fields added since at the values that behave as before them
    (``BEFORE_FIELDS``: a digest stays what it was before they existed)."""
    raw: dict[str, Any] = msgspec.to_builtins(config)
    for name, default in BEFORE_FIELDS.items():
        if getattr(config, name) == default:
            del raw[name]
    return raw


def _cell_shard(state: State, full: bool) -> dict[str, Any]:
    """A cell shard's dispatched jobs, in full or by size and running sum, like the big
    collections (only once it folded a dispatch: a single shard has none, and its digest is
    unchanged). Not sorted in full for a digest: that was O(jobs dispatched) per batch."""
    if not state.dispatches and not state.dispatched_seq:
        return {}
    if not full:
        return {
            "dispatches": [len(state.dispatches), state.sums[SUM_DISPATCHES]],
            "dispatched_seq": sorted(state.dispatched_seq.items()),
            "returned": [len(state.returned), state.sums[SUM_RETURNED]],
        }
    return {
        "dispatches": sorted([row, list(d)] for row, d in state.dispatches.items()),
        "dispatched_seq": sorted(state.dispatched_seq.items()),
        "returned": sorted([row, msgspec.to_builtins(r)] for row, r in state.returned.items()),
    }


def _scalars(state: State) -> dict[str, Any]:
    """Everything but the columns, in full (a snapshot's scalars)."""
    return {
        **_small_scalars(state),
        "names": {k: v.state() for k, v in sorted(state.names.items())},
        "reason_codes": state.reason_codes.state(),
        # msgpack writes tuples and lists alike: sorting the items as they are is the same bytes
        "job_cells": sorted(state.job_cells.items()),
        "recent_shapes": state.recent_shapes,
        "reason_text": sorted(state.reason_text.items()),
        # the dedup window in retirement order (an entry of an id that retired again is stale)
        "retired": list(state.retired_order),  # ((at, id) tuples: the bytes of [at, id] lists)
        # why waiting jobs were requeued: snapshotted for status, not digested (no decision reads it)
        "requeues": sorted([row, msgspec.to_builtins(r)] for row, r in state.requeues.items()),
    } | _summaries(state) | _job_meta(state) | _policy(state) | _observations(state)


def _observations(state: State) -> dict[str, Any]:
    """Why task reports were ignored (snapshotted for status and the metric, not digested: no
    decision reads it; a state with none has no key, and its snapshot is what it was)."""
    return {"observations": state.observations.to_builtins()} if state.observations else {}


def _policy(state: State) -> dict[str, Any]:
    """The last ``PolicySet`` (snapshotted, not digested: no decision reads it; a state with none has
    no key, and its snapshot is what it was)."""
    return {} if state.policy is None else {"policy": msgspec.to_builtins(state.policy)}


def _job_meta(state: State) -> dict[str, Any]:
    """The jobs' labels and annotations (snapshotted, not digested: no decision reads them; a
    state with none has no key, and its snapshot is what it was): a copy of the map, its entries
    sorted and encoded by :func:`_meta_entries` when the snapshot is encoded (fold replaces an
    entry or drops it, never changes one, so the copy is a consistent view of now)."""
    return {"job_meta": dict(state.job_meta)} if state.job_meta else {}


def _meta_entries(job_meta: dict[int, JobMeta]) -> list[msgspec.Raw]:
    """Each job's ``[row, labels' items sorted, annotations' items sorted]``, by row, each
    encoded on its own: the bytes of the list encoded whole, but in many short calls, so a
    snapshot encoded in a thread lets the event loop run between them."""
    encode = msgspec.msgpack.encode
    return [msgspec.Raw(encode([row, sorted(labels.items()), sorted(notes.items())]))
            for row, (labels, notes) in sorted(job_meta.items())]


def _summaries(state: State) -> dict[str, Any]:
    """A cell shard's last summary written per cell (snapshotted, not digested; a single shard
    has none, and its snapshot is unchanged)."""
    if not state.summaries:
        return {}
    return {"summaries": sorted([c, msgspec.to_builtins(s)] for c, s in state.summaries.items())}


def _columns(state: State) -> list[tuple[str, str, bytes]]:
    out = []
    for table in _TABLES:
        t: Table = getattr(state, table)
        for name in t.spec:
            col = t.view(name)
            out.append((f"{table}.{name}", col.dtype.str, np.ascontiguousarray(col).tobytes()))
    return out


_HASH_SEED: Final = np.uint64(0x9E3779B97F4A7C15)
_LANES: Final = 4


@numba.njit(cache=True, inline="always")
def _mix(h: np.uint64, word: np.uint64) -> np.uint64:
    h = (h ^ word) * np.uint64(0xBF58476D1CE4E5B9)
    return h ^ (h >> np.uint64(31))


@numba.njit(cache=True)
def _hash_words(words: npt.NDArray[np.uint64], tail: npt.NDArray[np.uint64]) -> np.uint64:
    """A 64-bit multiply-xorshift hash of the words of ``words`` then ``tail`` (integer only,
    order-sensitive). Word ``i`` goes to lane ``i % 4``: four independent chains keep the
    multiplier busy instead of waiting on one chain; then the lanes and the word count are
    mixed into one value, in order."""
    h0, h1 = _HASH_SEED + np.uint64(1), _HASH_SEED + np.uint64(2)
    h2, h3 = _HASH_SEED + np.uint64(3), _HASH_SEED + np.uint64(4)
    n = words.shape[0]
    whole = n - n % _LANES
    for i in range(0, whole, _LANES):
        h0 = _mix(h0, words[i])
        h1 = _mix(h1, words[i + 1])
        h2 = _mix(h2, words[i + 2])
        h3 = _mix(h3, words[i + 3])
    rest = np.empty(n - whole + tail.shape[0], dtype=np.uint64)
    rest[: n - whole] = words[whole:]
    rest[n - whole :] = tail
    for i in range(rest.shape[0]):  # at most 4 words: lanes 0, 1, 2, 3 in turn
        if i == 0:
            h0 = _mix(h0, rest[i])
        elif i == 1:
            h1 = _mix(h1, rest[i])
        elif i == 2:
            h2 = _mix(h2, rest[i])
        else:
            h3 = _mix(h3, rest[i])
    out = _mix(_mix(_mix(_mix(_HASH_SEED, h0), h1), h2), h3)
    return _mix(out, np.uint64(n + tail.shape[0]))


_NO_TAIL: Final = np.zeros(0, dtype=np.uint64)


_JIT_OFF: Final = bool(numba.config.DISABLE_JIT)  # type: ignore[attr-defined]


def _column_hash(col: npt.NDArray[Any]) -> int:
    """The hash of the column's bytes as little-endian words, the last one zero-padded: whole
    words are hashed in place, only a partial last word is copied. (A digest hashes some 40
    columns: the common case — contiguous, whole words — takes the fewest numpy calls.)"""
    raw = col if col.flags.c_contiguous else np.ascontiguousarray(col)
    if raw.nbytes % 8 == 0:
        words, tail = raw.reshape(-1).view(np.uint64), _NO_TAIL
    else:
        flat = raw.reshape(-1).view(np.uint8)
        whole = flat.size // 8 * 8
        padded = np.zeros(8, dtype=np.uint8)
        padded[: flat.size - whole] = flat[whole:]
        words, tail = flat[:whole].view(np.uint64), padded.view(np.uint64)
    if _JIT_OFF:
        with np.errstate(over="ignore"):  # the multiply wraps on purpose (warns only with the JIT off)
            return int(_hash_words(words, tail))
    return int(_hash_words(words, tail))


def _hashed_columns(state: State) -> list[tuple[str, npt.NDArray[Any]]]:
    """The columns the digest covers: every used row of every column, except that GPU shares
    are taken only up to the most GPUs any node has (the rest of each row is zero: set by
    fold, never written)."""
    out = []
    width = int(state.nodes.view("gpu_count").max(initial=0))
    for table in _TABLES:
        t: Table = getattr(state, table)
        size = t.size
        for name, col in t.cols.items():  # (the spec's order: Table builds ``cols`` from it)
            out.append((f"{table}.{name}", col[:size, :width] if name == "gpu_free" else col[:size]))
    return out


@functools.lru_cache(maxsize=256)
def _column_label(name: str, dtype: np.dtype[Any]) -> str:
    return f"{name}:{dtype.str}:"


def digest(state: State) -> str:
    """Hex BLAKE2b-256 over the scalars and a 64-bit hash of every column's used rows.

    Columns are hashed by a numba kernel, all in one call (:func:`_column_hashes`); interned
    names carry a running hash kept as they are interned, and the big collections (pending
    reasons, allowed cells, the shape window) an order-free sum of entry hashes kept by fold —
    so a digest costs about what hashing the columns costs, whatever the number of pending
    jobs.
    """
    h = hashlib.blake2b(digest_size=32)
    h.update(msgspec.msgpack.encode(_digest_scalars(state)))
    columns = _hashed_columns(state)
    hashes = _column_hashes([col for _, col in columns])
    # (one update of the lines joined: the same bytes as one update per column)
    lines = [
        f"{_column_label(name, col.dtype)}{col.shape}:{value}"
        for (name, col), value in zip(columns, hashes, strict=True)
    ]
    h.update("".join(lines).encode())
    return h.hexdigest()


@numba.njit(cache=True)
def _hash_spans(words: npt.NDArray[np.uint64], ends: npt.NDArray[np.int64]) -> npt.NDArray[np.uint64]:
    """:func:`_hash_words` of each span of ``words`` (span ``k`` ends at ``ends[k]``)."""
    out = np.empty(ends.shape[0], dtype=np.uint64)
    none = np.empty(0, dtype=np.uint64)
    start = 0
    for k in range(ends.shape[0]):
        out[k] = _hash_words(words[start : ends[k]], none)
        start = ends[k]
    return out


_PADS: Final = [np.zeros(k, dtype=np.uint8) for k in range(8)]


def _column_hashes(cols: list[npt.NDArray[Any]]) -> list[int]:
    """:func:`_column_hash` of each of ``cols``, in one kernel call: each column's bytes copied
    into one buffer of words, its last word zero-padded (hashing a column's whole words then
    its padded tail is hashing the two as one run of words), the spans hashed together."""
    parts, spans, at = [], [], 0
    for col in cols:
        n = col.nbytes
        raw = col if col.flags.c_contiguous else np.ascontiguousarray(col)  # (GPU shares up to a width)
        parts.append(raw.reshape(-1).view(np.uint8))
        if n % 8:
            parts.append(_PADS[8 - n % 8])
        at += (n + 7) // 8
        spans.append(at)
    words = np.concatenate(parts).view(np.uint64) if parts else _NO_TAIL
    ends = np.array(spans, dtype=np.int64)
    if _JIT_OFF:
        with np.errstate(over="ignore"):  # (as in _column_hash)
            return _hash_spans(words, ends).tolist()  # type: ignore[no-any-return]
    return _hash_spans(words, ends).tolist()  # type: ignore[no-any-return]


def _digest_scalars(state: State) -> dict[str, Any]:
    """The scalars as in a snapshot, but names by their running hashes (they only grow) and
    the big collections by their sizes and running entry sums."""
    out = _small_scalars(state, full=False)
    out["names"] = {k: [len(v), v.running_hash()] for k, v in sorted(state.names.items())}
    out["reason_codes"] = [len(state.reason_codes), state.reason_codes.running_hash()]
    out["job_cells"] = [len(state.job_cells), state.sums[SUM_JOB_CELLS]]
    out["recent_shapes"] = [len(state.recent_shapes), state.sums[SUM_RECENT_SHAPES]]
    out["reason_text"] = [len(state.reason_text), state.sums[SUM_REASON_TEXT]]
    out["retired"] = [len(state.retired), state.sums[SUM_RETIRED]]
    return out


def snapshot(state: State) -> bytes:
    """The state as bytes; :func:`restore` gives back a state with the same digest."""
    return encode_parts(snapshot_parts(state))


def snapshot_parts(state: State) -> dict[str, Any]:
    """What :func:`snapshot` encodes, taken off the state: the columns copied, the collections
    sorted or copied, the digest computed — nothing a later fold changes — so that
    :func:`encode_parts` may run in a thread while the loop folds on (the service's snapshots,
    issue 46).  The costly part, the jobs' labels and annotations, is left to ``encode_parts``."""
    encode = msgspec.msgpack.encode  # (each scalar as its bytes: some hold live lists of the state)
    scalars = {k: v if k == "job_meta" else msgspec.Raw(encode(v)) for k, v in _scalars(state).items()}
    return {
        "format": SNAPSHOT_FORMAT,
        "scalars": scalars,
        "columns": _columns(state),
        "sizes": {t: getattr(state, t).size for t in _TABLES},
        "digest": digest(state),
    }


def encode_parts(parts: dict[str, Any]) -> bytes:
    """The snapshot bytes of :func:`snapshot_parts` (pure: reads only ``parts``)."""
    scalars = parts["scalars"]
    if "job_meta" in scalars:  # (the same key, the same place: the bytes of a whole-list encode)
        scalars = scalars | {"job_meta": _meta_entries(scalars["job_meta"])}
    return msgspec.msgpack.encode(parts | {"scalars": scalars})


def restore(data: bytes) -> State:
    """Rebuild a state from :func:`snapshot` bytes; checks the digest it carries."""
    try:
        body = msgspec.msgpack.decode(data)
        if body["format"] != SNAPSHOT_FORMAT:
            raise SnapshotError(
                f"snapshot format {body['format']} is not {SNAPSHOT_FORMAT} (taken by an older fleetlog)"
            )
        state = _restore_scalars(body["scalars"])
        _restore_columns(state, body["sizes"], body["columns"])
        # the ids of retired jobs' rows stay released (their slots wait for a compaction)
        retired = np.flatnonzero(state.jobs.view("state") == int(JobState.RETIRED))
        state.names["job"] = Interner.restore(state.names["job"].names, retired.tolist())
        rebuild_held(state)
    except (msgspec.DecodeError, LookupError, TypeError, ValueError, AttributeError, RecursionError) as exc:
        raise SnapshotError(f"not a fleetlog snapshot: {exc}") from exc
    if digest(state) != body["digest"]:
        raise SnapshotError("snapshot digest does not match its contents")
    return state


def _restore_scalars(s: dict[str, Any]) -> State:
    state = State(msgspec.convert(BEFORE_FIELDS | s["config"], CoreConfig))
    state.now_ms, state.offset, state.next_sweep_ms = s["now_ms"], s["offset"], s["next_sweep_ms"]
    state.names = {k: Interner.restore(v) for k, v in s["names"].items()}
    state.reason_codes = Interner.restore(s["reason_codes"])
    state.job_cells = {k: tuple(v) for k, v in s["job_cells"]}
    state.usage = {(k[0], k[1]): v for k, v in s["usage"]}
    state.quotas = {(k[0], k[1]): _quota(q) for k, q in s["quotas"]}
    state.recent_shapes = [(a, b, c) for a, b, c in s["recent_shapes"]]
    state.recent_next = s["recent_next"]
    state.shape_mix = tuple((a, b, c, d) for a, b, c, d in s["shape_mix"])
    state.shape_mix_cpu = tuple((a, b, c, d) for a, b, c, d in s.get("shape_mix_cpu", ()))
    state.shapes_seen, state.mix_due = s["shape_mix_due"]
    for shape in state.recent_shapes:
        count_shape(state, shape, 1)
    state.reason_text = dict(s["reason_text"])
    state.requeues = {row: msgspec.convert(r, Requeue) for row, r in s.get("requeues", ())}
    state.job_meta = {row: (dict(labels), dict(notes)) for row, labels, notes in s.get("job_meta", ())}
    state.policy = msgspec.convert(s["policy"], PolicySet) if "policy" in s else None
    state.observations = Observations.restore(s.get("observations"))
    state.derived = Derived.of(state)
    state.dispatches = {row: (a, b, c, d) for row, (a, b, c, d) in s.get("dispatches", ())}
    state.dispatched_seq = dict(s.get("dispatched_seq", ()))
    state.returned = {row: msgspec.convert(r, JobReturned) for row, r in s.get("returned", ())}
    state.summaries = {c: msgspec.convert(v, CellSummary) for c, v in s.get("summaries", ())}
    state.pending_count, state.duplicates, state.ignored, state.retired_rows = s["counters"]
    state.retired_counts = {tenant: list(counts) for tenant, counts in s["retired_counts"]}
    order = [(at, name) for at, name in s["retired"]]
    state.retired_order.extend(order)
    state.retired = {name: at for at, name in order}  # (a later entry of the same id: the later time)
    state.node_attrs = {row: _attrs(a) for row, a in s.get("node_attrs", ())}
    state.node_foreign = {row: (a, b, c, d, e, f) for row, (a, b, c, d, e, f) in s.get("node_foreign", ())}
    state.drained = {row: (str(reason), bool(own)) for row, (reason, own) in s.get("drained", ())}
    for key in s.get("classes", ()):
        state.class_ids[_class(key)] = len(state.classes)
        state.classes.append(_class(key))
    state.sums = collection_sums(state)
    return state


def _attrs(a: list[Any]) -> NodeAttrs:
    labels, taints, cordoned = a
    return tuple((k, v) for k, v in labels), tuple((k, v, e) for k, v, e in taints), bool(cordoned)


def _class(c: list[Any]) -> ClassKey:
    selector, terms, tolerations, preferred = c
    return (
        tuple((k, v) for k, v in selector),
        tuple(_term(term) for term in terms),
        tuple((k, op, v, e) for k, op, v, e in tolerations),
        tuple((_term(term), int(weight)) for term, weight in preferred),
    )


def _term(term: list[Any]) -> tuple[Requirement, ...]:
    return tuple((k, op, tuple(values)) for k, op, values in term)


def _quota(q: dict[str, Any]) -> Quota:
    limit = q["borrowing_limit"]
    return Quota(tuple(q["nominal"]), None if limit is None else tuple(limit), q["cohort"], q["weight_milli"])


def _restore_columns(state: State, sizes: dict[str, int], columns: list[list[Any]]) -> None:
    for table in _TABLES:
        getattr(state, table).add(sizes[table])
    for name, dtype, data in columns:
        table, col = name.split(".", 1)
        t: Table = getattr(state, table)
        t.view(col)[...] = np.frombuffer(data, dtype=np.dtype(dtype)).reshape(t.view(col).shape)
