"""``StoreSink``: the capture ``Sink`` that writes into the trace store.

With it, an in-process LangGraph agent (``capture(sink=StoreSink(store))``) and the
runner land in the same tables as agents behind the capture gateway. Each call is stored
the moment it is recorded (one transaction), so a crash loses no finished call. Each call
also updates the session's replayable transcript (``seed_agents.transcript``: the task and
the tool results, read from the call's messages), as the gateway does, so an in-process
agent's session is replayable by the continual loop with nothing else.
"""

from __future__ import annotations

import threading

from pydantic import BaseModel

from seed_agents.store.store import TraceStore
from seed_agents.transcript import record_transcript, transcript_of
from seed_agents.types import LLMCall, Trajectory, new_id


class StoreSink:
    """Writes ``"call"`` and ``"trajectory"`` records into a ``TraceStore``; thread-safe.

    A call's session is its capture label ``session_key`` (the runner sets
    ``trajectory_id``), else one session fixed for this sink (``default_session_id``); its
    task key is the label ``task_key``. A trajectory stores its calls (idempotent: those
    already written as calls are not duplicated), its reward (source ``"env"``), its skill,
    and ends its session. Other kinds are ignored. Closing the sink leaves the store open:
    whoever opened the store closes it.
    """

    def __init__(self, store: TraceStore, session_key: str = "trajectory_id", task_key: str = "task_id",
                 *, default_session_id: str | None = None) -> None:
        self.store = store
        self.session_key = session_key
        self.task_key = task_key
        self.default_session_id = default_session_id or new_id()
        self._closed = False
        self._lock = threading.Lock()

    def write(self, kind: str, record: BaseModel) -> None:
        with self._lock:
            if self._closed:
                raise ValueError("this StoreSink is closed")
        if kind == "call" and isinstance(record, LLMCall):
            session = self.session_of(record)
            turn = self.store.add_call(session, record, task_key=self._task_of(record))
            if record.purpose == "policy":  # the analyzer's prompt is not the agent's conversation
                record_transcript(self.store, session, transcript_of(record.messages, record.tools), call=record, turn=turn)
        elif kind == "trajectory" and isinstance(record, Trajectory):
            session = self.session_of(record.calls[0]) if record.calls else record.trajectory_id
            self.store.add_trajectory(record, session_id=session)

    def session_of(self, call: LLMCall) -> str:
        """The session a call belongs to, from its capture labels."""
        value = call.scope.get(self.session_key)
        return str(value) if value not in (None, "") else self.default_session_id

    def _task_of(self, call: LLMCall) -> str | None:
        value = call.scope.get(self.task_key)
        return None if value in (None, "") else str(value)

    def close(self) -> None:
        with self._lock:
            self._closed = True

    def __enter__(self) -> StoreSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
