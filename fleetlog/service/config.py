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
what was expected; unknown keys are errors.  No message, ``repr``
or :meth:`Config.redacted` ever shows the SASL password.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Final, Literal, get_args, get_origin

import msgspec
from msgspec import Meta

from fleetlog.core.policy import UnknownPolicyError, policy_named
from fleetlog.log.kafka import KafkaConfig
from fleetlog.log.location import (
    MASK,
    PASSWORD_FILE_KEY,
    SASL_MECHANISMS,
    SECRET_KEYS,
    SECURITY_PROTOCOLS,
    ConfigError,
    FsyncPolicy,
    LogConfig,
    check_place,
    describe,
    kafka_config,
    make_store,
    open_store,
)

ENV_PREFIX: Final = "FLEETLOG_"
NOT_SETTINGS: Final = frozenset(
    {
        "FLEETLOG_KAFKA_PORT",
        "FLEETLOG_KAFKA_CONTROLLER_PORT",
        "FLEETLOG_KAFKA_DIR",
        "FLEETLOG_KAFKA_HEAP",
        "FLEETLOG_KAFKA_START_TIMEOUT",
        "FLEETLOG_KAFKA_SASL_PORT",
    }
)
"""Variables of ``infra/kafka/kafka.sh`` (the development broker), not settings of the service."""

__all__ = [
    "MASK", "PASSWORD_FILE_KEY", "SASL_MECHANISMS", "SECRET_KEYS", "SECURITY_PROTOCOLS", "Config",
    "ConfigError", "FsyncPolicy", "LogConfig", "ServiceSettings", "describe", "load_config", "make_store",
    "open_store",
]

Port = Annotated[int, Meta(ge=0, le=65535)]
Positive = Annotated[int, Meta(ge=1)]


class ServiceSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The ``[service]`` table: how the scheduler runs."""

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
    http_header_timeout_s: Annotated[float, Meta(gt=0)] = 10.0
    """A connection must send a whole request head this soon after it opens (or after its
    previous answer), else it is closed: idle and slow-header clients hold nothing."""
    http_body_timeout_s: Annotated[float, Meta(gt=0)] = 30.0
    """A request body must arrive this soon (else 408)."""
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
    max_request_events: Positive = 10_000
    """Events in one ingest request (more: 413)."""
    max_request_tasks: Positive = 100_000
    """Tasks of all the jobs one ingest request submits (more: 413)."""
    max_pending_tasks: Positive = 1_000_000
    """Tasks of pending jobs plus tasks accepted but not yet folded; a request that would pass it
    gets 429 with ``Retry-After``."""


class Config(msgspec.Struct, frozen=True):
    """Where the logs are and how the service runs.  ``repr`` masks the SASL password."""

    log: LogConfig = LogConfig()
    kafka: KafkaConfig | None = None
    service: ServiceSettings = ServiceSettings()

    def redacted(self) -> dict[str, Any]:
        """Plain data for logs and ``--json`` output, with every secret replaced by ``***``."""
        data: dict[str, Any] = msgspec.to_builtins(self)
        for key in SECRET_KEYS:
            if data.get("kafka") and data["kafka"].get(key) is not None:
                data["kafka"][key] = MASK
        return data


_TABLES: Final[dict[str, type[msgspec.Struct]]] = {
    "log": LogConfig,
    "kafka": KafkaConfig,
    "service": ServiceSettings,
}


def _field_types(table: str) -> dict[str, Any]:
    types = {f.name: f.type for f in msgspec.structs.fields(_TABLES[table])}
    if table == "kafka":
        types[PASSWORD_FILE_KEY] = str | None
    return types


_FIELD_TYPES: Final = {table: _field_types(table) for table in _TABLES}


# -- reading the sources ------------------------------------------------------------------------

Raw = dict[str, dict[str, Any]]
Origins = dict[str, str]
"""``table.key`` -> where its value came from (a file and line, or a variable)."""


def _shown(key: str, value: object) -> str:
    return MASK if key in SECRET_KEYS else repr(value)


def _check_known(table: str, key: str, where: str) -> None:
    known = _FIELD_TYPES[table]
    if key not in known:
        raise ConfigError(f"{where}: unknown key {table}.{key}; known keys: {', '.join(sorted(known))}")


def _typed(table: str, key: str, value: object, where: str, strict: bool) -> Any:
    """``value`` converted to the type of ``table.key``, or a :class:`ConfigError` naming ``where``."""
    _check_known(table, key, where)
    try:
        return msgspec.convert(value, _FIELD_TYPES[table][key], strict=strict)
    except msgspec.ValidationError as exc:
        detail = str(exc).split(" - at ")[0]
        choices = (
            get_args(_FIELD_TYPES[table][key]) if get_origin(_FIELD_TYPES[table][key]) is Literal else ()
        )
        if choices:
            detail += f"; expected one of {', '.join(map(str, choices))}"
        raise ConfigError(f"{where}: {table}.{key} = {_shown(key, value)}: {detail}") from None


def _line_of(text: str, table: str, key: str) -> int | None:
    """The line of ``key = ...`` inside ``[table]`` (a hint for error messages)."""
    current = ""
    for number, line in enumerate(text.splitlines(), 1):
        header = re.match(r"\s*\[\s*([\w.-]+)\s*\]", line)
        if header:
            current = header.group(1)
        elif current == table and re.match(rf"\s*{re.escape(key)}\s*=", line):
            return number
    return None


def _read_file(path: Path, origins: Origins) -> Raw:
    """The file's tables, each key checked against its field's type."""
    try:
        text = path.read_text(encoding="utf-8")
        doc = tomllib.loads(text)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    raw: Raw = {}
    for table, values in doc.items():
        if table not in _TABLES:
            raise ConfigError(f"{path}: unknown table [{table}]; expected {', '.join(_TABLES)}")
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: {table} must be a table ([{table}]), not a value")
        raw[table] = {}
        for key, value in values.items():
            line = _line_of(text, table, key)
            where = f"{path}, line {line}" if line else str(path)
            raw[table][key] = _typed(table, key, value, where, strict=True)
            origins[f"{table}.{key}"] = where
    return raw


def _optional(table: str, key: str) -> bool:
    try:
        msgspec.convert(None, _FIELD_TYPES[table][key])
    except msgspec.ValidationError:
        return False
    return True


def _env_value(table: str, key: str, text: str, where: str) -> Any:
    _check_known(table, key, where)
    if text == "" and _optional(table, key):
        return None  # an empty value clears an optional key
    return _typed(table, key, text, where, strict=False)


def _apply_env(raw: Raw, env: Mapping[str, str], origins: Origins) -> None:
    """Merge ``FLEETLOG_<TABLE>_<KEY>`` variables into ``raw`` (the environment wins)."""
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX) or name in NOT_SETTINGS:
            continue
        rest = name[len(ENV_PREFIX) :].lower()
        table = next((t for t in _TABLES if rest.startswith(t + "_")), None)
        if table is None:
            continue  # not a setting of a table (e.g. FLEETLOG_KAFKA, FLEETLOG_TRACES)
        key = rest[len(table) + 1 :]
        where = f"environment variable {name}"
        raw.setdefault(table, {})[key] = _env_value(table, key, env[name], where)
        origins[f"{table}.{key}"] = where


# -- building the structs -----------------------------------------------------------------------


def _check_policy(spec: str) -> None:
    try:
        policy_named(spec)
    except UnknownPolicyError as exc:
        raise ConfigError(f"service.policy = {spec!r}: {exc}", "service.policy") from None


def _build(raw: Raw) -> Config:
    log = msgspec.convert(raw.get("log", {}), LogConfig)
    service = msgspec.convert(raw.get("service", {}), ServiceSettings)
    _check_policy(service.policy)
    kafka_values = {k: v for k, v in raw.get("kafka", {}).items() if v is not None}
    kafka = kafka_config(kafka_values) if kafka_values else None
    check_place(log, kafka)
    return Config(log=log, kafka=kafka, service=service)


def _apply_shortcuts(raw: Raw, log_dir: str | None, kafka: str | None, origins: Origins) -> None:
    """``--log DIR`` / ``--kafka HOST:PORT``: the logs go there, whatever the file and environment say
    (other ``[kafka]`` settings, such as security, are kept for ``--kafka``)."""
    if log_dir is not None:
        raw.pop("kafka", None)
        raw.setdefault("log", {})["dir"] = _typed("log", "dir", log_dir, "--log", strict=True)
        origins["log.dir"] = "--log"
    if kafka is not None:
        raw.setdefault("log", {})["dir"] = None
        raw.setdefault("kafka", {})["bootstrap_servers"] = kafka
        origins["kafka.bootstrap_servers"] = "--kafka"


def _apply_flags(raw: Raw, flags: Mapping[str, tuple[str, object]], origins: Origins) -> None:
    """Command-line options that set a key (``{"service.policy": ("--policy", "fgd")}``): they
    beat the file and the environment, and an error names the flag, not a variable."""
    for name in sorted(flags):
        flag, value = flags[name]
        table, key = name.split(".", 1)
        raw.setdefault(table, {})[key] = _typed(table, key, value, flag, strict=False)
        origins[name] = flag


def load_config(
    path: Path | None, env: Mapping[str, str], *, log_dir: str | None = None, kafka: str | None = None,
    flags: Mapping[str, tuple[str, object]] | None = None,
) -> Config:
    """The configuration from ``path`` (``None``: none) with ``env``'s overrides on top, then the
    command-line ``flags`` (``table.key`` -> (flag, value)) and the shortcuts ``log_dir`` (the file
    log) or ``kafka`` (bootstrap servers) on top of all."""
    origins: Origins = {}
    raw = _read_file(path, origins) if path is not None else {}
    _apply_env(raw, env, origins)
    _apply_flags(raw, flags or {}, origins)
    _apply_shortcuts(raw, log_dir, kafka, origins)
    try:
        return _build(raw)
    except ConfigError as exc:
        where = origins.get(exc.key or "", str(path) if path is not None else None)
        if where is None:
            raise
        raise ConfigError(f"{where}: {exc}", exc.key) from None
