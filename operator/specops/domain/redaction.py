"""Take credentials out of text before it is shown: in status, in Events, in log lines.

Two sources of secrets reach messages: URLs with credentials in them (a Prometheus at
``http://user:password@host``, an engine URI a trainer signed) and log tails that a
failing trainer wrote (an ``Authorization: Bearer ...`` header, ``token=...``, cloud
keys). Each is replaced by ``***``; the rest of the text stays, so the message still
says what failed and where.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

MASK = "***"

_SECRET_QUERY_KEYS = re.compile(
    r"(?i)^(?:.*token|.*secret|.*password|passwd|pwd|.*api[_-]?key|.*access[_-]?key|sig|signature"
    r"|x-amz-(?:credential|signature|security-token)|auth|authorization|code)$"
)

# scheme://userinfo@ : the password (or a lone token standing as the user) is masked, a user name stays.
_URL_USERINFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.\-]*://)(?P<userinfo>[^\s/@?#]+)@")
# ?key=value or &key=value in a URL, for keys that name a credential.
_URL_QUERY_SECRET = re.compile(r"(?P<lead>[?&](?P<key>[^\s=&#]+)=)(?P<value>[^\s&#]+)")

_KEY_VALUE_SECRET = re.compile(
    r"(?i)(?P<lead>\b(?:[a-z0-9_.\-]*(?:token|secret|password|passwd|api[_-]?key|access[_-]?key)"
    r"|pwd|credentials?)\b[\"']?\s*[=:]\s*[\"']?)(?P<value>[^\s\"',;&]+)"
)
_AUTH_HEADER = re.compile(r"(?i)(?P<lead>\b(?:bearer|basic)\s+)(?P<value>[A-Za-z0-9._~+/=\-]{8,})")
_TOKEN_SHAPES = re.compile(
    r"\b(?:"
    r"(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA)[A-Z0-9]{16}"  # AWS access key ids
    r"|hf_[A-Za-z0-9]{20,}"  # Hugging Face tokens
    r"|(?:ghp|gho|ghs|ghu|ghr|github_pat|glpat|xox[abposr])[-_][A-Za-z0-9_\-]{16,}"  # forge and chat tokens
    r"|sk-[A-Za-z0-9_\-]{20,}"  # API keys of the sk- form
    r"|eyJ[A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]*"  # JSON Web Tokens
    r")"
)
_LONG_HEX = re.compile(r"\b[0-9a-fA-F]{32,}\b")
_LONG_BASE64 = re.compile(r"(?<![A-Za-z0-9+/_\-])[A-Za-z0-9+/_\-]{32,}={0,2}(?![A-Za-z0-9+/_\-])")


def _mask_userinfo(match: re.Match[str]) -> str:
    user, colon, _password = match["userinfo"].partition(":")
    # With a password, the user name helps tell which credentials failed; a lone part may be a token.
    return f"{match['scheme']}{user}:{MASK}@" if colon else f"{match['scheme']}{MASK}@"


def _mask_query(match: re.Match[str]) -> str:
    if _SECRET_QUERY_KEYS.match(match["key"]):
        return f"{match['lead']}{MASK}"
    return match.group(0)


def _looks_random(run: str) -> bool:
    """A long run with upper and lower case letters and digits: a key, not a word or a path."""
    return any(c.isupper() for c in run) and any(c.islower() for c in run) and any(c.isdigit() for c in run)


def _mask_base64(match: re.Match[str]) -> str:
    run = match.group(0)
    return MASK if _looks_random(run.replace("/", "")) and "/" not in run.strip("/") else run


def redact_url(url: str) -> str:
    """The URL without its password (user names stay) and without credential query parameters."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return redact_text(url)
    if parts.password is not None or (parts.username and not parts.password and "@" in parts.netloc):
        host = parts.netloc.rpartition("@")[2]
        user = parts.username or ""
        userinfo = f"{user}:{MASK}" if parts.password is not None else MASK
        parts = parts._replace(netloc=f"{userinfo}@{host}")
    shown = urlunsplit(parts)
    return _URL_QUERY_SECRET.sub(_mask_query, shown)


def redact_text(text: str) -> str:
    """The text with URL credentials and token-like strings replaced by ``***``."""
    text = _URL_USERINFO.sub(_mask_userinfo, text)
    text = _URL_QUERY_SECRET.sub(_mask_query, text)
    text = _AUTH_HEADER.sub(lambda m: f"{m['lead']}{MASK}", text)
    text = _KEY_VALUE_SECRET.sub(lambda m: f"{m['lead']}{MASK}", text)
    text = _TOKEN_SHAPES.sub(MASK, text)
    text = _LONG_HEX.sub(MASK, text)
    return _LONG_BASE64.sub(_mask_base64, text)
