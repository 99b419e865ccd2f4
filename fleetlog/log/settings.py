"""Reading fleetlog's configuration: a TOML file plus ``FLEETLOG_<TABLE>_<KEY>`` environment
overrides, command-line flags and the ``--log``/``--kafka`` shortcuts on top, for any set of
tables (:class:`Schema`).

Two readers use it: the service's (:mod:`fleetlog.service.config`: ``[log]``, ``[kafka]`` and
``[service]``) and :func:`load_location`, which reads only where the logs are (``[log]`` and
``[kafka]``): what a backend needs, from the same file and variables as ``fleetlog run``.  An
environment variable beats the file (an empty value clears an optional key), and a flag beats
both.  Every error is a :class:`~fleetlog.log.location.ConfigError` naming the file (and line),
the variable or the flag, the key and what was expected; unknown keys are errors.  No message
ever shows the SASL password.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Annotated, Any, Final, Literal, TypeVar, get_args, get_origin

import msgspec

from fleetlog.log.kafka import KafkaConfig
from fleetlog.log.location import (
    MASK,
    PASSWORD_FILE_KEY,
    SECRET_KEYS,
    ConfigError,
    LogConfig,
    check_place,
    kafka_config,
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
        "FLEETLOG_KAFKA_CLUSTER_PORT",
        "FLEETLOG_KAFKA_CLUSTER_DIR",
    }
)
"""Variables of ``infra/kafka/kafka.sh`` (the development broker), not settings of the service."""

Raw = dict[str, dict[str, Any]]
Origins = dict[str, str]
"""``table.key`` -> where its value came from (a file and line, or a variable)."""
T = TypeVar("T")


def _shown(key: str, value: object) -> str:
    return MASK if key in SECRET_KEYS else repr(value)


_HEADER: Final = re.compile(r"\s*\[\s*([\w.-]+|\"[^\"]*\")\s*\]")
_KEY: Final = re.compile(r"""\s*(?:"([^"]*)"|'([^']*)'|([\w.-]+))\s*=""")


def _lines(text: str) -> dict[tuple[str, str], int]:
    """The line of each ``key = ...`` by (table, key), bare or quoted (hints for error messages),
    in one pass: a map of 10,000 cells is indexed as fast as a table of ten keys."""
    found: dict[tuple[str, str], int] = {}
    current = ""
    for number, line in enumerate(text.splitlines(), 1):
        header = _HEADER.match(line)
        if header:
            current = header.group(1).strip('"')
        elif key := _KEY.match(line):
            found.setdefault((current, next(g for g in key.groups() if g is not None)), number)
    return found


