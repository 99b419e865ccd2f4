"""``fold_lists`` (steady heartbeats written with numpy) gives the state ``fold`` gives one by one."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetlog.core.decide import decide
from fleetlog.core.digest import digest
from fleetlog.core.fold import fold, fold_lists
from fleetlog.core.invariants import check
from fleetlog.core.policy import Policy
from fleetlog.core.state import CoreConfig, JobState, State
from fleetlog.events import DecisionBatch, Event, JobCancelled, NodeRemoved
from tests.core.builders import job, node

NODES = [f"n{i}" for i in range(6)]
# Heartbeat objects are reused, as readers that decode repeated bytes once hand them out: the
# same object again is the steady case; a reshaped or unhealthy node is a new object.
BEATS = {name: node(name, gpus=8) for name in NODES}
RESHAPED = {name: node(name, gpus=4) for name in NODES}
SICK = {name: node(name, healthy=False) for name in NODES}


@st.composite
def chunks(draw: st.DrawFn) -> list[tuple[list[Event], list[int]]]:
    """Chunks of inputs with their log times: mostly steady heartbeats, some of everything."""
    out, at, jobs = [], 1_000, 0
    for _ in range(draw(st.integers(1, 4))):
        events: list[Event] = []
        times: list[int] = []
        for _ in range(draw(st.integers(60, 160))):
            kind = draw(st.sampled_from("bbbbbbbbbbbbjcrsxt"))
            name = draw(st.sampled_from(NODES))
            if kind == "b":
                events.append(BEATS[name])
            elif kind == "j":
                events.append(job(f"j{jobs}", gpus=draw(st.integers(0, 8))))
                jobs += 1
            elif kind == "c":
                events.append(JobCancelled(job_id=f"j{draw(st.integers(0, max(0, jobs)))}"))
            elif kind == "r":
                events.append(RESHAPED[name])
            elif kind == "s":
                events.append(SICK[name])
            elif kind == "x":
                events.append(NodeRemoved(cell="c1", node=name))
            else:
                at += draw(st.sampled_from([1_500, 3_500]))  # past a sweep, past the timeout
                events.append(BEATS[name])
            at += draw(st.integers(0, 30))
            times.append(at - draw(st.sampled_from([0, 0, 0, 50])))  # log time may even go back
        out.append((events, times))
    return out


def _same(a: State, b: State) -> None:
    assert digest(a) == digest(b)
    assert (a.offset, a.now_ms, a.next_sweep_ms) == (b.offset, b.now_ms, b.next_sweep_ms)
    assert a.beat_cache.keys() == b.beat_cache.keys()
    assert sorted(b.steady_ids.values()) == sorted(row for row, _ in b.beat_cache.values())


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs=chunks())
def test_fold_lists_equals_fold_one_by_one(runs: list[tuple[list[Event], list[int]]]) -> None:
    config = CoreConfig(node_timeout_ms=3_000)
    one, lists = State(config), State(config)
    for events, times in runs:
        for event, at in zip(events, times, strict=True):
            fold(one, event, at)
        fold_lists(lists, events, times)
        check(lists)
        _same(one, lists)
        decisions = tuple(decide(one, Policy()))  # placements, so that cancels and failures free
        for state in (one, lists):
            fold(state, DecisionBatch(as_of=state.offset, digest="", decisions=decisions), state.now_ms)
        _same(one, lists)


def test_fold_lists_takes_short_runs_and_decision_batches_one_by_one() -> None:
    one, lists = State(), State()
    events: list[Event] = [BEATS["n0"], job("a"), BEATS["n0"]]
    fold_lists(lists, events, [1, 2, 3])
    for event, at in zip(events, [1, 2, 3], strict=True):
        fold(one, event, at)
    _same(one, lists)
    batch = DecisionBatch(as_of=3, digest="", decisions=tuple(decide(one, Policy())))
    long: list[Event] = [BEATS["n0"]] * 80 + [batch] + [BEATS["n0"]] * 80
    times = list(range(10, 10 + len(long)))
    fold_lists(lists, long, times)
    for event, at in zip(long, times, strict=True):
        fold(one, event, at)
    _same(one, lists)
    assert lists.offset == 3 + 160  # a decision batch is not an input


def _fold_both(runs: list[tuple[list[Event], list[int]]]) -> tuple[State, State]:
    """Fold each run one by one and with ``fold_lists``; decide (the same decisions for both)
    after each run."""
    config = CoreConfig(node_timeout_ms=3_000)
    one, lists = State(config), State(config)
    for events, times in runs:
        for event, at in zip(events, times, strict=True):
            fold(one, event, at)
        fold_lists(lists, events, times)
        decisions = tuple(decide(one, Policy()))
        for state in (one, lists):
            fold(state, DecisionBatch(as_of=state.offset, digest="", decisions=decisions), state.now_ms)
    return one, lists


def test_a_sweep_sees_the_steady_heartbeats_before_it() -> None:
    """Nodes that beat steadily for longer than the timeout stay up and keep their tasks: the
    sweeps within the run read heartbeat times that the run wrote with numpy."""
    fleet = [BEATS[n] for n in NODES]
    first = [*fleet * 12, *(job(f"j{i}", gpus=8) for i in range(6))]
    steady = fleet * 66  # 396 beats, 10 ms apart: about 4 s, past the 3 s timeout
    one, lists = _fold_both([(first, list(range(1_000, 1_078))), (steady, list(range(1_100, 5_060, 10)))])
    _same(one, lists)
    assert (lists.nodes.view("status") == 1).all()
    assert (lists.jobs.view("state") == JobState.RUNNING).all()


def test_a_node_that_went_down_mid_run_comes_back_on_its_next_beat() -> None:
    fleet = [BEATS[n] for n in NODES]
    run = [*fleet * 5, SICK["n1"], *fleet * 6, NodeRemoved(cell="c1", node="n2"), *fleet * 2]
    times = list(range(2_000, 2_000 + len(run)))
    one, lists = _fold_both([(fleet * 12, list(range(1_000, 1_072))), (run, times)])
    _same(one, lists)
    assert (lists.nodes.view("status") == 1).all()


def test_runs_of_submissions_fold_as_one_by_one() -> None:
    """``fold_many`` writes a run of submissions' columns at once: the same state as ``fold``
    one by one — duplicates (earlier and within the run), gangs of several groups, allowed
    cells and GPU models seen for the first time, a shape-mix refresh inside a run, steady
    heartbeats between runs, and a run that reaches a node sweep."""
    from fleetlog.events import JobSubmitted, TaskGroup

    config = CoreConfig(node_timeout_ms=4_000, shape_window=8, shape_mix_every=3)
    events: list[Event] = [BEATS[name] for name in NODES]
    times = [10] * len(NODES)
    at = 10
    for k in range(60):
        at += 70  # (node sweeps every second: some runs reach one)
        kind = k % 6
        if kind == 0:
            cells = ("c1",) if k % 4 else ()
            event: Event = job(f"j{k}", gpus=k % 3, milli=500 if k % 3 == 1 else 1000, cells=cells)
        elif kind == 1:
            event = JobSubmitted(
                job_id=f"j{k}",
                tenant=f"t{k % 4}",
                queue=f"q{k % 3}",
                priority=k % 5,
                required_topology="rack" if k % 4 == 1 else None,
                expected_duration_ms=1_000 * k,
                task_groups=(
                    TaskGroup(
                        count=3,
                        cpu_milli=2_000,
                        mem_mib=512,
                        gpu_count=1,
                        gpu_milli=1000,
                        gpu_models=(f"M{k}",),
                    ),
                    TaskGroup(count=1, cpu_milli=500, mem_mib=256),
                ),
            )
        elif kind == 2:
            event = job(f"j{k - 2}")  # a duplicate of a job submitted earlier
        elif kind == 3:
            event = BEATS[NODES[k % len(NODES)]]  # a steady heartbeat between runs
        else:
            event = job(f"j{k}", gpus=1, milli=250 * (k % 4 + 1), cpu=1_000 * k)
        events.append(event)
        times.append(at)
    events += [job("dup"), job("dup")]  # twice within one run
    times += [at + 1, at + 2]
    one_by_one, at_once = State(config), State(config)
    for event, at_ms in zip(events, times, strict=True):
        fold(one_by_one, event, at_ms)
    for start in range(0, len(events), 13):  # runs cut at arbitrary places
        fold_lists(at_once, events[start : start + 13], times[start : start + 13])
    check(at_once)
    assert at_once.duplicates == one_by_one.duplicates > 10
    assert at_once.shape_mix == one_by_one.shape_mix
    assert digest(at_once) == digest(one_by_one)
