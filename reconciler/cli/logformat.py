"""The command line's log lines on stderr: ``--log-format text`` (the default: a UTC timestamp,
the level, the logger, the message) or ``--log-format json`` (one JSON object a line: time,
level, logger, message, and the traceback as ``exception`` when there is one), for journald,
Loki or any collector that reads JSON lines."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Literal

__all__ = ["LOG_FORMATS", "JsonFormatter", "TextFormatter", "configure_logging"]

LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")


def _utc(record: logging.LogRecord) -> str:
    """``2026-11-26T02:38:47.123Z``: ISO 8601, UTC, milliseconds."""
    whole = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{whole}.{int(record.msecs):03d}Z"


class TextFormatter(logging.Formatter):
    """``2026-11-26T02:38:47.123Z WARNING reconciler.reconcile: message``."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{_utc(record)} {record.levelname} {record.name}: {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object a line: ``{"level": "warning", "logger": …, "message": …, "time": …}``."""

    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "time": _utc(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, sort_keys=True, ensure_ascii=False)


def configure_logging(level: int, fmt: LogFormat) -> None:
    """The root logger: ``level`` and above to stderr, in ``fmt``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    logging.basicConfig(level=level, handlers=[handler], force=True)
