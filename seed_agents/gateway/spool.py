"""The gateway's spool: chat calls the trace store could not take, kept on local disk until it can.

The store may fail (PostgreSQL stopped, a SQLite disk gone read-only, a write lock held
too long); users may not. With ``store_outage.on_failure: spool`` (the default) a call
whose store write fails for a reason that waiting can cure (``is_outage``) is appended
here, the user gets the answer, and ``Flusher`` writes it to the store once the store is
back. The promises:

- Durable before answered: an entry is committed (SQLite WAL, ``synchronous=FULL``, so
  fsynced) before the client gets its reply, and survives a restart of the gateway.
- Exactly once: the flusher replays the recorder's own write, which is idempotent on
  ``call_id`` (``add_call`` returns the seq of a call already stored; session creation,
  flagging and the transcript are idempotent too), and an entry is deleted only after the
  store committed it. A crash between the two re-writes the call harmlessly.
- In order: entries flush oldest first, and ``Recorder`` spools every later call of a
  session that has entries waiting, so a session's turns are stored in answer order.
- Redacted only: an entry is ``Recorder.build``'s output (redacted messages and ids) and
  the redacted transcript; the raw request never reaches this disk. The file is 0600.
- One owner: a lock file keeps a second gateway process off the file (two flushers and two
  in-memory depths would disagree), and the file remembers which store its calls are for,
  so a gateway pointed at another store refuses to start instead of flushing them there.

Why the stdlib ``sqlite3`` and not a queue library: none of the project's dependencies is a
durable queue, and SQLite gives an atomic append and delete, crash safety and ordered reads
in a few statements, where an append-only JSONL file would need its own compaction and
torn-write handling. It is a separate file from the store on purpose: it must work while
the store does not.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import filelock
import sqlalchemy as sa
import tenacity
from pydantic import BaseModel, ConfigDict, ValidationError
from sqlalchemy.exc import SQLAlchemyError

from seed_agents.store import StoreError
from seed_agents.transcript import Transcript
from seed_agents.types import LLMCall

log = logging.getLogger("seed_agents.gateway")

FLUSH_BATCH = 64
"""Entries read per flush step: small enough that a step's memory is bounded, large enough
that the spool file is not re-read per call."""
IDLE_POLL_S = 0.25
"""How often an idle flusher looks at the spool's depth (an in-memory number: free to read,
and simpler than signalling the event loop from the request threads that append)."""
FIRST_RETRY_S = 0.1
"""The flusher's first wait after an outage; it doubles (jittered) up to ``retry_max_s``."""
PG_DEFAULT_SPOOL = "runs/gateway-spool.sqlite"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: the flush order, across restarts
    session_id TEXT NOT NULL,
    payload TEXT NOT NULL,                  -- a SpoolEntry as JSON
    spooled_at REAL NOT NULL,
    rejected TEXT                           -- why the store refused it for good (kept for an operator)
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


class SpoolError(RuntimeError):
    """The spool cannot take a call (full, unwritable) or cannot be opened (in use, other store)."""


class SpoolEntry(BaseModel):
    """Everything ``Recorder``'s store write needs for one call; already redacted."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    session_id: str
    task_key: str | None
    call: LLMCall
    flagged: bool
    transcript: Transcript

    def dumps(self) -> str:
        """JSON as the store writes a call (``model_dump`` + ``json``), so what is flushed is
        what a direct write would have stored, -inf logprobs included (pydantic's own JSON
        turns them into null)."""
        return json.dumps(self.model_dump(), ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def loads(cls, payload: str) -> Self:
        return cls.model_validate(json.loads(payload))


@dataclass(frozen=True)
class FlushResult:
    """One flush step: the entries the store now holds, and how many it refused for good."""

    flushed: list[SpoolEntry] = field(default_factory=list)
    rejected: int = 0


def is_outage(e: BaseException) -> bool:
    """True for store errors that waiting can cure: the connection or the disk is gone
    (``OperationalError``: server down, refused, read-only or full disk), a connection
    dropped mid-use, the pool timed out, or the store's own lock wait ran out (a
    ``StoreError`` raised from a database error). Integrity, data and programming errors,
    and the store's own refusals, are properties of the call: no wait cures them."""
    if isinstance(e, StoreError):
        return isinstance(e.__cause__, sa.exc.DBAPIError)
    if isinstance(e, sa.exc.DBAPIError) and e.connection_invalidated:
        return True
    return isinstance(e, sa.exc.OperationalError | sa.exc.InterfaceError | sa.exc.DisconnectionError | sa.exc.TimeoutError)


