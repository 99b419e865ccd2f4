"""A cell shard's runs of dispatches folded at once (``fold_batch.dispatch_run``, the whole run
in comprehensions; ``NewJobs.shapes_of_run``, the shape window of a steady run; ``Interner.add_many``)
and its own placements folded back at once (``on_placed_many``'s kernels), against folding one
event at a time, on generated inputs at the limits: runs of one to thousands of dispatches, one
shape or several tenants and shapes interleaved, gangs, shape windows of 4 tasks to 4,096 and
mixes due every task, a job dispatched twice in a run or dispatched again, cancellations, node
removals and heartbeats inside runs, cells the shard does not hold, holds of 0 and 1 ms and
sweeps that fall due inside a run, every chunking."""

from __future__ import annotations

import random

import msgspec
import pytest

from fleetlog.core import fold_batch
from fleetlog.core.decide import decide
from fleetlog.core.digest import digest
from fleetlog.core.fold import fold, fold_decision, remember_shape
from fleetlog.core.fold_batch import fold_decisions, fold_many
from fleetlog.core.policy import Policy
from fleetlog.core.state import CoreConfig, State
from fleetlog.events import JobCancelled, JobDispatched, JobPlaced, NodeRemoved
from fleetlog.events.model import Event, JobSubmitted, TaskGroup, TaskPlacement
from tests.core.budget import seeds
from tests.core.builders import fold_chunked, job, node

Log = list[tuple[Event, int]]

SHAPES = [(1, 1000), (2, 1000), (1, 500), (0, 0), (8, 1000)]


def spec(rng: random.Random, name: str, mode: str) -> JobSubmitted:
    """One job: the steady shape, any of several tenants and shapes, or a gang of two groups."""
    if mode == "steady":  # (every seventh labelled: ``State.job_meta``, kept by the whole-run fold too)
        steady = job(name, tenant="t0", gpus=1)
        return msgspec.structs.replace(steady, labels={"run": name}) if name.endswith("7") else steady
    gpus, milli = rng.choice(SHAPES)
    if mode == "mixed":
        return job(name, tenant=f"t{rng.randint(0, 3)}", gpus=gpus, milli=milli, tasks=rng.choice((1, 1, 2)),
                   priority=rng.choice((0, 5)), models=rng.choice(((), ("A100",), ("H100", "A100"))))
    groups = tuple(TaskGroup(count=rng.randint(1, 10), cpu_milli=1000, mem_mib=1024, gpu_count=g,
                             gpu_milli=m) for g, m in (rng.choice(SHAPES), rng.choice(SHAPES)))
    return JobSubmitted(job_id=name, tenant=f"t{rng.randint(0, 3)}", task_groups=groups)


def generated(seed: int) -> tuple[CoreConfig, Log]:
    """A shard of cells a and b; runs of new dispatches, with now and then what breaks a run."""
    rng = random.Random(seed)
    config = CoreConfig(
        cells=("a", "b"), hold_ms=rng.choice((0, 1, 5, 60_000, 60_000)),
        node_timeout_ms=rng.choice((40, 60_000, 60_000)),
        shape_window=rng.choice((4, 8, 64, 4096)), shape_mix_every=rng.choice((1, 3, 16, 2048)),
    )  # fmt: skip
    beats = [node(f"{c}-n{i}", cell=c, gpus=(2, 8, 64)[i % 3]) for c in "ab" for i in range(4)]
    log: Log = [(b, 0) for b in beats]
    now, seq, made = 0, {"a": 0, "b": 0, "x": 0}, 0
    for _ in range(rng.randint(2, 6)):
        mode = rng.choice(("steady", "steady", "mixed", "gangs"))
        tick, breaks = rng.choice((0, 0, 1, 3)), rng.choice((0.0, 0.006))
        for _ in range(rng.choice((1, 2, 3, 125, 1000, 2500))):
            now += rng.choice((0, tick))
            r = rng.random()
            cell = "a" if mode == "steady" else rng.choice("ab")
            if r < breaks * 2 / 3 and made:  # a job dispatched again (in this run or before), or cancelled
                old = f"j{rng.randrange(made)}"
                log.append((rng.choice((JobCancelled(job_id=old), JobDispatched(
                    job=spec(rng, old, mode), cell=cell, attempt=2, seq=seq[cell] + 1, as_of=0))), now))
                continue
            if r < breaks:
                log.append((rng.choice((NodeRemoved(cell="b", node="b-n1"), rng.choice(beats))), now))
                continue
            cell = "x" if r < breaks + 0.001 and breaks else cell
            seq[cell] += 1
            back = rng.randint(1, seq[cell]) if rng.random() < 0.01 else seq[cell]  # (hostile: gone back)
            log.append((JobDispatched(job=spec(rng, f"j{made}", mode), cell=cell, attempt=1, seq=back,
                                      as_of=0), now))
            made += 1
        now += rng.choice((1, 50, 5_000))
    return config, log


