"""The data plane of the trace store: sessions, their calls, rewards, skills, and trajectories.

Everything a deployed agent produces lands here, from the capture gateway or from an
in-process ``StoreSink``, and the continual loop reads it back as ``Trajectory`` records.
Two promises are kept here:

- Every public write is one transaction (``StoreBase._write``). A process killed at any
  instant leaves each call either stored whole or not at all, and a retried write (same
  ``call_id``) never duplicates a row, so "kill -9 loses at most the calls in flight" holds.
- A session is trained at most once: ``claim_sessions`` marks sessions consumed with a
  conditional UPDATE, so two concurrent trainers never both get the same session.
  ``_trainable`` (which sessions a trainer may take) and ``_ensure_update`` live here
  and are shared with ``cycles``, whose ``start_cycle`` claims the same way.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from pydantic import ValidationError
from sqlalchemy.engine import Connection, RowMapping

from seed_agents.store._base import StoreBase, _check_id, _insert_ignore
from seed_agents.store.records import RewardPolicy, RewardRecord, SessionEpisode, SessionRecord, StoreError
from seed_agents.store.schema import calls, rewards, sessions, skills, updates
from seed_agents.types import LLMCall, Skill, StopReason, Trajectory, new_id

_NUM_CALLS = (
    sa.select(sa.func.count()).where(calls.c.session_id == sessions.c.session_id).scalar_subquery().label("num_calls")
)
_SESSION_COLUMNS = [*sessions.c, _NUM_CALLS]
_HAS_CALLS = sa.exists().where(calls.c.session_id == sessions.c.session_id)


class SessionStore(StoreBase):
    """Sessions, calls, rewards, skills and trajectories: what the agent produced."""

    # ---------------------------------------------------------------------- sessions

    def create_session(self, session_id: str | None = None, *, task_key: str | None = None,
                       metadata: dict[str, Any] | None = None) -> str:
        """Create a session and return its id; an existing id is returned unchanged, so a
        client that retries (or two gateways that race) cannot fork a session."""
        sid = _check_id(session_id if session_id is not None else new_id(), "session id")
        self._write(lambda conn: _ensure_session(conn, sid, task_key, metadata))
        return sid

    def get_session(self, session_id: str) -> SessionRecord | None:
        """The session, or None when no session has this id."""
        return self._read(lambda conn: _get_session(conn, session_id))

    def end_session(self, session_id: str) -> None:
        """Mark the session finished (trainable once rewarded); ending twice keeps the first time."""

        def tx(conn: Connection) -> None:
            _require_session(conn, session_id)
            conn.execute(sa.update(sessions)
                         .where(sessions.c.session_id == session_id, sessions.c.ended_at.is_(None))
                         .values(ended_at=time.time()))

        self._write(tx)

    def flag_session(self, session_id: str, reason: str) -> None:
        """Keep the session out of training for good (a secret seen, an infrastructure fault).
        The first reason stays; later flags do not overwrite it."""
        if not reason:
            raise StoreError("flag_session needs a non-empty reason (it is shown when counting flagged sessions)")

        def tx(conn: Connection) -> None:
            _require_session(conn, session_id)
            conn.execute(sa.update(sessions)
                         .where(sessions.c.session_id == session_id, sessions.c.flagged_reason.is_(None))
                         .values(flagged_reason=reason))

        self._write(tx)

    def sessions(self, *, ended: bool | None = None, rewarded: bool | None = None, consumed: bool | None = None,
                 flagged: bool | None = None, task_key: str | None = None,
                 limit: int | None = None) -> list[SessionRecord]:
        """Sessions in creation order; each filter left at None does not filter."""
        query = sa.select(*_SESSION_COLUMNS)
        has_reward = sa.exists().where(rewards.c.session_id == sessions.c.session_id)
        for wanted, condition in ((ended, sessions.c.ended_at.is_not(None)),
                                  (rewarded, has_reward),
                                  (consumed, sessions.c.consumed_by.is_not(None)),
                                  (flagged, sessions.c.flagged_reason.is_not(None))):
            if wanted is not None:
                query = query.where(condition if wanted else ~condition)
        if task_key is not None:
            query = query.where(sessions.c.task_key == task_key)
        return self._read(lambda conn: _session_list(conn, query, limit))

    def trainable_sessions(self, policy: RewardPolicy | None = None, limit: int | None = None) -> list[SessionRecord]:
        """Sessions a trainer may claim: ended, with calls, with a reward that ``policy``
        counts, not consumed by an earlier update and not flagged."""
        query = sa.select(*_SESSION_COLUMNS).where(*_trainable(policy or RewardPolicy()))
        return self._read(lambda conn: _session_list(conn, query, limit))

    def claim_sessions(self, session_ids: Sequence[str], update_id: str) -> list[str]:
        """Mark sessions as consumed by ``update_id`` and return those this call claimed.

        Exactly once: only sessions not yet consumed (and not flagged) are claimed, by a
        conditional UPDATE on rows locked in id order, so two concurrent claimers never
        both get a session and never deadlock. Unknown ids are not returned. The update
        row is created if missing. The result keeps the order of ``session_ids``.
        """
        _check_id(update_id, "update id")
        wanted = sorted(set(session_ids))

        def tx(conn: Connection) -> set[str]:
            _ensure_update(conn, update_id, None)
            locked = conn.execute(
                sa.select(sessions.c.session_id)
                .where(sessions.c.session_id.in_(wanted), sessions.c.consumed_by.is_(None),
                       sessions.c.flagged_reason.is_(None))
                .order_by(sessions.c.session_id).with_for_update()
            ).scalars().all()
            if not locked:
                return set()
            result = conn.execute(
                sa.update(sessions)
                .where(sessions.c.session_id.in_(locked), sessions.c.consumed_by.is_(None))
                .values(consumed_by=update_id, consumed_at=time.time())
                .returning(sessions.c.session_id)
            )
            return set(result.scalars().all())

        claimed = self._write(tx) if wanted else set()
        return [sid for sid in dict.fromkeys(session_ids) if sid in claimed]

    def merge_session_metadata(self, session_id: str, extra: dict[str, Any]) -> None:
        """Add keys to the session's metadata (e.g. the task and the recording its shadow
        replays need); existing keys are overwritten, others kept."""

        def tx(conn: Connection) -> None:
            _require_session(conn, session_id)
            _merge_metadata(conn, session_id, extra)

        self._write(tx)

    def create_update(self, update_id: str | None = None, *, metadata: dict[str, Any] | None = None) -> str:
        """Record a training update (idempotent on its id); ``claim_sessions`` points at it."""
        uid = _check_id(update_id if update_id is not None else new_id(), "update id")
        self._write(lambda conn: _ensure_update(conn, uid, metadata))
        return uid

    # ------------------------------------------------------------------------- calls

    def add_call(self, session_id: str, call: LLMCall, *, task_key: str | None = None) -> int:
        """Store one call in one transaction and return its turn index (``seq``).

        The session is created when missing (``task_key`` fills it, or a session that has
        none yet). Idempotent on ``call.call_id``: a retried insert returns the stored seq
        and writes nothing; the same call id in another session is a StoreError.
        """
        _check_id(session_id, "session id")
        _check_id(call.call_id, "call id")

        def tx(conn: Connection) -> int:
            _ensure_session(conn, session_id, task_key, None)
            return _add_call(conn, session_id, call)

        return self._write(tx)

    def calls(self, session_id: str) -> list[LLMCall]:
        """The session's calls in turn order ([] for an unknown session)."""
        return self._read(lambda conn: _calls(conn, session_id))

    # ----------------------------------------------------------------------- rewards

    def add_reward(self, session_id: str, value: float, *, source: str, turn: int | None = None,
                   comment: str | None = None) -> int:
        """Store one reward and return its id. Rewards accumulate; ``RewardPolicy`` decides
        which one counts. Unknown sessions and non-finite values are refused, because a
        NaN reward would silently poison every advantage of its group."""
        value = _check_reward(value, source, turn)

        def tx(conn: Connection) -> int:
            _require_session(conn, session_id)
            return _insert_reward(conn, session_id, value, source, turn, comment)

        return self._write(tx)

    def rewards(self, session_id: str) -> list[RewardRecord]:
        """The session's rewards in arrival order."""
        return self._read(lambda conn: _rewards(conn, session_id))

    def session_reward(self, session_id: str, policy: RewardPolicy | None = None) -> float | None:
        """The one reward the session trains on (see ``RewardPolicy``); None when unrewarded."""
        return (policy or RewardPolicy()).resolve(self.rewards(session_id))

    # ------------------------------------------------------------------------ skills

    def add_skill(self, session_id: str, skill: Skill) -> None:
        """Store the hindsight skill written about the session (replaces an earlier one)."""

        def tx(conn: Connection) -> None:
            _require_session(conn, session_id)
            _put_skill(conn, session_id, skill)

        self._write(tx)

    # ------------------------------------------------------------------ trajectories

    def add_trajectory(self, trajectory: Trajectory, *, session_id: str | None = None,
                       reward_source: str = "env") -> str:
        """Store a finished episode in one transaction: its calls (idempotent), its reward
        (once per source), its skill, and the end of the session. A faulted episode is
        flagged: an infrastructure failure says nothing about the policy. Returns the
        session id (``trajectory.trajectory_id`` unless given)."""
        sid = _check_id(session_id or trajectory.trajectory_id, "session id")
        reward = _check_reward(trajectory.reward, reward_source, None)

        def tx(conn: Connection) -> None:
            _ensure_session(conn, sid, trajectory.task_id, None)
            _merge_metadata(conn, sid, {"episode": SessionEpisode.of(trajectory).model_dump(mode="json")})
            for call in trajectory.calls:
                _add_call(conn, sid, call)
            already = conn.execute(sa.select(rewards.c.id).where(
                rewards.c.session_id == sid, rewards.c.source == reward_source).limit(1)).first()
            if already is None:
                _insert_reward(conn, sid, reward, reward_source, None, None)
            if trajectory.skill is not None:
                _put_skill(conn, sid, trajectory.skill)
            if trajectory.fault is not None:
                conn.execute(sa.update(sessions)
                             .where(sessions.c.session_id == sid, sessions.c.flagged_reason.is_(None))
                             .values(flagged_reason=f"fault: {trajectory.fault.value}"))
            conn.execute(sa.update(sessions).where(sessions.c.session_id == sid, sessions.c.ended_at.is_(None))
                         .values(ended_at=time.time()))

        self._write(tx)
        return sid

    def to_trajectory(self, session_id: str, policy: RewardPolicy | None = None) -> Trajectory:
        """The session as a ``Trajectory`` the rows pipeline reads.

        Sessions with the same task key share a GRPO group (``store-<task_key>``); the
        reward is the policy's pick (0.0 when unrewarded, see ``metadata['rewarded']``).
        A session written by ``add_trajectory`` gets its episode's stop reason and fault back.
        """
        policy = policy or RewardPolicy()

        def tx(conn: Connection) -> Trajectory:
            session = _get_session(conn, session_id)
            if session is None:
                raise StoreError(f"unknown session {session_id!r}")
            reward = policy.resolve(_rewards(conn, session_id))
            skill_json = conn.execute(sa.select(skills.c.skill).where(skills.c.session_id == session_id)).scalar()
            episode = _episode(session)
            task_key = session.task_key or session_id
            session_calls = _calls(conn, session_id)
            return Trajectory(
                trajectory_id=session_id,
                task_id=task_key,
                group_id=f"store-{task_key}",
                split=episode.split if episode else "train",
                calls=session_calls,
                reward=reward if reward is not None else 0.0,
                success=reward is not None and reward >= 1.0,
                steps=sum(c.purpose == "policy" for c in session_calls),
                stop_reason=episode.stop_reason if episode else StopReason.DONE,
                fault=episode.fault if episode else None,
                error=episode.error if episode else None,
                metadata={**session.metadata, "session_id": session_id, "rewarded": reward is not None,
                          "ended": session.ended_at is not None, "flagged_reason": session.flagged_reason},
                wall_s=(session.ended_at - session.created_at) if session.ended_at is not None else 0.0,
                skill=Skill.model_validate(skill_json) if skill_json is not None else None,
            )

        return self._read(tx)


