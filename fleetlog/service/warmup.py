"""Warm-up: every hot path run once before a process may lead, so numba's compile (or cache
load) never stalls a step (``fleetlog run``; ``python -m fleetlog.service.warmup`` fills numba's
cache for every policy ahead of time, as an image build or the test script does)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
from typing import Any

from fleetlog.core.cellshard import cell_summary
from fleetlog.core.decide import decide
from fleetlog.core.digest import digest, snapshot
from fleetlog.core.fold import fold
from fleetlog.core.fold_batch import fold_fast, fold_lists
from fleetlog.core.policy import POLICIES, Policy
from fleetlog.core.state import CoreConfig, State
from fleetlog.events.model import DecisionBatch, Event, JobDispatched, JobSubmitted, NodeHeartbeat, TaskGroup
from fleetlog.kernel_warmup import CompileCounter, warm_kernels


def warm_up(policy: Policy) -> None:
    """Run every hot path once on a toy fleet, so numba compiles (or loads from its cache) the
    kernels now — a compile takes seconds and must not stall a process that leads a shard."""
    state = State()
    nodes = [NodeHeartbeat(cell="warm", node=f"n{i}", cpu_milli=64_000, mem_mib=262_144, gpu_count=8,
                           gpu_model="A100", topology=("b", f"r{i % 2}", f"n{i}")) for i in range(4)]
    jobs = [
        _warm_job("one", 1, 1, 1000), _warm_job("frac", 1, 1, 500), _warm_job("gang", 2, 8, 1000),
        _warm_job("cpu", 1, 0, 0), _warm_job("huge", 1, 64, 1000), _warm_job("wait", 4, 8, 1000),
        _warm_job("urgent", 2, 8, 1000, priority=100),
        # a second tenant: the turns of several tenants (merged runs), not only one tenant's run
        _warm_job("other", 1, 1, 1000, tenant="other"), _warm_job("other-frac", 1, 1, 250, tenant="other"),
        # whole hosts until one waits for room it could have (the "insufficient capacity" story:
        # "huge" never fits, so it is told apart before that path)
        *(_warm_job(f"host-{i}", 1, 8, 1000) for i in range(5)),
    ]
    _run(state, policy, [*nodes, *jobs])
    snapshot(state)
    # Two cells: a one-task job takes the plain path (``fitting.place_single``), which one cell's
    # tenants no longer reach (their jobs are placed in runs, merged across tenants).
    two = [NodeHeartbeat(cell=f"warm-{i % 2}", node=f"m{i}", cpu_milli=64_000, mem_mib=262_144,
                         gpu_count=8, gpu_model="A100", topology=("b", "r", f"m{i}")) for i in range(2)]
    _run(State(), policy, [*two, _warm_job("two", 1, 1, 1000), _warm_job("two-frac", 1, 1, 500)])
    _warm_cell_shard(policy, two[:1])


def _warm_cell_shard(policy: Policy, nodes: list[NodeHeartbeat]) -> None:
    """A cell shard's step as its loop folds it: a read of dispatches folded at once, a batch of
    one-task placements folded back at once (their kernels), its cell's summary (its kernel)."""
    state = State(CoreConfig(cells=(nodes[0].cell,)))  # (before ``cell``: the shard's config)
    fold_lists(state, list(nodes), [1_000] * len(nodes))
    cell = nodes[0].cell
    sent = [JobDispatched(job=_warm_job(f"d{i}", 1, 1, 1000), cell=cell, attempt=1, seq=i + 1, as_of=0)
            for i in range(8)]
    fold_lists(state, sent, [1_001] * len(sent))
    batch = DecisionBatch(as_of=state.offset, digest=digest(state), decisions=tuple(decide(state, policy)),
                          policy=policy.name)
    fold_fast(state, batch, state.now_ms)
    cell_summary(state, cell, 0, 1)


def _run(state: State, policy: Policy, events: list[Event]) -> None:
    """Fold each event, decide, fold the decisions: the service loop's step, one event a step."""
    now = 1_000
    for event in events:
        now += 1
        fold(state, event, now)
        decisions = decide(state, policy)
        fold(state, DecisionBatch(as_of=now, digest=digest(state), decisions=tuple(decisions),
                                  policy=policy.name), now)


def _warm_job(
    name: str, tasks: int, gpus: int, milli: int, priority: int = 0, tenant: str = "warm"
) -> JobSubmitted:
    group = TaskGroup(count=tasks, cpu_milli=1000, mem_mib=1024, gpu_count=gpus, gpu_milli=milli)
    return JobSubmitted(job_id=name, tenant=tenant, task_groups=(group,), priority=priority,
                        required_topology="rack" if tasks > 1 else None)


class Warming:
    """Kernels being compiled (or loaded from numba's cache) off the event loop, so that a process
    on a cold cache serves ``/healthz`` (``warming``, with this progress) and honours SIGTERM at
    once instead of going silent and deaf for minutes (issue 47)."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.seconds: float | None = None
        self.counter = CompileCounter()

    @property
    def done(self) -> bool:
        return self.seconds is not None

    def progress(self) -> dict[str, Any]:
        """What health shows while warming: kernels compiled so far and seconds spent."""
        return {"kernels_compiled": self.counter.compiles,
                "seconds": round(time.monotonic() - self.started, 1)}


async def warm_off_loop(policy: Policy, stopping: asyncio.Event, warming: Warming) -> bool:
    """Warm ``policy``'s kernels in a daemon thread (the compile notice on stderr, as ``simulate``
    says it); ``True`` once warm, ``False`` when ``stopping`` was set first — the thread is left
    to end with the process (a compile cannot be interrupted, and a stop must not wait for it)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[float] = loop.create_future()

    def settle(result: float | None, failure: BaseException | None) -> None:
        def on_loop() -> None:
            if done.done():
                return
            if failure is not None:
                done.set_exception(failure)
            else:
                done.set_result(result or 0.0)

        with contextlib.suppress(RuntimeError):  # (the loop closed: the process is stopping)
            loop.call_soon_threadsafe(on_loop)

    def work() -> None:
        try:
            seconds = warm_kernels(functools.partial(warm_up, policy), counter=warming.counter)[0]
        except BaseException as exc:  # handed to the awaiting task
            settle(None, exc)
            return
        settle(seconds, None)

    threading.Thread(target=work, name="fleetlog-warm-up", daemon=True).start()
    stop: asyncio.Future[Any] = asyncio.ensure_future(stopping.wait())
    waited: set[asyncio.Future[Any]] = {done, stop}
    try:
        await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
    if not done.done():
        return False
    warming.seconds = done.result()
    return True


def main() -> None:
    """Warm every policy's kernels into numba's cache; says how long it took on stdout."""
    started = time.perf_counter()
    compiles = sum(warm_kernels(functools.partial(warm_up, p))[1] for p in POLICIES.values())
    print(f"kernels warm: {compiles} compiled in {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
