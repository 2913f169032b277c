"""The durable trace store: sessions, token-exact calls, rewards, skills, model versions.

Everything a deployed agent produces lands here, from the capture gateway or from an
in-process ``StoreSink``, and the continual loop reads it back as ``Trajectory`` records.
Two promises shape the code:

- Every public write is one transaction. A process killed at any instant leaves each
  call either stored whole or not at all, and a retried write (same ``call_id``) never
  duplicates a row, so "kill -9 loses at most the calls in flight" holds.
- A session is trained at most once: ``claim_sessions`` marks sessions consumed with a
  conditional UPDATE, so two concurrent trainers never both get the same session; the
  continual loop's ``start_cycle`` also writes one ``claims`` row per session (its primary
  key: one claim per session, ever) and moves it with its cycle's state.
- A model name has at most one promoted version: ``switch_promoted`` retires the old
  one, promotes the new one and stores the decision in one locked transaction, and a
  unique index in the database refuses a second promoted row from any writer.

SQLite is the embedded default, PostgreSQL the multi-machine option; both go through the
same SQLAlchemy Core statements (see ``_engine`` for the per-database set-up).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from types import EllipsisType
from typing import Any, TypeVar

import sqlalchemy as sa
import tenacity
from pydantic import BaseModel, Field, ValidationError
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine, RowMapping

from seed_agents.store import schema
from seed_agents.store._engine import READ_ONLY, create_engine, parse_url, transient_error
from seed_agents.store.records import EpisodeRecord, ModelVersionRecord, RewardPolicy, RewardRecord, SessionRecord, StoreError
from seed_agents.store.schema import (
    OPEN_CYCLE_STATES,
    calls,
    claims,
    cycles,
    decisions,
    model_versions,
    rewards,
    sessions,
    skills,
    updates,
)
from seed_agents.types import LLMCall, Skill, StopReason, Trajectory, new_id

T = TypeVar("T")

MAX_ID_LEN = 128
# A transaction that stays locked out this long is reported, not retried forever.
RETRY_FOR_S = 30.0

_NUM_CALLS = (
    sa.select(sa.func.count()).where(calls.c.session_id == sessions.c.session_id).scalar_subquery().label("num_calls")
)
_SESSION_COLUMNS = [*sessions.c, _NUM_CALLS]
_HAS_CALLS = sa.exists().where(calls.c.session_id == sessions.c.session_id)
PROMOTED = "promoted"


class DecisionRecord(BaseModel):
    """One stored decision about a model version: what moved, who decided, on what evidence.

    A read model like those in ``records``; ``seed_agents.continual.versions`` writes them.
    """

    decision_id: int
    name: str
    version: int = Field(description="The version decided on: the one rejected, or the one switched to (== to_version).")
    action: str = Field(description="'promote', 'reject', 'rollback' or 'retire'.")
    actor: str = Field(description="Who decided: 'gate', 'operator', 'bootstrap', 'recovery', 'migration', ...")
    from_version: int | None = Field(description="The promoted version before the decision (None: none was).")
    to_version: int | None = Field(description="The promoted version after it (equal to from_version when nothing moved).")
    summary: str = Field(description="One line for people.")
    evidence: dict[str, Any] = Field(description="What the decision rests on, e.g. the gate's paired canary statistics.")
    created_at: float


class CycleRecord(BaseModel):
    """One cycle of the continual loop: its state and what it produced (read model)."""

    cycle_id: int
    name: str = Field(description="The model name the cycle trains a candidate of.")
    state: str = Field(description="'claimed', 'trained', 'loaded', 'decided', 'released' or 'skipped'.")
    base_version: int | None = Field(description="The promoted version the candidate is trained from and compared with.")
    candidate_version: int | None = Field(description="The candidate it registered (from 'trained' on).")
    decision_id: int | None = Field(description="The stored decision on the candidate (state 'decided').")
    attempts: int = Field(description="Processes that worked on it: more than 1 after a crash and a resume.")
    created_at: float
    updated_at: float
    metadata: dict[str, Any]


class QueueLengths(BaseModel):
    """Rewarded sessions by where they are in the continual loop (what a dashboard shows)."""

    unclaimed: int = Field(description="Trainable (ended, rewarded, not consumed, not flagged) and waiting.")
    claimed: int = Field(description="Claimed by a cycle that has not trained yet.")
    trained: int = Field(description="Trained into a candidate (whatever the gate said about it).")
    unusable: int = Field(description="Claimed, then found unusable (e.g. every replay unreplayable); never trained.")


class TraceStore:
    """One store behind one URL; thread-safe (a pooled engine, a transaction per call)."""

    def __init__(self, engine: Engine) -> None:
        """Use ``TraceStore.open(url)``: it also creates or migrates the schema."""
        self._engine = engine
        self._transient = transient_error(engine.dialect.name)

    @classmethod
    def open(cls, url: str) -> TraceStore:
        """Open (creating or migrating) the store at ``sqlite:///path`` or ``postgresql://...``."""
        parsed = parse_url(url)
        engine = create_engine(parsed)
        try:
            schema.migrate(engine)
        except sa.exc.OperationalError as e:
            engine.dispose()
            raise StoreError(f"cannot open store {parsed.render_as_string(hide_password=True)}: "
                             f"{str(e.orig).strip().splitlines()[0]}") from None
        except BaseException:
            engine.dispose()
            raise
        return cls(engine)

    @property
    def dialect(self) -> str:
        """'sqlite' or 'postgresql'."""
        return self._engine.dialect.name

    def close(self) -> None:
        """Close pooled connections; the store must not be used afterwards."""
        self._engine.dispose()

    def __enter__(self) -> TraceStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- transactions

    def _write(self, fn: Callable[[Connection], T]) -> T:
        """Run ``fn`` in one write transaction, retried whole while the database is locked
        (SQLite past its busy timeout) or the server aborted it (PostgreSQL deadlock).
        tenacity gives jittered backoff with a deadline, which a hand loop would repeat."""
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(self._transient),
            stop=tenacity.stop_after_delay(RETRY_FOR_S),
            wait=tenacity.wait_random_exponential(multiplier=0.02, max=1.0),
            reraise=True,
        )
        try:
            return retrying(self._transaction, fn, False)
        except sa.exc.DBAPIError as e:
            if self._transient(e):
                raise StoreError(f"the store stayed locked for {RETRY_FOR_S:g} s (another process holds a long "
                                 f"write transaction?): {e.orig}") from e
            raise

    def _read(self, fn: Callable[[Connection], T]) -> T:
        """Run ``fn`` in one read transaction: a consistent snapshot, never blocking writers."""
        return self._transaction(fn, True)

    def _transaction(self, fn: Callable[[Connection], T], read_only: bool) -> T:
        with self._engine.connect() as conn:
            if read_only:
                # SQLite: a deferred BEGIN (the snapshot starts at the first read).
                # PostgreSQL: one snapshot for all statements, not one per statement.
                conn.execution_options(**{READ_ONLY: True})
                if self.dialect == "postgresql":
                    conn.execution_options(isolation_level="REPEATABLE READ")
            with conn.begin():
                return fn(conn)

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

    # ------------------------------------------------------------ continual-loop cycles

    def start_cycle(self, name: str, *, base_version: int | None, limit: int, policy: RewardPolicy | None = None,
                    metadata: dict[str, Any] | None = None) -> tuple[CycleRecord, list[str]] | None:
        """Open a cycle of ``name`` and claim up to ``limit`` trainable sessions for it, in ONE
        transaction; None (nothing written) when no session is waiting.

        Exactly once, also with several loops or ``train --from-store`` on one database:
        the sessions are picked with ``SELECT ... FOR UPDATE SKIP LOCKED`` (PostgreSQL: a
        concurrent claimer skips rows another holds instead of waiting and taking them
        again; SQLite's write lock serializes claimers), marked consumed by the update
        ``cycle-<id>`` with a conditional UPDATE, and given a ``claims`` row whose primary
        key is the session id. A name with an unfinished cycle is refused (StoreError):
        resume that one (``open_cycle``)."""
        _check_id(name, "model name")
        if limit < 1:
            raise StoreError(f"a cycle claims at least 1 session, got limit={limit}")
        policy = policy or RewardPolicy()

        def tx(conn: Connection) -> tuple[CycleRecord, list[str]] | None:
            if _open_cycle_row(conn, name) is not None:
                raise StoreError(f"{name!r} has an unfinished cycle; resume it (open_cycle) before starting another")
            candidates = conn.execute(
                sa.select(sessions.c.session_id).where(*_trainable(policy))
                .order_by(sessions.c.created_at, sessions.c.session_id).limit(limit)
                .with_for_update(skip_locked=True)
            ).scalars().all()
            if not candidates:
                return None
            now = time.time()
            cycle_id = int(conn.execute(sa.insert(cycles).values(
                name=name, state="claimed", base_version=base_version, attempts=1, created_at=now, updated_at=now,
                metadata=metadata or {})).inserted_primary_key[0])
            update_id = f"cycle-{cycle_id}"
            _ensure_update(conn, update_id, {"cycle": cycle_id, "name": name})
            taken = conn.execute(
                sa.update(sessions).where(sessions.c.session_id.in_(candidates), sessions.c.consumed_by.is_(None))
                .values(consumed_by=update_id, consumed_at=now).returning(sessions.c.session_id)
            ).scalars().all()
            if not taken:  # every candidate was consumed between our lock and our update
                conn.execute(sa.delete(cycles).where(cycles.c.id == cycle_id))
                return None
            conn.execute(sa.insert(claims), [dict(session_id=sid, cycle_id=cycle_id, state="claimed", reason=None,
                                                  claimed_at=now, updated_at=now) for sid in taken])
            order = {sid: i for i, sid in enumerate(candidates)}
            return _get_cycle(conn, cycle_id), sorted(taken, key=order.__getitem__)

        with _one_open_cycle_guard(name):
            return self._write(tx)

    def open_cycle(self, name: str) -> CycleRecord | None:
        """The unfinished cycle of ``name`` (claimed, trained or loaded), if any: what a
        restarted loop resumes."""
        return self._read(lambda conn: _open_cycle_row(conn, name))

    def get_cycle(self, cycle_id: int) -> CycleRecord:
        return self._read(lambda conn: _get_cycle(conn, cycle_id))

    def cycles(self, name: str | None = None, *, states: Collection[str] | None = None,
               limit: int | None = None) -> list[CycleRecord]:
        """Cycles in the order they started (the last ``limit``), optionally of one name and some states."""
        query = sa.select(cycles).order_by(cycles.c.id.desc())
        if name is not None:
            query = query.where(cycles.c.name == name)
        if states is not None:
            query = query.where(cycles.c.state.in_(list(states)))
        if limit is not None:
            query = query.limit(limit)
        return self._read(lambda conn: [_cycle(r) for r in conn.execute(query).mappings()][::-1])

    def cycle_sessions(self, cycle_id: int, state: str | None = None) -> list[str]:
        """The sessions a cycle claimed (in claim order, then id), optionally those in one claim state."""
        query = sa.select(claims.c.session_id).where(claims.c.cycle_id == cycle_id)
        if state is not None:
            query = query.where(claims.c.state == state)
        query = query.order_by(claims.c.claimed_at, claims.c.session_id)
        return self._read(lambda conn: list(conn.execute(query).scalars().all()))

    def claim_states(self, session_ids: Collection[str] | None = None) -> dict[str, tuple[int, str, str | None]]:
        """session id -> (cycle id, claim state, reason) for claimed sessions (all, or those given)."""
        query = sa.select(claims.c.session_id, claims.c.cycle_id, claims.c.state, claims.c.reason)
        if session_ids is not None:
            query = query.where(claims.c.session_id.in_(list(session_ids)))
        return self._read(lambda conn: {r.session_id: (int(r.cycle_id), str(r.state), r.reason)
                                        for r in conn.execute(query)})

    def resume_cycle(self, cycle_id: int, **fields: Any) -> CycleRecord:
        """Count one more attempt at an unfinished cycle (a restarted process took it up);
        ``fields`` (``base_version``) are updated too."""
        return self.advance_cycle(cycle_id, OPEN_CYCLE_STATES, None, attempts=sa.literal_column("attempts") + 1,
                                  **fields)

    def advance_cycle(self, cycle_id: int, from_states: Collection[str], to_state: str | None, *,
                      metadata: dict[str, Any] | None = None, **fields: Any) -> CycleRecord:
        """Move a cycle from one of ``from_states`` to ``to_state`` (None: keep it), setting
        ``fields`` and merging ``metadata``, in one transaction; a StoreError (nothing
        written) when the cycle is in another state: a compare-and-swap, so a transition
        taken twice (a resumed cycle, a second loop) is refused the second time."""

        def tx(conn: Connection) -> CycleRecord:
            current = _lock_cycle(conn, cycle_id)
            _check_cycle_state(current, from_states, to_state)
            values: dict[str, Any] = {**fields, "updated_at": time.time(),
                                      "metadata": {**current.metadata, **(metadata or {})}}
            if to_state is not None:
                values["state"] = to_state
            conn.execute(sa.update(cycles).where(cycles.c.id == cycle_id).values(**values))
            return _get_cycle(conn, cycle_id)

        return self._write(tx)

    def finish_training(self, cycle_id: int, *, path: str, served_name: str | None = None,
                        unusable: dict[str, str] | None = None,
                        metadata: dict[str, Any] | None = None) -> tuple[CycleRecord, ModelVersionRecord]:
        """The cycle trained: in ONE transaction, register its adapter (``path``) as the next
        candidate version of its name (never served; ``served_name`` defaults to
        ``{name}-v{version}``), move the cycle to ``trained``, its sessions' claims to
        ``trained``, and those in ``unusable`` (session -> why) to ``unusable``.

        One transaction, not ``VersionRegistry.add_candidate`` and then a state change: a
        kill between the two would leave a candidate no cycle knows, or a cycle that trains
        its sessions into a second candidate on resume."""

        def tx(conn: Connection) -> tuple[CycleRecord, ModelVersionRecord]:
            cycle = _lock_cycle(conn, cycle_id)
            _check_cycle_state(cycle, ("claimed",), "trained")
            now = time.time()
            version = _next_version(conn, cycle.name)
            served = served_name or f"{cycle.name}-v{version}"
            conn.execute(sa.insert(model_versions).values(
                name=cycle.name, version=version, path=path, status="candidate", created_at=now, updated_at=now,
                metadata={**(metadata or {}), "served_name": served, "cycle": cycle_id,
                          "base_version": cycle.base_version}))
            for sid, reason in (unusable or {}).items():
                conn.execute(sa.update(claims).where(claims.c.session_id == sid, claims.c.cycle_id == cycle_id,
                                                     claims.c.state == "claimed")
                             .values(state="unusable", reason=reason, updated_at=now))
            conn.execute(sa.update(claims).where(claims.c.cycle_id == cycle_id, claims.c.state == "claimed")
                         .values(state="trained", updated_at=now))
            conn.execute(sa.update(cycles).where(cycles.c.id == cycle_id)
                         .values(state="trained", candidate_version=version, updated_at=now))
            return _get_cycle(conn, cycle_id), _get_model_version(conn, cycle.name, version)

        with _one_promoted_guard(self._cycle_name(cycle_id)):
            return self._write(tx)

    def skip_cycle(self, cycle_id: int, unusable: dict[str, str]) -> CycleRecord:
        """None of the cycle's sessions could be trained: their claims become ``unusable``
        with the reason given per session (they are never claimed again) and the cycle
        ends ``skipped``, without a candidate."""

        def tx(conn: Connection) -> CycleRecord:
            _check_cycle_state(_lock_cycle(conn, cycle_id), ("claimed",), "skipped")
            now = time.time()
            for sid, reason in unusable.items():
                conn.execute(sa.update(claims).where(claims.c.session_id == sid, claims.c.cycle_id == cycle_id)
                             .values(state="unusable", reason=reason, updated_at=now))
            left = conn.execute(sa.select(sa.func.count()).where(claims.c.cycle_id == cycle_id,
                                                                 claims.c.state == "claimed")).scalar()
            if left:
                raise StoreError(f"cycle {cycle_id}: {left} claimed sessions have no reason to be unusable; "
                                 f"skip_cycle needs one for every session of the cycle")
            conn.execute(sa.update(cycles).where(cycles.c.id == cycle_id).values(state="skipped", updated_at=now))
            return _get_cycle(conn, cycle_id)

        return self._write(tx)

    def release_cycle(self, cycle_id: int, reason: str) -> CycleRecord:
        """Give a cycle's sessions back to the queue (an infrastructure failure, not the
        sessions' fault, stopped it before training): their claims are deleted and their
        ``consumed_by`` cleared in one transaction; the cycle ends ``released``."""

        def tx(conn: Connection) -> CycleRecord:
            cycle = _lock_cycle(conn, cycle_id)
            _check_cycle_state(cycle, ("claimed",), "released")
            mine = conn.execute(sa.select(claims.c.session_id).where(claims.c.cycle_id == cycle_id,
                                                                      claims.c.state == "claimed")).scalars().all()
            conn.execute(sa.delete(claims).where(claims.c.session_id.in_(mine)))
            conn.execute(sa.update(sessions).where(sessions.c.session_id.in_(mine),
                                                   sessions.c.consumed_by == f"cycle-{cycle_id}")
                         .values(consumed_by=None, consumed_at=None))
            conn.execute(sa.update(cycles).where(cycles.c.id == cycle_id).values(
                state="released", updated_at=time.time(),
                metadata={**cycle.metadata, "released": {"reason": reason, "sessions": len(mine)}}))
            return _get_cycle(conn, cycle_id)

        return self._write(tx)

    def queue_lengths(self, policy: RewardPolicy | None = None) -> QueueLengths:
        """How many rewarded sessions wait, are claimed, trained or unusable (one snapshot)."""
        unclaimed = sa.select(sa.func.count()).select_from(sessions).where(*_trainable(policy or RewardPolicy()))
        by_state = sa.select(claims.c.state, sa.func.count()).group_by(claims.c.state)

        def tx(conn: Connection) -> QueueLengths:
            counts = {str(state): int(n) for state, n in conn.execute(by_state)}
            return QueueLengths(unclaimed=int(conn.execute(unclaimed).scalar() or 0), claimed=counts.get("claimed", 0),
                                trained=counts.get("trained", 0), unusable=counts.get("unusable", 0))

        return self._read(tx)

    def _cycle_name(self, cycle_id: int) -> str:
        return self.get_cycle(cycle_id).name

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
            _merge_metadata(conn, sid, {"episode": EpisodeRecord.of(trajectory).model_dump(mode="json")})
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

    # ---------------------------------------------------------------- model versions

    def add_model_version(self, name: str, path: str, *, version: int | None = None, status: str = "candidate",
                          metadata: dict[str, Any] | None = None) -> ModelVersionRecord:
        """Record trained weights (a folder or LoRA adapter) as ``name`` version N; N is the
        next free number unless given. An existing (name, version) is a StoreError."""
        _check_id(name, "model name")

        def tx(conn: Connection) -> ModelVersionRecord:
            # An automatic number may be taken by a concurrent writer (PostgreSQL) between
            # our max() and our insert: then the next max() sees it and we try again.
            for _ in range(1 if version is not None else 8):
                number = version if version is not None else _next_version(conn, name)
                now = time.time()
                if _insert_ignore(conn, model_versions, ["name", "version"], dict(
                        name=name, version=number, path=path, status=status, created_at=now, updated_at=now,
                        metadata=metadata or {})):
                    return _get_model_version(conn, name, number)
            raise StoreError(f"model version {name} v{number} already exists; pick another version")

        with _one_promoted_guard(name):
            return self._write(tx)

    def model_versions(self, name: str | None = None, *, status: str | None = None) -> list[ModelVersionRecord]:
        """Recorded versions, by name then version; filtered by name and status when given."""
        query = sa.select(model_versions).order_by(model_versions.c.name, model_versions.c.version)
        if name is not None:
            query = query.where(model_versions.c.name == name)
        if status is not None:
            query = query.where(model_versions.c.status == status)
        return self._read(lambda conn: [_model_version(r) for r in conn.execute(query).mappings()])

    def set_version_status(self, name: str, version: int, status: str, *,
                           metadata: dict[str, Any] | None = None) -> ModelVersionRecord:
        """Record the loop's decision on a version; ``metadata`` (e.g. canary scores) is merged in.
        To change which version serves, use ``switch_promoted`` (``VersionRegistry``): it
        retires the old one and stores the decision in the same transaction."""

        def tx(conn: Connection) -> ModelVersionRecord:
            current = _get_model_version(conn, name, version)
            conn.execute(sa.update(model_versions)
                         .where(model_versions.c.name == name, model_versions.c.version == version)
                         .values(status=status, updated_at=time.time(),
                                 metadata={**current.metadata, **(metadata or {})}))
            return _get_model_version(conn, name, version)

        with _one_promoted_guard(name):
            return self._write(tx)

    # ------------------------------------------------------------- version decisions

    def promoted_version(self, name: str) -> ModelVersionRecord | None:
        """The version ``name`` serves now (its one ``promoted`` version), or None."""
        query = sa.select(model_versions).where(model_versions.c.name == name, model_versions.c.status == PROMOTED)
        return self._read(lambda conn: _first_model_version(conn, query))

    def switch_promoted(self, name: str, version: int, *, action: str, actor: str, summary: str,
                        evidence: dict[str, Any], allow_from: Collection[str],
                        expect_current: int | None | EllipsisType = ...,
                        expect_last_decision: int | None | EllipsisType = ...,
                        demote_to: str = "retired") -> DecisionRecord:
        """Make ``version`` the one promoted version of ``name`` and store the decision, in
        ONE transaction: a crash leaves either the old pointer or the new one, never none,
        two, or a switch without its decision.

        Refused (StoreError, nothing written) unless ``version``'s status is in
        ``allow_from`` and, when ``expect_current`` is given (an int, or None for "nothing
        promoted yet"), the promoted version is still that one: a compare-and-swap, so a
        decision taken against a version that has since been replaced is not applied.
        ``expect_last_decision`` (a decision id, or None for "no decision yet") is the same
        check on the whole history, for a choice made from it (a rollback's target): it
        also catches a pointer that moved away and back. The previous promoted version
        gets ``demote_to``. Concurrent switches serialize on
        the name's version rows (PostgreSQL: row locks; SQLite: the write lock), and a
        unique index keeps two promoted versions out of the database whatever the caller.
        """

        def tx(conn: Connection) -> DecisionRecord:
            status = _lock_versions(conn, name, version)
            current = _current(status)
            if expect_current is not ... and expect_current != current:
                raise StoreError(f"the promoted version of {name!r} is {_v(current)}, not {_v(expect_current)} as this "
                                 f"{action} of v{version} assumed: another decision came first; decide again "
                                 f"against {_v(current)}")
            if expect_last_decision is not ...:
                last = conn.execute(sa.select(sa.func.max(decisions.c.id)).where(decisions.c.name == name)).scalar()
                if last != expect_last_decision:
                    raise StoreError(f"another decision about {name!r} (#{last}) came after the history this {action} "
                                     f"was chosen from; look again and retry")
            _check_transition(name, version, status[version], allow_from, action)
            now = time.time()
            decision_id = _insert_decision(conn, dict(
                name=name, version=version, action=action, actor=actor, from_version=current, to_version=version,
                summary=summary, evidence=evidence, created_at=now))
            note = _decision_note(decision_id, action, actor, summary, now)
            if current is not None:  # demote first: the unique index sees one promoted row at every step
                _set_status(conn, name, current, demote_to, note, now)
            _set_status(conn, name, version, PROMOTED, note, now)
            return _get_decision(conn, decision_id)

        return self._write(tx)

    def decide_version(self, name: str, version: int, status: str, *, action: str, actor: str, summary: str,
                       evidence: dict[str, Any], allow_from: Collection[str]) -> DecisionRecord:
        """Give a version that does not serve a new ``status`` (e.g. reject a candidate) and
        store the decision, in one transaction; refused unless its status is in
        ``allow_from``. The promoted version does not move (from == to in the record)."""
        if status == PROMOTED:
            raise StoreError("decide_version cannot promote; use switch_promoted (it moves the pointer atomically)")

        def tx(conn: Connection) -> DecisionRecord:
            statuses = _lock_versions(conn, name, version)
            current = _current(statuses)
            _check_transition(name, version, statuses[version], allow_from, action)
            now = time.time()
            decision_id = _insert_decision(conn, dict(
                name=name, version=version, action=action, actor=actor, from_version=current, to_version=current,
                summary=summary, evidence=evidence, created_at=now))
            _set_status(conn, name, version, status, _decision_note(decision_id, action, actor, summary, now), now)
            return _get_decision(conn, decision_id)

        return self._write(tx)

    def decisions(self, name: str | None = None, *, limit: int | None = None) -> list[DecisionRecord]:
        """Stored decisions in the order they were made; the last ``limit`` when given."""
        query = sa.select(decisions).order_by(decisions.c.id.desc())
        if name is not None:
            query = query.where(decisions.c.name == name)
        if limit is not None:
            query = query.limit(limit)
        return self._read(lambda conn: [_decision(r) for r in conn.execute(query).mappings()][::-1])


