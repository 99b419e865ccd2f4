"""Hypothesis state machine: random submit / cancel / heartbeat / node loss / quota / decide.

After every step the invariants hold; at the end, a snapshot restores to the same digest and
replaying the recorded inputs and decisions from scratch reproduces every decision batch.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from fleetlog.core.decide import decide
from fleetlog.core.digest import digest, restore, snapshot
from fleetlog.core.fold import fold
from fleetlog.core.invariants import check
from fleetlog.core.policy import Policy
from fleetlog.core.state import CoreConfig, State
from fleetlog.events import DecisionBatch, Event, JobCancelled, NodeRemoved, TaskFailed, TaskFinished
from tests.core.builders import job, node, quota

NODES = [f"n{i}" for i in range(6)]
TENANTS = ["a", "b", "c"]
CONFIG = CoreConfig(node_timeout_ms=5_000)


class Scheduler(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = State(CONFIG)
        self.policy = Policy(thrash_window_ms=2_000)
        self.now_ms = 0
        self.log: list[tuple[int, Event]] = []
        self.jobs = 0

    def apply(self, event: Event, step_ms: int = 100) -> None:
        self.now_ms += step_ms
        fold(self.state, event, self.now_ms)
        self.log.append((self.now_ms, event))

    @rule(
        i=st.integers(0, 5),
        gpus=st.sampled_from([0, 1, 2, 4, 8]),
        rack=st.sampled_from(["r1", "r2"]),
        healthy=st.booleans(),
        step=st.integers(1, 3000),
    )
    def heartbeat(self, i: int, gpus: int, rack: str, healthy: bool, step: int) -> None:
        # a node keeps its shape unless it changes (then it is drained and reshaped)
        self.apply(
            node(NODES[i], gpus=gpus, rack=rack, model="A100" if i % 2 else "T4", healthy=healthy), step
        )

    @rule(
        tenant=st.sampled_from(TENANTS),
        tasks=st.integers(1, 3),
        gpus=st.sampled_from([0, 1, 2, 8]),
        milli=st.sampled_from([250, 500, 1000]),
        priority=st.integers(0, 2),
        topology=st.sampled_from([None, "rack"]),
    )
    def submit(
        self, tenant: str, tasks: int, gpus: int, milli: int, priority: int, topology: str | None
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
            )
        )  # type: ignore[arg-type]

    @precondition(lambda self: self.jobs > 0)
    @rule(data=st.data(), kind=st.sampled_from(["cancel", "finish", "fail"]))
    def job_event(self, data: st.DataObject, kind: str) -> None:
        j = f"j{data.draw(st.integers(1, self.jobs))}"
        event: Event = {
            "cancel": JobCancelled(job_id=j),
            "finish": TaskFinished(job_id=j, task_index=0),
            "fail": TaskFailed(job_id=j, task_index=0),
        }[kind]
        self.apply(event)

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
        batch = DecisionBatch(
            as_of=self.state.offset,
            digest=digest(self.state),
            decisions=tuple(decide(self.state, self.policy)),
        )
        fold(self.state, batch, self.now_ms)
        self.log.append((self.now_ms, batch))

    @invariant()
    def invariants_hold(self) -> None:
        check(self.state)

    def teardown(self) -> None:
        assert digest(restore(snapshot(self.state))) == digest(self.state)
        replayed = State(CONFIG)
        for at_ms, event in self.log:
            if isinstance(event, DecisionBatch):
                assert digest(replayed) == event.digest
                assert tuple(decide(replayed, self.policy)) == event.decisions
            fold(replayed, event, at_ms)
        assert digest(replayed) == digest(self.state)


Scheduler.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_scheduler_state_machine = Scheduler.TestCase
