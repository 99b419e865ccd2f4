"""What the inputs log already says about this cluster: the backend's memory across restarts.

The backend keeps no state of its own.  On start it folds the inputs log into a :class:`Ledger`,
then every observation it is about to append is checked against it: an observation the log
already holds is dropped.  So a relist after a ``410 Gone``, an API server that went away, or a
restarted backend emits only differences — nothing lost, nothing twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from fleetlog.events import (
    InputEvent,
    JobCancelled,
    JobSubmitted,
    NodeHeartbeat,
    NodeRemoved,
    TaskFailed,
    TaskFinished,
    TaskStarted,
)
from fleetlog.events.model import INPUT_TYPES, JobDispatched
from fleetlog.log.base import INPUTS, LogStore
from fleetlog.log.consumer import EventConsumer

STARTED: Final = 1
ENDED: Final = 2


@dataclass
class Ledger:
    cell: str
    jobs: dict[str, int] = field(default_factory=dict)
    """Submitted job id -> its number of tasks."""
    ended: set[str] = field(default_factory=set)
    """Jobs reported cancelled or with a failed task (nothing more to say about them)."""
    tasks: dict[tuple[str, int], int] = field(default_factory=dict)
    """(job, task index) -> STARTED or ENDED, as reported."""
    nodes: dict[str, NodeHeartbeat] = field(default_factory=dict)
    """The last heartbeat reported for each node that is not removed."""

    def novel(self, event: InputEvent) -> bool:
        """Whether the log lacks ``event`` (then it is recorded as said)."""
        if not self.says_new(event):
            return False
        self.record(event)
        return True

    def says_new(self, event: InputEvent) -> bool:
        match event:
            case JobSubmitted():
                return event.job_id not in self.jobs
            case JobCancelled():
                return event.job_id in self.jobs and not self.finished(event.job_id)
            case TaskStarted():
                return self.tasks.get((event.job_id, event.task_index), 0) < STARTED
            case TaskFinished() | TaskFailed():
                return event.job_id not in self.ended and self._task(event) < ENDED
            case NodeHeartbeat():
                return self.nodes.get(event.node) != event
            case NodeRemoved():
                return event.node in self.nodes
        return True

    def finished(self, job_id: str) -> bool:
        """Whether nothing more can be said of ``job_id``: cancelled, failed, or every task ended."""
        if job_id in self.ended:
            return True
        ntasks = self.jobs.get(job_id, 0)
        return ntasks > 0 and all(self.tasks.get((job_id, i), 0) == ENDED for i in range(ntasks))

    def _task(self, event: TaskFinished | TaskFailed) -> int:
        return self.tasks.get((event.job_id, event.task_index), 0)

    def record(self, event: InputEvent) -> None:
        match event:
            case JobSubmitted():
                self.jobs[event.job_id] = sum(g.count for g in event.task_groups)
            case JobCancelled():
                self.ended.add(event.job_id)
            case TaskStarted():
                self.tasks[(event.job_id, event.task_index)] = STARTED
            case TaskFinished():
                self.tasks[(event.job_id, event.task_index)] = ENDED
                if event.exit_code != 0:
                    self.ended.add(event.job_id)
            case TaskFailed():
                self.tasks[(event.job_id, event.task_index)] = ENDED
                self.ended.add(event.job_id)
            case NodeHeartbeat() if event.cell == self.cell:
                self.nodes[event.node] = event
            case NodeRemoved() if event.cell == self.cell:
                self.nodes.pop(event.node, None)


async def read_ledger(store: LogStore, cell: str) -> tuple[Ledger, int]:
    """Fold the whole inputs log into a ledger; also return the offset it ends at."""
    # with a [cells] map the cell's partition holds its pod groups as dispatched, not as submitted
    consumer = EventConsumer(store, INPUTS, accepts=(*INPUT_TYPES, JobDispatched))
    ledger, offset = Ledger(cell), 0
    end = await store.log(INPUTS).end_offset()
    while offset < end:
        polled = await consumer.poll(offset, 10_000, park=False)
        if polled.next_offset == offset:
            break
        for delivered in polled.events:
            event = delivered.envelope.event
            if isinstance(event, JobDispatched):
                ledger.record(event.job)
            elif isinstance(event, INPUT_TYPES):  # the consumer parks the rest; never here
                ledger.record(event)
        offset = polled.next_offset
    return ledger, offset
