"""Secrets out of text that may reach a file, a log or a terminal.

One rule makes it safe: redact *before* truncating. A key cut in two by a length limit no
longer matches itself, so redacting afterwards leaks the part before the cut; ``redact``
therefore takes the length limit itself (``max_chars``) and applies it last. It also masks
a secret's head left at the very end of the text (and its tail at the very start): text
that someone upstream already cut still does not show a usable prefix.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MASK = "***"
MIN_SECRET_CHARS = 4
"""Shorter values (``""``, ``"x"``, ``"abc"``) are not credentials; masking every occurrence
would garble the text. Also the shortest partial prefix/suffix that is masked."""

DEFAULT_PATTERNS: tuple[re.Pattern[str], ...] = (
    # Authorization headers quoted back: keep the scheme, mask the credential.
    re.compile(r"(?i)(?P<pre>\bbearer\s+)[A-Za-z0-9._~+/=-]{8,}"),
    # OpenAI-style keys (sk-..., sk-proj-...) and Hugging Face tokens (hf_...).
    re.compile(r"\b(?:sk|rk|pk)-[A-Za-z0-9_-]{8,}"),
    re.compile(r"\bhf_[A-Za-z0-9]{8,}"),
    # key=value in query strings, JSON or env dumps: api_key=..., "access_token": "...".
    re.compile(r"(?i)(?P<pre>\b(?:api[_-]?key|access[_-]?token|auth[_-]?token|secret|password|passwd)[\"']?\s*[=:]\s*[\"']?)"
               r"[^\s\"'&,;}]{4,}"),
    # Credentials inside URLs: scheme://user:password@host.
    re.compile(r"(?i)(?P<pre>\b[a-z][a-z0-9+.-]*://[^/\s:@]+:)[^/\s@]+(?P<post>@)"),
)


def redact(text: str, secrets: Iterable[str | None] = (), patterns: Iterable[re.Pattern[str] | str] = DEFAULT_PATTERNS,
           *, max_chars: int | None = None) -> str:
    """``text`` with every secret and every pattern match replaced by ``***``, then cut to
    ``max_chars`` characters (the cut comes last, so it can never split a secret first).

    ``secrets``: literal values (e.g. ``os.environ.get(api_key_env)``); ``None``, empty and
    shorter-than-4 values are ignored. ``patterns``: regexes for secrets whose value is not
    known (``DEFAULT_PATTERNS``: bearer tokens, ``sk-...`` and ``hf_...`` keys,
    ``api_key=...`` pairs, ``user:password@`` in URLs); a pattern's named groups ``pre`` and
    ``post`` are kept, the rest of its match is masked. Pass ``patterns=()`` for literal secrets only.
    """
    values = sorted({s for s in secrets if s and len(s) >= MIN_SECRET_CHARS}, key=len, reverse=True)
    for value in values:  # longest first: a secret that contains another is masked whole
        text = text.replace(value, MASK)
    for value in values:
        text = _mask_cut_ends(text, value)
    for pattern in patterns:
        rx = re.compile(pattern) if isinstance(pattern, str) else pattern
        text = rx.sub(_keep_groups, text)
    if max_chars is not None and len(text) > max_chars:
        text = text[: max(0, max_chars)]
    return text


def _keep_groups(match: re.Match[str]) -> str:
    """Named groups ``pre`` and ``post`` (the context around a secret) stay; the rest is masked."""
    parts = match.groupdict()
    return (parts.get("pre") or "") + MASK + (parts.get("post") or "")


def _mask_cut_ends(text: str, secret: str) -> str:
    """Mask a head of ``secret`` that ends the text, or a tail of it that starts the text."""
    for n in range(len(secret) - 1, MIN_SECRET_CHARS - 1, -1):
        if text.endswith(secret[:n]):
            text = text[: len(text) - n] + MASK
            break
    for n in range(len(secret) - 1, MIN_SECRET_CHARS - 1, -1):
        if text.startswith(secret[-n:]):
            text = MASK + text[n:]
            break
    return text
