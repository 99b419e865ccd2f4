"""Hypothesis state machine: random submit / cancel / heartbeat / node loss / quota / decide,
steady heartbeats across sweeps and outages longer than the node timeout, resends of old
submissions; ended jobs retire soon and the tables compact often.

After every step the invariants hold, and decide gives the same decisions on a restored copy
(no memo of earlier calls); at the end, a snapshot restores to the same digest, and replaying
the recorded inputs and decisions from scratch — one by one, and with ``fold_many`` and
``fold_lists`` over the log cut where the machine chose — reproduces every decision batch.
A twin state that never retires folds the same log: every decide gives the same decisions as
long as no resend came after its job's dedup window (from then on the two may differ: the
retiring state takes it for a new job).
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from fleetlog.core.decide import decide
from fleetlog.core.digest import digest, restore, snapshot
from fleetlog.core.fold import fold
from fleetlog.core.fold_batch import fold_lists, fold_many
from fleetlog.core.invariants import check
from fleetlog.core.policy import Policy
from fleetlog.core.state import CoreConfig, State
from fleetlog.events import (
    DecisionBatch,
    Event,
    JobCancelled,
    NodeHeartbeat,
    NodeRemoved,
    TaskFailed,
    TaskFinished,
    TaskStarted,
)
from tests.core.budget import examples
from tests.core.builders import job, node, quota

NODES = [f"n{i}" for i in range(6)]
TENANTS = ["a", "b", "c"]
CONFIG = CoreConfig(node_timeout_ms=5_000, retain_finished_ms=2_000, dedup_window_ms=8_000,
                    compact_min_rows=2)
KEEP_ALL = CoreConfig(node_timeout_ms=5_000, retain_finished_ms=None)


class Scheduler(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = State(CONFIG)
        self.plain = State(KEEP_ALL)  # the twin that never retires
        self.same = True  # no resend after its dedup window yet: the twins decide alike
        self.policy = Policy(thrash_window_ms=2_000)
        self.now_ms = 0
        self.log: list[tuple[int, Event]] = []
        self.jobs = 0
        self.beats: dict[int, NodeHeartbeat] = {}  # each node's last heartbeat, the object itself
        self.cuts: list[int] = []  # where the log is cut for fold_many and fold_lists

    def apply(self, event: Event, step_ms: int = 100) -> None:
        self.now_ms += step_ms
        fold(self.state, event, self.now_ms)
        fold(self.plain, event, self.now_ms)
        self.log.append((self.now_ms, event))

    @rule(
        i=st.integers(0, 5),
        gpus=st.sampled_from([0, 1, 2, 4, 8]),
        rack=st.sampled_from(["r1", "r2"]),
        healthy=st.booleans(),
        step=st.integers(1, 3000),
        foreign=st.sampled_from([(0, 0), (0, 1), (0, 8), (90_000, 0), (96_000, 2)]),
    )
    def heartbeat(
        self, i: int, gpus: int, rack: str, healthy: bool, step: int, foreign: tuple[int, int]
    ) -> None:
        # a node keeps its shape unless it changes (then it is drained and reshaped); work
        # fleetlog does not own may hold some of it, also what fleetlog's tasks hold
        held = (foreign[0], foreign[0] * 4, min(foreign[1], gpus))
        beat = node(NODES[i], gpus=gpus, rack=rack, model="A100" if i % 2 else "T4", healthy=healthy,
                    foreign=held)
        if healthy:
            self.beats[i] = beat
        else:
            self.beats.pop(i, None)  # (a sick node sends nothing more in ``steady_fleet``)
        self.apply(beat, step)

    @precondition(lambda self: self.beats)
    @rule(rounds=st.integers(1, 12), step=st.sampled_from([50, 400, 1_500, 3_000]), submit=st.booleans())
    def steady_fleet(self, rounds: int, step: int, submit: bool) -> None:
        """Producers write in rounds ``step`` apart: maybe a submission, then every node's last
        heartbeat again (the very object) at the same time. Runs of steady heartbeats that cross
        sweeps and the node timeout, with the sweeps falling on the submissions."""
        for _ in range(rounds):
            first = step
            if submit:
                self.jobs += 1
                self.apply(job(f"j{self.jobs}", gpus=0, cpu=500), step)
                first = 0
            for i in sorted(self.beats):
                self.apply(self.beats[i], first)
                first = 0

    @rule(gap=st.sampled_from([6_000, 20_000, 65_000]), submissions=st.integers(1, 5))
    def outage(self, gap: int, submissions: int) -> None:
        """Nothing for longer than the node timeout, then submissions first: a sweep falls in a run
        of submissions."""
        for k in range(submissions):
            self.jobs += 1
            self.apply(job(f"j{self.jobs}", gpus=1), gap if k == 0 else 10)

    @rule(gap=st.sampled_from([1_000, 3_000, 9_000]), data=st.data())
    def wait(self, gap: int, data: st.DataObject) -> None:
        """Time passes (a heartbeat of a node that sent one, or a quota, ``gap`` later): ended
        jobs retire, retired ids leave the dedup window, the tables compact."""
        if self.beats:
            self.apply(self.beats[data.draw(st.sampled_from(sorted(self.beats)))], gap)
        else:
            self.apply(quota("a", 4, cohort="co"), gap)

    @rule()
    def cut(self) -> None:
        self.cuts.append(len(self.log))

    @rule(
        tenant=st.sampled_from(TENANTS),
        tasks=st.integers(1, 3),
        gpus=st.sampled_from([0, 1, 2, 8]),
        milli=st.sampled_from([250, 500, 1000]),
        priority=st.integers(0, 2),
        topology=st.sampled_from([None, "rack"]),
        spread=st.sampled_from([None, None, "host"]),
    )
    def submit(
        self, tenant: str, tasks: int, gpus: int, milli: int, priority: int, topology: str | None,
        spread: str | None,
    ) -> None:
        self.jobs += 1
        self.apply(
            job(
                f"j{self.jobs}",
                tenant=tenant,
                tasks=tasks,
                gpus=gpus,
                milli=milli if gpus == 1 else 1000,
                priority=priority,
                topology=topology,
                spread=spread,
            )
        )  # type: ignore[arg-type]

    @precondition(lambda self: self.jobs > 0)
    @rule(data=st.data(), kind=st.sampled_from(["start", "cancel", "finish", "finish", "fail"]))
    def job_event(self, data: st.DataObject, kind: str) -> None:
        j = f"j{data.draw(st.integers(1, self.jobs))}"
        task = data.draw(st.integers(0, 2))
        event: Event = {
            "start": TaskStarted(job_id=j, task_index=task, node="n0"),
            "cancel": JobCancelled(job_id=j),
            "finish": TaskFinished(job_id=j, task_index=task),
            "fail": TaskFailed(job_id=j, task_index=task),
        }[kind]
        self.apply(event)

    @precondition(lambda self: self.jobs > 0)
    @rule(data=st.data())
    def finish_job(self, data: st.DataObject) -> None:
        """Every task of a job reports finished (it succeeds if it runs): jobs end often."""
        j = f"j{data.draw(st.integers(1, self.jobs))}"
        row = self.plain.job_row(j)
        for task in range(int(self.plain.jobs.cols["ntasks"][row]) if row >= 0 else 1):
            self.apply(TaskFinished(job_id=j, task_index=task), 10)

    @precondition(lambda self: self.jobs > 0)
    @rule(data=st.data(), gpus=st.sampled_from([0, 1]))
    def resend(self, data: st.DataObject, gpus: int) -> None:
        """An old submission again: a duplicate while its id is known or remembered, a new job
        to the retiring state once its dedup window has passed."""
        j = f"j{data.draw(st.integers(1, self.jobs))}"
        if not self.state.known_job(j):
            self.same = False
        self.apply(job(j, gpus=gpus))

    @rule(i=st.integers(0, 5))
    def remove(self, i: int) -> None:
        self.apply(NodeRemoved(cell="c1", node=NODES[i]))

    @rule(
        tenant=st.sampled_from(TENANTS),
        gpus=st.integers(0, 16),
        borrow=st.one_of(st.none(), st.integers(0, 8)),
    )
    def set_quota(self, tenant: str, gpus: int, borrow: int | None) -> None:
        self.apply(quota(tenant, gpus, cohort="co", borrow=borrow))

    @rule()
    def run_decide(self) -> None:
        fresh = tuple(decide(restore(snapshot(self.state)), self.policy))  # (no memo of earlier calls)
        batch = DecisionBatch(
            as_of=self.state.offset,
            digest=digest(self.state),
            decisions=tuple(decide(self.state, self.policy)),
        )
        assert batch.decisions == fresh
        own = tuple(decide(self.plain, self.policy))
        if self.same:
            assert own == batch.decisions
        fold(self.state, batch, self.now_ms)
        fold(self.plain, DecisionBatch(as_of=self.plain.offset, digest="", decisions=own), self.now_ms)
        self.log.append((self.now_ms, batch))

    @invariant()
    def invariants_hold(self) -> None:
        check(self.state)
        check(self.plain)

    def teardown(self) -> None:
        assert digest(restore(snapshot(self.state))) == digest(self.state)
        replayed = State(CONFIG)
        for at_ms, event in self.log:
            if isinstance(event, DecisionBatch):
                assert digest(replayed) == event.digest
                assert tuple(decide(replayed, self.policy)) == event.decisions
            fold(replayed, event, at_ms)
        assert digest(replayed) == digest(self.state)
        for how in ("many", "lists"):
            assert self.refold(how) == digest(self.state), how

    def refold(self, how: str) -> str:
        """Fold the log cut at ``cuts``: with ``fold_many`` (decision batches within its runs),
        or as the loop does (``fold_lists`` of the inputs, ``fold`` of each batch, whose digest
        is checked); the final digest."""
        state = State(CONFIG)
        for start, end in zip([0, *self.cuts], [*self.cuts, len(self.log)], strict=True):
            run: list[tuple[Event, int]] = []
            for at_ms, event in self.log[start:end]:
                if how == "lists" and isinstance(event, DecisionBatch):
                    fold_lists(state, [e for e, _ in run], [t for _, t in run])
                    run = []
                    assert digest(state) == event.digest
                    fold(state, event, at_ms)
                else:
                    run.append((event, at_ms))
            if how == "many":
                fold_many(state, run)
            else:
                fold_lists(state, [e for e, _ in run], [t for _, t in run])
        return digest(state)


Scheduler.TestCase.settings = settings(
    max_examples=examples(60), stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_scheduler_state_machine = Scheduler.TestCase
