"""The model version registry: trained versions, which one serves, and the decisions.

The promise kept here: a model name has at most one promoted version.
``switch_promoted`` retires the old one, promotes the new one and stores the decision
in one locked transaction (a compare-and-swap on the promoted version and, optionally,
on the last decision), and a unique index in the database refuses a second promoted
row from any writer (``_one_promoted_guard`` turns that into a StoreError that says
what to use). ``decide_version`` changes a version that does not serve, with its
decision, in one transaction too. Both store the canary episodes a decision rests on in
that same transaction (``canary_episodes``): a decision never lacks its episodes, and
no episode outlives a decision that was not stored.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from types import EllipsisType
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, RowMapping

from seed_agents.store import schema
from seed_agents.store._base import StoreBase, _check_id, _insert_ignore, _unique_index_guard
from seed_agents.store.records import CanaryEpisodeRecord, DecisionRecord, ModelVersionRecord, StoreError
from seed_agents.store.schema import canary_episodes, decisions, model_versions

PROMOTED = "promoted"
CANARY_SIDES = ("candidate", "promoted", "anchor")


class VersionStore(StoreBase):
    """Model versions and the decisions that move them."""

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
                        demote_to: str = "retired", canary: Sequence[Mapping[str, Any]] = ()) -> DecisionRecord:
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
        gets ``demote_to``. ``canary``: the episodes the decision rests on (``_canary_row``
        says the fields), stored with it. Concurrent switches serialize on
        the name's version rows (PostgreSQL: row locks; SQLite: the write lock), and a
        unique index keeps two promoted versions out of the database whatever the caller.
        """

        rows = [_canary_row(e) for e in canary]  # a malformed episode refuses the decision before any write

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
            _insert_canary(conn, decision_id, name, rows, now)
            note = _decision_note(decision_id, action, actor, summary, now)
            if current is not None:  # demote first: the unique index sees one promoted row at every step
                _set_status(conn, name, current, demote_to, note, now)
            _set_status(conn, name, version, PROMOTED, note, now)
            return _get_decision(conn, decision_id)

        return self._write(tx)

    def decide_version(self, name: str, version: int, status: str, *, action: str, actor: str, summary: str,
                       evidence: dict[str, Any], allow_from: Collection[str],
                       canary: Sequence[Mapping[str, Any]] = ()) -> DecisionRecord:
        """Give a version that does not serve a new ``status`` (e.g. reject a candidate) and
        store the decision with its ``canary`` episodes, in one transaction; refused unless
        its status is in ``allow_from``. The promoted version does not move (from == to in
        the record)."""
        if status == PROMOTED:
            raise StoreError("decide_version cannot promote; use switch_promoted (it moves the pointer atomically)")
        rows = [_canary_row(e) for e in canary]

        def tx(conn: Connection) -> DecisionRecord:
            statuses = _lock_versions(conn, name, version)
            current = _current(statuses)
            _check_transition(name, version, statuses[version], allow_from, action)
            now = time.time()
            decision_id = _insert_decision(conn, dict(
                name=name, version=version, action=action, actor=actor, from_version=current, to_version=current,
                summary=summary, evidence=evidence, created_at=now))
            _insert_canary(conn, decision_id, name, rows, now)
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

    def canary_episodes(self, decision_ids: Collection[int] | None = None, *,
                        name: str | None = None) -> list[CanaryEpisodeRecord]:
        """The canary episodes stored with decisions (of ``decision_ids`` / of ``name`` when
        given), by decision, then in the order they were stored."""
        query = sa.select(canary_episodes).order_by(canary_episodes.c.decision_id, canary_episodes.c.id)
        if decision_ids is not None:
            query = query.where(canary_episodes.c.decision_id.in_(list(decision_ids)))
        if name is not None:
            query = query.where(canary_episodes.c.name == name)
        return self._read(lambda conn: [_canary_episode(r) for r in conn.execute(query).mappings()])


# ----------------------------------------------------------------- statement helpers


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


_CANARY_FIELDS = ("version", "side", "task_id", "seed", "reward", "success", "fault", "trace")


def _canary_row(episode: Mapping[str, Any]) -> dict[str, Any]:
    """One episode to store: exactly ``_CANARY_FIELDS`` (``CanaryEpisode.model_dump(mode="json")``
    gives them), checked here so a malformed one is refused before anything is written."""
    missing = [k for k in _CANARY_FIELDS if k not in episode]
    if missing or episode["side"] not in CANARY_SIDES or not isinstance(episode["trace"], dict):
        raise StoreError(f"a canary episode needs {', '.join(_CANARY_FIELDS)} with side one of "
                         f"{' or '.join(CANARY_SIDES)} and a trace dict; got keys {sorted(episode)!r:.200}")
    fault = episode["fault"]
    return {"version": int(episode["version"]), "side": episode["side"], "task_id": str(episode["task_id"]),
            "seed": int(episode["seed"]), "reward": float(episode["reward"]), "success": bool(episode["success"]),
            "fault": None if fault is None else str(fault), "trace": episode["trace"]}


def _insert_canary(conn: Connection, decision_id: int, name: str, rows: list[dict[str, Any]], now: float) -> None:
    if rows:
        conn.execute(sa.insert(canary_episodes), [{**r, "decision_id": decision_id, "name": name, "created_at": now}
                                                  for r in rows])


def _canary_episode(row: RowMapping) -> CanaryEpisodeRecord:
    return CanaryEpisodeRecord(episode_id=row["id"],
                               **{k: row[k] for k in CanaryEpisodeRecord.model_fields if k != "episode_id"})


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
