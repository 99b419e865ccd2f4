"""Prometheus metrics of one service (its own registry, so tests may run several services)."""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    """Every metric ``fleetlog run`` exports on ``/metrics``."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.input_events = Counter("fleetlog_input_events", "Input events folded", registry=r)
        self.decisions = Counter("fleetlog_decisions", "Decisions published", registry=r)
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
        self._reasons: set[str] = set()

    def set_pending(self, counts: dict[str, int]) -> None:
        """Pending jobs by reason; reasons that emptied are set to 0, not left stale."""
        for reason in sorted(self._reasons | set(counts)):
            self.pending.labels(reason=reason).set(counts.get(reason, 0))
        self._reasons |= set(counts)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
