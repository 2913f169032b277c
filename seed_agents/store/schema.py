"""The trace store's tables and the migrations that build them.

One schema serves SQLite and PostgreSQL (SQLAlchemy Core types only). The ``Table``
objects below describe the *current* schema; ``MIGRATIONS`` is the ordered history that
takes any older database there, one transaction for the whole run, so a crash mid-upgrade
leaves the database at its old version, never in between.

Rule for the next schema change: before editing a ``Table`` below, freeze the migration
that creates it (migration 1, 2 for ``decisions``, 4 for ``cycles``/``claims``, 5 for
``canary_episodes``, 7 for ``gateways``: copy today's definitions into it),
then append migration N that alters existing tables.
Opening a database whose version is newer than ``len(MIGRATIONS)`` is refused: this code
would misread tables it does not know.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Dialect, Engine

from seed_agents.store.records import StoreError

Migration = Callable[[Connection], None]

# Any 64-bit constant: every writer that opens a PostgreSQL store takes this advisory lock
# while migrating, so two processes opening a fresh database do not both create tables.
_PG_MIGRATION_LOCK = 0x5EED_A6E7


class JsonText(sa.TypeDecorator[Any]):
    """JSON kept as plain text, written and read by Python's ``json``.

    Used for the token payload of a call (ids, logprobs, messages): it is never queried in
    SQL, the text round-trips floats exactly, ``-inf`` logprobs survive (PostgreSQL's
    ``json`` rejects ``-Infinity``), and the server does not parse large arrays per insert.
    """

    impl = sa.Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> str | None:
        return None if value is None else json.dumps(value, separators=(",", ":"))

    def process_result_value(self, value: str | None, dialect: Dialect) -> Any:
        return None if value is None else json.loads(value)


ID = sa.String(128)  # session, call and update ids: uuid hex or a client's header value
metadata = sa.MetaData()

schema_version = sa.Table(
    "schema_version", metadata,
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("migrated_at", sa.Double, nullable=False),
)

updates = sa.Table(
    "updates", metadata,
    sa.Column("update_id", ID, primary_key=True),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Column("metadata", sa.JSON, nullable=False),
)

sessions = sa.Table(
    "sessions", metadata,
    sa.Column("session_id", ID, primary_key=True),
    sa.Column("task_key", sa.String(256), nullable=True, index=True),
    sa.Column("created_at", sa.Double, nullable=False, index=True),
    sa.Column("ended_at", sa.Double, nullable=True),
    sa.Column("metadata", sa.JSON, nullable=False),
    sa.Column("flagged_reason", sa.Text, nullable=True),
    sa.Column("consumed_by", ID, sa.ForeignKey("updates.update_id"), nullable=True, index=True),
    sa.Column("consumed_at", sa.Double, nullable=True),
)

calls = sa.Table(
    "calls", metadata,
    sa.Column("call_id", ID, primary_key=True),
    sa.Column("session_id", ID, sa.ForeignKey("sessions.session_id"), nullable=False),
    sa.Column("seq", sa.Integer, nullable=False),
    sa.Column("prompt_ids", JsonText, nullable=False),
    sa.Column("completion_ids", JsonText, nullable=False),
    sa.Column("logprobs", JsonText, nullable=False),
    sa.Column("messages", JsonText, nullable=False),
    sa.Column("tools", JsonText, nullable=True),
    sa.Column("text", sa.Text, nullable=False),
    sa.Column("policy_version", sa.Integer, nullable=False),
    sa.Column("purpose", sa.String(16), nullable=False),
    sa.Column("finish_reason", sa.String(16), nullable=False),
    sa.Column("latency_s", sa.Double, nullable=False),
    sa.Column("started_at", sa.Double, nullable=False),
    sa.Column("sampling", JsonText, nullable=True),
    sa.Column("scope", JsonText, nullable=False),
    sa.Column("complete", sa.Boolean, nullable=False, server_default=sa.true()),
    sa.Column("guided", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("prefill_len", sa.Integer, nullable=False, server_default="0"),
    sa.UniqueConstraint("session_id", "seq", name="uq_calls_session_seq"),
)

rewards = sa.Table(
    "rewards", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("session_id", ID, sa.ForeignKey("sessions.session_id"), nullable=False, index=True),
    sa.Column("value", sa.Double, nullable=False),
    sa.Column("source", sa.String(64), nullable=False),
    sa.Column("turn", sa.Integer, nullable=True),
    sa.Column("comment", sa.Text, nullable=True),
    sa.Column("created_at", sa.Double, nullable=False),
)

skills = sa.Table(
    "skills", metadata,
    sa.Column("session_id", ID, sa.ForeignKey("sessions.session_id"), primary_key=True),
    sa.Column("skill", sa.JSON, nullable=False),
)

model_versions = sa.Table(
    "model_versions", metadata,
    sa.Column("name", sa.String(128), primary_key=True),
    sa.Column("version", sa.Integer, primary_key=True),
    sa.Column("path", sa.Text, nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Column("updated_at", sa.Double, nullable=False),
    sa.Column("status", sa.String(32), nullable=False),
    sa.Column("metadata", sa.JSON, nullable=False),
)

DATA_TABLES = [updates, sessions, calls, rewards, skills, model_versions]

# Every change of which version a model name serves, and every verdict on a candidate,
# with its evidence (added by migration 2). ``from_version``/``to_version`` are the
# promoted version before and after: equal for a reject, so the pointer's whole history
# reads off this table. ``version`` is the version decided on: the one rejected, or
# the one switched to (then equal to ``to_version``).
decisions = sa.Table(
    "decisions", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("name", sa.String(128), nullable=False),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("action", sa.String(16), nullable=False),
    sa.Column("actor", sa.String(64), nullable=False),
    sa.Column("from_version", sa.Integer, nullable=True),
    sa.Column("to_version", sa.Integer, nullable=True),
    sa.Column("summary", sa.Text, nullable=False),
    sa.Column("evidence", sa.JSON, nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.ForeignKeyConstraint(["name", "version"], ["model_versions.name", "model_versions.version"]),
    sa.Index("ix_decisions_name_id", "name", "id"),
)

# The continual loop's cycles and the sessions each one claimed (added by migration 4).
# A cycle is a small state machine that survives kill -9: ``claimed`` (its sessions are
# taken) -> ``trained`` (its candidate version is stored) -> ``loaded`` (the candidate is
# in the server) -> ``decided`` (the gate's decision is stored); or ``released`` (its
# sessions went back to the queue) or ``skipped`` (none of its sessions could be
# replayed). A claim is a session's one-way ticket: at most one row per session, ever
# (the primary key), in state ``claimed``, then ``trained`` or ``unusable``.
cycles = sa.Table(
    "cycles", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("name", sa.String(128), nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("base_version", sa.Integer, nullable=True),
    sa.Column("candidate_version", sa.Integer, nullable=True),
    sa.Column("decision_id", sa.Integer, sa.ForeignKey("decisions.id"), nullable=True),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Column("updated_at", sa.Double, nullable=False),
    sa.Column("metadata", sa.JSON, nullable=False),
    sa.Index("ix_cycles_name_state", "name", "state"),
)

claims = sa.Table(
    "claims", metadata,
    sa.Column("session_id", ID, sa.ForeignKey("sessions.session_id"), primary_key=True),
    sa.Column("cycle_id", sa.Integer, sa.ForeignKey("cycles.id"), nullable=False, index=True),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("reason", sa.Text, nullable=True),
    sa.Column("claimed_at", sa.Double, nullable=False),
    sa.Column("updated_at", sa.Double, nullable=False),
)

# Every canary episode a gate decision rests on (added by migration 5): both sides' episodes
# of each (task, seed), with what the agent did, so a decision reads episode by episode. They
# are written in the decision's own transaction. ``side`` is 'candidate', 'promoted' (the
# baseline it was compared with) or 'anchor' (the gate's anchor, when that is another); ``trace`` is ``seed_agents.continual.canary.EpisodeTrace``
# (tool calls with their arguments and results or errors, the final answer), bounded by
# its writer.
canary_episodes = sa.Table(
    "canary_episodes", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("decision_id", sa.Integer, sa.ForeignKey("decisions.id"), nullable=False),
    sa.Column("name", sa.String(128), nullable=False),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("side", sa.String(16), nullable=False),
    sa.Column("task_id", sa.Text, nullable=False),
    sa.Column("seed", sa.Integer, nullable=False),
    sa.Column("reward", sa.Double, nullable=False),
    sa.Column("success", sa.Boolean, nullable=False),
    sa.Column("fault", sa.String(32), nullable=True),
    sa.Column("trace", sa.JSON, nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.ForeignKeyConstraint(["name", "version"], ["model_versions.name", "model_versions.version"]),
    sa.Index("ix_canary_episodes_decision", "decision_id", "id"),
)

# Every gateway writing to this store, one row each, refreshed while it runs (added by
# migration 7): several gateways share one PostgreSQL store, and ``seed-agents status``
# reads them all from here. ``state`` is what the gateway last reported
# (``seed_agents.gateway.fleet``): what it serves, its replicas in and out of rotation
# and why, its spool's depth. A row is never deleted: a gateway that stopped says so in
# ``state``, one that died stops being seen.
gateways = sa.Table(
    "gateways", metadata,
    sa.Column("name", sa.String(128), primary_key=True),
    sa.Column("url", sa.Text, nullable=False),
    sa.Column("started_at", sa.Double, nullable=False),
    sa.Column("seen_at", sa.Double, nullable=False),
    sa.Column("state", sa.JSON, nullable=False),
)

# At most one unfinished cycle per model name (migration 4): a restarted loop resumes
# that one, and a second loop on the same name cannot open another beside it.
ONE_OPEN_CYCLE_INDEX = "uq_cycles_one_open"
OPEN_CYCLE_STATES = ("claimed", "trained", "loaded")

# At most one promoted version per name, enforced by the database itself (migration 2).
# Raw DDL rather than an ``sa.Index`` on ``model_versions``: migration 1 creates that table
# from its current definition and would otherwise create the index too early.
ONE_PROMOTED_INDEX = "uq_model_versions_one_promoted"


def _v1_initial(conn: Connection) -> None:
    """Version 1: every table of the data plane and the continual loop."""
    metadata.create_all(conn, tables=DATA_TABLES)


def _v2_decisions(conn: Connection) -> None:
    """Version 2: the ``decisions`` table, and at most one promoted version per name.

    A database written before this may hold several promoted versions of one name (the
    store did not forbid it): the most recently updated one stays promoted, the others
    are retired, each with a decision row saying so, before the unique index is built.
    """
    decisions.create(conn)
    promoted = conn.execute(
        sa.select(model_versions.c.name, model_versions.c.version)
        .where(model_versions.c.status == "promoted")
        .order_by(model_versions.c.name, model_versions.c.updated_at.desc(), model_versions.c.version.desc())
    ).all()
    kept: dict[str, int] = {}
    now = time.time()
    for name, version in promoted:
        if name not in kept:
            kept[name] = version
            continue
        conn.execute(sa.update(model_versions)
                     .where(model_versions.c.name == name, model_versions.c.version == version)
                     .values(status="retired", updated_at=now))
        conn.execute(sa.insert(decisions).values(
            name=name, version=version, action="retire", actor="migration", from_version=version,
            to_version=kept[name], created_at=now, evidence={},
            summary=f"migration: v{version} retired, v{kept[name]} stays the one promoted version"))
    conn.execute(sa.text(f"CREATE UNIQUE INDEX {ONE_PROMOTED_INDEX} ON model_versions (name) "
                         "WHERE status = 'promoted'"))


def _v3_call_complete(conn: Connection) -> None:
    """Version 3: ``calls.complete`` (``LLMCall.complete``: False for a stream its consumer
    abandoned, never trained on). Migration 1 builds ``calls`` from the current table, so
    a database created at this version already has the column; older ones get it, every
    stored call counting as complete (nothing incomplete was recorded before)."""
    if "complete" not in {c["name"] for c in sa.inspect(conn).get_columns("calls")}:
        conn.execute(sa.text(f"ALTER TABLE calls ADD COLUMN complete BOOLEAN NOT NULL DEFAULT {_true_literal(conn)}"))


def _true_literal(conn: Connection) -> str:
    return "1" if conn.dialect.name == "sqlite" else "TRUE"


def _v4_cycles(conn: Connection) -> None:
    """Version 4: the continual loop's ``cycles`` and ``claims`` (see their definitions).
    Sessions consumed before (``train --from-store``) keep ``consumed_by`` and get no
    claim: the loop takes only sessions nobody consumed."""
    metadata.create_all(conn, tables=[cycles, claims])
    states = ", ".join(f"'{s}'" for s in OPEN_CYCLE_STATES)
    conn.execute(sa.text(f"CREATE UNIQUE INDEX IF NOT EXISTS {ONE_OPEN_CYCLE_INDEX} ON cycles (name) WHERE state IN ({states})"))


def _v5_canary_episodes(conn: Connection) -> None:
    """Version 5: ``canary_episodes`` (see its definition). Decisions stored before keep
    their aggregate evidence only: their episodes were never kept. Idempotent, like 3 and 4."""
    canary_episodes.create(conn, checkfirst=True)


def _v6_call_guided(conn: Connection) -> None:
    """Version 6: ``calls.guided`` and ``calls.prefill_len`` (``LLMCall``'s guided openings,
    steered training calls). Every call stored before was unguided. Idempotent, like 3."""
    have = {c["name"] for c in sa.inspect(conn).get_columns("calls")}
    if "guided" not in have:
        false = "0" if conn.dialect.name == "sqlite" else "FALSE"
        conn.execute(sa.text(f"ALTER TABLE calls ADD COLUMN guided BOOLEAN NOT NULL DEFAULT {false}"))
    if "prefill_len" not in have:
        conn.execute(sa.text("ALTER TABLE calls ADD COLUMN prefill_len INTEGER NOT NULL DEFAULT 0"))


def _v7_gateways(conn: Connection) -> None:
    """Version 7: ``gateways`` (see its definition). Idempotent, like 5."""
    gateways.create(conn, checkfirst=True)


MIGRATIONS: list[Migration] = [_v1_initial, _v2_decisions, _v3_call_complete, _v4_cycles, _v5_canary_episodes,
                               _v6_call_guided, _v7_gateways]


def stored_version(conn: Connection) -> int:
    """The database's schema version; 0 for a database this code never opened."""
    if not sa.inspect(conn).has_table(schema_version.name):
        return 0
    return int(conn.execute(sa.select(sa.func.max(schema_version.c.version))).scalar() or 0)


def migrate(engine: Engine, migrations: Sequence[Migration] = MIGRATIONS) -> int:
    """Bring the database to ``len(migrations)`` in one transaction; return that version.

    ``migrations`` is a parameter so tests can play a future upgrade on today's data.
    """
    target = len(migrations)
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_MIGRATION_LOCK})
        current = stored_version(conn)
        if current > target:
            raise StoreError(
                f"the store's schema is version {current}, newer than this code understands "
                f"({target}): upgrade seed-agents, or point --store at another database"
            )
        if current == target:
            return current
        schema_version.create(conn, checkfirst=True)
        for migration in migrations[current:]:
            migration(conn)
        conn.execute(sa.delete(schema_version))
        conn.execute(sa.insert(schema_version).values(version=target, migrated_at=time.time()))
    return target
