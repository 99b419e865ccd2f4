"""The batch twin of ``fold.on_dispatched`` (``fold_batch.NewJobs.dispatch``, runs of
``JobDispatched`` folded with the submissions in ``fold_submissions``) against folding one event
at a time, on generated cell-shard inputs: new jobs, resends, older and newer attempts, returns
and reopens, cells the shard does not hold, jobs submitted here directly, a job dispatched twice
in one run, holds of 0 and 1 ms that end inside a run, node sweeps, every chunking."""

from __future__ import annotations

import random

import pytest

from fleetlog.core import fold_batch
from fleetlog.core.cellshard import returns
from fleetlog.core.digest import digest
from fleetlog.core.fold import fold
from fleetlog.core.fold_batch import fold_many
from fleetlog.core.state import CoreConfig, State
from fleetlog.events import JobDispatched
from fleetlog.events.model import Event
from tests.core.builders import fold_chunked, job, node

Log = list[tuple[Event, int]]


def generated(seed: int) -> tuple[CoreConfig, Log]:
    """A cell shard of cells a and b over a few nodes; mostly runs of dispatches."""
    rng = random.Random(seed)
    hold = rng.choice((0, 1, 50, 2_000, 30_000))
    config = CoreConfig(hold_ms=hold, cells=("a", "b"), node_timeout_ms=rng.choice((500, 60_000)))
    beats = [node(f"{c}-n{i}", cell=c, gpus=8) for c in "ab" for i in range(3)]
    log: Log = [(b, 0) for b in beats]
    now, attempts, seq = 0, {}, {"a": 0, "b": 0, "x": 0}
    for _ in range(rng.randint(100, 400)):
        now += rng.choice((0, 0, 0, 1, 1, 7, 60, 700))
        kind = rng.random()
        if kind < 0.55:  # a dispatch: new, or again (resend, older, newer attempt)
            name = f"j{rng.randint(0, 60)}"
            cell = rng.choice("aab" + ("x" if rng.random() < 0.05 else ""))
            attempt = attempts.get(name, 0) + rng.choice((1, 1, 1, 0, -1))
            attempts[name] = max(attempt, attempts.get(name, 0))
            seq[cell] += 1
            spec = job(name, tenant=f"t{rng.randint(0, 2)}", gpus=rng.choice((0, 1, 2, 8)), milli=1000,
                       tasks=rng.choice((1, 1, 2, 3)), cells=tuple(rng.sample("abc", rng.randint(0, 2))))
            sent = JobDispatched(job=spec, cell=cell, attempt=max(attempt, 1), seq=seq[cell], as_of=0)
            log.append((sent, now))
        elif kind < 0.65:
            log.append((job(f"s{rng.randint(0, 80)}", gpus=1), now))  # submitted here (or a dispatch's id)
        elif kind < 0.7:
            log.append((job(f"j{rng.randint(0, 60)}"), now))  # a submission of a dispatched job's id
        else:
            log.append((rng.choice(beats), now))
    return config, log


def readable(state: State) -> tuple[object, ...]:
    return (state.offset, state.now_ms, dict(state.dispatches), dict(state.held), dict(state.returned),
            dict(state.job_cells), dict(state.dispatched_seq), state.ignored, state.duplicates,
            state.pending_count, state.next_return_ms, state.jobs.size, state.tasks.size)


def one_by_one(config: CoreConfig, log: Log) -> State:
    state = State(config)
    for e, at in log:
        fold(state, e, at)
    return state


@pytest.mark.parametrize("seed", range(16))
def test_runs_of_dispatches_fold_as_one_by_one_however_chunked(seed: int) -> None:
    config, log = generated(seed)
    plain = one_by_one(config, log)
    assert plain.dispatches  # (the generator reaches the cases)
    for chunk in (1, 2, 5, 64, 65, len(log)):
        for fast in ("many", "lists"):
            state = fold_chunked(config, log, chunk, fast)
            assert readable(state) == readable(plain), (chunk, fast)
            assert digest(state) == digest(plain), (chunk, fast)
            assert returns(state, 0) == returns(plain, 0)


def test_the_generated_logs_reach_every_case() -> None:
    """Resends, reopens, other cells, hand-backs and jobs submitted here all occur."""
    seen = {"ignored": 0, "returned": 0, "reopened": 0, "duplicates": 0}
    for seed in range(16):
        config, log = generated(seed)
        state = one_by_one(config, log)
        seen["ignored"] += state.ignored
        seen["returned"] += len(state.returned)
        seen["duplicates"] += state.duplicates
        seen["reopened"] += sum(1 for _, attempt, _, _ in state.dispatches.values() if attempt > 1)
    assert all(seen.values()), seen


def test_the_twin_test_can_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch that takes every dispatch as new (no resend or reopen to the spec) folds
    otherwise: the comparison above sees it."""
    config, log = generated(3)
    plain = one_by_one(config, log)
    monkeypatch.setattr(fold_batch, "plain_dispatch",
                        lambda state, e: bool(state.config.cells and e.cell not in state.config.cells))
    state = State(config)
    fold_many(state, log)
    assert readable(state) != readable(plain)
