"""The continual loop's cycle queue: cycles, and the claims that tie sessions to them.

The promise kept here: a session is trained at most once, also with several loops or
``train --from-store`` on one database. ``start_cycle`` claims sessions with a
conditional UPDATE and writes one ``claims`` row per session (its primary key: one
claim per session, ever), and every later step moves the cycle with a compare-and-swap
on its state (``advance_cycle``), so a transition taken twice is refused the second
time. A model name has at most one unfinished cycle (a unique index backs the check).
Each step is one transaction: ``finish_training`` registers the candidate version and
moves the cycle and its claims together.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from contextlib import AbstractContextManager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, RowMapping

from seed_agents.store import schema
from seed_agents.store._base import StoreBase, _check_id, _unique_index_guard
from seed_agents.store.records import CycleRecord, ModelVersionRecord, QueueLengths, RewardPolicy, StoreError
from seed_agents.store.schema import OPEN_CYCLE_STATES, claims, cycles, model_versions, sessions
from seed_agents.store.sessions import _ensure_update, _trainable
from seed_agents.store.versions import _get_model_version, _next_version, _one_promoted_guard


class CycleStore(StoreBase):
    """Cycles of the continual loop and their session claims."""

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

    def skip_cycle(self, cycle_id: int, unusable: dict[str, str], *, release: Collection[str] = (),
                   reason: str | None = None) -> CycleRecord:
        """The cycle ends ``skipped``, without a candidate, in ONE transaction: the claims in
        ``unusable`` become ``unusable`` with the reason given per session (never claimed
        again), and the sessions in ``release`` go back to the queue as ``release_cycle``
        gives them back (claim deleted, ``consumed_by`` cleared). Every session of the cycle
        must be in one of the two. ``reason``: why the whole cycle was skipped, kept in its
        metadata (``skipped``)."""

        def tx(conn: Connection) -> CycleRecord:
            cycle = _lock_cycle(conn, cycle_id)
            _check_cycle_state(cycle, ("claimed",), "skipped")
            now = time.time()
            for sid, why in unusable.items():
                conn.execute(sa.update(claims).where(claims.c.session_id == sid, claims.c.cycle_id == cycle_id)
                             .values(state="unusable", reason=why, updated_at=now))
            back = list(release)
            if back:
                conn.execute(sa.delete(claims).where(claims.c.session_id.in_(back), claims.c.cycle_id == cycle_id,
                                                     claims.c.state == "claimed"))
                conn.execute(sa.update(sessions).where(sessions.c.session_id.in_(back),
                                                       sessions.c.consumed_by == f"cycle-{cycle_id}")
                             .values(consumed_by=None, consumed_at=None))
            left = conn.execute(sa.select(sa.func.count()).where(claims.c.cycle_id == cycle_id,
                                                                 claims.c.state == "claimed")).scalar()
            if left:
                raise StoreError(f"cycle {cycle_id}: {left} claimed sessions have no reason to be unusable and are not "
                                 f"released; skip_cycle needs every session of the cycle in one of the two")
            metadata = cycle.metadata if reason is None else {
                **cycle.metadata, "skipped": {"reason": reason, "unusable": len(unusable), "released": len(back)}}
            conn.execute(sa.update(cycles).where(cycles.c.id == cycle_id).values(state="skipped", updated_at=now,
                                                                                 metadata=metadata))
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


# ----------------------------------------------------------------- statement helpers


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


def _one_open_cycle_guard(name: str) -> AbstractContextManager[None]:
    """The database's one-unfinished-cycle index (a second loop raced us)."""
    return _unique_index_guard(schema.ONE_OPEN_CYCLE_INDEX, "cycles.name",
                               f"{name!r} has an unfinished cycle (another loop started one at the same time); "
                               f"run one continual loop per model name")
