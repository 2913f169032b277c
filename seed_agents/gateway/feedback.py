"""Rewards that arrive after the calls: from users, verifiers run at session end, a judge.

A session may collect several rewards; the store's ``RewardPolicy`` decides which one
trains (default precedence: ``verifier`` > ``user`` > ``judge``, first value of the
winning source). The gateway only records rewards with their source, never resolves them.

Because the source decides what trains, it carries the authority of who sent it
(``reward_source``): a feedback key (and anyone on an open gateway) posts ``user``
rewards only, a verifier key ``verifier`` ones, an admin key any source; the gateway's
own verifiers record ``verifier`` and its judge ``judge``. A body asking for more than
its key allows is refused (403), never quietly downgraded.

A verifier is any ``fn(session: SessionRecord, calls: list[LLMCall]) -> float | None``
(``seed_agents.types.Verifier``: what each input holds, here and in the loop's replays)
named by import path (``pkg.mod:fn``) in the config. It runs when a session ends; a
float becomes a reward with source ``"verifier"`` (comment: the verifier's path), None
means "no opinion". A verifier that raises or returns a non-number is a fault: nothing
is stored for it, the fault is counted and logged in one line, and the session still
ends; a verifier's bug never costs the session or turns into an HTTP 500.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from sqlalchemy.exc import SQLAlchemyError

from seed_agents.gateway.errors import GatewayError
from seed_agents.gateway.security import Role
from seed_agents.imports import load_object
from seed_agents.store import StoreError, TraceStore
from seed_agents.types import Verifier

log = logging.getLogger("seed_agents.gateway")

VERIFIER_SOURCE = "verifier"
USER_SOURCE = "user"


class RewardIn(BaseModel):
    """Body of ``POST /v1/sessions/{id}/reward``."""

    model_config = ConfigDict(extra="forbid")

    value: float = Field(description="The reward; any finite number (the trainer normalizes per group).")
    source: str | None = Field(None, min_length=1, max_length=64,
                               description="Who gives it: user, verifier, env, ...; must be one the key's role may send "
                                           "(default: user, or verifier for a verifier-only key).")
    turn: int | None = Field(None, ge=0, description="The call index (0-based) it is about; None for the whole session.")
    comment: str | None = Field(None, max_length=20000, description="Free text; redacted before it is stored.")

    @field_validator("value")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v


def reward_source(requested: str | None, roles: set[Role]) -> str:
    """The source a reward is stored with, given the sender's key roles (empty: an open
    gateway). Raises 403 when ``requested`` is more than those roles may send."""
    if Role.ADMIN in roles:
        return requested or USER_SOURCE
    allowed = [USER_SOURCE] if Role.FEEDBACK in roles or not roles else []
    if Role.VERIFIER in roles:
        allowed.append(VERIFIER_SOURCE)
    source = requested or allowed[0]
    if source not in allowed:
        who = "an open gateway (no keys configured)" if not roles else "this key"
        raise GatewayError(403, f"{who} may post rewards with source {' or '.join(map(repr, allowed))} only, not "
                           f"{source[:64]!r}; a verifier key or an admin key may send other sources",
                           type="permission_error", code="reward_source_forbidden")
    return source


def load_verifiers(paths: list[str]) -> list[tuple[str, Verifier]]:
    """Import every verifier at start-up, so a typo fails the launch, not the first session."""
    out: list[tuple[str, Verifier]] = []
    for path in paths:
        fn = load_object(path)
        if not callable(fn):
            raise ValueError(f"verifier {path!r} is not callable")
        out.append((path, fn))
    return out


@dataclass
class VerifierOutcome:
    """What one verifier did with one session."""

    verifier: str
    value: float | None = None
    reward_id: int | None = None
    error: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


def run_verifiers(store: TraceStore, session_id: str, verifiers: list[tuple[str, Verifier]]) -> list[VerifierOutcome]:
    """Run each verifier on the ended session and store its reward (blocking; call in a
    thread). Faults, the verifier's or the store's, are in the outcomes' ``error``."""
    if not verifiers:
        return []
    session = store.get_session(session_id)
    if session is None:
        return []
    calls = store.calls(session_id)
    outcomes = []
    for path, fn in verifiers:
        outcome = VerifierOutcome(path)
        try:
            value = fn(session, calls)
            if value is not None:
                if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                    raise TypeError(f"returned {type(value).__name__} {value!r:.50}, not a finite float or None")
                outcome.value = float(value)
        except Exception as e:  # a verifier is user code: any failure is its fault, not the session's
            outcome.error = f"{type(e).__name__}: {str(e)[:200]}"
            log.warning("verifier %s failed on session %s: %s", path, session_id, outcome.error)
            outcomes.append(outcome)
            continue
        if outcome.value is not None:
            try:
                outcome.reward_id = store.add_reward(session_id, outcome.value, source=VERIFIER_SOURCE, comment=path)
            except (StoreError, SQLAlchemyError) as e:  # one lost reward must not cost the others
                outcome.error = f"store: {str(e).splitlines()[0][:200] if str(e) else type(e).__name__}"
                log.error("verifier %s: reward for session %s not stored: %s", path, session_id, outcome.error)
        outcomes.append(outcome)
    return outcomes
