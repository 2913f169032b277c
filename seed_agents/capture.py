"""Capture scopes: every LLM call made inside ``with capture():`` is recorded.

The active scope lives in a ContextVar, so concurrent episodes (asyncio tasks, or the
worker threads LangGraph runs sync nodes in) each record into their own scope: a task
copies the context it was created in, and the scope object it finds there is shared by
reference. Scopes nest; a call is recorded in the innermost scope and every enclosing
one, and written once to every sink on the chain as it happens (nothing is buffered
until the end, so a crash loses no finished call).

A scope may also carry what makes an episode's sampling reproducible (set by the
runner): a ``seed`` from which every LLM call made in it derives its own per-request
seed (``request_seed``: the scope's seed and the call's index in the scope, never the
order in which concurrent episodes happen to call), and the ``Cohort`` of episodes it
runs with, which a backend may use to batch in a schedule that does not depend on timing.

A scope may carry a ``guide`` (set by the runner for a share of training episodes): the
first policy call in it that leaves the model free to call a tool or not is steered into a
call (see ``SeedChatModel`` and ``docs/training.md``, "Guided openings"). A ``"first_call"``
guide (``trainer.guide_share: auto``) steers only the episode's first policy call, and only
where that call is free: an agent whose first turn is forced, or offers no tools, is left
alone, and a forced opening is never followed by a steered second call.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

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


def derive_seed(*parts: str | int) -> int:
    """A 63-bit seed from ``parts``: the same parts give the same seed in any process
    (a cryptographic hash of their ``repr``, not Python's salted ``hash``)."""
    digest = hashlib.blake2b(repr(parts).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


@dataclass(eq=False)
class Ticket:
    """One request's place in a ``Cohort``'s lockstep: ``wave`` is set when it may run."""

    t0: float = field(default_factory=time.monotonic)
    wave: int | None = None


class Cohort:
    """The episodes one ``EpisodeRunner.run`` plays together: a barrier for backends that
    batch them in lockstep (``LocalBackend``), so that a batch's composition depends on
    what the episodes did, never on when their requests arrived.

    A request joins (``join``) and waits; when every live episode has a request waiting
    (``live``: ``min(concurrency, total - finished)``, so a slot freed by a finished
    episode counts until the next one has started and asked), all waiting requests are
    released together as one wave, whatever backend holds them. A backend runs a wave's
    requests and reports each ``done``. An episode blocked on something else (a slow tool,
    a stream) delays the wave; one that asks for nothing while the cohort has been idle
    for ``wait_s`` is not waited for (``late_waves`` counts those waves: their batches,
    and so the run, then depend on timing). One call in flight per episode is assumed.
    """

    def __init__(self, total: int, concurrency: int, wait_s: float = 30.0) -> None:
        self.total, self.concurrency, self.wait_s = total, concurrency, wait_s
        self.waves = self.late_waves = 0
        self._waiting: list[Ticket] = []
        self._in_flight = 0  # released, not yet done
        self._quiet_since = time.monotonic()
        self._finished: set[object] = set()
        self._lock = threading.Lock()

    @property
    def live(self) -> int:
        return min(self.concurrency, self.total - len(self._finished))

    def join(self) -> Ticket:
        ticket = Ticket()
        with self._lock:
            self._waiting.append(ticket)
            self._close_if_full()
        return ticket

    def withdraw(self, ticket: Ticket) -> None:
        """A waiting request was abandoned (its episode timed out): it no longer counts."""
        with self._lock:
            if ticket in self._waiting:
                self._waiting.remove(ticket)

    def done(self, ticket: Ticket) -> None:
        with self._lock:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._quiet_since = time.monotonic()

    def finish(self, member: object) -> None:
        """``member`` (any hashable id) makes no more calls; a repeat is ignored."""
        with self._lock:
            self._finished.add(member)
            self._close_if_full()

    def release_overdue(self) -> None:
        """Release the waiting requests if the cohort has been idle for ``wait_s``."""
        with self._lock:
            if self._waiting and self._in_flight == 0:
                since = max(self._quiet_since, min(t.t0 for t in self._waiting))
                if time.monotonic() - since >= self.wait_s:
                    self.late_waves += 1
                    self._release()

    def _close_if_full(self) -> None:
        if self._waiting and len(self._waiting) >= self.live:
            self._release()

    def _release(self) -> None:
        for t in self._waiting:
            t.wave = self.waves
        self._in_flight += len(self._waiting)
        self._waiting.clear()
        self.waves += 1


Guide = bool | Literal["first_call"]
"""A scope's guide: none (False), the first free tool choice (True), or the first policy call
when it is free (``"first_call"``)."""


class CaptureScope:
    """Collects the calls made while it is active; see ``capture``."""

    def __init__(
        self,
        labels: dict[str, Any],
        parent: CaptureScope | None,
        sink: Sink | None,
        purpose: Purpose | None,
        seed: int | None = None,
        cohort: Cohort | None = None,
        guide: Guide = False,
    ) -> None:
        self.parent = parent
        self.guide: Guide = guide  # cleared by the call that takes it (a first_call guide: by the first policy call)
        self.labels = {**(parent.labels if parent else {}), **labels}
        self.sink = sink
        self.purpose: Purpose | None = purpose if purpose is not None else (parent.purpose if parent else None)
        self.seed = seed
        self.cohort: Cohort | None = cohort if cohort is not None else (parent.cohort if parent else None)
        self.calls: list[LLMCall] = []
        self._lock = threading.Lock()
        self._requests = 0  # calls that asked this scope for a seed

    def request_seed(self, *identity: str | int) -> int | None:
        """The next call's seed: ``derive_seed(seed, n, *identity)`` for the n-th call that
        asks the nearest scope holding a seed (nested scopes, such as the hindsight node's,
        share their episode's count); None when no enclosing scope has a seed."""
        owner: CaptureScope | None = self
        while owner is not None and owner.seed is None:
            owner = owner.parent
        if owner is None or owner.seed is None:
            return None
        with owner._lock:
            n = owner._requests
            owner._requests += 1
        return derive_seed(owner.seed, n, *identity)

    def take_guide(self, free: bool = True) -> bool:
        """Whether a policy call made in this scope (or one it is nested in) is steered: True
        once per guided episode, for its first free tool choice (``free``: tools bound, the
        choice left to the model). The nearest scope that still holds a guide gives it up; a
        ``first_call`` guide is given up by the first policy call, free or not."""
        scope: CaptureScope | None = self
        while scope is not None:
            with scope._lock:
                if scope.guide:
                    if not free and scope.guide is True:  # a forced or tool-less call leaves it for a free one
                        return False
                    scope.guide = False
                    return free
            scope = scope.parent
        return False

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
def capture(sink: Sink | None = None, purpose: Purpose | None = None, *, seed: int | None = None,
            cohort: Cohort | None = None, guide: Guide = False, **labels: Any) -> Iterator[CaptureScope]:
    """Record every ``SeedChatModel`` call made inside the block.

    ``labels`` (e.g. ``task_id``, ``group_id``) are stamped onto each call's ``scope``;
    ``purpose`` overrides the chat model's own purpose for calls in the block (the
    hindsight node uses ``purpose="analyzer"``). ``seed``: calls in the block without a
    seed of their own sample with one derived from it (``CaptureScope.request_seed``);
    ``cohort``: the episodes this one runs with (see ``Cohort``); ``guide``: steer the
    block's first free tool choice into a call, or with ``"first_call"`` its first policy
    call where that is free (``CaptureScope.take_guide``).
    """
    scope = CaptureScope(labels, _ACTIVE.get(), sink, purpose, seed, cohort, guide)
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
