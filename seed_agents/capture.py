"""Capture scopes: every LLM call made inside ``with capture():`` is recorded.

The active scope lives in a ContextVar, so concurrent episodes (asyncio tasks, or the
worker threads LangGraph runs sync nodes in) each record into their own scope: a task
copies the context it was created in, and the scope object it finds there is shared by
reference. Scopes nest; a call is recorded in the innermost scope and every enclosing
one, and written once to every sink on the chain as it happens (nothing is buffered
until the end, so a crash loses no finished call).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel

from seed_agents.types import LLMCall, Purpose


class Sink(Protocol):
    """Receives records as they happen. Must be safe to call from several threads."""

    def write(self, kind: str, record: BaseModel) -> None: ...

    def close(self) -> None: ...


class JsonlSink:
    """Appends one JSON object per line; flushed per record so a killed run keeps its data."""

    def __init__(self, path: str | Path, kinds: tuple[str, ...] | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.kinds = kinds
        self._lock = threading.Lock()
        self._file = self.path.open("a", encoding="utf-8")

    def write(self, kind: str, record: BaseModel) -> None:
        if self.kinds is not None and kind not in self.kinds:
            return
        line = record.model_dump_json()
        with self._lock:
            if self._file.closed:
                raise ValueError(f"sink {self.path} is closed")
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()

    def __enter__(self) -> JsonlSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_jsonl(path: str | Path, model: type[BaseModel]) -> list[Any]:
    """Read records back; a truncated last line (a killed writer) is skipped, not fatal."""
    out = []
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append(model.model_validate_json(line))
        except ValueError:
            if i == len(lines) - 1:
                break
            raise
    return out


class CaptureScope:
    """Collects the calls made while it is active; see ``capture``."""

    def __init__(
        self,
        labels: dict[str, Any],
        parent: CaptureScope | None,
        sink: Sink | None,
        purpose: Purpose | None,
    ) -> None:
        self.parent = parent
        self.labels = {**(parent.labels if parent else {}), **labels}
        self.sink = sink
        self.purpose: Purpose | None = purpose if purpose is not None else (parent.purpose if parent else None)
        self.calls: list[LLMCall] = []
        self._lock = threading.Lock()

    def record(self, call: LLMCall) -> None:
        call.scope = {**self.labels, **call.scope}
        scope: CaptureScope | None = self
        seen_sinks: set[int] = set()
        while scope is not None:
            with scope._lock:
                scope.calls.append(call)
            if scope.sink is not None and id(scope.sink) not in seen_sinks:
                seen_sinks.add(id(scope.sink))
                scope.sink.write("call", call)
            scope = scope.parent


_ACTIVE: ContextVar[CaptureScope | None] = ContextVar("seed_agents_capture", default=None)


@contextmanager
def capture(sink: Sink | None = None, purpose: Purpose | None = None, **labels: Any) -> Iterator[CaptureScope]:
    """Record every ``SeedChatModel`` call made inside the block.

    ``labels`` (e.g. ``task_id``, ``group_id``) are stamped onto each call's ``scope``;
    ``purpose`` overrides the chat model's own purpose for calls in the block (the
    hindsight node uses ``purpose="analyzer"``).
    """
    scope = CaptureScope(labels, _ACTIVE.get(), sink, purpose)
    token = _ACTIVE.set(scope)
    try:
        yield scope
    finally:
        _ACTIVE.reset(token)


def current_scope() -> CaptureScope | None:
    return _ACTIVE.get()


def record_call(call: LLMCall) -> None:
    """Record ``call`` into the active scope chain; a no-op outside ``capture()``."""
    scope = _ACTIVE.get()
    if scope is not None:
        scope.record(call)
