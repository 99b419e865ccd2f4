"""Prometheus metrics of one service (its own registry, so tests may run several services).

Two kinds: what the loop counts as it goes (:class:`Metrics`), and gauges of what the live state
holds — per tenant, per queue, per cell and GPU model (:class:`FleetGauges`), computed by the same
pure functions as the read API (``fleetlog.api.resources``, ``fleetlog.core.views``), so a gauge
and ``GET /v1/tenants`` never disagree on what they count.

GPU quantities are in GPUs (``_gpus``; fractional: the state's milli-GPUs / 1000), times in
seconds.  A thing a producer names (tenant, queue, cell, GPU model) is a label value: each family
shows at most ``max_label_values`` of them, the largest first, and sums the rest into one series
labelled :data:`OTHERS` (``fleetlog_capped_label_values`` says how many were folded in), so a
producer that invents tenants cannot blow up the number of series.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from fleetlog.api.resources import CellItem, TenantItem, list_cells, list_tenants, phase_counts
from fleetlog.core.fold import is_cpu_bound
from fleetlog.core.state import State
from fleetlog.core.views import queues_table

LATENCY_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
STEP_BUCKETS: Final = (0.0001, 0.00025, 0.0005, *LATENCY_BUCKETS)
"""A step that decided: from 100 us (a few events on a small fleet) to seconds."""
MAX_LABEL_VALUES: Final = 100
"""Per family, the most tenants (queues, cells, cell and GPU model pairs) shown by name."""
OTHERS: Final = "(all others)"
"""The label value of the series that sums the things past the cap: it has a space, so no tenant,
queue, cell or model (printable, no spaces: docs/events.md) is ever called that."""
STATE_GAUGES_SHARE: Final = 0.01
"""The fleet gauges take at most this share of the loop's time: an update that took ``c``
seconds is not repeated for ``c / STATE_GAUGES_SHARE`` seconds (and the service asks at most
once a second)."""

Row = tuple[tuple[str, ...], Sequence[float | None]]
"""One thing's label values and its value for each column (``None``: no series)."""


class CappedFamily:
    """Gauges that share one thing's labels (a tenant; a cell and GPU model): each update sets
    every series anew and removes those of things gone (no stale series), for the first
    ``cap`` things in the caller's order, and one :data:`OTHERS` series that sums the rest."""

    def __init__(self, name: str, columns: Sequence[tuple[Gauge, tuple[str, ...]]], cap: int,
                 capped: Gauge) -> None:
        self.name, self.columns, self.cap, self.capped = name, columns, cap, capped
        self._shown: set[tuple[int, tuple[str, ...]]] = set()  # (column, the thing's labels)

    def update(self, rows: Sequence[Row]) -> None:
        kept, rest = list(rows[: self.cap]), rows[self.cap:]
        if rest:
            merged = [_sum(values[i] for _, values in rest) for i in range(len(self.columns))]
            kept.append(((OTHERS,) * len(rest[0][0]), merged))
        shown = set()
        for labels, values in kept:
            for column, ((gauge, extra), value) in enumerate(zip(self.columns, values, strict=True)):
                if value is not None:
                    gauge.labels(*labels, *extra).set(value)
                    shown.add((column, labels))
        for column, labels in sorted(self._shown - shown):
            gauge, extra = self.columns[column]
            gauge.remove(*labels, *extra)
        self._shown = shown
        self.capped.labels(family=self.name).set(len(rest))


