"""The service's configuration: a TOML file plus ``FLEETLOG_<TABLE>_<KEY>`` environment overrides.

```toml
[log]       # the embedded file log ...
dir = "var/fleetlog"
fsync = "batch"
[kafka]     # ... or Kafka: every field of KafkaConfig, plus sasl_plain_password_file
bootstrap_servers = "broker:9093"
[service]
policy = "default"
```

Exactly one of ``log.dir`` and the ``[kafka]`` table says where the logs are.  An environment
variable beats the file (``FLEETLOG_KAFKA_BOOTSTRAP_SERVERS``, ``FLEETLOG_SERVICE_HTTP_PORT``; an
empty value clears an optional key), and a command-line flag (``--http-port``) beats both.  Every
error is a :class:`ConfigError` naming the file (and line), the variable or the flag, the key and
what was expected; unknown keys are errors (the reader: :mod:`fleetlog.log.settings`).  No message, ``repr``
or :meth:`Config.redacted` ever shows the SASL password.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Final, Literal

import msgspec
from msgspec import Meta

from fleetlog.core.dispatch import CellMap
from fleetlog.core.policy import UnknownPolicyError, policy_named
from fleetlog.core.state import CoreConfig
from fleetlog.log.kafka import KafkaConfig
from fleetlog.log.location import MASK, SECRET_KEYS, ConfigError, LogConfig
from fleetlog.log.settings import CellPartitions, Raw, Schema, cells_of, located

Port = Annotated[int, Meta(ge=0, le=65535)]
Positive = Annotated[int, Meta(ge=1)]


Role = Literal["all", "dispatch", "cell"]
ROLES: Final = ("all", "dispatch", "cell")


class ServiceSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The ``[service]`` table: how the scheduler runs."""

    role: Role = "all"
    """``all``: one shard folds the whole fleet (the default); ``dispatch``: the global
    dispatcher; ``cell``: the cell shards of the ``[cells]`` map (docs/scale-out.md)."""
    cell_hold_ms: Annotated[int, Meta(ge=0, le=1 << 40)] = 30_000
    """A cell shard hands a dispatched job it could not place back after this much log time
    (``CoreConfig.hold_ms``; replay must be given the same value)."""
    summary_every_ms: Positive = 5_000
    """A cell shard writes its summary at least this often (log time)."""
    summary_material_milli: Annotated[int, Meta(ge=1, le=1000)] = 125
    """...and when a free row's slots move by this share (milli) of the larger count."""
    role_commit_every_ms: Positive = 5_000
    """The dispatcher and each cell shard commit inputs folded without a publication (heartbeats)
    at most this long after their last commit: each is a transaction that holds the shard's steps
    (a step that publishes commits with it).  A restart folds those inputs again."""
    policy: str = "default"
    """A policy spec, as :func:`fleetlog.core.policy.policy_named` reads it."""
    group: str = "fleetlog-scheduler"
    producer_id: str = "fleetlog-scheduler"
    max_batch: Positive = 10_000
    idle_wait_ms: Annotated[int, Meta(ge=0)] = 100
    snapshot_every_events: Positive = 100_000
    snapshot_every_s: Annotated[float, Meta(gt=0)] = 60.0
    http_host: str = "127.0.0.1"
    http_port: Port = 9464
    """Metrics, health and ingest; 0 picks any free port."""
    leader_session_timeout_ms: Positive = 6000
    node_timeout_ms: Positive = 60_000
    """A node silent this long (log time) is down and its gangs requeued: the fold's
    ``CoreConfig.node_timeout_ms``.  Replay must be given the same value."""
    tick_every_ms: Annotated[int, Meta(ge=0)] = 5_000
    """While it leads, the scheduler (every cell shard too) appends a ``Tick`` to its inputs log when
    no input arrived for this long, so log time moves on and a silent node goes down within
    ``node_timeout_ms`` and a few ticks, not at the next input; 0: never."""
    retain_finished_ms: Annotated[int, Meta(ge=0, le=1 << 50)] | None = 3_600_000
    """An ended job leaves the state this long (log time) after it ended; its status is then
    read from the logs (``CoreConfig.retain_finished_ms``; unset: never). Replay reads the same
    setting from the same configuration."""
    dedup_window_ms: Annotated[int, Meta(ge=0, le=1 << 50)] = 86_400_000
    """A resend of a retired job's submission this soon after it retired is a duplicate
    (``CoreConfig.dedup_window_ms``); later, the id is a new job's."""
    shape_cpu_rows: Annotated[int, Meta(ge=0, le=64)] = 12
    """Rows of the shape mix's view by CPU that ``default`` scores against beside the (gpus,
    milli) one (``CoreConfig.shape_cpu_rows``); 0: none, as fleetlog decided before 2026-12-06.
    Replay a log recorded before then with 0 (docs/replay.md)."""
    cpu_bound_rule: bool = True
    """Score CPU-bound windows with each fractional shape's own starvation term
    (``CoreConfig.cpu_bound_rule``); false: as fleetlog decided before 2026-12-07. Replay a log
    recorded before then with false, and ``cpu_bound_weights`` false (docs/replay.md)."""
    cpu_bound_weights: bool = True
    """Score CPU-bound windows against the view by CPU alone, each shape weighted by the GPU it
    takes per CPU (``CoreConfig.cpu_bound_weights``); false: both views at their counts, as
    fleetlog decided with the first CPU-bound rule (d932362, 2026-12-07). Replay a log recorded
    with that rule with false (docs/replay.md)."""
    most_free_usable: bool = True
    """A job waiting for capacity is told the most free room on a node it may use, and what
    excluded the nodes with more (``CoreConfig.most_free_usable``); false: over every up node, as
    fleetlog said before 2026-12-07. Replay a log recorded before then with false (docs/replay.md)."""

    def core(self, **fields: Any) -> CoreConfig:
        """The fold's settings these service settings make (``fields`` instead, where given)."""
        made = {"node_timeout_ms": self.node_timeout_ms, "retain_finished_ms": self.retain_finished_ms,
                "dedup_window_ms": self.dedup_window_ms, "shape_cpu_rows": self.shape_cpu_rows,
                "cpu_bound_rule": self.cpu_bound_rule, "cpu_bound_weights": self.cpu_bound_weights,
                "most_free_usable": self.most_free_usable}
        return CoreConfig(**(made | fields))
    http_header_timeout_s: Annotated[float, Meta(gt=0)] = 10.0
    """A connection must send a whole request head this soon after it opens (or after its
    previous answer), else it is closed: idle and slow-header clients hold nothing."""
    http_body_timeout_s: Annotated[float, Meta(gt=0)] = 30.0
    """A request body must arrive this soon (else 408)."""
    http_body_first_byte_timeout_s: Annotated[float, Meta(gt=0)] = 5.0
    """...and its first byte this soon after the head (else 408): a head alone holds a body slot
    for seconds, not for ``http_body_timeout_s``."""
    http_tls_handshake_timeout_s: Annotated[float, Meta(gt=0)] = 5.0
    """A TLS connection must finish its handshake this soon after it opens, else it is closed
    (until then it counts toward ``http_max_connections``)."""
    http_max_connections: Positive = 256
    """Open connections; one more closes the oldest idle one (or gets 503 if none is idle).
    Also held under half of the process's file-descriptor limit."""
    http_max_headers: Positive = 64
    http_max_header_bytes: Positive = 8190
    """Longest request line and header field (longer: 400)."""
    max_request_bytes: Positive = 8 * 1024 * 1024
    """Largest ingest body, however framed (larger: 413)."""
    max_concurrent_requests: Positive = 16
    """Requests with a body read and handled at a time (more: 429); health never waits for them."""
    max_concurrent_requests_per_client: Positive = 4
    """...of them at most this many from one principal (unauthenticated: one peer address), so one
    client cannot hold them all (more: 429 ``busy``)."""
    max_request_events: Positive = 10_000
    """Events in one ingest request (more: 413)."""
    max_request_tasks: Positive = 100_000
    """Tasks of all the jobs one ingest request submits (more: 413)."""
    max_pending_tasks: Positive = 1_000_000
    """Tasks of pending jobs plus tasks accepted but not yet folded; a request that would pass it
    gets 429 with ``Retry-After``."""
    max_submissions_per_s: Annotated[float, Meta(gt=0)] | None = None
    """Jobs one tenant may submit a second, on average (fleetlog.service.limits; more: 429
    ``too_many_submissions`` with ``Retry-After``); none: no bound."""
    max_submission_burst: Positive | None = None
    """...and at once (default: a second's worth, at least 1); a request of more waits for a full
    bucket and leaves it in debt."""
    watch_read_bytes: Positive = 1 << 20
    """``GET /v1/watch``: bytes of records one read of a watcher returns (a larger record alone)."""
    watch_held_bytes: Positive = 8 << 20
    """Bytes one watcher may hold: records read and their frames not yet taken by its client."""
    watch_total_bytes: Positive = 64 << 20
    """Bytes all watchers together may hold; a watcher waits for room before it reads."""
    watch_drain_timeout_s: Annotated[float, Meta(gt=0)] = 10.0
    """A watcher whose client takes nothing this long is dropped, told where to resume."""
    watch_max_streams: Positive = 128
    """Open watch streams at a time (more: 429 ``too_many_watchers``)."""
    watch_max_streams_per_client: Positive = 64
    """...of one principal (unauthenticated: one peer address)."""
    max_dry_runs_per_s: Annotated[float, Meta(gt=0)] = 1.0
    """``POST /v1/dry-run`` requests one principal may make a second, on average
    (fleetlog.service.dryruns; more: 429 ``too_many_dry_runs`` with ``Retry-After``)..."""
    max_dry_run_burst: Positive = 10
    """...and at once."""
    max_dry_runs_in_flight: Positive = 1
    """Dry runs of one principal running or waiting at a time (the service runs one at a time in all)."""
    max_pending_tasks_per_tenant: Positive | None = None
    """Of ``max_pending_tasks``, what one tenant may hold (its pending tasks plus those accepted
    but not folded; more: 429 ``too_much_pending`` naming the tenant), so one tenant cannot lock the others
    out (issue 46); default: a quarter of ``max_pending_tasks``, and at least ``max_request_tasks``
    (one largest request always fits an empty share)."""
    max_submitted_tasks_per_s: Annotated[float, Meta(gt=0)] | None = None
    """Tasks one tenant may submit a second, on average, beside ``max_submissions_per_s``'s jobs
    (a job of 10,000 tasks costs 10,000; more: 429 ``too_many_submissions``); none: no bound."""
    max_submitted_task_burst: Positive | None = None
    """...and at once (default: a second's worth, at least 1), in debt as the jobs' bucket."""
    max_metadata_bytes_per_tenant: Positive = 64 * 1024 * 1024
    """The memory the labels and annotations of one tenant's jobs may take in the scheduler's
    state (their UTF-8 and the objects around them, ``fleetlog.core.state.held_bytes``; held
    from submission until a job retires), with those accepted but not folded; more: 429
    ``too_much_metadata`` naming the tenant (fleetlog.service.metadata; issue 46)."""
    job_ids_by_tenant: bool = False
    """With ``[auth]`` roles: a job submitted by a ``tenant:NAME`` role must have an id that
    starts with ``NAME/`` (else 403 naming the rule), so no tenant can take the ids another will
    use (issue 46; docs/api.md "Job ids")."""


class AuthSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The ``[auth]`` table (fleetlog.service.auth)."""

    tokens_file: str | None = None
    """The bearer tokens (hashed) the API accepts; none: no authentication (loopback only)."""
    policy_file: str | None = None
    """Who may do what (fleetlog.service.authz); none: every authenticated principal may do all."""
    tls_cert_file: str | None = None
    """The server's certificate chain (PEM): the API is then served over HTTPS; none: plain HTTP."""
    tls_key_file: str | None = None
    """Its private key (PEM; refused when others may read it)."""
    client_ca_file: str | None = None
    """The CA (PEM) whose client certificates the API accepts (mutual TLS; the principal is the
    certificate's CN); needs ``tls_cert_file`` and ``tls_key_file``."""


class Config(msgspec.Struct, frozen=True):
    """Where the logs are and how the service runs.  ``repr`` masks the SASL password."""

    log: LogConfig = LogConfig()
    kafka: KafkaConfig | None = None
    service: ServiceSettings = ServiceSettings()
    cells: CellPartitions = ()
    """The ``[cells]`` map: each cell's partition of the cells topic, sorted by cell."""
    auth: AuthSettings = AuthSettings()

    @property
    def cell_map(self) -> CellMap:
        return CellMap(self.cells)

    def redacted(self) -> dict[str, Any]:
        """Plain data for logs and ``--json`` output, with every secret replaced by ``***``."""
        data: dict[str, Any] = msgspec.to_builtins(self)
        for key in SECRET_KEYS:
            if data.get("kafka") and data["kafka"].get(key) is not None:
                data["kafka"][key] = MASK
        return data


