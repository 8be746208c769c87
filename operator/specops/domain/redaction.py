"""Take credentials out of text before it is shown: in status, in Events, in log lines.

Three sources of secrets reach messages:

- URLs with credentials in them (a Prometheus at ``http://user:password@host``, an engine URI
  a trainer signed). URLs are redacted by structure: the userinfo (everything before the last
  ``@`` that is followed by a host) is never echoed, whatever characters the password holds
  (raw ``#``, ``/``, ``?`` and ``@`` included); a user name stays when one can be told apart.
  Query parameters that name a credential are masked.
- Our own messages and log lines that quote a credential (``Authorization: Bearer ...``,
  ``token=...``, ``--password ...``, cloud and Git-hosting keys): ``redact_text`` masks the
  known shapes and keeps the rest, so the message still says what failed and where.
- A trainer's termination message: text written by someone else's program. ``redact_untrusted``
  keeps only what passes an allow-list (see there) and drops the rest of any line at the first
  word that names a credential.

Each secret is replaced by ``***``.
"""

from __future__ import annotations

import re

MASK = "***"

_SECRET_QUERY_KEYS = re.compile(
    r"(?i)^(?:.*token|.*secret|.*password|passwd|pwd|.*api[_-]?key|.*access[_-]?key|.*sig|.*signature"
    r"|.*credential|x-amz-security-token|auth|authorization|code|key)$"
)

_URL = re.compile(r"\b(?P<scheme>[a-zA-Z][a-zA-Z0-9+.\-]*://)(?P<rest>\S+)")
# A host (name, IPv4 or [IPv6]) and port, ending where no host character follows.
_HOST = re.compile(
    r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9\-.]*[A-Za-z0-9])?)(?::\d{1,5})?(?![A-Za-z0-9.\-:@_%])"
)
# ?key=value or &key=value in a URL, for keys that name a credential.
_URL_QUERY_SECRET = re.compile(r"(?P<lead>[?&](?P<key>[^\s=&#]+)=)(?P<value>[^\s&#]+)")

_KEYWORDS = (
    r"token|secret|password|passwd|pwd|api[_-]?key|access[_-]?key|private[_-]?key|signature"
    r"|credentials?|auth|authorization"
)
# key=value, key: value, "key": "value", with the key a word (or dotted/dashed/underscored words)
# holding a credential keyword: SECRET_KEY=, aws_secret_access_key =, X-Goog-Signature=, "auth": "..."
_KEY_VALUE_SECRET = re.compile(
    rf"(?i)(?P<lead>(?<![A-Za-z0-9])(?:[A-Za-z0-9]+[_.\-])*(?:{_KEYWORDS})(?:[_.\-][A-Za-z0-9]+)*"
    r"[\"']?\s*[=:]\s*[\"']?)(?P<value>[^\s\"',;&]+)"
)
# --token VALUE, -password VALUE, passwd VALUE, api key VALUE: a credential word, a space, the value.
_WORD_SECRET = re.compile(
    r"(?i)(?P<lead>(?:(?<![A-Za-z0-9\-])--?(?:[A-Za-z0-9]+[_\-])*(?:token|secret|password|passwd|pwd|"
    r"api[_-]?key|access[_-]?key|auth)(?:[_\-][A-Za-z0-9]+)*"
    r"|(?<![A-Za-z0-9])(?:password|passwd|pwd|api[ _\-]?key|apikey))\s+)(?P<value>[^\s\"',;&]+)"
)
_AUTH_HEADER = re.compile(
    r"(?i)(?P<lead>\b(?:authorization\s*[:=]\s*[\"']?(?:(?:bearer|basic|token|digest)\s+)?"
    r"|(?:bearer|basic)\s+))(?P<value>[A-Za-z0-9._~+/=\-]{6,})"
)
_PEM = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)", re.S)
_SLACK_WEBHOOK = re.compile(r"(?<=/services/)[A-Za-z0-9_]+/[A-Za-z0-9_]+/[A-Za-z0-9_]+")
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


def _split_userinfo(rest: str) -> tuple[str | None, str]:
    """(userinfo, the rest from the host on) of what follows ``scheme://``; userinfo None without one.

    The userinfo ends at the last ``@`` followed by a host: a password may hold raw ``#``, ``/``,
    ``?`` or ``@`` (not valid, but written), so the first ``/`` or ``@`` cannot be trusted."""
    for at in range(len(rest) - 1, -1, -1):
        if rest[at] == "@" and _HOST.match(rest, at + 1):
            return rest[:at], rest[at + 1 :]
    return None, rest


