"""Structured log events of the checkpoint layer.

Each record carries ``event`` (a dotted name) and ``fields`` (a dict) as LogRecord attributes for
structured handlers, and the same fields as ``key=value`` text in the message for plain ones.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("accelpact.checkpoint")


def log_event(level: int, event: str, message: str, **fields: Any) -> None:
    """Log ``message`` as ``event`` with ``fields``, both structured and rendered."""
    if not logger.isEnabledFor(level):
        return
    rendered = " ".join(f"{k}={v!r}" for k, v in fields.items())
    logger.log(level, "%s: %s [%s]", event, message, rendered, extra={"event": event, "fields": fields})