def default_spool_path(store_url: str, gateway: str | None = None) -> Path:
    """Beside a SQLite store (``traces.db`` -> ``traces.db.spool``): the folder the
    operator chose for the gateway's data. For PostgreSQL, ``runs/gateway-spool.sqlite``
    under the working directory (the store's own default folder).

    With ``gateway`` (its name) the file is that gateway's own (``traces.db.NAME.spool``,
    ``runs/gateway-spool-NAME.sqlite``): several gateways on one store each drain their
    own spool, exactly once, and a restarted one finds what it left."""
    tag = "" if gateway is None else re.sub(r"[^A-Za-z0-9._-]", "_", gateway)
    url = sa.make_url(store_url)
    if url.get_backend_name() == "sqlite" and url.database:
        db = Path(url.database).expanduser()
        return db.with_name(f"{db.name}.{tag}.spool" if tag else f"{db.name}.spool")
    default = Path(PG_DEFAULT_SPOOL)
    return default.with_name(f"{default.stem}-{tag}{default.suffix}") if tag else default


def adopt_unnamed(unnamed: Path, path: Path) -> bool:
    """Move a spool left at the unnamed default ``unnamed`` (a gateway before spools were
    named after their gateway) to ``path``, so its calls are flushed, not stranded. Only
    when ``path`` does not exist yet and no process holds ``unnamed``; True when moved."""
    if path.exists() or not unnamed.exists():
        return False
    lock = filelock.FileLock(f"{unnamed}.lock", timeout=0, mode=0o600, thread_local=False)
    try:
        lock.acquire()
    except filelock.Timeout:
        return False  # another gateway still uses it as its own
    try:
        if path.exists() or not unnamed.exists():
            return False
        path.parent.mkdir(parents=True, exist_ok=True)
        for suffix in ("-wal", "-shm", ""):  # the WAL may hold committed calls: it moves with its file
            part = Path(f"{unnamed}{suffix}")
            if part.exists():
                os.replace(part, f"{path}{suffix}")
        return True
    finally:
        lock.release()