def _show_url(scheme: str, rest: str) -> str:
    userinfo, tail = _split_userinfo(rest)
    if userinfo is not None:
        user, colon, _password = userinfo.partition(":")
        # A user name helps tell which credentials failed; a lone part may be a token.
        shown_user = f"{user}:{MASK}" if colon and user and not re.search(r"[/?#@%]", user) else MASK
        tail = f"{shown_user}@{tail}"
    return scheme + _URL_QUERY_SECRET.sub(_mask_query, tail)


def redact_url(url: str) -> str:
    """The URL without its userinfo's secret (a plain user name stays) and credential query parameters."""
    match = _URL.fullmatch(url.strip())
    if match is None:
        return redact_text(url)
    return _show_url(match["scheme"], match["rest"])


def redact_text(text: str) -> str:
    """The text with URL credentials and token-like strings replaced by ``***``.

    Kept: everything that matches none of the shapes above, so our own messages read as written.
    """
    text = _PEM.sub(f"[private key {MASK}]", text)
    text = _URL.sub(lambda m: _show_url(m["scheme"], m["rest"]), text)
    text = _SLACK_WEBHOOK.sub(MASK, text)
    text = _AUTH_HEADER.sub(lambda m: f"{m['lead']}{MASK}", text)
    text = _KEY_VALUE_SECRET.sub(lambda m: f"{m['lead']}{MASK}", text)
    text = _WORD_SECRET.sub(lambda m: f"{m['lead']}{MASK}", text)
    text = _TOKEN_SHAPES.sub(MASK, text)
    text = _LONG_HEX.sub(MASK, text)
    return _LONG_BASE64.sub(_mask_base64, text)


# A word that names a credential: what follows it on its line is not shown.
_CREDENTIAL_WORD = re.compile(
    r"(?i)(?<![A-Za-z0-9])(?:[A-Za-z0-9]+[_.\-])*(?:token|secret|password|passwd|pwd|api[ _\-]?key|apikey"
    r"|access[_\-]?key|private[ _\-]?key|signature|credentials?|auth|authorization|bearer|cookie"
    r"|webhook)(?![A-Za-z])"
)
_ALNUM_RUN = re.compile(r"[A-Za-z0-9]+")
MAX_WORD = 30
MAX_NUMBER = 12
MAX_MIXED = 12


def _plain_word(word: str) -> bool:
    """Letters (up to 30), digits (up to 12) or a short mix (up to 12: v3, H100, rt1, 70B)."""
    for run in _ALNUM_RUN.findall(word):
        if run.isalpha():
            if len(run) > MAX_WORD:
                return False
        elif run.isdigit():
            if len(run) > MAX_NUMBER:
                return False
        elif len(run) > MAX_MIXED:
            return False
    return True


def redact_untrusted(text: str) -> str:
    """A message another program wrote (a trainer's termination message), reduced to what is safe.

    Kept: whitespace-separated words whose letter-and-digit runs are plain (words of up to 30
    letters, numbers of up to 12 digits, mixes of up to 12 such as ``v3``, ``H100``, ``70B``),
    with punctuation, paths and exception names; URLs with their userinfo and credential query
    parameters masked. Dropped: private key blocks; on each line, everything after the first word
    that names a credential (``token``, ``password``, ``secret``, ``auth``, ``signature``, ``api
    key``, ...); and every other word (long random runs, keys of any format), each shown as ``***``.
    Then ``redact_text`` runs over the result as well.
    """
    text = _PEM.sub(f"[private key {MASK}]", text)
    lines = []
    for line in text.splitlines():
        found = _CREDENTIAL_WORD.search(line)
        if found is not None:
            line = f"{line[: found.end()]} {MASK}"
        words = []
        for word in line.split(" "):
            url = _URL.search(word)
            if url is not None:
                shown = _show_url(url["scheme"], url["rest"])
                if not _plain_word(shown):  # a signed or secret path: the scheme and host stay
                    host = re.match(r"[^/]*//[^/]*", shown)
                    shown = f"{host.group(0) if host else url['scheme']}/{MASK}"
                word = word[: url.start()] + shown
            words.append(word if url is not None or _plain_word(word) else MASK)
        lines.append(" ".join(words))
    return redact_text("\n".join(lines))