# ----------------------------------------------------------------- statement helpers


def _trainable(policy: RewardPolicy) -> list[sa.ColumnElement[bool]]:
    """Conditions on ``sessions`` for a session a trainer may take (``trainable_sessions``)."""
    counted = sa.exists().where(rewards.c.session_id == sessions.c.session_id)
    if policy.ignore_unlisted:
        counted = counted.where(rewards.c.source.in_(policy.precedence))
    return [sessions.c.ended_at.is_not(None), sessions.c.consumed_by.is_(None),
            sessions.c.flagged_reason.is_(None), counted, _HAS_CALLS]


def _cycle(row: RowMapping) -> CycleRecord:
    return CycleRecord(cycle_id=row["id"], **{k: row[k] for k in CycleRecord.model_fields if k != "cycle_id"})


def _get_cycle(conn: Connection, cycle_id: int) -> CycleRecord:
    row = conn.execute(sa.select(cycles).where(cycles.c.id == cycle_id)).mappings().first()
    if row is None:
        raise StoreError(f"unknown cycle {cycle_id}")
    return _cycle(row)


def _lock_cycle(conn: Connection, cycle_id: int) -> CycleRecord:
    row = conn.execute(sa.select(cycles).where(cycles.c.id == cycle_id).with_for_update()).mappings().first()
    if row is None:
        raise StoreError(f"unknown cycle {cycle_id}")
    return _cycle(row)


