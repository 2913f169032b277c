"""Engines for the two supported databases, set up for many threads and crash safety.

SQLite (the embedded default): one engine per store with a connection pool; every
connection runs in WAL mode (readers never block the writer) with a busy timeout, and
foreign keys on. Writes start with ``BEGIN IMMEDIATE``: the write lock is taken up
front, so two writers queue on the busy timeout instead of one failing later when it
upgrades a read lock (which no timeout can save). Reads start a deferred ``BEGIN``.

PostgreSQL (several machines): psycopg 3 through SQLAlchemy, pre-ping so a restarted
server costs one reconnect rather than an error.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection, Engine

from seed_agents.store.records import StoreError

# Waits for the SQLite write lock up to this long inside SQLite itself, before our retry.
SQLITE_BUSY_TIMEOUT_S = 10.0
# An execution option marking a read-only transaction (deferred BEGIN on SQLite).
READ_ONLY = "seed_read_only"

_EXAMPLES = "use sqlite:///path/to/traces.db or postgresql://user:password@host:5432/dbname"


def parse_url(url: str) -> URL:
    """A store URL, normalized to the driver we ship with; StoreError when unusable."""
    try:
        parsed = sa.make_url(url)
    except sa.exc.ArgumentError:
        raise StoreError(f"cannot parse store URL {url!r}: {_EXAMPLES}") from None
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        if not parsed.database or parsed.database == ":memory:":
            raise StoreError(f"store URL {url!r} names no file (an in-memory SQLite store is not durable and "
                             f"not shared between connections): {_EXAMPLES}")
        return parsed.set(drivername="sqlite")
    if backend in ("postgresql", "postgres"):
        return parsed.set(drivername="postgresql+psycopg")
    raise StoreError(f"unsupported store URL scheme {parsed.drivername!r} in "
                     f"{parsed.render_as_string(hide_password=True)!r}: {_EXAMPLES}")


def create_engine(url: URL) -> Engine:
    """An engine for ``url`` (from ``parse_url``) that is safe to share between threads."""
    if url.get_backend_name() == "sqlite":
        return _sqlite_engine(url)
    try:
        return sa.create_engine(url, pool_pre_ping=True)
    except ImportError as e:
        raise StoreError(f"PostgreSQL needs psycopg 3: pip install 'psycopg[binary]>=3.1' ({e})") from None


def _sqlite_engine(url: URL) -> Engine:
    assert url.database is not None  # parse_url refused a missing path
    Path(url.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(
        url,
        connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_S},
        pool_size=8,
        max_overflow=24,
    )

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: sqlite3.Connection, _record: Any) -> None:
        # The driver must not open transactions on its own: _on_begin below does.
        dbapi_conn.isolation_level = None
        for pragma in (
            "PRAGMA journal_mode=WAL",
            # WAL + NORMAL: a killed process loses no committed transaction and the file
            # never corrupts; only a power cut may roll back the last few commits.
            "PRAGMA synchronous=NORMAL",
            f"PRAGMA busy_timeout={int(SQLITE_BUSY_TIMEOUT_S * 1000)}",
            "PRAGMA foreign_keys=ON",
        ):
            dbapi_conn.execute(pragma)

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        read_only = conn.get_execution_options().get(READ_ONLY, False)
        conn.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")

    return engine


def transient_error(dialect_name: str) -> Callable[[BaseException], bool]:
    """A predicate for errors that a retry of the whole transaction can cure.

    SQLite: the write lock stayed busy past the busy timeout. PostgreSQL: a detected
    deadlock or a serialization failure (the server rolled the transaction back).
    """
    if dialect_name == "postgresql":
        from psycopg import errors as pg_errors

        retry_on: tuple[type[BaseException], ...] = (pg_errors.DeadlockDetected, pg_errors.SerializationFailure)

        def pg_transient(e: BaseException) -> bool:
            return isinstance(e, sa.exc.DBAPIError) and isinstance(e.orig, retry_on)

        return pg_transient

    def sqlite_transient(e: BaseException) -> bool:
        if not (isinstance(e, sa.exc.OperationalError) and isinstance(e.orig, sqlite3.OperationalError)):
            return False
        message = str(e.orig)
        return "database is locked" in message or "database is busy" in message

    return sqlite_transient
