"""Builders for core tests: nodes, jobs, quotas, and a driver that folds, decides and checks."""

from __future__ import annotations

from collections.abc import Callable

from fleetlog.core.decide import decide
from fleetlog.core.digest import digest
from fleetlog.core.fold import fold
from fleetlog.core.fold_batch import fold_fast, fold_lists, fold_many
from fleetlog.core.invariants import check
from fleetlog.core.policy import Policy
from fleetlog.core.state import CoreConfig, State
from fleetlog.events import (
    DecisionBatch,
    Event,
    JobPending,
    JobPlaced,
    JobSubmitted,
    NodeHeartbeat,
    QuotaSet,
    Resources,
    TaskGroup,
)
from fleetlog.events.model import Decision, SpreadLevel, TopologyLevel


def node(
    name: str,
    gpus: int = 8,
    model: str = "A100",
    cell: str = "c1",
    rack: str = "r1",
    block: str = "b1",
    cpu: int = 96_000,
    mem: int = 786_432,
    healthy: bool = True,
    foreign: tuple[int, int, int] = (0, 0, 0),
) -> NodeHeartbeat:
    """A node's heartbeat; ``foreign``: the (cpu, mem, GPUs) work fleetlog does not own holds."""
    return NodeHeartbeat(
        cell=cell,
        node=name,
        cpu_milli=cpu,
        mem_mib=mem,
        gpu_count=gpus,
        gpu_model=model if gpus else "",
        topology=(block, rack, name),
        healthy=healthy,
        foreign_cpu_milli=foreign[0],
        foreign_mem_mib=foreign[1],
        foreign_gpus=foreign[2],
    )


def job(
    job_id: str,
    tenant: str = "t1",
    tasks: int = 1,
    gpus: int = 1,
    milli: int = 1000,
    cpu: int = 1000,
    mem: int = 1024,
    priority: int = 0,
    topology: TopologyLevel | None = None,
    models: tuple[str, ...] = (),
    cells: tuple[str, ...] = (),
    expected_ms: int | None = None,
    spread: SpreadLevel | None = None,
) -> JobSubmitted:
    return JobSubmitted(
        spread=spread,
        job_id=job_id,
        tenant=tenant,
        priority=priority,
        required_topology=topology,
        allowed_cells=cells,
        expected_duration_ms=expected_ms,
        task_groups=(
            TaskGroup(
                count=tasks,
                cpu_milli=cpu,
                mem_mib=mem,
                gpu_count=gpus,
                gpu_milli=milli if gpus else 0,
                gpu_models=models,
            ),
        ),
    )


def quota(
    tenant: str, gpus: int, cohort: str = "", borrow: int | None = None, weight: int = 1000
) -> QuotaSet:
    big = 1 << 39
    return QuotaSet(
        tenant=tenant,
        cohort=cohort,
        weight_milli=weight,
        nominal=Resources(cpu_milli=big, mem_mib=big, gpu_milli=gpus * 1000),
        borrowing_limit=None
        if borrow is None
        else Resources(cpu_milli=big, mem_mib=big, gpu_milli=borrow * 1000),
    )


class Driver:
    """Folds inputs at 1 ms steps of log time, decides, folds the batch, checks invariants."""

    def __init__(self, policy: Policy | None = None, config: CoreConfig | None = None) -> None:
        self.state = State(config)
        self.policy = policy or Policy()
        self.now_ms = 1_000
        self.batches: list[DecisionBatch] = []

    def feed(self, *events: Event, step_ms: int = 1, check_each: bool = True) -> None:
        """Fold ``events`` and check the invariants after each, or only after the last with
        ``check_each=False`` (thousands of alike events: a check reads the whole state, so
        checking after each one is quadratic)."""
        for event in events:
            self.now_ms += step_ms
            fold(self.state, event, self.now_ms)
            if check_each:
                check(self.state)
        if not check_each:
            check(self.state)

    def decide(self) -> list[Decision]:
        decisions = decide(self.state, self.policy)
        batch = DecisionBatch(
            as_of=self.state.offset,
            digest=digest(self.state),
            decisions=tuple(decisions),
            policy=self.policy.name,
        )
        self.batches.append(batch)
        fold_fast(self.state, batch, self.now_ms)  # (as the service loop does)
        check(self.state)
        return decisions

    def placed(self, decisions: list[Decision]) -> dict[str, JobPlaced]:
        return {d.job_id: d for d in decisions if isinstance(d, JobPlaced)}

    def reasons(self, decisions: list[Decision]) -> dict[str, str]:
        return {d.job_id: d.reason for d in decisions if isinstance(d, JobPending)}


def fold_chunked(
    config: CoreConfig,
    log: list[tuple[Event, int]],
    chunk: int,
    how: str,
    each: Callable[[State, int], None] | None = None,
) -> State:
    """A new state folded from ``log`` (events and their log times) ``chunk`` records at a time,
    by ``fold_many`` (``how == "many"``) or ``fold_lists``: the batch folds under any chunking.
    ``each(state, last)`` after each chunk, ``last`` the index of its last record."""
    state = State(config)
    for i in range(0, len(log), chunk):
        part = log[i : i + chunk]
        if how == "many":
            fold_many(state, part)
        else:
            fold_lists(state, [e for e, _ in part], [at for _, at in part])
        if each is not None:
            each(state, i + len(part) - 1)
    return state