def _open_cycle_row(conn: Connection, name: str) -> CycleRecord | None:
    row = conn.execute(sa.select(cycles).where(cycles.c.name == name, cycles.c.state.in_(OPEN_CYCLE_STATES))
                       .order_by(cycles.c.id)).mappings().first()
    return None if row is None else _cycle(row)


def _check_cycle_state(cycle: CycleRecord, from_states: Collection[str], to_state: str | None) -> None:
    if cycle.state not in from_states:
        goal = f"move to {to_state!r}" if to_state else "be resumed"
        raise StoreError(f"cycle {cycle.cycle_id} of {cycle.name!r} is {cycle.state!r}; it can {goal} only from "
                         f"{' or '.join(repr(s) for s in from_states)} (another process moved it?)")


@contextmanager
def _unique_index_guard(index: str, sqlite_column: str, message: str) -> Iterator[None]:
    """A violation of the partial unique index ``index`` as a StoreError saying ``message``
    (PostgreSQL names the index; SQLite names the column, ``sqlite_column``); any other
    integrity error propagates."""
    try:
        yield
    except sa.exc.IntegrityError as e:
        if index not in str(e.orig) and sqlite_column not in str(e.orig):
            raise
        raise StoreError(message) from None


def _one_open_cycle_guard(name: str) -> AbstractContextManager[None]:
    """The database's one-unfinished-cycle index (a second loop raced us)."""
    return _unique_index_guard(schema.ONE_OPEN_CYCLE_INDEX, "cycles.name",
                               f"{name!r} has an unfinished cycle (another loop started one at the same time); "
                               f"run one continual loop per model name")


