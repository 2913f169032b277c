"""The durable trace store: sessions, token-exact calls, rewards, skills, model versions.

Everything a deployed agent produces lands here, from the capture gateway or from an
in-process ``StoreSink``, and the continual loop reads it back as ``Trajectory`` records.
``TraceStore`` is composed of one class per area, each in its own module with the
promise it keeps:

- ``_base.StoreBase``: every public write is one transaction. A process killed at any
  instant leaves each call either stored whole or not at all, and a retried write (same
  ``call_id``) never duplicates a row, so "kill -9 loses at most the calls in flight" holds.
- ``sessions.SessionStore`` (the data plane) and ``cycles.CycleStore`` (the continual
  loop's queue): a session is trained at most once. ``claim_sessions`` marks sessions
  consumed with a conditional UPDATE, so two concurrent trainers never both get the same
  session; ``start_cycle`` also writes one ``claims`` row per session (its primary key:
  one claim per session, ever) and moves it with its cycle's state.
- ``versions.VersionStore``: a model name has at most one promoted version.
  ``switch_promoted`` retires the old one, promotes the new one and stores the decision
  in one locked transaction, and a unique index in the database refuses a second
  promoted row from any writer.
- ``gateways.GatewayStore``: each gateway on the store reports what it serves, so one
  ``status`` sees them all.

SQLite is the embedded default, PostgreSQL the multi-machine option; both go through the
same SQLAlchemy Core statements (see ``_engine`` for the per-database set-up). The record
types live in ``records``; the three re-exported here are for existing imports.
"""

from __future__ import annotations

from seed_agents.store.cycles import CycleStore
from seed_agents.store.gateways import GatewayStore
from seed_agents.store.records import CycleRecord, DecisionRecord, QueueLengths
from seed_agents.store.sessions import SessionStore
from seed_agents.store.versions import VersionStore

__all__ = ["CycleRecord", "DecisionRecord", "QueueLengths", "TraceStore"]


class TraceStore(SessionStore, CycleStore, VersionStore, GatewayStore):
    """One store behind one URL; thread-safe (a pooled engine, a transaction per call).

    Open it with ``TraceStore.open(url)``: it also creates or migrates the schema.
    """
