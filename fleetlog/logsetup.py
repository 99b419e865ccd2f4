"""The one logging setup of every fleetlog process: ``fleetlog`` and its subcommands, the
service, and the backends' ``python -m`` entry points.

structlog renders every line, its own loggers' (:func:`structlog.get_logger`) and the standard
library's (``logging.getLogger("fleetlog....")``, aiokafka's, aiohttp's) alike, on stderr, as
``--log-format`` says:

* ``json``: one JSON object per line, keys sorted, with ``event``, ``level`` and ``timestamp``
  (ISO 8601, UTC), plus ``logger`` for a standard-library logger and the event's own fields;
* ``console``: one human line per event (time, level, message, fields), no colours.

``--log-level`` is the level of fleetlog's own loggers; other libraries log warnings and up
(everything at ``debug``).  No module of fleetlog installs a handler or a format of its own:
a test holds every ``basicConfig``, ``addHandler`` and ``structlog.configure`` to this module.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Final, Literal

import structlog

LogFormat = Literal["json", "console"]
FORMATS: Final = ("json", "console")
LEVELS: Final = ("debug", "info", "warning", "error")


class _Stderr:
    """Whatever ``sys.stderr`` is when a line is written (a test's capture, a redirect)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """The one handler, on the root logger (so the next setup replaces it, never adds one)."""


def _renderer(log_format: LogFormat) -> list[Any]:
    if log_format == "json":
        return [structlog.processors.format_exc_info, structlog.processors.JSONRenderer(sort_keys=True)]
    return [structlog.dev.ConsoleRenderer(colors=False)]


def configure_logging(log_format: LogFormat, level: str = "info") -> None:
    """Render structlog's and the standard library's log lines on stderr in ``log_format``,
    fleetlog's loggers from ``level`` up (see the module's docstring)."""
    number = logging.getLevelNamesMapping()[level.upper()]
    stamp = structlog.processors.TimeStamper(fmt="iso", utc=True)
    renderer = _renderer(log_format)
    structlog.configure(
        processors=[structlog.processors.add_log_level, stamp, *renderer],
        wrapper_class=structlog.make_filtering_bound_logger(number),
        logger_factory=structlog.PrintLoggerFactory(_Stderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=False,  # a later setup (a test's, another command's) applies
    )
    handler = _Handler(_Stderr())
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *renderer],
        foreign_pre_chain=[structlog.stdlib.add_log_level, structlog.stdlib.add_logger_name, stamp],
    ))
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(number if number <= logging.DEBUG else max(number, logging.WARNING))
    logging.getLogger("fleetlog").setLevel(number)


def silence(name: str) -> None:
    """No lines from library ``name`` below CRITICAL: its errors reach the command as one line
    of its own (aiokafka's connection errors under ``submit``, ``replay``)."""
    logging.getLogger(name).setLevel(logging.CRITICAL)
