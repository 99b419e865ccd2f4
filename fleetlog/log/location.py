"""Where the logs are and how to open them: the file log's ``[log]`` table or Kafka's ``[kafka]``
(with its security settings), checked, and the store they name.

The service, the client, the backends and replay all open the log through this module; the
reader (:mod:`fleetlog.log.settings`, for the service's loader and the backends' alike) reads the
same tables from the TOML file and the ``FLEETLOG_<TABLE>_<KEY>`` variables and builds them with
:func:`kafka_config` and :func:`check_place`.  No message or :func:`describe` line ever shows
the SASL password.
"""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any, Final, Literal, Protocol

import msgspec

from fleetlog.log.base import LogStore, Shard
from fleetlog.log.file import FileLogStore
from fleetlog.log.kafka import KafkaConfig, KafkaLogStore

PASSWORD_FILE_KEY: Final = "sasl_plain_password_file"
SECRET_KEYS: Final = frozenset({"sasl_plain_password"})
MASK: Final = "***"
SECURITY_PROTOCOLS: Final = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS: Final = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI", "OAUTHBEARER")
_PASSWORD_MECHANISMS: Final = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

FsyncPolicy = Literal["never", "batch", "always"]


class ConfigError(Exception):
    """A configuration that cannot be used; the message names where and what.  ``key``
    (``table.key``) lets :func:`load_config` name the file or variable a value came from."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class LogConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The ``[log]`` table: the embedded file log's directory (unset when Kafka holds the logs)."""

    dir: str | None = None
    fsync: FsyncPolicy = "batch"


class Located(Protocol):
    """Anything that says where the logs are (the service's ``Config`` does)."""

    @property
    def log(self) -> LogConfig: ...

    @property
    def kafka(self) -> KafkaConfig | None: ...


# -- checking the [kafka] table -----------------------------------------------------------------


def _password_from_file(kafka: dict[str, Any]) -> None:
    path = kafka.pop(PASSWORD_FILE_KEY, None)
    if path is None:
        return
    if kafka.get("sasl_plain_password") is not None:
        raise ConfigError(
            f"set kafka.sasl_plain_password or kafka.{PASSWORD_FILE_KEY}, not both",
            f"kafka.{PASSWORD_FILE_KEY}",
        )
    try:
        _check_private(Path(path))
        kafka["sasl_plain_password"] = Path(path).read_text(encoding="utf-8").rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"kafka.{PASSWORD_FILE_KEY}: cannot read {path}: {exc}", f"kafka.{PASSWORD_FILE_KEY}"
        ) from None


def _check_private(path: Path) -> None:
    """Refuse a password file that others may read (or change): the secret is already out."""
    mode = path.stat().st_mode
    if mode & 0o077:
        raise ConfigError(
            f"kafka.{PASSWORD_FILE_KEY}: {path} is accessible by others (mode {stat.S_IMODE(mode):04o}); "
            f"make it readable by its owner only (chmod 600 {path})",
            f"kafka.{PASSWORD_FILE_KEY}",
        )


def _check_security(kafka: KafkaConfig) -> None:
    """Fail at load, not at the first connection, on settings that cannot work."""
    if kafka.security_protocol not in SECURITY_PROTOCOLS:
        raise ConfigError(
            f"kafka.security_protocol = {kafka.security_protocol!r}: expected one of "
            f"{', '.join(SECURITY_PROTOCOLS)}",
            "kafka.security_protocol",
        )
    if kafka.security_protocol.startswith("SASL_"):
        if kafka.sasl_mechanism not in SASL_MECHANISMS:
            raise ConfigError(
                f"kafka.sasl_mechanism = {kafka.sasl_mechanism!r}: {kafka.security_protocol} needs one of "
                f"{', '.join(SASL_MECHANISMS)}",
                "kafka.sasl_mechanism" if kafka.sasl_mechanism else "kafka.security_protocol",
            )
        missing = kafka.sasl_plain_username is None or kafka.sasl_plain_password is None
        if kafka.sasl_mechanism in _PASSWORD_MECHANISMS and missing:
            raise ConfigError(
                f"kafka: {kafka.sasl_mechanism} needs sasl_plain_username and sasl_plain_password "
                f"(or {PASSWORD_FILE_KEY})",
                "kafka.sasl_mechanism",
            )
    for key in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
        path = getattr(kafka, key)
        if path is not None and not Path(path).is_file():
            raise ConfigError(f"kafka.{key} = {path!r}: no such file", f"kafka.{key}")
    try:
        kafka.client_options()  # loads the TLS files
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        raise ConfigError(f"kafka: cannot load the TLS files: {exc}", "kafka.ssl_certfile") from None


def kafka_config(values: dict[str, Any]) -> KafkaConfig:
    values = dict(values)
    _password_from_file(values)
    if values.get("bootstrap_servers") is None:
        raise ConfigError("kafka.bootstrap_servers is required when [kafka] is set")
    kafka = msgspec.convert(values, KafkaConfig)
    _check_security(kafka)
    return kafka


def check_place(log: LogConfig, kafka: KafkaConfig | None) -> None:
    if (log.dir is None) == (kafka is None):
        raise ConfigError(
            "set exactly one place for the logs: log.dir (the embedded file log) or the [kafka] table "
            f"(now: {'both' if kafka else 'neither'})"
        )


# -- using it -----------------------------------------------------------------------------------


def make_store(config: Located, shard: Shard = Shard.SINGLE) -> LogStore:
    """An unopened store for the configured logs of ``shard`` (today's single shard by default)."""
    if config.kafka is not None:
        return KafkaLogStore(config.kafka, shard)
    assert config.log.dir is not None
    return FileLogStore(config.log.dir, shard=shard, fsync=config.log.fsync)


async def open_store(config: Located, shard: Shard = Shard.SINGLE) -> LogStore:
    """The configured store of ``shard``, opened (a :class:`fleetlog.log.base.LogError` if it
    cannot be)."""
    store = make_store(config, shard)
    await store.open()
    return store


def describe(config: Located) -> str:
    """One line for logs: where the logs are and how they are reached; never a secret."""
    kafka = config.kafka
    if kafka is None:
        return f"file log at {config.log.dir} (fsync={config.log.fsync})"
    auth = kafka.security_protocol
    if kafka.sasl_mechanism is not None:
        auth += f"/{kafka.sasl_mechanism}"
        if kafka.sasl_plain_username is not None:
            auth += f" as {kafka.sasl_plain_username}"
    return (
        f"Kafka at {kafka.bootstrap_servers} ({auth}), topics {kafka.topic_prefix}.*, "
        f"shard {kafka.shard} of {kafka.shards}"
    )
