"""The batch twins of fold (:mod:`fleetlog.core.fold_batch`) give the state ``fold`` gives one
event at a time: ``fold_lists`` (steady heartbeats written with numpy), ``fold_many``, runs of
submissions (``NewJobs``) and runs of placements (``fold_decisions``/``on_placed_many``),
over every chunking, gaps past the node timeout, duplicates and unknown jobs and nodes."""

from __future__ import annotations

import random

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetlog.core.decide import decide
from fleetlog.core.digest import digest
from fleetlog.core.fold import fold, fold_decision
from fleetlog.core.fold_batch import fold_decisions, fold_fast, fold_lists, fold_many, fold_submissions
from fleetlog.core.invariants import check
from fleetlog.core.policy import Policy
from fleetlog.core.state import CoreConfig, JobState, State
from fleetlog.events import (
    DecisionBatch,
    Event,
    JobCancelled,
    JobPlaced,
    JobSubmitted,
    NodeDrained,
    NodeRemoved,
    PolicyGrant,
    PolicySet,
    TaskFailed,
    TaskFinished,
    TaskPreempted,
    TaskStarted,
)
from fleetlog.events.model import NodeLabel, Taint, Toleration
from tests.core.budget import examples
from tests.core.builders import job, node, quota

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
    assert a.observations.to_builtins() == b.observations.to_builtins()
    assert a.derived.beat_cache.keys() == b.derived.beat_cache.keys()
    beats = b.derived
    assert sorted(beats.steady_ids.values()) == sorted(row for row, _ in beats.beat_cache.values())


@settings(max_examples=examples(120), deadline=None, suppress_health_check=[HealthCheck.too_slow])
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
    from fleetlog.events import TaskGroup

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
                labels={"k": str(k)},
                annotations={"why": "a gang"} if k % 4 == 1 else {},
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
    assert at_once.job_meta == one_by_one.job_meta
    assert len(at_once.job_meta) == 10  # (kind 1: every sixth event, labelled)


# --- chunking: fold one by one == fold_many == fold_lists, however the log is cut -------------

CHUNK_CONFIG = CoreConfig(node_timeout_ms=3_000, shape_window=16, shape_mix_every=5)
CHUNK_POLICY = Policy(thrash_window_ms=1_000)
Log = list[tuple[Event, int]]


class _LogWriter:
    """Builds a log as producers and the scheduler would write it: every input folded one by
    one into a reference state as it is written, decision batches decided on that state."""

    def __init__(self) -> None:
        self.ref, self.at, self.jobs = State(CHUNK_CONFIG), 1_000, 0
        self.log: Log = []

    def put(self, event: Event, step: int = 0, back: int = 0) -> None:
        self.at += step
        at = self.at - back  # (log time may even go back)
        fold(self.ref, event, at)
        self.log.append((event, at))

    def decide(self) -> None:
        decisions = tuple(decide(self.ref, CHUNK_POLICY))
        self.put(DecisionBatch(as_of=self.ref.offset, digest=digest(self.ref), decisions=decisions))


def _task_event(draw: st.DrawFn, w: _LogWriter, kind: str) -> Event:
    j, t = f"j{draw(st.integers(0, max(0, w.jobs - 1)))}", draw(st.integers(0, 2))
    if kind == "t":
        return TaskStarted(job_id=j, task_index=t, node="n0")
    if kind == "f":
        return TaskFinished(job_id=j, task_index=t, exit_code=draw(st.sampled_from([0, 0, 1])))
    if kind == "F":
        return TaskFailed(job_id=j, task_index=t)
    return JobCancelled(job_id=j)


def _unknown(draw: st.DrawFn) -> Event:
    return draw(
        st.sampled_from([
            TaskStarted(job_id="ghost", task_index=0, node="n0"),
            TaskFinished(job_id="ghost", task_index=0, exit_code=0),
            TaskFailed(job_id="ghost", task_index=0),
            JobCancelled(job_id="ghost"),
            NodeRemoved(cell="c1", node="ghost-node"),
            NodeRemoved(cell="ghost-cell", node="n0"),
        ])
    )  # fmt: skip


