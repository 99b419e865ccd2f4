"""A pending job's ``queue_position`` (GET /v1/jobs) is the order decide really takes: against the
scheduler's own turns (``order.drf_runs``, none placed) on generated states of several tenants,
priorities, quotas and queues, and by capacity for one job at a time: each round places the job
the positions put first."""

from __future__ import annotations

import random

import msgspec
import pytest

from fleetlog.api.resources import list_jobs, queue_positions
from fleetlog.core.order import drf_runs, waiting_order
from fleetlog.core.state import JobState, State
from fleetlog.events import JobPlaced
from tests.core.builders import Driver, job, node, quota


def considered_with_none_placed(state: State) -> list[int]:
    """The job rows decide's turns yield, every job considered and none placed."""
    usage = {k: list(v) for k, v in state.usage.items()}
    runs, out = drf_runs(state, usage), []
    try:
        run, _ = next(runs)
        while True:
            out += run.tolist()
            run, _ = runs.send((run.size, False))
    except StopIteration:
        return out


def mixed(seed: int, nodes: int) -> Driver:
    """Tenants with and without quotas (weights), priorities, two queues; ``nodes`` 8-GPU nodes."""
    rng = random.Random(seed)
    driver = Driver()
    driver.feed(*(node(f"n{i}") for i in range(nodes)), check_each=False)
    driver.feed(*(quota(f"t{i}", gpus=rng.randint(1, 16), weight=rng.choice([500, 1000, 3000]))
                  for i in range(rng.randint(0, 3))))
    for round_ in range(3):
        driver.feed(*(msgspec.structs.replace(
            job(f"j{round_}-{i}", tenant=f"t{rng.randint(0, 3)}", gpus=rng.choice([1, 2, 4]),
                priority=rng.choice([0, 0, 5, 10])), queue=rng.choice(["q1", "q2", "q3"]))
            for i in range(rng.randint(5, 30))), check_each=False)
        driver.decide()
    return driver


@pytest.mark.parametrize("seed", range(12))
def test_positions_follow_the_schedulers_turns(seed: int) -> None:
    state = mixed(seed, nodes=seed % 3).state
    order = considered_with_none_placed(state)
    assert waiting_order(state).tolist() == order
    pending = [int(r) for r in range(state.jobs.size) if state.jobs.cols["state"][r] == JobState.PENDING]
    assert sorted(order) == pending
    items = {i.job_id: i for i in list_jobs(state, {"limit": ["10000"]}).items}
    seen: dict[str, int] = {}
    for row in order:  # each queue's jobs numbered 1, 2, ... in the turns' order
        item = items[state.names["job"].names[row]]
        seen[item.queue] = seen.get(item.queue, 0) + 1
        assert item.queue_position == seen[item.queue]
    assert all(i.queue_position is None for i in items.values() if i.state != "pending")
    numbers = {i.queue_position for i in items.values() if i.queue_position}
    assert len(numbers) == max(seen.values(), default=0)


def test_capacity_for_one_job_at_a_time_places_them_as_the_positions_say() -> None:
    """Every job asks one GPU; each round adds a one-GPU node: the job placed is the one first in
    decide's order (position 1 of its queue), as the API said just before deciding — across priorities,
    tenants (their DRF shares moving with each placement) and queues."""
    rng = random.Random(7)
    driver = Driver()
    driver.feed(quota("t0", gpus=40, weight=2000), quota("t1", gpus=20))  # (shares, never a quota's block)
    driver.feed(*(msgspec.structs.replace(
        job(f"j{i}", tenant=f"t{rng.randint(0, 2)}", priority=rng.choice([0, 3])),
        queue=rng.choice(["a", "b"])) for i in range(24)), check_each=False)
    driver.decide()
    state, placed_order = driver.state, []
    for round_ in range(24):
        driver.feed(node(f"n{round_}", gpus=1))  # (first: the fleet a tenant's share is of grows)
        items = {i.job_id: i for i in list_jobs(state, {"state": ["pending"]}).items}
        first = state.names["job"].names[int(waiting_order(state)[0])]
        assert items[first].queue_position == 1
        placed = [d for d in driver.decide() if isinstance(d, JobPlaced)]
        assert [d.job_id for d in placed] == [first], round_
        placed_order.append(first)
    assert sorted(placed_order) == sorted(f"j{i}" for i in range(24))
    assert not queue_positions(state).any()


def test_watch_does_not_reprint_a_job_whose_only_change_is_its_position() -> None:
    """``fleetlog jobs --watch``: a placement renumbers every job behind it in its queue; those
    are not printed again for that alone (a job that changes otherwise is, with its position)."""
    from fleetlog.reads_watch import changed

    seen: dict[str, object] = {}
    first = [{"job_id": "a", "state": "pending", "queue_position": 2},
             {"job_id": "b", "state": "pending", "queue_position": 3}]
    assert changed(seen, first) == first
    moved = [{"job_id": "a", "state": "pending", "queue_position": 1},
             {"job_id": "b", "state": "placed", "queue_position": None}]
    assert changed(seen, moved) == [moved[1]]
