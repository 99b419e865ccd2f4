"""The dispatcher's fast path for a step of equal jobs (``dispatch._dispatch_equal``: one task
group, no quota, no cell list, no return) against its twin, the plain per-job loop
(``dispatch(state, runs=False)``), and the batch fold (``fold_all``) against ``fold``
one event at a time: generated logs at the limits — one job, runs of one and of
thousands, equal cells (ties), cells that fill, every cell full, jobs that fit nowhere, tenants
interleaved, priorities, CPU-only jobs and gangs of one group, node limits, GPU models — and
steps the fast path must leave to the plain one (quotas and cohorts, cell lists, returns, jobs
of other shapes). Both must send the same ``JobDispatched`` list, leave the same waiting
reasons and the same state digest, step after step; and the test fails when the fast path is
broken (last tests)."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

import pytest

from fleetlog.core import dispatch as d
from fleetlog.core.dispatch import DispatchState, Step
from fleetlog.core.dispatch_log import state_digest
from fleetlog.events import (
    CellSummary,
    FreeSlots,
    JobCancelled,
    JobReturned,
    JobSubmitted,
    QuotaSet,
    Resources,
    TaskGroup,
    TenantUsage,
)
from tests.core.test_dispatch import cells
from tests.same import assert_same

MODELS = ("", "A100", "H100")
REFUSED: list[tuple[int, str]] = []
"""What the batch folds refused (:func:`test_the_generated_logs_reach_every_limit` counts them)."""
TENANTS = ("a", "b", "c", "d")


def shapes(rng: random.Random) -> list[tuple[TaskGroup, ...]]:
    """A few job shapes: one group (1-GPU, a quarter GPU, 8-GPU gangs, CPU-only, model-bound),
    sometimes two."""
    out = []
    for _ in range(rng.randint(1, 3)):
        gpus = rng.choice((0, 1, 1, 2, 8))
        out.append((TaskGroup(
            count=rng.choice((1, 1, 1, 2, 4)), cpu_milli=rng.choice((0, 1_000, 4_000, 40_000)),
            mem_mib=rng.choice((0, 8_192, 300_000)), gpu_count=gpus,
            gpu_milli=(rng.choice((1_000, 250)) if gpus == 1 else 1_000) if gpus else 0,
            gpu_models=tuple(sorted(rng.sample(MODELS[1:], rng.randint(1, 2)))) if rng.random() < 0.2 else (),
        ),))
    if rng.random() < 0.1:
        out.append(out[0] + out[-1])
    return out


def cell_summary(rng: random.Random, state: DispatchState, cell: str, seq: int, roomy: bool) -> CellSummary:
    """A summary of random rows (some empty, some whose nodes lack the CPU or memory a task
    needs, several models), usage of a few tenants, a total with a resource sometimes 0."""
    scale = rng.choice((0, 1, 3, 40)) if not roomy else rng.choice((200, 2_000))
    free = []
    for model in sorted(rng.sample(MODELS, rng.randint(1, 3))):
        for b in (0, 1, 2, 4, 8):
            if rng.random() < 0.8:
                slots = rng.randint(0, 8 * scale // max(b, 1))
                cpu, mem = rng.randint(0, 96_000) * scale, rng.randint(0, 786_432) * scale
                free.append(FreeSlots(model, b, slots, cpu, mem, rng.choice((None, 2_000, 96_000)),
                                      rng.choice((None, 100_000, 786_432))))
    usage = tuple(TenantUsage(t, rng.randint(0, 10**6), rng.randint(0, 10**7), rng.randint(0, 64_000))
                  for t in TENANTS if rng.random() < 0.5)
    total = Resources(cpu_milli=rng.choice((0, 96_000 * (scale + 1))), mem_mib=786_432 * (scale + 1),
                      gpu_milli=rng.choice((0, 8_000 * (scale + 1))))
    lag = rng.choice((0, 0, 1, 5))  # a summary that does not count the last dispatches yet
    return CellSummary(cell=cell, partition=int(cell[1:]), seq=seq, as_of=seq, at_ms=seq,
                       dispatched_seq=max(0, state.dispatch_seq.get(cell, 0) - lag), free=tuple(free),
                       usage=usage, total=total)


def burst(rng: random.Random, state: DispatchState, k: int, mixed: bool) -> Iterator[object]:
    """Submissions of one step: ``n`` jobs (1 up to thousands) of one shape, tenants interleaved
    (or one tenant's run), sometimes priorities; ``mixed``: other shapes, cell lists, quotas."""
    kinds = shapes(rng)
    n = rng.choice((1, 1, 2, 7, 60, 400, 3_000))
    tenants = rng.sample(TENANTS, rng.randint(1, 4))
    priorities = (0,) if rng.random() < 0.6 else (0, 0, 5)
    for i in range(n):
        shape = rng.choice(kinds) if mixed else kinds[0]
        allowed = tuple(sorted(rng.sample(state.cells.cells, 1))) if mixed and rng.random() < 0.1 else ()
        yield JobSubmitted(job_id=f"s{k}-{i}", tenant=rng.choice(tenants), task_groups=shape,
                           allowed_cells=allowed, priority=rng.choice(priorities))
    if mixed and rng.random() < 0.3:
        tenant, cohort = rng.choice(TENANTS), rng.choice(("", "co"))
        yield QuotaSet(tenant=tenant, nominal=Resources(cpu_milli=10**6, mem_mib=10**7, gpu_milli=rng.choice(
            (8_000, 64_000))), cohort=cohort, weight_milli=rng.choice((500, 1_000, 3_000)))


def held_events(rng: random.Random, state: DispatchState, k: int) -> Iterator[object]:
    """A few returns and cancellations of held and pending jobs."""
    held = [j for j in state.jobs.values() if j.status == d.HELD]
    for j in rng.sample(held, min(len(held), rng.choice((0, 0, 1, 3)))):
        yield JobReturned(job_id=j.spec.job_id, cell=j.cell, attempt=j.attempt, reason="no_fit", as_of=k)
    ids = sorted(state.jobs)
    for job_id in rng.sample(ids, min(len(ids), rng.choice((0, 0, 2)))):
        yield JobCancelled(job_id=job_id)


def bad_input(rng: random.Random, state: DispatchState) -> list[object]:
    """A submission again (the first counts), a summary of a cell the map does not name, a
    stale one: folded or refused alike one by one and in a batch."""
    out: list[object] = []
    if state.jobs and rng.random() < 0.5:
        out.append(state.jobs[rng.choice(sorted(state.jobs))].spec)
    if rng.random() < 0.3:
        out.append(CellSummary(cell="zz", partition=99, seq=1, as_of=1, at_ms=1, dispatched_seq=0, free=(),
                               usage=(), total=Resources()))
    if state.summaries and rng.random() < 0.3:
        out.append(state.summaries[rng.choice(sorted(state.summaries))])
    return out


def twin_run(seed: int, steps: int = 6, mixed: bool | None = None) -> list[Step]:
    """Two states fed the same generated log, one dispatched by ``dispatch`` and one by its
    plain twin: the same steps and state digests, step after step; the fast one's steps."""
    rng = random.Random(seed)
    mixed = rng.random() < 0.3 if mixed is None else mixed
    n = rng.choice((1, 2, 3, 8, 20))
    fast, plain = DispatchState(cells(n)), DispatchState(cells(n))
    seqs, out, roomy = dict.fromkeys(fast.cells.cells, 0), [], rng.random() < 0.5
    for k in range(steps):
        events: list[object] = []
        for cell in fast.cells.cells:
            if rng.random() < 0.7:
                seqs[cell] += 1
                events.append(cell_summary(rng, fast, cell, seqs[cell], roomy))
        events += held_events(rng, fast, k) if mixed else []
        events += burst(rng, fast, k, mixed)
        events += bad_input(rng, fast) if mixed else []
        records = [(event, k * 100 + rng.choice((0, i))) for i, event in enumerate(events)]
        refused = [(i, why) for i, (event, at) in enumerate(records) if (why := d.fold(plain, event, at))]
        assert d.fold_all(fast, records) == refused
        REFUSED.extend(refused)
        step = d.dispatch(fast)
        CALLS.append("|")
        assert_same(step, d.dispatch(plain, runs=False), f"seed {seed} step {k}")
        assert state_digest(fast) == state_digest(plain), f"seed {seed} step {k}"
        out.append(step)
    return out


CALLS: list[str] = []
"""Each ``_dispatch_equal`` call's run length, ``p`` for each plain range, ``|`` after a step."""


@pytest.fixture
def equal_steps(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the jobs of each run the fast path decided (and logs the plain ranges in CALLS)."""
    decided: list[int] = []
    real, plain = d._dispatch_equal, d._dispatch_plain
    CALLS.clear()

    def counted(*args: object) -> tuple[list[object], list[object]]:
        out = real(*args)  # type: ignore[arg-type]
        decided.append(len(out[0]) + len(out[1]))
        CALLS.append(str(decided[-1]))
        return out  # type: ignore[return-value]

    def logged(*args: object) -> tuple[list[object], list[object]]:
        CALLS.append("p")
        return plain(*args)  # type: ignore[arg-type,return-value]

    monkeypatch.setattr(d, "_dispatch_equal", counted)
    monkeypatch.setattr(d, "_dispatch_plain", logged)
    return decided


@pytest.mark.parametrize("least", [1, 64])
@pytest.mark.parametrize("seed", range(40))
def test_the_fast_path_decides_as_the_plain_loop(
    seed: int, least: int, equal_steps: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs from ``least`` jobs on (1: every run, between plain ranges in mixed steps)."""
    monkeypatch.setattr(d, "run_least", lambda cells: least)
    twin_run(seed)


def test_the_generated_logs_reach_every_limit(
    equal_steps: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over the seeds: the fast path decides runs of one job and of thousands, sends jobs, and
    leaves some with no cell; plain ranges and runs meet in one step; the batch fold refuses."""
    monkeypatch.setattr(d, "run_least", lambda cells: 1)
    waits, sends = 0, 0
    REFUSED.clear()
    for seed in range(40):
        steps = twin_run(seed)
        sends += sum(len(s.dispatched) for s in steps)
        waits += sum(1 for s in steps for w in s.waiting if w[1] == d.NO_ROOM)
    assert min(equal_steps) == 1
    assert max(equal_steps) >= 3_000
    assert sends > 10_000
    assert waits > 100
    steps = " ".join(CALLS).split("|")
    assert sum(1 for step in steps if "p" in step and any(c.isdigit() for c in step)) > 10
    assert {why.split(":")[0] for _, why in REFUSED} == {d.UNKNOWN_CELL, d.STALE_SUMMARY}


def test_every_cell_full_and_equal_cells_tie() -> None:
    """Two equal cells of 3 one-GPU slots, 10 equal jobs of two tenants: each tenant goes round
    the cells by its share (ties to the smaller id), 6 are sent, 4 wait with no room."""
    state = DispatchState(cells(2))
    for c in state.cells.cells:
        free = (FreeSlots("A100", 1, 3, 96_000, 786_432),)
        d.fold(state, CellSummary(cell=c, partition=int(c[1:]), seq=1, as_of=1, at_ms=1, dispatched_seq=0,
                                  free=free, usage=(), total=Resources(96_000, 786_432, 8_000)), 1)
    group = (TaskGroup(count=1, cpu_milli=1_000, mem_mib=1_024, gpu_count=1, gpu_milli=1_000),)
    for i in range(10):
        d.fold(state, JobSubmitted(job_id=f"j{i}", tenant="ab"[i % 2], task_groups=group), 2)
    step = d.dispatch(state)
    assert [(e.job.job_id, e.cell) for e in step.dispatched] == [
        ("j0", "c000"), ("j1", "c000"), ("j2", "c001"), ("j3", "c001"), ("j4", "c000"), ("j5", "c001")]
    assert [w[:2] for w in step.waiting] == [(f"j{i}", d.NO_ROOM) for i in range(6, 10)]


def heaps_told() -> list[tuple[str, str]]:
    """A plain job, a run of its tenant's other shape, a plain job again, in one step (runs
    from 2 jobs): the run's shares must reach the plain heap built before it. Tenant a's
    8-GPU job goes to c000 (tie, smaller id); its eight 1-GPU jobs to c001 (least share) until
    the shares tie; its next 8-GPU job to c000 again (tie) — to c001 if the heap missed the
    run (its c001 entry, share 0, still looking current). Checked against the plain twin."""
    fast, plain = DispatchState(cells(2)), DispatchState(cells(2))
    rows = (FreeSlots("A100", 1, 64, 768_000, 6_291_456), FreeSlots("A100", 8, 8, 768_000, 6_291_456))
    events: list[object] = [
        CellSummary(cell=c, partition=i, seq=1, as_of=1, at_ms=1, dispatched_seq=0, free=rows, usage=(),
                    total=Resources(768_000, 6_291_456, 64_000)) for i, c in enumerate(fast.cells.cells)]
    def shape(gpus: int) -> tuple[TaskGroup, ...]:
        return (TaskGroup(count=1, cpu_milli=1_000, mem_mib=1_024, gpu_count=gpus, gpu_milli=1_000),)
    events += [JobSubmitted(job_id="y0", tenant="a", task_groups=shape(8), priority=10)]
    events += [JobSubmitted(job_id=f"x{i}", tenant="a", task_groups=shape(1), priority=5) for i in range(8)]
    events += [JobSubmitted(job_id="y1", tenant="a", task_groups=shape(8))]
    for state in (fast, plain):
        assert d.fold_all(state, [(e, 1) for e in events]) == []
    step = d.dispatch(fast)
    assert_same(step, d.dispatch(plain, runs=False), "heaps_told")
    return [(e.job.job_id, e.cell) for e in step.dispatched]


def test_a_run_s_shares_reach_the_plain_heaps_built_before_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(d, "run_least", lambda cells: 2)
    assert heaps_told() == [("y0", "c000"), *[(f"x{i}", "c001") for i in range(8)], ("y1", "c000")]


def broken(name: str) -> Callable[[pytest.MonkeyPatch], None]:
    """Ways to break the fast path: one job too many per cell, a share that never grows, full
    cells never dropped, a run's room not drawn, the plain heaps not told of a run's shares."""
    def one_more(room: d.Room, g: TaskGroup) -> int:
        return real_held(room, g) + g.count

    def frozen(self: d.Spread, cell: str, tenant: int, demand: tuple[int, int, int]) -> int:
        return self.share(cell, tenant)

    def undrawn(state: DispatchState, scores: d.Scores, jobs: list[d.Job], g: TaskGroup) -> object:
        rooms = {c: {k: list(row) for k, row in r.items()} for c, r in scores.room.items()}
        out = real_equal(state, scores, jobs, g)
        for c, r in rooms.items():
            scores.room[c].update(r)
        return out

    def unseen(state: DispatchState, scores: d.Scores, jobs: list[d.Job], g: TaskGroup) -> object:
        version = dict(scores.version)
        out = real_equal(state, scores, jobs, g)
        scores.version.clear()
        scores.version.update(version)
        return out

    real_held, real_equal = d.held, d._dispatch_equal
    patches: dict[str, Callable[[pytest.MonkeyPatch], None]] = {
        "held": lambda m: m.setattr(d, "held", one_more),
        "share": lambda m: m.setattr(d.Spread, "grow", frozen),
        "full": lambda m: m.setattr(d, "held", lambda room, g: 10**9),
        "draw": lambda m: m.setattr(d, "_dispatch_equal", undrawn),
        "version": lambda m: m.setattr(d, "_dispatch_equal", unseen),
    }
    return patches[name]


@pytest.mark.parametrize("name", ["held", "share", "full", "draw", "version"])
def test_the_twin_test_fails_when_the_fast_path_is_broken(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The generated logs find each break; the plain heaps not told of a run, :func:`heaps_told`
    (the seeds need not meet it: a plain job's heap, a run of its tenant's other shape, that
    shape again in the same step)."""
    broken(name)(monkeypatch)
    if name == "version":
        monkeypatch.setattr(d, "run_least", lambda cells: 2)
        with pytest.raises(AssertionError):
            heaps_told()
    else:
        monkeypatch.setattr(d, "run_least", lambda cells: 1)
        with pytest.raises(AssertionError):
            twin_runs(40)


def twin_runs(seeds: int) -> None:
    for seed in range(seeds):
        twin_run(seed)


def test_the_turns_are_the_heaps() -> None:
    """``_ordered`` (keys sorted) against ``scan_ordered`` (the heap of turns), with quotas and
    weights, priorities, ties, and tenants of several shapes."""
    for seed in range(60):
        rng = random.Random(seed)
        state = DispatchState(cells(2))
        kinds = shapes(rng)
        for i in range(rng.choice((0, 1, 5, 300))):
            event = JobSubmitted(job_id=f"j{i}", tenant=rng.choice(TENANTS), task_groups=rng.choice(kinds),
                                 priority=rng.choice((0, 0, 3)))
            d.fold(state, event, i)
        for t in rng.sample(TENANTS, rng.randint(0, 4)):
            d.fold(state, QuotaSet(tenant=t, nominal=Resources(rng.choice((0, 10**6)), 10**7, rng.choice(
                (0, 64_000))), weight_milli=rng.choice((1, 1_000, 2_500))), 0)
        used = {(t, -1): [rng.randint(0, 10**6), rng.randint(0, 10**7), rng.randint(0, 10**5)]
                for t in range(len(state.tenants)) if rng.random() < 0.7}
        fleet = rng.choice(((0, 0, 0), (10**7, 10**8, 10**6), (0, 10**8, 0)))
        assert d._ordered(state, used, fleet) == d.scan_ordered(state, used, fleet), seed