def one_by_one(config: CoreConfig, log: Log) -> State:
    state = State(config)
    for e, at in log:
        fold(state, e, at)
    return state


def everything(state: State) -> tuple[object, ...]:
    """The state as the digest does not see it too: the dicts in their order, the window."""
    return (state.offset, state.now_ms, list(state.dispatches.items()), list(state.held.items()),
            list(state.returned.items()), list(state.job_cells.items()), list(state.dispatched_seq.items()),
            list(state.usage.items()), state.ignored, state.duplicates, state.pending_count,
            state.next_return_ms, state.recent_shapes, state.recent_next, list(state.shape_stats.items()),
            state.shape_mix, state.shapes_seen, state.mix_due, list(state.sums), list(state.job_meta.items()),
            {k: (v.names, v.running_hash()) for k, v in state.names.items()})


def taken(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the jobs of the runs ``dispatch_run`` folded at once."""
    runs: list[int] = []
    inner = fold_batch.dispatch_run

    def counting(state: State, events: list[Event], times: list[int]) -> bool:
        done = inner(state, events, times)  # type: ignore[arg-type]
        if done:
            runs.append(len(events))
        return done

    monkeypatch.setattr(fold_batch, "dispatch_run", counting)
    return runs


@pytest.mark.parametrize("seed", seeds(range(12)))
def test_runs_of_new_dispatches_fold_as_one_by_one_however_chunked(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, log = generated(seed)
    plain = one_by_one(config, log)
    runs = taken(monkeypatch)
    for chunk in (1, 7, 125, 1000, len(log)):
        for how in ("many", "lists"):
            state = fold_chunked(config, log, chunk, how)
            assert everything(state) == everything(plain), (chunk, how)
            assert digest(state) == digest(plain), (chunk, how)
            for table in ("jobs", "tasks", "nodes"):
                for name in getattr(state, table).spec:
                    assert (getattr(state, table).view(name) == getattr(plain, table).view(name)).all(), name
    assert runs or config.hold_ms < 60_000  # (the whole-run path taken, not only the job-by-job one)


def test_the_generated_logs_reach_the_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Long runs taken whole, mixes taken inside them, dispatches refused or ignored, returns."""
    seen = {"long_runs": 0, "mixes": 0, "ignored": 0, "returned": 0, "windows_wrapped": 0}
    runs = taken(monkeypatch)
    for seed in range(12):
        config, log = generated(seed)
        state = State(config)
        fold_many(state, log)
        seen["mixes"] += state.shapes_seen >= config.shape_window
        seen["windows_wrapped"] += state.shapes_seen > 2 * config.shape_window
        seen["ignored"] += state.ignored
        seen["returned"] += len(state.returned)
    seen["long_runs"] = sum(1 for n in runs if n >= 1000)
    assert all(seen.values()), seen


def test_the_twin_tests_can_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole-run fold that forgets to hold its jobs, or one that gathers a steady run's shapes
    as one call past the window, folds otherwise: the comparison above sees both."""
    config, log = generated(1)
    plain = one_by_one(config, log)
    inner = fold_batch.dispatch_run

    def forgets_the_hold(state: State, events: list[Event], times: list[int]) -> bool:
        held = dict(state.held)
        done = inner(state, events, times)  # type: ignore[arg-type]
        state.held = held
        return done

    monkeypatch.setattr(fold_batch, "dispatch_run", forgets_the_hold)
    state = State(config)
    fold_many(state, log)
    assert everything(state) != everything(plain)
    monkeypatch.undo()
    wide = CoreConfig(cells=("a",), shape_window=8, shape_mix_every=1_000)
    steady: Log = [(node("a-n0", cell="a"), 0)]
    steady += [(JobDispatched(job=job(f"j{i}"), cell="a", attempt=1, seq=i + 1, as_of=0), 1)
               for i in range(20)]

    def one_call(self: object, state: State, shape: tuple[int, int, int], total: int, window: int) -> None:
        remember_shape(state, shape, total)

    monkeypatch.setattr(fold_batch.NewJobs, "_gather", one_call)
    state = State(wide)
    fold_many(state, steady)
    assert digest(state) != digest(one_by_one(wide, steady))


def placements(seed: int) -> tuple[CoreConfig, Log, list[JobPlaced | object]]:
    """A shard of two cells of 2-, 8- and 64-GPU nodes, jobs of four tenants dispatched to both,
    and the decisions of one decide over them (runs of one-task placements, several to a node,
    shares of one GPU, the 64th GPU of a node)."""
    rng = random.Random(seed)
    config = CoreConfig(cells=("a", "b"), hold_ms=60_000)
    log: Log = [(node(f"{c}-n{i}", cell=c, gpus=(2, 8, 64)[i % 3]), 0) for c in "ab" for i in range(3)]
    for i in range(rng.randint(40, 160)):
        gpus, milli = rng.choice([(1, 1000), (1, 250), (2, 1000), (0, 0), (8, 1000)])
        spec = job(f"j{i}", tenant=f"t{rng.randint(0, 3)}", gpus=gpus, milli=milli)
        log.append((JobDispatched(job=spec, cell=rng.choice("ab"), attempt=1, seq=i + 1, as_of=0), 1))
    state = one_by_one(config, log)
    return config, log, list(decide(state, Policy()))


@pytest.mark.parametrize("seed", seeds(range(6)))
def test_a_cells_placements_fold_back_as_one_by_one(seed: int) -> None:
    """``on_placed_many`` (kernels for the nodes' capacity and the usage sums) against
    ``on_placed`` one after another: every column, the usage counters in their order."""
    config, log, decisions = placements(seed)
    assert sum(isinstance(d, JobPlaced) for d in decisions) >= 20
    at_once, plain = one_by_one(config, log), one_by_one(config, log)
    fold_decisions(at_once, decisions)
    for d in decisions:
        fold_decision(plain, d)
    assert everything(at_once) == everything(plain)
    assert digest(at_once) == digest(plain)
    for table in ("jobs", "tasks", "nodes"):
        for name in getattr(at_once, table).spec:
            assert (getattr(at_once, table).view(name) == getattr(plain, table).view(name)).all(), name


def test_a_placement_on_a_nodes_64th_gpu_takes_its_share() -> None:
    """The GPU mask's last bit (a node of 64 GPUs): taken off that GPU, as one by one."""
    config = CoreConfig(cells=("a",))
    log: Log = [(node("a-n0", cell="a", gpus=64), 0)]
    log += [(JobDispatched(job=job(f"j{i}", gpus=1, milli=250), cell="a", attempt=1, seq=i + 1, as_of=0), 1)
            for i in range(10)]
    placed = [JobPlaced(job_id=f"j{i}", cell="a", tasks=(TaskPlacement(0, "a-n0", (63 - i % 2,)),))
              for i in range(10)]
    at_once, plain = one_by_one(config, log), one_by_one(config, log)
    fold_decisions(at_once, placed)
    for d in placed:
        fold_decision(plain, d)
    assert (at_once.nodes.view("gpu_free") == plain.nodes.view("gpu_free")).all()
    assert int(at_once.nodes.view("gpu_free")[0, 63]) == 1000 - 5 * 250
    assert digest(at_once) == digest(plain)


def test_a_run_of_seqs_gone_back_leaves_the_cells_seq_as_one_by_one() -> None:
    """A run whose seqs are all below what the cell saw (hostile input), and one whose seqs go
    back inside it: the cell's ``dispatched_seq`` is the largest ever seen, as one by one."""
    config = CoreConfig(cells=("a", "b"))
    log: Log = [(node("a-n0", cell="a"), 0)]
    log += [(JobDispatched(job=job(f"j{i}"), cell="a", attempt=1, seq=100 + i, as_of=0), 1) for i in range(5)]
    log += [(node("a-n0", cell="a"), 2)]  # (a heartbeat between: three runs)
    log += [(JobDispatched(job=job(f"k{i}"), cell="a", attempt=1, seq=1 + i, as_of=0), 2) for i in range(5)]
    log += [(node("a-n0", cell="a"), 3)]
    log += [(JobDispatched(job=job(f"m{i}"), cell="ab"[i % 2], attempt=1, seq=(9, 7, 500, 3)[i], as_of=0), 3)
            for i in range(4)]
    plain = one_by_one(config, log)
    for chunk in (5, 6, 12, len(log)):
        state = State(config)
        for i in range(0, len(log), chunk):
            fold_many(state, log[i : i + chunk])
        assert list(state.dispatched_seq.items()) == list(plain.dispatched_seq.items()) == [(0, 500), (1, 7)]
        assert digest(state) == digest(plain)
