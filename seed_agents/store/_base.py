"""What every part of the trace store shares: the engine, and one transaction per write.

The promise kept here: every public write of ``TraceStore`` is ONE transaction, run by
``_write`` and retried whole while the database is locked (SQLite past its busy timeout)
or the server aborted it (PostgreSQL deadlock), so a process killed at any instant
leaves each write either stored whole or not at all. Reads run in ``_read``: one
consistent snapshot that never blocks writers.

The area classes (``sessions.SessionStore``, ``cycles.CycleStore``,
``versions.VersionStore``) build on ``StoreBase``; ``store.TraceStore`` composes them.
The statement helpers here are those more than one area uses: an idempotent INSERT
(``_insert_ignore``), the id check, and the guard that turns a unique-index violation
into a ``StoreError`` that says what to do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Self, TypeVar

import sqlalchemy as sa
import tenacity
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine

from seed_agents.store import schema
from seed_agents.store._engine import READ_ONLY, create_engine, parse_url, transient_error
from seed_agents.store.records import StoreError

T = TypeVar("T")

MAX_ID_LEN = 128
# A transaction that stays locked out this long is reported, not retried forever.
RETRY_FOR_S = 30.0


class StoreBase:
    """One store behind one URL; thread-safe (a pooled engine, a transaction per call)."""

    def __init__(self, engine: Engine) -> None:
        """Use ``TraceStore.open(url)``: it also creates or migrates the schema."""
        self._engine = engine
        self._transient = transient_error(engine.dialect.name)

    @classmethod
    def open(cls, url: str) -> Self:
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

    @property
    def url(self) -> str:
        """The store's URL, password hidden: which store a log line (or the gateway's spool) is about."""
        return self._engine.url.render_as_string(hide_password=True)

    def close(self) -> None:
        """Close pooled connections; the store must not be used afterwards."""
        self._engine.dispose()

    def __enter__(self) -> Self:
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


# ------------------------------------------------------------ shared statement helpers


def _check_id(value: str, what: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ID_LEN:
        raise StoreError(f"{what} must be a non-empty string of at most {MAX_ID_LEN} characters, got {value!r:.200}")
    return value


def _insert_ignore(conn: Connection, table: sa.Table, keys: list[str], values: dict[str, Any]) -> bool:
    """INSERT unless a row with the same ``keys`` exists; True when this call inserted.

    ON CONFLICT DO NOTHING (both databases) keeps racing inserts from raising. Whether a
    row went in is read from RETURNING: drivers need not report an INSERT's rowcount
    (psycopg through SQLAlchemy reports -1)."""
    insert = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
    statement = insert(table).values(**values).on_conflict_do_nothing(index_elements=keys)
    return conn.execute(statement.returning(table.c[keys[0]])).first() is not None


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
