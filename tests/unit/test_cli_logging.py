"""`specops run` logging: one line per action at INFO (HTTP request lines only at debug), text or JSON."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from specops.cli import QUIET_LOGGERS, configure_logging


@pytest.fixture
def root_logging() -> Iterator[None]:
    """Leave the process' logging as it was (kopf.configure replaces the root handler)."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    levels = {name: logging.getLogger(name).level for name in QUIET_LOGGERS}
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, saved in levels.items():
        logging.getLogger(name).setLevel(saved)


def _capture() -> io.StringIO:
    """Point the handler kopf.configure installed at a buffer."""
    stream = io.StringIO()
    (handler,) = [h for h in logging.getLogger().handlers if type(h).__name__ == "_KopfStreamHandler"]
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(stream)
    return stream


def test_request_lines_are_hidden_at_info_and_shown_at_debug(root_logging: None) -> None:
    configure_logging("info", "text")
    stream = _capture()
    logging.getLogger("httpx").info('HTTP Request: GET http://api/x "HTTP/1.1 200 OK"')
    logging.getLogger("specops.services.control").info("speculation on at length 4")
    assert "HTTP Request" not in stream.getvalue()
    assert "speculation on at length 4" in stream.getvalue()

    configure_logging("debug", "text")
    stream = _capture()
    logging.getLogger("httpx").info('HTTP Request: GET http://api/x "HTTP/1.1 200 OK"')
    assert "HTTP Request" in stream.getvalue()


def test_json_format_writes_one_object_per_line(root_logging: None) -> None:
    configure_logging("warning", "json")
    stream = _capture()
    logging.getLogger("specops.services.control").info("not shown at warning")
    logging.getLogger("specops.services.control").warning("control tick of ml/chat failed: 503")
    (line,) = stream.getvalue().splitlines()
    record = json.loads(line)
    assert record["message"] == "control tick of ml/chat failed: 503"
    assert record["severity"] == "warn"
