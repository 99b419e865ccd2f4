"""Retirement and compaction (``CoreConfig.retain_finished_ms``, docs/retention.md).

Seeded long logs where most jobs end — with pending jobs that wait across many compactions,
resends within and after the dedup window, observations of retired jobs, outages longer than
the retention — folded by a retiring state and by a twin that keeps everything: the same
decisions at every step until a resend comes after its window; the retiring state's log
replayed one event at a time, in batches cut anywhere, and from a snapshot taken anywhere
gives every recorded digest again.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np
import pytest

from fleetlog.core.decide import decide
from fleetlog.core.digest import digest, restore, snapshot
from fleetlog.core.fold import fold
from fleetlog.core.fold_batch import fold_lists
from fleetlog.core.invariants import check
from fleetlog.core.policy import Policy
from fleetlog.core.state import CoreConfig, JobState, State
from fleetlog.core.views import job_status, jobs_table, tenants_table
from fleetlog.events import (
    DecisionBatch,
    Event,
    JobCancelled,
    JobDispatched,
    TaskFailed,
    TaskFinished,
    TaskStarted,
)
from tests.core.builders import job, node

RETIRING = CoreConfig(node_timeout_ms=4_000, retain_finished_ms=3_000, dedup_window_ms=10_000,
                      compact_min_rows=8)
KEEP_ALL = CoreConfig(node_timeout_ms=4_000, retain_finished_ms=None)
POLICY = Policy()


@dataclass
class Twins:
    """A retiring state and one that keeps every job, fed the same log; the retiring state's
    log (events and its decision batches) recorded for replay."""

    seed: int
    state: State = field(default_factory=lambda: State(RETIRING))
    plain: State = field(default_factory=lambda: State(KEEP_ALL))
    now_ms: int = 0
    log: list[tuple[int, Event]] = field(default_factory=list)
    same: bool = True
    compactions: int = 0

    def apply(self, event: Event, step_ms: int) -> None:
        self.now_ms += step_ms
        rows = self.state.jobs.size
        for s in (self.state, self.plain):
            fold(s, event, self.now_ms)
        self.log.append((self.now_ms, event))
        self.compactions += self.state.jobs.size < rows

    def step(self) -> None:
        decisions = tuple(decide(self.state, POLICY))
        own = tuple(decide(self.plain, POLICY))
        if self.same:
            assert own == decisions, f"seed {self.seed}: the twins decided apart at {self.now_ms} ms"
        batch = DecisionBatch(as_of=self.state.offset, digest=digest(self.state), decisions=decisions)
        fold(self.state, batch, self.now_ms)
        fold(self.plain, DecisionBatch(as_of=self.plain.offset, digest="", decisions=own), self.now_ms)
        self.log.append((self.now_ms, batch))


def running(state: State) -> list[int]:
    return np.flatnonzero(state.jobs.view("state") == JobState.RUNNING).tolist()  # type: ignore[no-any-return]


def run(seed: int, events: int = 500, forgotten: bool = False) -> Twins:
    """``events`` random events; ``forgotten``: resends of ids past their dedup window too
    (new jobs to the retiring state, duplicates to its twin: the twins decide apart after)."""
    rng = random.Random(seed)
    t = Twins(seed)
    nodes = [node(f"n{i}", gpus=rng.choice([4, 8]), rack=f"r{i % 2}") for i in range(5)]
    for beat in nodes:
        t.apply(beat, 10)
    made = 0
    for _ in range(events):
        roll = rng.random()
        if roll < 0.2:
            made += 1
            big = rng.random() < 0.05  # now and then a job that waits for long (never fits)
            gpus = 64 if big else rng.choice([0, 1, 2])
            t.apply(job(f"j{made}", tenant=rng.choice("ab"), tasks=rng.choice([1, 1, 2, 3]), gpus=gpus,
                        milli=rng.choice([1000, 500]) if gpus == 1 else 1000,
                        priority=rng.choice([0, 0, 5])), rng.choice([1, 50, 400]))
        elif roll < 0.55 and running(t.plain):
            row = rng.choice(running(t.plain))
            j = t.plain.names["job"].names[row]
            for task in range(int(t.plain.jobs.cols["ntasks"][row])):
                t.apply(TaskFinished(job_id=j, task_index=task, exit_code=int(rng.random() < 0.1)), 5)
        elif roll < 0.62 and made:  # an observation or a cancel, of any job (retired ones too)
            j, task = f"j{rng.randint(1, made)}", rng.randint(0, 2)
            t.apply(rng.choice([JobCancelled(job_id=j), TaskStarted(job_id=j, task_index=task, node="n0"),
                                TaskFailed(job_id=j, task_index=task),
                                TaskFinished(job_id=j, task_index=task)]), 5)
        elif roll < 0.67 and made:  # a resend of an old submission
            j = f"j{rng.randint(1, made)}"
            if not t.state.known_job(j):
                if not forgotten:
                    continue
                t.same = False
            t.apply(job(j), 5)
        elif roll < 0.69:  # an outage longer than the retention and the node timeout
            t.apply(nodes[0], rng.choice([5_000, 12_000]))
            for beat in nodes[1:]:
                t.apply(beat, 1)
        else:
            beat = rng.choice(nodes)
            t.apply(beat, rng.choice([100, 700, 1_500]))
        if rng.random() < 0.5:
            t.step()
        check(t.state)
    return t


@pytest.mark.parametrize("seed", range(8))
def test_a_retiring_state_decides_as_one_that_keeps_everything(seed: int) -> None:
    t = run(seed)
    retired = sum(sum(c) for c in t.state.retired_counts.values())
    assert t.same
    assert retired > 50, retired
    assert t.compactions >= 3, t.compactions
    assert t.state.live_jobs() < t.plain.jobs.size / 3
    check(t.plain)


@pytest.mark.parametrize("seed", range(3))
def test_replay_in_batches_and_from_any_snapshot_gives_the_recorded_digests(seed: int) -> None:
    t = run(100 + seed, events=400, forgotten=True)
    assert not t.same
    assert t.compactions >= 2
    rng = random.Random(seed)
    cut = sorted(rng.sample(range(len(t.log)), 12))
    # one at a time, a snapshot taken and restored at every cut
    state = State(RETIRING)
    for i, (at_ms, event) in enumerate(t.log):
        if i in cut:
            state = restore(snapshot(state))
        if isinstance(event, DecisionBatch):
            assert digest(state) == event.digest, i
            assert tuple(decide(state, POLICY)) == event.decisions, i
        fold(state, event, at_ms)
    assert digest(state) == digest(t.state)
    # in runs of inputs cut anywhere (the batch twins), the batches folded one by one
    state, run_events, run_times = State(RETIRING), [], []
    for i, (at_ms, event) in enumerate(t.log):
        if isinstance(event, DecisionBatch) or i in cut:
            fold_lists(state, run_events, run_times)
            run_events, run_times = [], []
        if isinstance(event, DecisionBatch):
            assert digest(state) == event.digest, i
            fold(state, event, at_ms)
        else:
            run_events.append(event)
            run_times.append(at_ms)
    fold_lists(state, run_events, run_times)
    assert digest(state) == digest(t.state)


def _status(state: State, job_id: str) -> str | None:
    found = job_status(state, job_id)
    return None if found is None else str(found["state"])


def _ended(state: State, job_id: str, at_ms: int) -> int:
    """Submit, place and finish ``job_id``; returns the log time after."""
    fold(state, job(job_id), at_ms)
    fold(state, DecisionBatch(as_of=state.offset, digest="", decisions=tuple(decide(state, POLICY))), at_ms)
    fold(state, TaskFinished(job_id=job_id, task_index=0), at_ms + 1)
    return at_ms + 1


def test_a_job_retires_at_the_first_sweep_after_its_retention_and_its_id_is_remembered() -> None:
    state = State(RETIRING)
    fold(state, node("n0"), 0)
    ended = _ended(state, "x", 10)
    assert _status(state, "x") == "succeeded"
    fold(state, node("n0"), ended + 2_999)  # not yet: retained 3 s
    assert state.job_row("x") >= 0
    fold(state, node("n0"), ended + 4_000)  # a sweep (every second) after the retention
    assert state.job_row("x") < 0
    assert state.known_job("x")
    assert state.retired_counts == {0: [1, 0, 0, 0]}
    assert [r["job_id"] for r in jobs_table(state)] == []
    (row,) = tenants_table(state)
    assert (row["tenant"], row["retired_succeeded"], row["retired_failed"]) == ("t1", 1, 0)
    # a resend within the dedup window is a duplicate; observations of it are ignored
    before = (state.duplicates, state.ignored)
    fold(state, job("x"), ended + 5_000)
    for e in (TaskFinished(job_id="x", task_index=0), TaskFailed(job_id="x", task_index=0),
              TaskStarted(job_id="x", task_index=0, node="n0"), JobCancelled(job_id="x")):
        fold(state, e, ended + 5_000)
    assert (state.duplicates, state.ignored) == (before[0] + 1, before[1] + 4)
    assert state.job_row("x") < 0
    # after the window the id is forgotten: the same id is a new job
    fold(state, node("n0"), ended + 4_000 + 10_000 + 1_000)
    assert not state.known_job("x")
    fold(state, job("x"), ended + 16_000)
    assert _status(state, "x") == "pending"
    check(state)


@pytest.mark.parametrize("end", ["cancelled", "failed", "rejected"])
def test_every_ended_state_retires_and_is_counted_by_tenant(end: str) -> None:
    state = State(RETIRING)
    fold(state, node("n0", gpus=8), 0)
    fold(state, job("x", tenant="b", gpus=1 if end != "rejected" else 64), 1)
    if end == "rejected":
        fold(state, DecisionBatch(as_of=state.offset, digest="", decisions=tuple(
            decide(state, Policy(fail_unplaced=True)))), 1)
    elif end == "cancelled":
        fold(state, JobCancelled(job_id="x"), 2)
    else:
        fold(state, DecisionBatch(as_of=state.offset, digest="", decisions=tuple(decide(state, POLICY))), 1)
        fold(state, TaskFailed(job_id="x", task_index=0), 2)
    assert _status(state, "x") == end
    fold(state, node("n0"), 5_000)
    assert state.job_row("x") < 0
    index = ("succeeded", "failed", "cancelled", "rejected").index(end)
    assert state.retired_counts[state.names["tenant"].get("b")][index] == 1


def test_running_and_pending_jobs_never_retire_however_long() -> None:
    state = State(RETIRING)
    fold(state, node("n0", gpus=1), 0)
    fold(state, job("runs"), 1)
    fold(state, job("waits"), 2)
    fold(state, DecisionBatch(as_of=state.offset, digest="", decisions=tuple(decide(state, POLICY))), 2)
    for k in range(1, 50):
        fold(state, node("n0", gpus=1), k * 3_000)
    assert _status(state, "runs") == "placed"  # (never seen started)
    assert _status(state, "waits") == "pending"
    assert state.retired_rows == 0


def test_without_retention_nothing_retires() -> None:
    state = State(KEEP_ALL)
    fold(state, node("n0"), 0)
    ended = _ended(state, "x", 10)
    fold(state, node("n0"), ended + 10**9)
    assert _status(state, "x") == "succeeded"


def test_the_tables_stay_within_twice_the_live_jobs_and_the_snapshot_does_not_grow() -> None:
    """Costs follow the live state: 20 live jobs, 15,000 jobs through; from 4,500 on (the shape
    window full), the tables' capacity is what it was and the snapshot's size varies only with
    the rows awaiting a compaction (history would have tripled it)."""
    config = CoreConfig(node_timeout_ms=4_000, retain_finished_ms=1_000, dedup_window_ms=2_000,
                        compact_min_rows=64)
    state, at, sizes = State(config), 0, []
    fold(state, node("n0", gpus=8), 0)
    for k in range(15_000):
        at += 10
        fold(state, job(f"j{k}", gpus=0), at)
        if k >= 20:
            fold(state, JobCancelled(job_id=f"j{k - 20}"), at)
        if k % 1_500 == 1_499 and k >= 4_500:
            fold(state, node("n0", gpus=8), at)
            sizes.append((state.jobs.capacity, state.tasks.capacity, len(snapshot(state))))
    assert state.live_jobs() <= 2 * 64 + 20
    assert len({(jobs, tasks) for jobs, tasks, _ in sizes}) == 1, sizes
    snapshots = [size for _, _, size in sizes]
    assert max(snapshots) < 1.5 * min(snapshots), sizes
    check(state)


def test_a_cell_shard_ignores_a_resent_dispatch_of_a_retired_job() -> None:
    config = CoreConfig(node_timeout_ms=4_000, retain_finished_ms=1_000, compact_min_rows=1, cells=("c1",))
    state = State(config)
    fold(state, node("n0"), 0)
    sent = JobDispatched(job=job("d"), cell="c1", attempt=1, seq=1, as_of=0)
    fold(state, sent, 1)
    fold(state, DecisionBatch(as_of=state.offset, digest="", decisions=tuple(decide(state, POLICY))), 1)
    fold(state, TaskFinished(job_id="d", task_index=0), 2)
    fold(state, node("n0"), 3_000)
    assert state.job_row("d") < 0
    assert not state.dispatches
    ignored = state.ignored
    fold(state, sent, 3_001)
    assert state.job_row("d") < 0
    assert state.ignored == ignored + 1
    check(state)


def test_a_snapshot_with_a_released_id_interned_again_restores_to_the_same_digest() -> None:
    """A job id retired, forgotten after the window and submitted again before any compaction:
    the id has two slots (one released); a restore must keep both, the live one found."""
    config = CoreConfig(node_timeout_ms=4_000, retain_finished_ms=1_000, dedup_window_ms=1_000)
    state = State(config)
    fold(state, node("n0"), 0)
    ended = _ended(state, "x", 10)
    fold(state, node("n0"), ended + 2_000)
    fold(state, node("n0"), ended + 4_000)
    assert not state.known_job("x")
    fold(state, job("x"), ended + 4_001)
    assert state.names["job"].names.count("x") == 2
    back = restore(snapshot(state))
    assert digest(back) == digest(state)
    assert back.job_row("x") == state.job_row("x")
    assert _status(back, "x") == "pending"
    assert int(back.jobs.cols["state"][0]) == JobState.RETIRED
    check(back)
