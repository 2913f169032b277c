"""Role keys and secret redaction: what keeps the gateway safe to put in front of users.

Keys: each role (client, feedback, verifier, admin) has a set of keys; a presented key is hashed
and compared with every configured key's hash by ``hmac.compare_digest``, so neither the
time taken nor an early exit tells an attacker how much of a guess was right. Key values
are never logged, stored or echoed.

Redaction: every text the gateway writes to the store or to its log first goes through
``Redactor``: regex patterns for common key shapes plus the literal values of named
environment variables (and of the gateway's own and the upstream's keys) become
``[REDACTED]``. Anything that truncates text does so after redaction, so a cut can never
leave half a secret that the patterns no longer recognise.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum
from typing import Any

from seed_agents.gateway.config import SecurityConfig
from seed_agents.gateway.errors import GatewayError

log = logging.getLogger("seed_agents.gateway")

REDACTED = "[REDACTED]"
MIN_ENV_SECRET_LEN = 6  # shorter values ("1", "true") would shred ordinary text
MAX_LOG_CHARS = 600


class Role(StrEnum):
    CLIENT = "client"
    FEEDBACK = "feedback"
    VERIFIER = "verifier"  # an outside verifier: may post rewards with source "verifier"
    ADMIN = "admin"


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class KeyRing:
    """The configured keys per role; ``check`` admits a key for a role or raises 401/403."""

    def __init__(self, keys: Mapping[Role, Iterable[str]]) -> None:
        self._digests: dict[Role, list[bytes]] = {role: [_digest(k) for k in keys.get(role, ()) if k] for role in Role}
        self._values: list[str] = [k for ks in keys.values() for k in ks if k]

    @classmethod
    def from_config(cls, cfg: SecurityConfig, environ: Mapping[str, str] | None = None) -> KeyRing:
        env = os.environ if environ is None else environ
        keys: dict[Role, list[str]] = {}
        for role, inline, env_name in (
            (Role.CLIENT, cfg.client_keys, cfg.client_keys_env),
            (Role.FEEDBACK, cfg.feedback_keys, cfg.feedback_keys_env),
            (Role.VERIFIER, cfg.verifier_keys, cfg.verifier_keys_env),
            (Role.ADMIN, cfg.admin_keys, cfg.admin_keys_env),
        ):
            from_env = [k.strip() for k in env.get(env_name, "").split(",") if k.strip()]
            keys[role] = [s.get_secret_value() for s in inline] + from_env
        return cls(keys)

    @property
    def open(self) -> bool:
        """True when no key is configured at all: every request is admitted."""
        return not any(self._digests.values())

    @property
    def values(self) -> list[str]:
        """The key values themselves, for the redactor only."""
        return list(self._values)

    def role_of(self, presented: str) -> set[Role]:
        """Every role whose keys include ``presented`` (all keys are compared, always)."""
        got = _digest(presented)
        roles: set[Role] = set()
        for role, digests in self._digests.items():
            for d in digests:
                if hmac.compare_digest(d, got):
                    roles.add(role)
        return roles

    def check(self, presented: str | None, allowed: Role) -> None:
        """Admit a request needing ``allowed`` (an admin key is admitted everywhere)."""
        self.admit(presented, allowed)

    def admit(self, presented: str | None, *allowed: Role) -> set[Role]:
        """Admit a request needing any of ``allowed`` (or admin); return the key's roles,
        which an endpoint may use to decide what the caller may do (empty when open)."""
        if self.open:
            return set()
        if not presented:
            raise GatewayError(401, "missing API key: send 'Authorization: Bearer <key>'", type="authentication_error", code="missing_api_key")
        roles = self.role_of(presented)
        if not roles:
            raise GatewayError(401, "invalid API key", type="authentication_error", code="invalid_api_key")
        if roles.isdisjoint(allowed) and Role.ADMIN not in roles:
            names = " or ".join(r.value for r in allowed)
            raise GatewayError(403, f"this key may not use {names} endpoints", type="permission_error", code="forbidden")
        return roles


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The key a request carries: ``Authorization: Bearer <key>`` (what OpenAI clients send) or ``X-API-Key``."""
    auth = headers.get("authorization", "")
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return headers.get("x-api-key") or None


class Redactor:
    """Replaces secrets by ``[REDACTED]`` in strings and in nested JSON-like data."""

    def __init__(self, patterns: Sequence[str], literals: Iterable[str] = ()) -> None:
        parts = [_scoped(p) for p in patterns]
        # longest first, so a value that contains another is removed whole
        lits = sorted({v for v in literals if len(v) >= MIN_ENV_SECRET_LEN}, key=len, reverse=True)
        parts = [re.escape(v) for v in lits] + parts
        self._regex = re.compile("|".join(parts)) if parts else None

    @classmethod
    def from_config(cls, cfg: SecurityConfig, extra_literals: Iterable[str] = (), environ: Mapping[str, str] | None = None) -> Redactor:
        """Patterns from ``cfg`` plus the values of ``cfg.redact_env`` and ``extra_literals``."""
        env = os.environ if environ is None else environ
        literals = list(extra_literals)
        for name in cfg.redact_env:
            value = env.get(name)
            if value is None:
                log.warning("redact_env names %s, which is not set; nothing to redact for it", name)
            elif len(value) < MIN_ENV_SECRET_LEN:
                log.warning("redact_env: the value of %s is shorter than %d characters and is not redacted", name, MIN_ENV_SECRET_LEN)
            else:
                literals.append(value)
        return cls([*cfg.secret_patterns, *cfg.extra_secret_patterns], literals)

    def text(self, s: str) -> str:
        return s if self._regex is None else self._regex.sub(REDACTED, s)

    def found(self, s: str) -> bool:
        return self._regex is not None and self._regex.search(s) is not None

    def obj(self, value: Any) -> Any:
        """A copy of ``value`` with every string (keys included) redacted."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.obj(k): self.obj(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.obj(v) for v in value]
        return value


_GLOBAL_FLAGS = re.compile(r"^\(\?([aiLmsux]+)\)")


def _scoped(pattern: str) -> str:
    """Wrap ``pattern`` for an alternation; a leading global flag group such as ``(?i)``
    (not allowed mid-expression) becomes a scoped one, ``(?i:...)``."""
    m = _GLOBAL_FLAGS.match(pattern)
    return f"(?{m.group(1)}:{pattern[m.end():]})" if m else f"(?:{pattern})"


class RedactingFilter(logging.Filter):
    """Redacts (then truncates) every record of the gateway's logger before any handler sees it."""

    def __init__(self, redactor: Redactor, max_chars: int = MAX_LOG_CHARS) -> None:
        super().__init__()
        self.redactor = redactor
        self.max_chars = max_chars

    def filter(self, record: logging.LogRecord) -> bool:
        message = self.redactor.text(record.getMessage())
        if record.exc_info:  # a traceback may quote request data: keep only its redacted last line
            message += " | " + self.redactor.text(repr(record.exc_info[1]))
            record.exc_info = None
            record.exc_text = None
        if len(message) > self.max_chars:
            message = message[: self.max_chars] + "..."
        record.msg, record.args = message, ()
        return True
