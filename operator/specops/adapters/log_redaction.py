"""Every log line of the process passes through redaction before any handler sees it.

Kopf logs whole resource bodies at debug level (and its Warning log lines become Events);
a password in ``spec.metrics.prometheus.url`` would be copied into each. A log record
factory masks credentials once the message is formatted, so every handler (console, JSON,
Kopf's Event poster) gets the masked text.
"""

from __future__ import annotations

import logging
from typing import Any

from specops.domain.redaction import redact_text

_installed = False


def install() -> None:
    """Wrap the current log record factory (idempotent)."""
    global _installed
    if _installed:
        return
    previous = logging.getLogRecordFactory()

    def redacting_factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # a malformed call: leave it to logging's own error report
            return record
        shown = redact_text(message)
        if shown != message:
            record.msg, record.args = shown, None
        return record

    logging.setLogRecordFactory(redacting_factory)
    _installed = True
