"""Log output of every process: text lines or one JSON object per line (`--log-format json`).

A record logged with `extra={"request_id": id}` carries the request's correlation id
(`correlation.py`): text lines show it in brackets after the logger name, JSON lines as the field
`request_id`, so one id finds a request in the frontend's, the scheduler's and the worker's logs.
The level comes from `DSV4SERVE_LOG_LEVEL` (default INFO).
"""
from __future__ import annotations

import datetime
import json
import logging
import os
import sys

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s%(request_tag)s: %(message)s"
LOG_FORMATS = ("text", "json")


class _RequestTag(logging.Filter):
    """Gives every record `request_tag` (" [id]" or ""), so the text format never misses a field."""

    def filter(self, record: logging.LogRecord) -> bool:
        request_id = getattr(record, "request_id", "")
        record.request_tag = f" [{request_id}]" if request_id else ""
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601), level, service, logger, message, and
    request_id / exception when present."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self._service = service

    def format(self, record: logging.LogRecord) -> str:
        payload = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
                    .isoformat(timespec="milliseconds"),
            "level": record.levelname, "service": self._service, "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = getattr(record, "request_id", "")
        if request_id:
            payload["request_id"] = request_id
        if record.exc_info:
            payload["exception"] = self.formatException(record.exc_info)
        return json.dumps(payload, ensure_ascii=False)


def configure_logging(log_format: str, service: str) -> None:
    """Send every logger's records to stderr in `log_format` ("text" or "json"), replacing any
    handler configured before."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_RequestTag())
    handler.setFormatter(JsonFormatter(service) if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(os.environ.get("DSV4SERVE_LOG_LEVEL", "INFO"))
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per readiness poll otherwise