# ----------------------------------------------------------------- statement helpers


def _trainable(policy: RewardPolicy) -> list[sa.ColumnElement[bool]]:
    """Conditions on ``sessions`` for a session a trainer may take (``trainable_sessions``)."""
    counted = sa.exists().where(rewards.c.session_id == sessions.c.session_id)
    if policy.ignore_unlisted:
        counted = counted.where(rewards.c.source.in_(policy.precedence))
    return [sessions.c.ended_at.is_not(None), sessions.c.consumed_by.is_(None),
            sessions.c.flagged_reason.is_(None), counted, _HAS_CALLS]


def _check_reward(value: float, source: str, turn: int | None) -> float:
    if not isinstance(value, int | float) or not math.isfinite(value):
        raise StoreError(f"reward value must be a finite number, got {value!r}")
    if not source:
        raise StoreError("a reward needs a source ('verifier', 'user', 'judge', 'env', ...)")
    if turn is not None and turn < 0:
        raise StoreError(f"reward turn must be a call index >= 0, got {turn}")
    return float(value)


def _ensure_session(conn: Connection, session_id: str, task_key: str | None, metadata: dict[str, Any] | None) -> None:
    """Create the session if missing; a missing task key is filled in, nothing else changes."""
    created = _insert_ignore(conn, sessions, ["session_id"], dict(
        session_id=session_id, task_key=task_key, created_at=time.time(), metadata=metadata or {}))
    if not created and task_key is not None:
        conn.execute(sa.update(sessions)
                     .where(sessions.c.session_id == session_id, sessions.c.task_key.is_(None))
                     .values(task_key=task_key))


