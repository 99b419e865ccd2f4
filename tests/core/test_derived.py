"""``state.derived`` is droppable: rebuilt from the rest of the state (``Derived.of``) at any point,
it changes no later decision and no digest; snapshots and digests never see it; and ``decide``
writes nothing else of the state."""

from __future__ import annotations

import random

import pytest

from fleetlog.core.decide import decide
from fleetlog.core.digest import digest, restore, snapshot
from fleetlog.core.fold_batch import fold_fast, fold_lists
from fleetlog.core.invariants import check
from fleetlog.core.memo import MemoCache
from fleetlog.core.policy import Policy
from fleetlog.core.state import CoreConfig, Derived, State
from fleetlog.events import DecisionBatch, Event, JobPlaced
from tests.core.builders import job, node
from tests.core.test_decide_fast import inputs

CONFIG = CoreConfig(node_timeout_ms=3_000, shape_window=64, shape_mix_every=16)
# the same heartbeat objects again and again: the steady case the batch fold caches
STEADY = [node(f"n{i}", gpus=(2, 4, 8)[i % 3], cpu=(16_000, 64_000)[i % 2], cell="c0") for i in range(12)]


def step_inputs(rng: random.Random, step: int, placed: list[str]) -> list[Event]:
    """Arrivals, finishes and node changes, then every node's steady heartbeat (most steps)."""
    events = inputs(rng, step, placed, cells=1)
    if rng.random() < 0.9:  # (else a gap: the nodes go silent past the timeout)
        events.extend(STEADY)
    return events


def run(policy: Policy, seed: int, drop_at: set[int], steps: int = 40) -> list[tuple[list[object], str]]:
    """Fold, decide and fold the batch as the service loop does, ``steps`` times; before the
    steps in ``drop_at``, the derived caches are replaced by ones rebuilt from the state."""
    rng, state, placed, now = random.Random(seed), State(CONFIG), [], 1_000
    seen = []
    for step in range(steps):
        events = step_inputs(rng, step, placed)
        now += rng.choice([200, 900, 4_000])  # some steps past the node timeout
        fold_lists(state, events, [now] * len(events))
        if step in drop_at:
            state.derived = Derived.of(state)
        got = decide(state, policy)
        fold_fast(state, DecisionBatch(as_of=state.offset, digest=digest(state), decisions=tuple(got)), now)
        check(state)
        placed.extend(d.job_id for d in got if isinstance(d, JobPlaced) and len(d.tasks) == 1)
        seen.append((list(got), digest(state)))
    return seen


POLICIES = [Policy(), Policy(name="best-fit", scoring="best-fit")]


@pytest.mark.parametrize("policy", POLICIES, ids=["fgd", "best-fit"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_dropping_the_derived_caches_mid_run_changes_no_decision_or_digest(policy: Policy, seed: int) -> None:
    kept = run(policy, seed, drop_at=set())
    assert sum(isinstance(d, JobPlaced) for got, _ in kept for d in got) > 20  # (a run that places)
    for drop_at in ({7}, {3, 19, 20, 31}, set(range(40))):
        dropped = run(policy, seed, drop_at)
        for step, (a, b) in enumerate(zip(kept, dropped, strict=True)):
            assert a == b, f"seed {seed}: dropping state.derived at {sorted(drop_at)} changed step {step}"


def _busy_state() -> State:
    state, rng, placed = State(CONFIG), random.Random(5), []
    for step in range(12):
        events = step_inputs(rng, step, placed)
        fold_lists(state, events, [1_000 + 500 * step] * len(events))
        got = decide(state, Policy())
        fold_fast(state, DecisionBatch(as_of=state.offset, digest="", decisions=tuple(got)), state.now_ms)
        placed.extend(d.job_id for d in got if isinstance(d, JobPlaced) and len(d.tasks) == 1)
    return state


def test_decide_writes_only_the_derived_caches() -> None:
    """decide's docstring: the state the snapshot holds is unchanged; only ``state.derived``
    (memos, key ids) is written."""
    state = _busy_state()
    arrivals = [node("fresh", gpus=8, cpu=64_000), *(job(f"late{k}", gpus=k % 3) for k in range(6))]
    fold_lists(state, arrivals, [state.now_ms] * len(arrivals))
    state.derived = Derived()
    before = snapshot(state)
    assert any(isinstance(d, JobPlaced) for d in decide(state, Policy()))
    assert snapshot(state) == before
    assert state.derived.decide_memo is None or isinstance(state.derived.decide_memo, MemoCache)
    assert state.derived.key_ids
    assert state.derived.fit_memo is not None


def test_snapshots_and_digests_hold_no_derived_cache() -> None:
    """A snapshot and a digest are the same with the caches full or dropped; a restored state
    starts with caches rebuilt from its reason texts (nothing else)."""
    state = _busy_state()
    assert state.derived.beat_cache
    assert state.derived.job_keys.col.max() >= 0
    full_snapshot, full_digest = snapshot(state), digest(state)
    state.derived = Derived()
    assert (snapshot(state), digest(state)) == (full_snapshot, full_digest)
    back = restore(full_snapshot)
    assert not back.derived.beat_cache
    assert not back.derived.key_ids
    assert back.derived.decide_memo is None
    assert sorted(back.derived.text_index) == sorted(set(back.reason_text.values()))


# Every attribute of State, by how a snapshot carries it. A new attribute must be placed here:
# snapshotted (real state), rebuilt on restore from what is snapshotted, or derived.
SNAPSHOTTED = {
    "config", "now_ms", "offset", "next_sweep_ms", "nodes", "jobs", "tasks", "names", "job_cells",
    "usage", "quotas", "recent_shapes", "recent_next", "shape_mix", "shape_mix_cpu", "shapes_seen", "mix_due",
    "reason_text", "reason_codes", "pending_count", "requeues", "job_meta", "duplicates", "ignored",
    "observations",
    "dispatches", "dispatched_seq", "returned", "summaries", "retired_order", "retired_rows",
    "retired_counts", "node_attrs", "classes", "node_foreign", "drained",
}  # fmt: skip
REBUILT_ON_RESTORE = {
    "shape_stats",
    "sums",
    "held",
    "next_return_ms",
    "retired",
    "class_ids",
}  # (from recent_shapes; the collections; dispatches; retired_order; classes)
DERIVED = {"derived"}


def test_every_state_attribute_is_snapshotted_rebuilt_or_derived() -> None:
    assert set(vars(State())) == SNAPSHOTTED | REBUILT_ON_RESTORE | DERIVED
    assert set(Derived.__slots__) == {
        "job_keys", "key_ids", "text_ids", "text_index", "beat_cache", "steady_ids", "steady_gone",
        "fit_memo", "decide_memo", "attrs_version", "eligibility", "policy_roles", "shape_rows", "meta_bytes",
    }  # fmt: skip
