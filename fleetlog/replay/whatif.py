"""``what-if``: re-run the recorded inputs under another policy and compare with what happened.

The run decides where the recorded scheduler published a batch (``as_of``), with the new policy.
Until the first decision that differs, it is the recorded run.  From then on a job whose
placements or preemptions differ from the recorded ones is *moved*: its recorded task
observations no longer apply, so they are dropped and a simulated cell
(:class:`fleetlog.backends.simulated.SimulatedCell`, on a virtual clock) starts it where the new
policy put it and finishes it after the duration it ran in the recorded log (first start to last
finish of its tasks; never, if it never finished).  Everything else — submissions, cancels,
heartbeats, node failures and the observations of unmoved jobs — comes from the log as recorded.
Both sides are measured by the same observer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fleetlog.backends.simulated import (
    CellBehaviour,
    Cluster,
    NodeSpec,
    SimulatedCell,
    Timers,
    VirtualClock,
)
from fleetlog.core.decide import decide
from fleetlog.core.fold_batch import fold_fast, fold_many
from fleetlog.core.policy import Policy
from fleetlog.core.state import CoreConfig, JobState, State
from fleetlog.core.views import nodes_table
from fleetlog.events.codec import decode
from fleetlog.events.model import (
    Decision,
    DecisionBatch,
    Event,
    JobPending,
    JobPlaced,
    JobSubmitted,
    TaskFailed,
    TaskFinished,
    TaskStarted,
)
from fleetlog.log.base import INPUTS
from fleetlog.replay.engine import replay
from fleetlog.replay.observe import Measures
from fleetlog.replay.source import Input, InputReader, Progress, Source, batches, end_offset, instants
from fleetlog.replay.state_at import first_start
from fleetlog.simulation.metrics import Recorder

_OBSERVATIONS = (TaskStarted, TaskFinished, TaskFailed)


@dataclass
class Durations:
    """Observer of the recorded run: how long each job ran — from the first task start after its
    last placement to the last task finish of that run (a preempted run does not count)."""

    started: dict[str, int] = field(default_factory=dict)
    finished: dict[str, int] = field(default_factory=dict)
    placed: set[str] = field(default_factory=set)  # placed, no task started since: membership only

    def inputs(self, state: State, events: Sequence[Input]) -> None:
        for _, e, at_ms in events:
            if type(e) is TaskStarted and e.job_id in self.placed:
                self.placed.discard(e.job_id)
                self.started[e.job_id] = at_ms
            elif type(e) is TaskFinished and e.job_id in self.started:
                self.finished[e.job_id] = at_ms

    def decided(self, state: State, batch: DecisionBatch) -> None:
        for d in batch.decisions:
            if isinstance(d, JobPlaced):
                self.placed.add(d.job_id)
                self.finished.pop(d.job_id, None)

    def of(self, job_id: str) -> int | None:
        end = self.finished.get(job_id)
        return None if end is None else end - self.started[job_id]


@dataclass
class WhatIf:
    policy: str
    recorded_policy: str
    recorded: dict[str, Any]
    replayed: dict[str, Any]
    first_divergence: dict[str, Any] | None
    moved_jobs: int
    batches: int
    simulated_observations: int
    """Task starts and finishes of moved jobs that the simulated cells reported."""


class _Cells:
    """Simulated cells (one per cell of the recorded fleet) that run the moved jobs."""

    def __init__(self, final: State, durations: Durations) -> None:
        self.clock = VirtualClock(0)
        self.observations = 0
        self.timers = Timers(self.clock)
        self.durations = durations
        by_cell: dict[str, list[NodeSpec]] = {}
        for row in nodes_table(final):
            by_cell.setdefault(row["cell"], []).append(
                NodeSpec(row["node"], row["cpu_milli"], row["mem_mib"], row["gpus"], row["gpu_model"])
            )
        behaviour = CellBehaviour(max_start_delay_ms=0)
        self.cells = {
            cell: SimulatedCell(Cluster(cell, tuple(nodes), behaviour), self.timers, 0, Recorder(0))
            for cell, nodes in sorted(by_cell.items())
        }

    def register(self, job: JobSubmitted) -> None:
        for cell in self.cells.values():
            cell.register(job, self.durations.of(job.job_id))

    def apply(self, now_ms: int, decision: Decision) -> None:
        """A decision about a moved job: a placement goes to its cell, anything else to every cell."""
        self.clock.advance(max(self.clock.now_ms, now_ms))
        target = self.cells.get(decision.cell) if isinstance(decision, JobPlaced) else None
        for cell in [target] if target is not None else self.cells.values():
            cell.apply(decision)

    def due(self, until_ms: int) -> list[tuple[Event, int]]:
        """Observations the cells make up to ``until_ms``, with their virtual times."""
        out: list[tuple[Event, int]] = []
        while (at := self.timers.next_time()) is not None and at <= until_ms:
            for message in self.timers.fire_next().messages:
                out.append((decode(message.value).event, at))
        self.observations += len(out)
        return out


class _Run:
    """The what-if side: state, moved jobs, and the simulated cells."""

    def __init__(self, policy: Policy, cells: _Cells, core: CoreConfig | None = None) -> None:
        self.policy, self.cells = policy, cells
        self.state = State(core)
        self.measures = Measures()
        self.moved: set[str] = set()  # membership only
        self.placed: dict[str, JobPlaced] = {}
        self.first: dict[str, Any] | None = None

    def fold_inputs(self, events: Sequence[Input]) -> None:
        kept = [i for i in events if not self._of_moved(i[1])]
        pairs: list[tuple[Event, int]] = []
        for _, event, at_ms in kept:
            pairs += self.cells.due(at_ms)
            pairs.append((event, at_ms))
            if type(event) is JobSubmitted:
                self.cells.register(event)
        fold_many(self.state, pairs)
        self.measures.inputs(self.state, kept)

    def _of_moved(self, event: Event) -> bool:
        """A recorded observation of a moved job: the simulated cell reports it instead."""
        return isinstance(event, _OBSERVATIONS) and event.job_id in self.moved

    def decide_at(self, offset: int, recorded: DecisionBatch) -> None:
        for event, at in self.cells.due(self.state.now_ms):
            fold_fast(self.state, event, at)
        mine = tuple(decide(self.state, self.policy))
        if mine != recorded.decisions and self.first is None:
            self.first = {"decisions_offset": offset, "as_of": recorded.as_of, "time_ms": self.state.now_ms}
        if self.first is not None:
            self._mark_moved(recorded.decisions, mine)
        batch = DecisionBatch(as_of=recorded.as_of, digest="", decisions=mine, policy=self.policy.name,
                              typical_pods=self.policy.typical_pods)
        fold_fast(self.state, batch, self.state.now_ms)
        for d in mine:
            if isinstance(d, JobPlaced):
                self.placed[d.job_id] = d
            if not isinstance(d, JobPending) and d.job_id in self.moved:
                self.cells.apply(self.state.now_ms, d)
        self.measures.decided(self.state, batch)

    def _mark_moved(self, recorded: tuple[Decision, ...], mine: tuple[Decision, ...]) -> None:
        def effects(decisions: tuple[Decision, ...]) -> dict[str, list[Decision]]:
            out: dict[str, list[Decision]] = {}
            for d in decisions:
                if not isinstance(d, JobPending):
                    out.setdefault(d.job_id, []).append(d)
            return out

        a, b = effects(recorded), effects(mine)
        for job_id in sorted(a.keys() | b.keys()):
            if a.get(job_id) != b.get(job_id) and job_id not in self.moved:
                self.moved.add(job_id)
                self._hand_over(job_id, job_id in b)

    def _hand_over(self, job_id: str, decided_now: bool) -> None:
        """A job running under the new policy becomes the simulated cell's to finish."""
        row = self.state.job_row(job_id)
        running = row >= 0 and int(self.state.jobs.cols["state"][row]) == JobState.RUNNING
        if running and not decided_now and job_id in self.placed:
            self.cells.apply(self.state.now_ms, self.placed[job_id])


async def what_if(source: Source, policy: Policy, progress: Progress | None = None) -> WhatIf:
    durations, recorded = Durations(), Measures()
    start = await first_start(source)  # (after a prune: the oldest snapshot, for both sides)
    done = await replay(source, start, observers=(durations, recorded), progress=progress)
    recorded.finish(done.state)
    run = _Run(policy, _Cells(done.state, durations), source.core)
    again = await first_start(source)
    run.state = again.state
    reader = InputReader(source.store, again.inputs, run.state.config.cells)
    count, recorded_policy = 0, ""
    async for offset, _, batch in batches(source.store, again.decisions):
        async for events in reader.until(batch.as_of):
            for part in instants(events, run.state):  # measured at every log time, as the recorded side
                run.fold_inputs(part)
            if progress is not None:
                progress(len(events))
        run.decide_at(offset, batch)
        count, recorded_policy = count + 1, batch.policy
    async for events in reader.until(await end_offset(source.store, INPUTS)):
        for part in instants(events, run.state):
            run.fold_inputs(part)
    run.measures.finish(run.state)
    return WhatIf(
        policy.name,
        recorded_policy,
        recorded.summary(),
        run.measures.summary(),
        run.first,
        len(run.moved),
        count,
        run.cells.observations,
    )