def _ensure_update(conn: Connection, update_id: str, metadata: dict[str, Any] | None) -> None:
    _insert_ignore(conn, updates, ["update_id"], dict(update_id=update_id, created_at=time.time(),
                                                      metadata=metadata or {}))


def _require_session(conn: Connection, session_id: str) -> None:
    found = conn.execute(sa.select(sessions.c.session_id).where(sessions.c.session_id == session_id)).first()
    if found is None:
        raise StoreError(f"unknown session {session_id!r}: create it first (a call or create_session)")


def _merge_metadata(conn: Connection, session_id: str, extra: dict[str, Any]) -> None:
    current = conn.execute(sa.select(sessions.c["metadata"]).where(sessions.c.session_id == session_id)
                           .with_for_update()).scalar_one()
    conn.execute(sa.update(sessions).where(sessions.c.session_id == session_id)
                 .values(metadata={**current, **extra}))


def _add_call(conn: Connection, session_id: str, call: LLMCall) -> int:
    """Insert ``call`` as the session's next turn, or return the seq it already has."""
    # Lock the session row: concurrent writers to one session (PostgreSQL) take turns, so
    # two of them never compute the same next seq. SQLite's BEGIN IMMEDIATE already did.
    conn.execute(sa.select(sessions.c.session_id).where(sessions.c.session_id == session_id).with_for_update())
    stored = conn.execute(sa.select(calls.c.session_id, calls.c.seq).where(calls.c.call_id == call.call_id)).first()
    if stored is None:
        last = conn.execute(sa.select(sa.func.max(calls.c.seq)).where(calls.c.session_id == session_id)).scalar()
        seq = 0 if last is None else last + 1
        if _insert_ignore(conn, calls, ["call_id"], {**call.model_dump(), "session_id": session_id, "seq": seq}):
            return seq
        # Another session stored this call id between our check and our insert.
        stored = conn.execute(sa.select(calls.c.session_id, calls.c.seq).where(calls.c.call_id == call.call_id)).one()
    if stored.session_id != session_id:
        raise StoreError(f"call {call.call_id!r} is already stored in session {stored.session_id!r}, "
                         f"not {session_id!r}: call ids must be unique across sessions")
    return int(stored.seq)


