"""Credentials never reach what the operator shows: URLs and trainer log tails are scrubbed."""

from __future__ import annotations

import pytest

from specops.domain.redaction import redact_text, redact_url


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://user:secret@prom:9090", "http://user:***@prom:9090"),
        ("https://user:p%40ss@prom.example:443/prometheus", "https://user:***@prom.example:443/prometheus"),
        ("http://ghp_0123456789abcdefghij@prom:9090", "http://***@prom:9090"),
        ("http://prom:9090/api?token=abc123&step=15", "http://prom:9090/api?token=***&step=15"),
        ("http://prom:9090", "http://prom:9090"),
        ("http://prom:9090/select/0/prometheus", "http://prom:9090/select/0/prometheus"),
    ],
)
def test_urls_keep_their_host_and_user_but_not_their_secrets(url: str, shown: str) -> None:
    assert redact_url(url) == shown


SECRETS = [
    ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJl", "eyJhbGciOiJIUzI1NiJ9"),
    ("curl -H 'Authorization: Bearer abcdefghijklmnop0123'", "abcdefghijklmnop0123"),
    ("HF_TOKEN=hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789", "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"),
    ("using hub token hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234", "hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234"),
    ("aws_access_key_id=AKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPLE"),
    ("key AKIAIOSFODNN7EXAMPLE was refused", "AKIAIOSFODNN7EXAMPLE"),
    ("aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "wJalrXUtnFEMI"),
    ("password=hunter2 rejected", "hunter2"),
    ('{"api_key": "k-12345-secret"}', "k-12345-secret"),
    ("login with token: 9f8e7d6c5b4a3", "9f8e7d6c5b4a3"),
    ("fetch s3://AKIAX:wJalrXUtnFEMIK7MDENG@bucket/x failed", "wJalrXUtnFEMIK7MDENG"),
    (
        "sha 3f786850e387550fdab836ed7e6dc881de23001b0a1c2d3e",
        "3f786850e387550fdab836ed7e6dc881de23001b0a1c2d3e",
    ),
    (
        "blob dGhpcyBpcyBhIHNlY3JldCBrZXkgdGhhdCBpcyBsb25nMTIz end",
        "dGhpcyBpcyBhIHNlY3JldCBrZXkgdGhhdCBpcyBsb25nMTIz",
    ),
    ("openai sk-proj0123456789abcdefABCDEF", "sk-proj0123456789abcdefABCDEF"),
]


@pytest.mark.parametrize(("text", "secret"), SECRETS, ids=[s[1][:12] for s in SECRETS])
def test_token_like_strings_are_masked(text: str, secret: str) -> None:
    shown = redact_text(text)
    assert secret not in shown
    assert "***" in shown


@pytest.mark.parametrize(
    "text",
    [
        "cannot reach Prometheus at http://prom:9090: ConnectError('All connection attempts failed')",
        "holding revision 2b9d3c5678; max_tokens: 16",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "engine pvc://engines/llama-3.1-70b-instruct-draft/v3-rt1-2026-10-01 loaded",
        "model repository /models/llmapi_repo/tensorrt_llm/config.pbtxt not found",
        "alpha canary 0.879 vs stable 0.750 over 12 samples",
        "the token returned by the hub expired; tokenizer loaded from /models/tokenizer.json",
    ],
)
def test_ordinary_messages_are_unchanged(text: str) -> None:
    assert redact_text(text) == text


def test_a_url_with_credentials_inside_free_text() -> None:
    shown = redact_text("Prometheus at http://metrics:s3cr3t@127.0.0.1:9 timed out after 5s")
    assert shown == "Prometheus at http://metrics:***@127.0.0.1:9 timed out after 5s"
