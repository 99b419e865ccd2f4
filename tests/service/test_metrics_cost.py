"""What the fleet gauges cost (issue 21; the numbers in docs/service.md, "Metrics", note 4):
one update of the tenant, queue and cell gauges on a state of 10,000 jobs and 1,000 nodes.

``python -m tests.service.test_metrics_cost`` prints the median of 20 updates for the plain
state (20 tenants, 10 queues) and a hostile one (2,000 tenants, 500 queues); the test holds the
plain one to a budget with room for a slow CI machine."""

from __future__ import annotations

import statistics
import time
from typing import Final

import msgspec

from fleetlog.core.state import State
from fleetlog.core.views import pending_by_reason
from fleetlog.service.metrics import MAX_LABEL_VALUES, Metrics
from tests.core.builders import Driver, job, node

BUDGET_MS: Final = 25.0
"""Measured about 2 ms (docs/service.md): the budget allows 10x for a loaded machine."""


def fleet_state(tenants: int, queues: int, nodes: int = 1000, jobs: int = 10_000) -> State:
    """``nodes`` nodes of 8 GPUs in 4 cells of 2 models, ``jobs`` jobs of 1 to 4 GPUs spread over
    ``tenants`` and ``queues``, decided once: about 4,000 placed, the rest pending."""
    driver = Driver()
    driver.feed(*(node(f"n{i}", cell=f"c{i % 4}", model=("A100", "H100")[i % 2], rack=f"r{i // 16}")
                  for i in range(nodes)), check_each=False)
    driver.feed(*(msgspec.structs.replace(job(f"j{i}", f"t{i % tenants}", gpus=1 + i % 4),
                                          queue=f"q{i % queues}") for i in range(jobs)), check_each=False)
    driver.decide()
    return driver.state


def update_ms(state: State, repeat: int = 20) -> float:
    """The median time of one update of the fleet gauges, in milliseconds."""
    metrics, times = Metrics(), []
    for _ in range(repeat):
        started = time.perf_counter()
        metrics.fleet.update(state)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def test_one_update_on_10k_jobs_and_1k_nodes_is_within_its_budget() -> None:
    state = fleet_state(tenants=20, queues=10)
    assert state.jobs.size == 10_000
    assert 1000 < sum(pending_by_reason(state).values()) < 10_000
    assert update_ms(state) < BUDGET_MS


def test_a_hostile_number_of_tenants_and_queues_still_makes_a_bounded_exposition() -> None:
    state = fleet_state(tenants=2000, queues=500, nodes=100, jobs=4000)
    metrics = Metrics()
    metrics.fleet.update(state)
    text = metrics.exposition().decode()
    for name in ("fleetlog_tenant_used_gpus", "fleetlog_queue_pending_gpus"):
        shown = {line.split("}")[0] for line in text.splitlines() if line.startswith(name + "{")}
        assert len(shown) == MAX_LABEL_VALUES + 1, name


def main() -> None:
    for tenants, queues in ((20, 10), (2000, 500)):
        state = fleet_state(tenants, queues)
        pending = sum(pending_by_reason(state).values())
        print(f"{state.jobs.size} jobs ({pending} pending), {state.nodes.size} nodes, {tenants} tenants, "
              f"{queues} queues: one fleet gauges update {update_ms(state):.2f} ms (median of 20)")


if __name__ == "__main__":
    main()