def _parse(path: Path) -> tuple[str, dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8")
        return text, tomllib.loads(text)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None


CELLS: Final = "cells"
"""The ``[cells]`` table: each cell's partition of the cells topic, ``name = partition``
(docs/scale-out.md: an explicit map, never a hash).  Every reader reads it: the service for its
roles, producers to route a cell's events."""
Partition = Annotated[int, msgspec.Meta(ge=0, le=(1 << 31) - 1)]
MAPS: Final[Mapping[str, Any]] = {CELLS: Partition}
"""Tables whose keys are names of the fleet's (any key), each value of one type."""


class Schema:
    """The tables a reader knows (``name`` -> its struct), and the ``others``: tables of the same
    file that another part of fleetlog reads (the backends leave ``[service]`` to the service).
    Every reader also reads the :data:`MAPS` (``[cells]``), from the file only: their keys are
    names no variable could spell (case, dashes)."""

    def __init__(self, tables: Mapping[str, type[msgspec.Struct]], others: Collection[str] = ()) -> None:
        self.tables, self.others = dict(tables), frozenset(others)
        self.field_types = {table: self._field_types(table) for table in self.tables}

    def _field_types(self, table: str) -> dict[str, Any]:
        types = {f.name: f.type for f in msgspec.structs.fields(self.tables[table])}
        if table == "kafka":
            types[PASSWORD_FILE_KEY] = str | None
        return types

    # -- one value ------------------------------------------------------------------------------

    def _check_known(self, table: str, key: str, where: str) -> None:
        known = self.field_types[table]
        if key not in known:
            close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
            hint = f"; did you mean {table}.{close[0]}?" if close else ""
            raise ConfigError(f"{where}: unknown key {table}.{key}{hint}; known keys: "
                              f"{', '.join(sorted(known))}")

    def typed(self, table: str, key: str, value: object, where: str, strict: bool) -> Any:
        """``value`` converted to the type of ``table.key``, or a :class:`ConfigError` naming ``where``."""
        self._check_known(table, key, where)
        kind = self.field_types[table][key]
        try:
            return msgspec.convert(value, kind, strict=strict)
        except msgspec.ValidationError as exc:
            detail = str(exc).split(" - at ")[0]
            choices = get_args(kind) if get_origin(kind) is Literal else ()
            if choices:
                detail += f"; expected one of {', '.join(map(str, choices))}"
            raise ConfigError(f"{where}: {table}.{key} = {_shown(key, value)}: {detail}") from None

    def _optional(self, table: str, key: str) -> bool:
        try:
            msgspec.convert(None, self.field_types[table][key])
        except msgspec.ValidationError:
            return False
        return True

    def _env_value(self, table: str, key: str, text: str, where: str) -> Any:
        self._check_known(table, key, where)
        if text == "" and self._optional(table, key):
            return None  # an empty value clears an optional key
        return self.typed(table, key, text, where, strict=False)

    # -- the sources ----------------------------------------------------------------------------

    def read_file(self, path: Path, origins: Origins) -> Raw:
        """The file's tables, each key checked against its field's type (others' tables skipped)."""
        text, doc = _parse(path)
        raw: Raw = {}
        lines = _lines(text)
        for table, values in doc.items():
            if table in self.others:
                continue
            if table not in self.tables and table not in MAPS:
                close = difflib.get_close_matches(table, [*self.tables, *MAPS], n=1, cutoff=0.6)
                hint = f"; did you mean [{close[0]}]?" if close else ""
                raise ConfigError(f"{path}: unknown table [{table}]{hint}; expected "
                                  f"{', '.join([*self.tables, *MAPS, *sorted(self.others)])}")
            if not isinstance(values, dict):
                raise ConfigError(f"{path}: {table} must be a table ([{table}]), not a value")
            raw[table] = {}
            for key, value in values.items():
                line = lines.get((table, key))
                where = f"{path}, line {line}" if line else str(path)
                raw[table][key] = (self.map_value(table, key, value, where) if table in MAPS
                                   else self.typed(table, key, value, where, strict=True))
                origins[f"{table}.{key}"] = where
        return raw

    @staticmethod
    def map_value(table: str, key: str, value: object, where: str) -> Any:
        """One entry of a :data:`MAPS` table, of its type, or a :class:`ConfigError` naming ``where``."""
        if isinstance(value, dict):
            raise ConfigError(f"{where}: {table}.{key} is a table; [{table}] holds name = value lines")
        try:
            return msgspec.convert(value, MAPS[table], strict=True)
        except msgspec.ValidationError as exc:
            detail = str(exc).split(" - at ")[0]
            raise ConfigError(f"{where}: {table}.{key} = {value!r}: {detail}") from None

    def apply_env(self, raw: Raw, env: Mapping[str, str], origins: Origins) -> None:
        """Merge ``FLEETLOG_<TABLE>_<KEY>`` variables into ``raw`` (the environment wins)."""
        for name in sorted(env):
            if not name.startswith(ENV_PREFIX) or name in NOT_SETTINGS:
                continue
            rest = name[len(ENV_PREFIX) :].lower()
            if rest.split("_")[0] in MAPS:
                raise ConfigError(f"environment variable {name}: the [{rest.split('_')[0]}] table is read "
                                  "from the config file only (its keys are names a variable cannot spell)")
            table = next((t for t in self.tables if rest.startswith(t + "_")), None)
            if table is None:
                continue  # not a setting of a table (e.g. FLEETLOG_KAFKA, FLEETLOG_TRACES, others')
            key = rest[len(table) + 1 :]
            where = f"environment variable {name}"
            raw.setdefault(table, {})[key] = self._env_value(table, key, env[name], where)
            origins[f"{table}.{key}"] = where

    def apply_flags(self, raw: Raw, flags: Mapping[str, tuple[str, object]], origins: Origins) -> None:
        """Command-line options that set a key (``{"service.policy": ("--policy", "fgd")}``): they
        beat the file and the environment, and an error names the flag, not a variable."""
        for name in sorted(flags):
            flag, value = flags[name]
            table, key = name.split(".", 1)
            raw.setdefault(table, {})[key] = self.typed(table, key, value, flag, strict=False)
            origins[name] = flag

    def apply_shortcuts(self, raw: Raw, log_dir: str | None, kafka: str | None, origins: Origins) -> None:
        """``--log DIR`` / ``--kafka HOST:PORT``: the logs go there, whatever the file and environment
        say (other ``[kafka]`` settings, such as security, are kept for ``--kafka``)."""
        if log_dir is not None:
            raw.pop("kafka", None)
            raw.setdefault("log", {})["dir"] = self.typed("log", "dir", log_dir, "--log", strict=True)
            origins["log.dir"] = "--log"
        if kafka is not None:
            raw.setdefault("log", {})["dir"] = None
            raw.setdefault("kafka", {})["bootstrap_servers"] = kafka
            origins["kafka.bootstrap_servers"] = "--kafka"

    # -- all of it ------------------------------------------------------------------------------

    def load(
        self, build: Callable[[Raw], T], path: Path | None, env: Mapping[str, str], *,
        log_dir: str | None = None, kafka: str | None = None,
        flags: Mapping[str, tuple[str, object]] | None = None,
    ) -> T:
        """``build`` of the file at ``path`` (``None``: none) with ``env``'s overrides on top, then
        the command-line ``flags`` (``table.key`` -> (flag, value)) and the shortcuts ``log_dir``
        (the file log) or ``kafka`` (bootstrap servers) on top of all; an error of ``build``
        names where the value it is about came from."""
        origins: Origins = {}
        raw = self.read_file(path, origins) if path is not None else {}
        self.apply_env(raw, env, origins)
        self.apply_flags(raw, flags or {}, origins)
        self.apply_shortcuts(raw, log_dir, kafka, origins)
        try:
            return build(raw)
        except ConfigError as exc:
            where = origins.get(exc.key or "", str(path) if path is not None else None)
            if where is None:
                raise
            raise ConfigError(f"{where}: {exc}", exc.key) from None


# -- where the logs are -------------------------------------------------------------------------


CellPartitions = tuple[tuple[str, int], ...]
"""The ``[cells]`` map as (cell, partition) pairs sorted by cell."""


class Location(msgspec.Struct, frozen=True):
    """Where the logs are (a :class:`~fleetlog.log.location.Located`), and each cell's partition."""

    log: LogConfig = LogConfig()
    kafka: KafkaConfig | None = None
    cells: CellPartitions = ()


def cells_of(raw: Raw, kafka: KafkaConfig | None) -> CellPartitions:
    """The ``[cells]`` map of ``raw``, checked against the cells topics' partitions on Kafka
    (``kafka.shards``: a partition past them would be a topic the cells cannot have)."""
    cells = tuple(sorted(raw.get(CELLS, {}).items()))
    for cell, partition in cells:
        if kafka is not None and partition >= kafka.shards:
            raise ConfigError(f"cells.{cell} = {partition}: the cells topics have kafka.shards = "
                              f"{kafka.shards} partitions (0..{kafka.shards - 1}); raise kafka.shards "
                              "(adding partitions moves no cell) or map the cell to one of them",
                              f"{CELLS}.{cell}")
    return cells


def located(raw: Raw) -> tuple[LogConfig, KafkaConfig | None]:
    """The ``[log]`` and ``[kafka]`` tables of ``raw``, checked: exactly one place for the logs."""
    log = msgspec.convert(raw.get("log", {}), LogConfig)
    kafka_values = {k: v for k, v in raw.get("kafka", {}).items() if v is not None}
    kafka = kafka_config(kafka_values) if kafka_values else None
    check_place(log, kafka)
    return log, kafka


def _location(raw: Raw) -> Location:
    log, kafka = located(raw)
    return Location(log=log, kafka=kafka, cells=cells_of(raw, kafka))


def load_location(
    path: Path | None, env: Mapping[str, str], *, others: Collection[str] = (),
    log_dir: str | None = None, kafka: str | None = None,
) -> Location:
    """Where the logs are, from the ``[log]`` and ``[kafka]`` tables of the file at ``path`` and
    the ``FLEETLOG_LOG_*``/``FLEETLOG_KAFKA_*`` variables, ``--log``/``--kafka`` on top; the
    file's ``others`` tables are another reader's and are skipped."""
    schema = Schema({"log": LogConfig, "kafka": KafkaConfig}, others)
    return schema.load(_location, path, env, log_dir=log_dir, kafka=kafka)