SCHEMA: Final = Schema({"log": LogConfig, "kafka": KafkaConfig, "service": ServiceSettings,
                        "auth": AuthSettings})
"""The service's tables (the reader itself, shared with the backends', is :mod:`fleetlog.log.settings`)."""


def _check_policy(spec: str) -> None:
    try:
        policy_named(spec)
    except UnknownPolicyError as exc:
        raise ConfigError(f"service.policy = {spec!r}: {exc}", "service.policy") from None


def _check_cells(service: ServiceSettings, cells: CellPartitions) -> None:
    for cell in cells:
        try:
            CellMap((cell,))
        except ValueError as exc:
            raise ConfigError(f"[cells]: {exc}", f"cells.{cell[0]}") from None
    if service.role != "all" and not cells:
        raise ConfigError(f"service.role = {service.role!r} needs the [cells] table (each cell's "
                          "partition, e.g. a100-east = 0): there is no cell to shard by", "service.role")


def _build(raw: Raw) -> Config:
    service = msgspec.convert(raw.get("service", {}), ServiceSettings)
    _check_policy(service.policy)
    log, kafka = located(raw)
    cells = cells_of(raw, kafka)
    _check_cells(service, cells)
    auth = msgspec.convert(raw.get("auth", {}), AuthSettings)
    return Config(log=log, kafka=kafka, service=service, cells=cells, auth=auth)


def load_config(
    path: Path | None, env: Mapping[str, str], *, log_dir: str | None = None, kafka: str | None = None,
    flags: Mapping[str, tuple[str, object]] | None = None,
) -> Config:
    """The configuration from ``path`` (``None``: none) with ``env``'s overrides on top, then the
    command-line ``flags`` (``table.key`` -> (flag, value)) and the shortcuts ``log_dir`` (the file
    log) or ``kafka`` (bootstrap servers) on top of all."""
    return SCHEMA.load(_build, path, env, log_dir=log_dir, kafka=kafka, flags=flags)