class Spool:
    """A durable FIFO of ``SpoolEntry`` in one SQLite file; thread-safe (one lock around
    the connection). ``store_down`` is the recorder's circuit breaker: set with an entry
    spooled after an outage, cleared by the flusher's next successful write, so while the
    store is known down requests spool at once instead of each waiting on a dead store."""

    def __init__(self, conn: sqlite3.Connection, lock: filelock.BaseFileLock, path: Path, max_bytes: int) -> None:
        """Use ``Spool.open``."""
        self.path = path
        self.max_bytes = max_bytes
        self.store_down = False
        self._conn = conn
        self._file_lock = lock
        self._lock = threading.Lock()  # the connection and the counters below
        self._flushing = threading.Lock()  # one flush step at a time (a cancelled step's thread may still run)
        rows = conn.execute("SELECT session_id, COUNT(*), COALESCE(SUM(LENGTH(payload)), 0) FROM entries "
                            "WHERE rejected IS NULL GROUP BY session_id").fetchall()
        self._pending: Counter[str] = Counter({sid: n for sid, n, _ in rows})  # per session, for holds()
        self._depth = sum(self._pending.values())
        self._bytes = sum(b for *_, b in rows)

    @classmethod
    def open(cls, path: Path, store_url: str, max_bytes: int) -> Self:
        """Open (creating, mode 0600) the spool at ``path`` for the store at ``store_url``.
        SpoolError when another process holds it, or when it still holds calls of another store."""
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = filelock.FileLock(f"{path}.lock", timeout=0, mode=0o600, thread_local=False)
        try:
            lock.acquire()
        except filelock.Timeout:
            raise SpoolError(f"the spool {path} is in use by another gateway process; give each gateway its own "
                             f"store_outage.spool_path") from None
        conn = None
        try:
            os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
            os.chmod(path, 0o600)  # also tightens a file made by hand; SQLite gives -wal/-shm the same mode
            conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            # WAL + FULL: every append is fsynced before the user is answered
            conn.executescript("PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;" + _SCHEMA)
            _claim_for(conn, path, store_url)
            return cls(conn, lock, path, max_bytes)
        except BaseException:
            if conn is not None:
                conn.close()
            lock.release()
            raise

    # -- what the recorder asks -------------------------------------------------------------

    @property
    def depth(self) -> int:
        """Calls waiting for the store (refused ones not counted)."""
        return self._depth

    def holds(self, session_id: str) -> bool:
        """Whether the session has calls waiting: its later calls must queue behind them."""
        return self._pending.get(session_id, 0) > 0

    def append(self, entry: SpoolEntry, *, mark_down: bool = False) -> None:
        """Commit ``entry`` to disk (fsynced); with ``mark_down``, the store is known down
        from now on. SpoolError when the spool already holds ``max_bytes``."""
        payload = entry.dumps()
        with self._lock:
            if self._bytes + len(payload) > self.max_bytes:
                raise SpoolError(f"the spool {self.path} is full ({self._bytes} bytes of calls wait for the store)")
            self._conn.execute("INSERT INTO entries (session_id, payload, spooled_at) VALUES (?, ?, ?)",
                               (entry.session_id, payload, time.time()))
            self._pending[entry.session_id] += 1
            self._depth += 1
            self._bytes += len(payload)
            self.store_down = self.store_down or mark_down

    # -- what the flusher does ---------------------------------------------------------------

    def flush_step(self, write: Callable[[SpoolEntry], Any], limit: int = FLUSH_BATCH) -> FlushResult:
        """Write up to ``limit`` of the oldest entries with ``write``, oldest first, deleting
        each once the store has it. An entry the store refuses for good (not an outage) is
        set aside, kept in the file with the reason, so it cannot block the queue forever.
        At an outage the step stops: it raises when nothing went through yet (the flusher
        then backs off), else returns what did."""
        with self._flushing:
            flushed: list[SpoolEntry] = []
            rejected = 0
            for seq, session_id, payload in self._head(limit):
                try:
                    entry = SpoolEntry.loads(payload)
                    write(entry)
                except (StoreError, SQLAlchemyError, ValidationError, ValueError) as e:
                    if is_outage(e):
                        if flushed or rejected:
                            break
                        raise
                    self._reject(seq, session_id, len(payload), e)
                    rejected += 1
                    continue
                self._remove(seq, session_id, len(payload))
                flushed.append(entry)
            return FlushResult(flushed, rejected)

    def close(self) -> None:
        """Close the file and release it for the next gateway; what is left stays."""
        with self._flushing, self._lock:
            self._conn.close()
            self._file_lock.release()

    def _head(self, limit: int) -> list[tuple[int, str, str]]:
        with self._lock:
            return self._conn.execute("SELECT seq, session_id, payload FROM entries WHERE rejected IS NULL "
                                      "ORDER BY seq LIMIT ?", (limit,)).fetchall()

    def _remove(self, seq: int, session_id: str, size: int) -> None:
        with self._lock:
            self._conn.execute("DELETE FROM entries WHERE seq = ?", (seq,))
            self._forget(session_id, size)
            self.store_down = False  # a write went through: requests may try the store again

    def _reject(self, seq: int, session_id: str, size: int, e: BaseException) -> None:
        reason = (str(e).splitlines() or [type(e).__name__])[0][:300]
        log.error("the trace store refused spooled call #%d of session %s for good (%s); it stays in %s, set aside",
                  seq, session_id, reason, self.path)
        with self._lock:
            self._conn.execute("UPDATE entries SET rejected = ? WHERE seq = ?", (reason, seq))
            self._forget(session_id, size)

    def _forget(self, session_id: str, size: int) -> None:
        self._pending[session_id] -= 1
        if self._pending[session_id] <= 0:
            del self._pending[session_id]
        self._depth -= 1
        self._bytes -= size