def _submission(draw: st.DrawFn, w: _LogWriter) -> Event:
    w.jobs += 1
    gpus = draw(st.sampled_from([0, 1, 2, 4, 8]))
    submitted = job(
        f"j{w.jobs - 1}",
        tenant=draw(st.sampled_from(["a", "b"])),
        tasks=draw(st.integers(1, 3)),
        gpus=gpus,
        milli=draw(st.sampled_from([250, 500, 1000])) if gpus == 1 else 1000,
        priority=draw(st.integers(0, 3)),  # (higher ones preempt when the fleet is full)
    )
    meta = draw(st.sampled_from([{}, {"labels": {"team": "a"}}, {"annotations": {"note": f"j {w.jobs}"}}]))
    return msgspec.structs.replace(submitted, **meta)  # (State.job_meta: kept, compacted, retired alike)


@st.composite
def chunked_logs(draw: st.DrawFn) -> tuple[Log, list[int]]:
    """A log of every kind of event, with gaps longer than the node timeout (many times), node
    sweeps falling inside runs of submissions and of steady heartbeats, and decision batches
    with placements and preemptions; and cut points."""
    w = _LogWriter()
    for name in NODES:
        w.put(BEATS[name], 1)
    for name in NODES:  # a full fleet, so that later jobs of higher priority preempt
        w.put(job(f"fill-{name}", tasks=draw(st.integers(1, 2)), gpus=8 // len(NODES[:2])), 1)
    w.decide()
    beat_weight = draw(st.sampled_from([1, 6, 30]))  # (fold_lists' fast path and its fallback)
    for _ in range(draw(st.integers(10, 120))):
        kind = draw(st.sampled_from("b" * beat_weight + "SSJJPtfFcqeRUxgGGGddDuTCNA"))
        name = draw(st.sampled_from(NODES))
        step, back = draw(st.integers(0, 40)), draw(st.sampled_from([0, 0, 0, 50]))
        if kind == "b":
            w.put(BEATS[name], step, back)
        elif kind == "S":  # a run of submissions, 200-2,000 ms apart: past a sweep, maybe the timeout
            for _ in range(draw(st.integers(2, 12))):
                w.put(_submission(draw, w), draw(st.sampled_from([0, 200, 2_000])))
        elif kind == "J":
            w.put(_submission(draw, w), step, back)
        elif kind == "P":  # urgent: preempts
            w.jobs += 1
            w.put(job(f"j{w.jobs - 1}", tasks=draw(st.integers(1, 3)), gpus=8, priority=9), step)
        elif kind in "tfFc":
            w.put(_task_event(draw, w, kind), step, back)
        elif kind == "q":
            w.put(quota(draw(st.sampled_from(["a", "b"])), draw(st.integers(0, 24)), cohort="co"), step)
        elif kind == "e":  # an equal heartbeat, not the same object
            w.put(node(name, gpus=8), step, back)
        elif kind in "RUx":
            w.put(
                {"R": RESHAPED, "U": SICK}[kind][name] if kind != "x" else NodeRemoved(cell="c1", node=name)
            )
        elif kind == "T":  # labels, taints (NoExecute: evicts), a cordon, or none again
            hb = BEATS[name]
            attrs = draw(
                st.sampled_from(
                    [
                        {},
                        {"labels": {"zone": "a"}},
                        {"unschedulable": True},
                        {"taints": (Taint(key="m", effect="NoExecute"),)},
                        {"taints": (Taint(key="g", value="x", effect="NoSchedule"),)},
                    ]
                )
            )
            w.put(msgspec.structs.replace(hb, **attrs), step, back)
        elif kind == "A":  # the API's policy: kept, never decided by
            roles = draw(st.sampled_from([("policy-admin",), ("tenant:a", "reader"), ()]))
            w.put(PolicySet(grants=(PolicyGrant(f"p{w.jobs}", roles),)), step, back)
        elif kind == "N":  # an operator's drain, or its undoing (also of a node never drained)
            w.put(NodeDrained(cell="c1", node=name, drained=draw(st.booleans()), reason="ops"), step, back)
        elif kind == "C":  # a submission with constraints
            base = _submission(draw, w)
            assert isinstance(base, JobSubmitted)
            extra = draw(
                st.sampled_from(
                    [
                        {"tolerations": (Toleration(operator="Exists"),)},
                        {"node_selector": (NodeLabel("zone", "a"),)},
                        {"tolerations": (Toleration(key="g", value="x"),)},
                    ]
                )
            )
            groups = tuple(msgspec.structs.replace(g, **extra) for g in base.task_groups)
            w.put(msgspec.structs.replace(base, task_groups=groups), step, back)
        elif kind == "D":  # a resent submission (a duplicate job id)
            w.put(job(f"j{draw(st.integers(0, max(0, w.jobs - 1)))}"), step, back)
        elif kind == "u":  # observations of a job and a node the state never saw
            w.put(_unknown(draw), step, back)
        elif kind == "g":  # an outage: nothing for longer than the node timeout
            w.put(BEATS[name], draw(st.sampled_from([3_500, 9_000, 30_000])))
        elif kind == "G":  # the fleet beats steadily across several sweeps and past the timeout
            for _ in range(draw(st.integers(2, 12))):
                for beat in BEATS.values():
                    w.put(beat, draw(st.sampled_from([0, 10, 150])))
                if draw(st.booleans()):
                    w.put(_submission(draw, w), draw(st.sampled_from([0, 600])))
        else:
            w.decide()
    cuts = draw(st.lists(st.integers(1, len(w.log) - 1), max_size=12))
    return w.log, sorted(set(cuts))


def _readable(state: State) -> tuple[object, ...]:
    """A few fields a person reads: position, clock, nodes up, jobs running and pending."""
    return (
        state.offset,
        state.now_ms,
        state.next_sweep_ms,
        int((state.nodes.view("status") == 1).sum()),
        int((state.jobs.view("state") == JobState.RUNNING).sum()),
        state.pending_count,
        state.nodes.view("last_heartbeat_ms").tolist(),
        state.shape_mix,
        state.job_meta,
        state.policy,
        state.observations.to_builtins(),  # (why task reports were ignored: recorded alike)
    )


def _fold_as_the_loop_does(state: State, chunk: Log) -> None:
    """``fold_lists`` of each run of inputs, ``fold_fast`` of each decision batch between them
    (at the state's clock), as the scheduler loop and replay do."""
    run: Log = []
    for event, at in [*chunk, (None, 0)]:
        if isinstance(event, DecisionBatch | None):
            fold_lists(state, [e for e, _ in run], [t for _, t in run])
            run = []
            if event is not None:
                fold_fast(state, event, state.now_ms)
        else:
            run.append((event, at))


def _fold_chunked(log: Log, cuts: list[int], how: str, digests: dict[int, str]) -> State:
    """Fold ``log`` cut at ``cuts`` with ``how`` ("many" or "lists"), checking the digest at
    the end of every chunk against ``digests`` (of fold one by one) where it has one."""
    state = State(CHUNK_CONFIG)
    for start, end in zip([0, *cuts], [*cuts, len(log)], strict=True):
        chunk = log[start:end]
        if how == "many":
            fold_many(state, chunk)
        else:
            _fold_as_the_loop_does(state, chunk)
        if end in digests:
            assert digest(state) == digests[end], f"{how}, chunk [{start}, {end}) of {len(log)}"
    return state


@settings(
    max_examples=examples(80), deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(case=chunked_logs())
def test_every_chunking_folds_to_the_state_of_fold_one_by_one(case: tuple[Log, list[int]]) -> None:
    log, cuts = case
    one, digests = State(CHUNK_CONFIG), {}
    for i, (event, at) in enumerate(log, 1):
        fold(one, event, at)
        if i in cuts or i == len(log):
            digests[i] = digest(one)
    singly = State(CHUNK_CONFIG)  # every decision of a batch on its own (no on_placed_many)
    for event, at in log:
        if isinstance(event, DecisionBatch):
            for decision in event.decisions:
                fold_decision(singly, decision)
        else:
            fold(singly, event, at)
    assert digest(singly) == digests[len(log)]
    for chunking in (cuts, [], list(range(1, len(log)))):  # drawn cuts, the whole log, chunks of 1
        for how in ("many", "lists"):
            state = _fold_chunked(log, chunking, how, digests)
            check(state)
            assert _readable(state) == _readable(one)


def test_a_backlog_longer_than_the_node_timeout_folded_in_one_step_keeps_every_gang_running() -> None:
    """The probe of issue 14: after an outage of the scheduler, during which producers kept
    heartbeating and submitting, one step folds 90 s of log time (the node timeout is 60 s).
    Folded one by one nothing goes down; folded as one run, the sweeps inside the runs of
    submissions read the heartbeat times as they were before the step, so every node was
    marked down and every running gang requeued, and decide placed them all again."""
    fleet = [node(f"h{i}", rack=f"r{i % 4}") for i in range(64)]
    gangs = [job(f"gang{i}", tasks=2, gpus=8, topology="rack") for i in range(32)]
    one, step = State(), State()
    for state in (one, step):
        fold_many(state, [(e, 1_000) for e in (*fleet, *gangs)])
    placed = tuple(decide(one, Policy()))
    assert sum(isinstance(d, JobPlaced) for d in placed) == 32
    for state in (one, step):
        fold(state, DecisionBatch(as_of=state.offset, digest="", decisions=placed), state.now_ms)
    events: list[Event] = []
    times: list[int] = []
    for second in range(90):  # each second: 100 submissions, then every node's steady heartbeat
        events += [job(f"s{second}-{k}", gpus=0, cpu=100) for k in range(100)] + fleet
        times += [2_000 + 1_000 * second] * (100 + len(fleet))
    for event, at in zip(events, times, strict=True):
        fold(one, event, at)
    fold_lists(step, events, times)
    assert int((step.nodes.view("status") == 1).sum()) == 64
    running = step.jobs.view("state")[: len(gangs)]
    assert (running == JobState.RUNNING).all()
    _same(one, step)
    again = decide(step, Policy())
    assert not [d for d in again if isinstance(d, TaskPreempted) or d.job_id.startswith("gang")]


def test_folding_without_fold_lists_keeps_no_growing_record() -> None:
    """``steady_gone`` is fold_lists' note of what left the steady cache while it runs; folding
    one by one (the reference, what-if, tests) used to append to it at every heartbeat."""
    state = State()
    for at in range(1, 5_001):
        fold(state, BEATS[NODES[at % len(NODES)]], at)
        fold(state, job(f"j{at}", gpus=0), at)
    fold_many(state, [(RESHAPED[name], 5_001) for name in NODES])
    derived = state.derived
    assert not derived.steady_gone
    assert sorted(derived.steady_ids.values()) == sorted(row for row, _ in derived.beat_cache.values())


def test_fold_many_equals_fold_one_by_one() -> None:
    """Steady heartbeats, a reshape, a removal, a sick node, a submission, with gaps of 700 ms
    past a 3 s node timeout: ``fold_many`` gives the state of ``fold`` one by one."""
    beats = [node(f"n{i}", gpus=8) for i in range(5)]
    events = [
        *beats,
        job("a", gpus=8),
        *beats,
        node("n1", gpus=4),
        *beats,
        NodeRemoved(cell="c1", node="n2"),
        *beats,
        node("n3", healthy=False),
        *beats * 3,
    ]
    pairs = [(e, 100 + i * 700) for i, e in enumerate(events)]
    one, many = State(CoreConfig(node_timeout_ms=3_000)), State(CoreConfig(node_timeout_ms=3_000))
    for e, at in pairs:
        fold(one, e, at)
    fold_many(many, pairs)
    assert digest(one) == digest(many)
    assert many.offset == len(events)


# --- runs of placements (fold_decisions, on_placed_many) -------------------------------------

PLACED_CONFIG = CoreConfig(node_timeout_ms=60_000, shape_window=64, shape_mix_every=16)


def placements_of(seed: int) -> tuple[list[Event], list[JobPlaced]]:
    """Inputs, and a decide call's placements over them (many on shared nodes, some on GPU shares)."""
    rng = random.Random(seed)
    events: list[Event] = [node("n0", gpus=2)]
    for k in range(30):
        gpus = rng.choice([0, 1, 1, 2])
        events.append(job(f"j{k}", gpus=gpus, milli=rng.choice([250, 500, 1000]) if gpus == 1 else 1000))
    state = State(PLACED_CONFIG)
    for at, event in enumerate(events):
        fold(state, event, at + 1)
    first = DecisionBatch(as_of=state.offset, digest=digest(state), decisions=tuple(decide(state, Policy())))
    fold(state, first, len(events))
    assert len(state.reason_text) > 10  # most wait, with a reason, before the nodes below come
    events.append(first)
    events.extend(node(f"n{i}", gpus=(2, 4, 8)[i % 3]) for i in range(1, 6))
    for at, event in enumerate(events[-5:]):
        fold(state, event, len(events) + at)
    placed = [d for d in decide(state, Policy()) if isinstance(d, JobPlaced)]
    return events, placed


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_runs_of_placements_fold_as_one_by_one(seed: int) -> None:
    """``fold_decisions`` takes runs of one-task ``JobPlaced`` at once: the same state (every
    column, usage, reasons) as ``on_placed`` one after another."""
    events, placed = placements_of(seed)
    assert len(placed) > 15
    at_once, one_by_one = State(PLACED_CONFIG), State(PLACED_CONFIG)
    for at, event in enumerate(events):
        fold(at_once, event, at + 1)
        fold(one_by_one, event, at + 1)
    fold_decisions(at_once, placed)
    for d in placed:
        fold_decision(one_by_one, d)
    check(at_once)
    assert digest(at_once) == digest(one_by_one)
    assert at_once.usage == one_by_one.usage
    for table in ("nodes", "jobs", "tasks"):
        for name in getattr(at_once, table).spec:
            assert (getattr(at_once, table).view(name) == getattr(one_by_one, table).view(name)).all(), name


def test_a_bad_placement_in_a_run_fails_as_it_did_one_by_one() -> None:
    """A run with a job placed twice: the first placement is applied, the second raises."""
    events, placed = placements_of(4)
    run = [*placed[:9], placed[3]]
    state = State(PLACED_CONFIG)
    for at, event in enumerate(events):
        fold(state, event, at + 1)
    with pytest.raises(ValueError, match=f"places job '{placed[3].job_id}', which is not pending"):
        fold_decisions(state, run)
    assert int(state.jobs.view("state")[state.job_row(placed[8].job_id)]) == JobState.RUNNING


# --- the limits: empty runs, runs of one ----------------------------------------------------


def _started() -> tuple[State, list[Event]]:
    """A state with nodes, running and pending jobs; and a decide call's decisions on it."""
    state = State(CHUNK_CONFIG)
    events: list[Event] = [*BEATS.values(), *(job(f"j{i}", gpus=2) for i in range(20))]
    for at, event in enumerate(events, 1_000):
        fold(state, event, at)
    return state, list(decide(state, Policy()))


def test_empty_runs_change_nothing() -> None:
    state, decisions = _started()
    before = (digest(state), state.offset, state.now_ms, state.next_sweep_ms)
    fold_lists(state, [], [])
    fold_many(state, [])
    fold_submissions(state, [], [])
    fold_decisions(state, [])
    fold_fast(state, DecisionBatch(as_of=state.offset, digest="", decisions=()), 99_999)
    assert (digest(state), state.offset, state.now_ms, state.next_sweep_ms) == before
    assert decisions  # (the state had something to decide: a batch of one below)


@pytest.mark.parametrize(
    "event",
    [BEATS["n0"], SICK["n1"], RESHAPED["n2"], job("new", gpus=1), job("j3"), JobCancelled(job_id="ghost")],
    ids=["steady", "sick", "reshaped", "submitted", "duplicate", "unknown-job"],
)
@pytest.mark.parametrize("at_ms", [1_030, 9_000], ids=["soon", "past-the-timeout"])
def test_a_run_of_one_folds_as_fold(event: Event, at_ms: int) -> None:
    one, _ = _started()
    for twin in ("lists", "many", "submissions", "fast"):
        state, _ = _started()
        if twin == "lists":
            fold_lists(state, [event], [at_ms])
        elif twin == "many":
            fold_many(state, [(event, at_ms)])
        elif twin == "submissions" and isinstance(event, JobSubmitted):
            fold_submissions(state, [event], [at_ms])
        else:
            fold_fast(state, event, at_ms)
        if twin == "lists":
            fold(one, event, at_ms)
        _same(one, state)


def test_a_decision_batch_of_one_folds_as_fold() -> None:
    _, decisions = _started()
    placed = [d for d in decisions if isinstance(d, JobPlaced)]
    for batch in ([placed[0]], placed[:8], decisions):
        state, _ = _started()
        ref, _ = _started()
        fold_decisions(state, batch)
        for d in batch:
            fold_decision(ref, d)
        _same(ref, state)