def _calls(conn: Connection, session_id: str) -> list[LLMCall]:
    rows = conn.execute(sa.select(calls).where(calls.c.session_id == session_id).order_by(calls.c.seq)).mappings()
    return [LLMCall.model_validate({k: v for k, v in row.items() if k not in ("session_id", "seq")}) for row in rows]


def _insert_reward(conn: Connection, session_id: str, value: float, source: str, turn: int | None,
                   comment: str | None) -> int:
    result = conn.execute(sa.insert(rewards).values(session_id=session_id, value=value, source=source, turn=turn,
                                                    comment=comment, created_at=time.time()))
    return int(result.inserted_primary_key[0])


def _rewards(conn: Connection, session_id: str) -> list[RewardRecord]:
    rows = conn.execute(sa.select(rewards).where(rewards.c.session_id == session_id).order_by(rewards.c.id)).mappings()
    return [RewardRecord(reward_id=r["id"], session_id=r["session_id"], value=r["value"], source=r["source"],
                         turn=r["turn"], comment=r["comment"], created_at=r["created_at"]) for r in rows]


def _put_skill(conn: Connection, session_id: str, skill: Skill) -> None:
    conn.execute(sa.delete(skills).where(skills.c.session_id == session_id))
    conn.execute(sa.insert(skills).values(session_id=session_id, skill=skill.model_dump(mode="json")))


def _session_record(row: RowMapping) -> SessionRecord:
    return SessionRecord(**{k: row[k] for k in SessionRecord.model_fields})


def _get_session(conn: Connection, session_id: str) -> SessionRecord | None:
    row = conn.execute(sa.select(*_SESSION_COLUMNS).where(sessions.c.session_id == session_id)).mappings().first()
    return None if row is None else _session_record(row)


def _session_list(conn: Connection, query: sa.Select[Any], limit: int | None) -> list[SessionRecord]:
    query = query.order_by(sessions.c.created_at, sessions.c.session_id)
    if limit is not None:
        query = query.limit(limit)
    return [_session_record(r) for r in conn.execute(query).mappings()]


def _episode(session: SessionRecord) -> SessionEpisode | None:
    """The runner episode recorded with the session, if ``add_trajectory`` wrote one."""
    raw = session.metadata.get("episode")
    if raw is None:
        return None
    try:
        return SessionEpisode.model_validate(raw)
    except ValidationError as e:
        raise StoreError(f"session {session.session_id!r}: metadata['episode'] is reserved for the runner's "
                         f"episode record and does not parse ({e.error_count()} errors); rename that key") from None