def _sum(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


class FleetGauges:
    """Gauges of the live state: per tenant, per queue, per cell and GPU model, nodes up and
    down; refreshed by :meth:`maybe_update`, which keeps their cost to a bounded share of time."""

    def __init__(self, r: CollectorRegistry, cap: int = MAX_LABEL_VALUES) -> None:
        def gauge(name: str, text: str, *labels: str) -> Gauge:
            return Gauge(name, text, labels, registry=r)

        used = gauge("fleetlog_tenant_used_gpus", "GPUs a tenant's jobs hold, all cells", "tenant")
        nominal = gauge("fleetlog_tenant_nominal_gpus", "A tenant's fleet-wide nominal GPU quota (no "
                        "series: no quota)", "tenant")
        borrowed = gauge("fleetlog_tenant_borrowed_gpus", "GPUs a tenant uses past its nominal quota",
                         "tenant")
        tjobs = gauge("fleetlog_tenant_jobs", "A tenant's jobs by state: pending, placed (not every task "
                      "started) or running (every task started), as GET /v1/jobs says", "tenant", "state")
        qjobs = gauge("fleetlog_queue_jobs", "A queue's jobs by state: pending, placed (not every task "
                      "started) or running (every task started), as GET /v1/jobs says", "queue", "state")
        qgpus = gauge("fleetlog_queue_pending_gpus", "GPUs the pending jobs of a queue ask for", "queue")
        self.placed_longest = gauge(
            "fleetlog_placed_longest_seconds", "How long (log time) the longest-placed job whose tasks have "
            "not all started has waited to start, fleet-wide (0: none): work held but not started")
        gpus = gauge("fleetlog_cell_gpus", "GPUs on a cell's up nodes, by GPU model", "cell", "gpu_model")
        alloc = gauge("fleetlog_cell_allocated_gpus", "GPUs allocated on a cell's up nodes, by GPU model",
                      "cell", "gpu_model")
        nodes = gauge("fleetlog_nodes", "Nodes of a cell by status (up, down)", "cell", "status")
        self.capped = gauge("fleetlog_capped_label_values", f"Things past the cap of a family, summed into "
                            f"its {OTHERS!r} series", "family")
        self.seconds = gauge("fleetlog_fleet_gauges_seconds", "How long the last update of the per-tenant, "
                             "per-queue and per-cell gauges took")
        self.regime = gauge("fleetlog_shape_mix_regime", "1 for the regime the shape mix was last taken "
                            "in (cpu-bound: the window asks more of the fleet's CPU than of its GPUs), 0 for "
                            "the other", "regime")
        phases = [("pending",), ("placed",), ("running",)]
        self.tenants = CappedFamily("tenant", [(used, ()), (nominal, ()), (borrowed, ()),
                                               *((tjobs, phase) for phase in phases)], cap, self.capped)
        self.queues = CappedFamily("queue", [*((qjobs, phase) for phase in phases), (qgpus, ())], cap,
                                   self.capped)
        self.models = CappedFamily("cell_gpu_model", [(gpus, ()), (alloc, ())], cap, self.capped)
        self.cells = CappedFamily("cell", [(nodes, ("up",)), (nodes, ("down",))], cap, self.capped)
        self._due = 0.0

    def maybe_update(self, state: State, now: float) -> bool:
        """Update unless the last update's cost says wait (``now``: a monotonic clock)."""
        if now < self._due:
            return False
        started = time.perf_counter()
        self.update(state)
        cost = time.perf_counter() - started
        self.seconds.set(cost)
        self._due = now + cost / STATE_GAUGES_SHARE
        return True

    def update(self, state: State) -> None:
        tenants = list_tenants(state, {}).items
        self.tenants.update(tenant_rows(tenants))
        self.placed_longest.set(max((t.placed_longest_ms or 0 for t in tenants), default=0) / 1000)
        self.queues.update(queue_rows(_with_phases(state, queues_table(state))))
        cells = list_cells(state, {}).items
        self.models.update(model_rows(cells))
        self.cells.update(cell_rows(cells))
        bound = is_cpu_bound(state)
        for regime, value in (("cpu-bound", bound), ("gpu-bound", not bound)):
            self.regime.labels(regime).set(int(value))

    def clear(self) -> None:
        """No series: a process that does not lead shows nothing stale."""
        for family in (self.tenants, self.queues, self.models, self.cells):
            family.update([])
        self.regime.clear()
        self.placed_longest.set(0)
        self._due = 0.0


def tenant_rows(items: Sequence[TenantItem]) -> list[Row]:
    """Most GPUs used first, then most pending jobs, then by name."""
    ordered = sorted(items, key=lambda t: (-t.used.gpu_milli, -t.pending, t.tenant))
    return [((t.tenant,), (t.used.gpu_milli / 1000, None if t.nominal is None else t.nominal.gpu_milli / 1000,
                           t.borrowed.gpu_milli / 1000, t.pending, t.placed, t.running)) for t in ordered]


def _with_phases(state: State, table: list[dict[str, object]]) -> list[dict[str, object]]:
    """``queues_table``'s rows (by queue id) with ``placed`` and ``running`` as the API counts them
    (its ``running`` counts every job placed, started or not)."""
    placed, running, _ = phase_counts(state, "queue")
    return [row | {"placed": int(placed[qid]), "running": int(running[qid])} for qid, row in enumerate(table)]


def queue_rows(table: Sequence[dict[str, object]]) -> list[Row]:
    """Most pending jobs first, then most placed or running, then by name."""
    ordered = sorted(table, key=lambda q: (-_int(q["pending"]), -_int(q["placed"]) - _int(q["running"]),
                                           str(q["queue"])))
    return [((str(q["queue"]),), (_int(q["pending"]), _int(q["placed"]), _int(q["running"]),
                                  _int(q["pending_gpu_milli"]) / 1000)) for q in ordered]


def model_rows(cells: Sequence[CellItem]) -> list[Row]:
    """Most GPUs first, then by cell and model."""
    pairs = sorted(((c.cell, model, a) for c in cells for model, a in c.by_model.items()),
                   key=lambda p: (-p[2].gpus, p[0], p[1]))
    return [((cell, model), (a.gpus, a.allocated_milli / 1000)) for cell, model, a in pairs]


def cell_rows(cells: Sequence[CellItem]) -> list[Row]:
    """Most nodes first, then by name."""
    ordered = sorted(cells, key=lambda c: (-(c.nodes_up + c.nodes_down), c.cell))
    return [((c.cell,), (c.nodes_up, c.nodes_down)) for c in ordered]


def _int(value: object) -> int:
    assert isinstance(value, int)
    return value


class Metrics:
    """Every metric ``fleetlog run`` exports on ``/metrics``."""

    def __init__(self, max_label_values: int = MAX_LABEL_VALUES) -> None:
        self.registry = r = CollectorRegistry()
        self.input_events = Counter("fleetlog_input_events", "Input events folded", registry=r)
        self.decisions = Counter("fleetlog_decisions", "Decisions published", registry=r)
        self.unauthenticated = Counter(
            "fleetlog_http_unauthenticated", "HTTP requests refused 401 (no, unknown, expired or revoked "
            "token; no client certificate; a certificate without one CN)", registry=r)
        self.forbidden = Counter(
            "fleetlog_http_forbidden", "HTTP requests refused 403 by the authorization policy, by the event "
            "type refused (any: a principal the policy does not name)", ["action"], registry=r)
        self.rate_limited = Counter(
            "fleetlog_http_rate_limited", "Ingest requests refused 429 too_many_submissions "
            "because a tenant submitted past max_submissions_per_s", registry=r)
        self.batches = Counter("fleetlog_decision_batches", "Decision batches published", registry=r)
        self.dead_letters = Counter(
            "fleetlog_dead_letters", "Input records parked in the dead-letter log", registry=r
        )
        self.latency = Histogram(
            "fleetlog_decision_latency_seconds",
            "From the log append time of the oldest input of a batch to the batch being visible",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.step = Histogram(
            "fleetlog_step_seconds",
            "The work of one loop step: read, decode, fold, decide, publish (never the idle wait for input)",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.decide_step = Histogram(
            "fleetlog_decide_step_seconds",
            "The work of each step that folded input and decided: read, decode, fold, decide, publish "
            "(not the idle wait, not the empty polls of an idle loop)",
            buckets=STEP_BUCKETS,
            registry=r,
        )
        self.pending = Gauge("fleetlog_pending_jobs", "Pending jobs by reason", ["reason"], registry=r)
        self.lag = Gauge("fleetlog_consumer_lag", "Input records not folded yet", registry=r)
        self.offset = Gauge("fleetlog_inputs_offset", "The next input offset to fold", registry=r)
        self.snapshot_age = Gauge(
            "fleetlog_snapshot_age_seconds", "Seconds since the newest snapshot was taken", registry=r
        )
        self.snapshots = Counter("fleetlog_snapshots", "Snapshots written", registry=r)
        self.leader = Gauge("fleetlog_leader", "1 while this process publishes decisions", registry=r)
        self.restarts = Counter(
            "fleetlog_loop_restarts", "Recoveries after a lost connection or leadership", registry=r
        )
        self.recovery = Gauge("fleetlog_recovery_seconds", "Duration of the last recovery", registry=r)
        self.loop_errors = Counter(
            "fleetlog_loop_errors", "Errors that ended a cycle of the loop, by status (retrying: may "
            "pass, stalled: an operator must act) and exception type", ["status", "error"], registry=r,
        )
        self.stalled = Gauge(
            "fleetlog_stalled", "1 while the service stands by on a problem an operator must fix", registry=r
        )
        self.watchers = Gauge("fleetlog_watchers", "Open GET /v1/watch streams", registry=r)
        self.watch_bytes = Gauge(
            "fleetlog_watch_bytes_held", "Bytes the watchers hold: records read and frames not yet taken by "
            "their clients", registry=r)
        self.watch_dropped = Counter(
            "fleetlog_watch_dropped", "Watchers dropped: their client took nothing for watch_drain_timeout_s",
            registry=r)
        self.ignored = Counter(
            "fleetlog_ignored_observations", "Task reports the fold did not apply as written, by reason "
            "(unknown_job, unknown_task, not_placed, already_started, already_finished; unknown_node and "
            "wrong_node: a start applied, but naming another node)", ["reason"], registry=r)
        self._ignored_seen: dict[tuple[str, str], int] = {}
        self.fleet = FleetGauges(r, max_label_values)
        self._reasons: set[str] = set()

    def count_ignored(self, loop: str, counts: dict[str, int]) -> None:
        """Feed ``fleetlog_ignored_observations_total`` from one loop's state (``State.observations``
        counts, which only grow along a log): what each reason grew by since that loop's last feed.
        A state recovered in a new process counts from its log's start, as the state does."""
        for reason, count in sorted(counts.items()):
            seen = self._ignored_seen.get((loop, reason), 0)
            if count > seen:
                self.ignored.labels(reason=reason).inc(count - seen)
                self._ignored_seen[(loop, reason)] = count

    def set_pending(self, counts: dict[str, int]) -> None:
        """Pending jobs by reason; reasons that emptied are set to 0, not left stale."""
        for reason in sorted(self._reasons | set(counts)):
            self.pending.labels(reason=reason).set(counts.get(reason, 0))
        self._reasons |= set(counts)

    def stopped_leading(self) -> None:
        """``fleetlog_leader`` 0, and no pending or fleet gauges: only the leader shows the state."""
        self.leader.set(0)
        self.pending.clear()
        self._reasons = set()
        self.fleet.clear()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