def _check_id(value: str, what: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ID_LEN:
        raise StoreError(f"{what} must be a non-empty string of at most {MAX_ID_LEN} characters, got {value!r:.200}")
    return value


def _check_reward(value: float, source: str, turn: int | None) -> float:
    if not isinstance(value, int | float) or not math.isfinite(value):
        raise StoreError(f"reward value must be a finite number, got {value!r}")
    if not source:
        raise StoreError("a reward needs a source ('verifier', 'user', 'judge', 'env', ...)")
    if turn is not None and turn < 0:
        raise StoreError(f"reward turn must be a call index >= 0, got {turn}")
    return float(value)


def _insert_ignore(conn: Connection, table: sa.Table, keys: list[str], values: dict[str, Any]) -> bool:
    """INSERT unless a row with the same ``keys`` exists; True when this call inserted.

    ON CONFLICT DO NOTHING (both databases) keeps racing inserts from raising. Whether a
    row went in is read from RETURNING: drivers need not report an INSERT's rowcount
    (psycopg through SQLAlchemy reports -1)."""
    insert = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
    statement = insert(table).values(**values).on_conflict_do_nothing(index_elements=keys)
    return conn.execute(statement.returning(table.c[keys[0]])).first() is not None


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


def _episode(session: SessionRecord) -> EpisodeRecord | None:
    """The runner episode recorded with the session, if ``add_trajectory`` wrote one."""
    raw = session.metadata.get("episode")
    if raw is None:
        return None
    try:
        return EpisodeRecord.model_validate(raw)
    except ValidationError as e:
        raise StoreError(f"session {session.session_id!r}: metadata['episode'] is reserved for the runner's "
                         f"episode record and does not parse ({e.error_count()} errors); rename that key") from None


def _model_version(row: RowMapping) -> ModelVersionRecord:
    return ModelVersionRecord(**{k: row[k] for k in ModelVersionRecord.model_fields})


def _next_version(conn: Connection, name: str) -> int:
    last = conn.execute(sa.select(sa.func.max(model_versions.c.version)).where(model_versions.c.name == name)).scalar()
    return (last or 0) + 1


def _get_model_version(conn: Connection, name: str, version: int) -> ModelVersionRecord:
    row = conn.execute(sa.select(model_versions).where(model_versions.c.name == name,
                                                       model_versions.c.version == version)).mappings().first()
    if row is None:
        raise StoreError(f"unknown model version {name} v{version}")
    return _model_version(row)


def _one_promoted_guard(name: str) -> AbstractContextManager[None]:
    """The database's one-promoted-version index, as an error that says what to use."""
    return _unique_index_guard(schema.ONE_PROMOTED_INDEX, "model_versions.name",
                               f"{name!r} already has a promoted version: switch versions with "
                               f"VersionRegistry.promote or `seed-agents versions promote N`, which retire the "
                               f"old one in the same step")


def _first_model_version(conn: Connection, query: sa.Select[Any]) -> ModelVersionRecord | None:
    row = conn.execute(query).mappings().first()
    return None if row is None else _model_version(row)


def _v(version: int | None) -> str:
    return "none" if version is None else f"v{version}"


def _lock_versions(conn: Connection, name: str, version: int) -> dict[int, str]:
    """Lock every version row of ``name`` (version -> status); ``version`` must be one."""
    rows = conn.execute(sa.select(model_versions.c.version, model_versions.c.status)
                        .where(model_versions.c.name == name)
                        .order_by(model_versions.c.version).with_for_update()).all()
    status = {int(v): str(s) for v, s in rows}
    if version not in status:
        raise StoreError(f"unknown model version {name} v{version}")
    return status


def _current(status: dict[int, str]) -> int | None:
    return next((v for v, s in status.items() if s == PROMOTED), None)


def _check_transition(name: str, version: int, status: str, allow_from: Collection[str], action: str) -> None:
    if status not in allow_from:
        raise StoreError(f"cannot {action} {name} v{version}: it is {status} (a {action} needs "
                         f"{' or '.join(sorted(allow_from))})")


def _insert_decision(conn: Connection, values: dict[str, Any]) -> int:
    return int(conn.execute(sa.insert(decisions).values(**values)).inserted_primary_key[0])


def _decision_note(decision_id: int, action: str, actor: str, summary: str, at: float) -> dict[str, Any]:
    """What a version's metadata keeps of the last decision that touched it."""
    return {"decision_id": decision_id, "action": action, "actor": actor, "summary": summary, "at": at}


def _set_status(conn: Connection, name: str, version: int, status: str, note: dict[str, Any], now: float) -> None:
    where = (model_versions.c.name == name, model_versions.c.version == version)
    current = conn.execute(sa.select(model_versions.c["metadata"]).where(*where)).scalar_one()
    conn.execute(sa.update(model_versions).where(*where)
                 .values(status=status, updated_at=now, metadata={**current, "last_decision": note}))


def _decision(row: RowMapping) -> DecisionRecord:
    return DecisionRecord(decision_id=row["id"], **{k: row[k] for k in DecisionRecord.model_fields if k != "decision_id"})


def _get_decision(conn: Connection, decision_id: int) -> DecisionRecord:
    return _decision(conn.execute(sa.select(decisions).where(decisions.c.id == decision_id)).mappings().one())