def _claim_for(conn: sqlite3.Connection, path: Path, store_url: str) -> None:
    """Bind the spool to ``store_url``; refuse when it still holds calls of another store."""
    row = conn.execute("SELECT value FROM meta WHERE key = 'store'").fetchone()
    if row is not None and row[0] != store_url:
        (waiting,) = conn.execute("SELECT COUNT(*) FROM entries WHERE rejected IS NULL").fetchone()
        if waiting:
            raise SpoolError(f"the spool {path} holds {waiting} calls for the store {row[0]}, not {store_url}: "
                             f"start a gateway on that store to flush them, or set store_outage.spool_path")
    conn.execute("INSERT INTO meta (key, value) VALUES ('store', ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                 (store_url,))


class Flusher:
    """Drains the spool into the store in the background, oldest entry first.

    While the store stays down each step fails at once and the next waits longer
    (tenacity's jittered exponential backoff from ``FIRST_RETRY_S`` to ``retry_max_s``),
    so a dead store costs one cheap probe per wait, and a recovered one is used within
    ``retry_max_s``. ``on_step`` runs on the event loop, so it may touch what the
    request handlers touch (the gateway's counters) without a lock.
    """

    def __init__(self, spool: Spool, write: Callable[[SpoolEntry], Any], on_step: Callable[[FlushResult], None],
                 retry_max_s: float) -> None:
        self.spool = spool
        self.write = write
        self.on_step = on_step
        self.retry_max_s = retry_max_s

    async def run(self) -> None:
        """Flush whenever the spool holds calls, until cancelled."""
        retrying = tenacity.AsyncRetrying(
            retry=tenacity.retry_if_exception(is_outage),
            wait=tenacity.wait_random_exponential(multiplier=FIRST_RETRY_S, max=self.retry_max_s),
            before_sleep=self._note_outage,
            reraise=True,
        )
        while True:
            if not self.spool.depth:
                await asyncio.sleep(IDLE_POLL_S)
                continue
            try:
                if not await retrying(self.flush) and self.spool.depth:
                    await asyncio.sleep(IDLE_POLL_S)  # only refused entries moved (or none): do not spin
            except Exception as e:  # noqa: BLE001 - not an outage (the spool file failed, a bug): a dead flusher would strand every call
                log.error("flushing the spool %s failed (retrying in %g s): %s", self.spool.path, self.retry_max_s, e)
                await asyncio.sleep(self.retry_max_s)

    async def flush(self) -> int:
        """Flush until the spool is empty; an outage before any progress raises. Returns the calls flushed."""
        done = 0
        while self.spool.depth:
            step = await asyncio.to_thread(self.spool.flush_step, self.write)
            self.on_step(step)
            done += len(step.flushed)
            if not step.flushed and not step.rejected:
                break  # nothing readable is left (the depth and the file disagree): do not spin
        if done:
            log.info("flushed %d spooled calls to the trace store (%d still waiting)", done, self.spool.depth)
        return done

    def _note_outage(self, state: tenacity.RetryCallState) -> None:
        if state.attempt_number == 1 or state.attempt_number % 20 == 0:
            error = state.outcome.exception() if state.outcome else None
            log.warning("the trace store is still unavailable (%d calls spooled in %s; attempt %d): %s",
                        self.spool.depth, self.spool.path, state.attempt_number,
                        (str(error).splitlines() or [type(error).__name__])[0][:300])
