"""Deterministic "greedy decoding" of a prompt, and the divergence a lossy draft causes."""

from __future__ import annotations

import hashlib

_VOCABULARY = tuple(
    onset + vowel + coda
    for onset in "bdfgklmnprstvz"
    for vowel in ("a", "e", "i", "o", "u")
    for coda in ("", "n", "r")
)


def greedy_text(prompt: str, max_tokens: int, divergence_salt: str | None = None) -> str:
    """The target's greedy output for a prompt; with a salt it diverges from one position on.

    The divergent continuation mimics a speculation bug: identical up to the first
    wrongly accepted token, different from there on.
    """
    words: list[str] = []
    diverge_at = max_tokens
    if divergence_salt is not None and max_tokens > 0:
        diverge_at = _hash_int(divergence_salt, prompt, "diverge") % max_tokens
    for position in range(max_tokens):
        index = _hash_int(prompt, str(position)) % len(_VOCABULARY)
        if position >= diverge_at:
            shift = 1 + _hash_int(str(divergence_salt), prompt, str(position)) % (len(_VOCABULARY) - 1)
            index = (index + shift) % len(_VOCABULARY)
        words.append(_VOCABULARY[index])
    return " ".join(words)


def _hash_int(*parts: str) -> int:
    digest = hashlib.sha256("\x00".join(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big")
