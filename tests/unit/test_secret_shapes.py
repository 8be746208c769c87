"""Every secret shape of tests/data/secret_shapes.txt stays out of every sink the operator writes.

The sinks: log lines (every record passes the redacting record factory), a failed trainer's
message (status.retraining.lastMessage, the Retraining condition and the RetrainingFailed Event
carry it), and a Prometheus URL as messages show it. The status, condition and Event of a
retraining round are checked end to end against the emulated API server in
tests/component/test_retraining_jobs.py.
"""

from __future__ import annotations

import logging

import pytest

from specops.adapters import log_redaction
from specops.domain.redaction import redact_untrusted, redact_url
from specops.domain.retraining.outcome import training_outcome
from specops.domain.retraining.state import Failed
from tests.secret_shapes import IDS, SHAPES, URL_SHAPES, SecretShape


def test_the_corpus_holds_the_shapes_it_promises() -> None:
    assert len(SHAPES) >= 30 and len(URL_SHAPES) >= 5
    for shape in SHAPES:
        assert shape.secret in shape.text, shape.name


@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_no_secret_shape_reaches_a_log_line(shape: SecretShape, caplog: pytest.LogCaptureFixture) -> None:
    log_redaction.install()
    caplog.set_level(logging.DEBUG)
    logging.getLogger("specops.test").warning("training job failed: %s", shape.text)
    [record] = caplog.records
    assert shape.secret not in record.getMessage()
    assert "training job failed" in record.getMessage()


def failed_job_with(message: str) -> Failed:
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "chat-retrain-1"},
        "status": {"conditions": [{"type": "Failed", "status": "True", "message": "BackoffLimitExceeded"}]},
    }
    pod = {
        "metadata": {"name": "chat-retrain-1-x"},
        "status": {
            "containerStatuses": [
                {"name": "trainer", "state": {"terminated": {"exitCode": 1, "message": message}}}
            ]
        },
    }
    outcome = training_outcome(job, [pod])
    assert isinstance(outcome, Failed)
    return outcome


@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_no_secret_shape_from_a_trainer_reaches_its_failure_message(shape: SecretShape) -> None:
    outcome = failed_job_with(shape.text)
    assert shape.secret not in outcome.message
    # still says where it failed
    assert "chat-retrain-1-x/trainer" in outcome.message and "BackoffLimitExceeded" in outcome.message


@pytest.mark.parametrize("shape", URL_SHAPES, ids=[s.name for s in URL_SHAPES])
def test_a_url_never_shows_its_password_and_keeps_its_host(shape: SecretShape) -> None:
    assert shape.url is not None
    shown = redact_url(shape.url)
    assert shape.secret not in shown and "***@" in shown
    host = shape.url.rpartition("@")[2]
    assert shown.endswith("@" + host)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://metrics:pa#ss@prom:9090", "http://metrics:***@prom:9090"),
        ("http://metrics:pa/ss@prom:9090/api", "http://metrics:***@prom:9090/api"),
        ("http://metrics:p@ss@prom:9090", "http://metrics:***@prom:9090"),
        ("http://tok/en@prom:9090", "http://***@prom:9090"),
        ("https://u:x@[::1]:9090/p?token=abc", "https://u:***@[::1]:9090/p?token=***"),
    ],
)
def test_urls_are_redacted_by_structure(url: str, shown: str) -> None:
    assert redact_url(url) == shown


@pytest.mark.parametrize(
    "message",
    [
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "RuntimeError: expected 8 draft heads, found 4 in /data/ckpt/step-1200/config.json",
        "engine pvc://engines/llama-3.1-70b-instruct-draft/v3-rt1 could not be written",
    ],
)
def test_a_trainers_ordinary_error_still_reads_as_written(message: str) -> None:
    assert redact_untrusted(message) == message


def test_a_trainers_text_after_a_credential_word_is_dropped() -> None:
    shown = redact_untrusted("login failed: token expired for user trainer\nValueError: bad shape")
    assert shown == "login failed: token ***\nValueError: bad shape"
