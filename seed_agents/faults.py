"""Faults that end an episode, and crash points where a test can kill the process.

``EpisodeFault`` is how env or tool code ends an episode as an infrastructure fault of a
given kind (e.g. a shadow replay that would have to send a write to production): the
runner records the episode with that ``Trajectory.fault`` and it is never trained on.
Tool nodes turn every other tool error into a message the model reads
(``tool_error_message``), but let this one through.

Crash points: named places where a test can kill the process as ``kill -9`` would.

Resume must be exact from every moment a real run can die (mid-rollout, mid-update,
mid-checkpoint, mid-sync). The kill-and-resume tests prove it by setting
``SEED_AGENTS_CRASH_AT=<name>[@<n>]``: the n-th time (default 1st) the process reaches
``crash_point(<name>)`` it sends itself SIGKILL, so no ``finally`` block, flush or atexit
hook runs, exactly like an OOM kill or a pulled plug. Unset, a crash point costs one
environment lookup.
"""

from __future__ import annotations

import os
import signal
import threading
from collections import Counter

from seed_agents.types import FaultKind


class EpisodeFault(Exception):
    """Ends the episode as an infrastructure fault of ``kind`` (a class attribute, or
    ``kind=`` given to the constructor); raise it from env or tool code."""

    kind: FaultKind = FaultKind.ENV

    def __init__(self, *args: object, kind: FaultKind | None = None) -> None:
        super().__init__(*args)
        if kind is not None:
            self.kind = kind


def tool_error_message(error: Exception) -> str:
    """``ToolNode(handle_tool_errors=tool_error_message)``: a failing tool tells the model
    what went wrong (it may fix its call), except an ``EpisodeFault``, which ends the episode."""
    if isinstance(error, EpisodeFault):
        raise error
    return f"Error: {type(error).__name__}: {error}\nPlease fix your mistakes."


CRASH_ENV = "SEED_AGENTS_CRASH_AT"
CRASH_POINTS = ("rollout", "update", "checkpoint", "sync")

_reached: Counter[str] = Counter()
_lock = threading.Lock()


def crash_point(name: str) -> None:
    """SIGKILL this process here if ``$SEED_AGENTS_CRASH_AT`` names this point."""
    spec = os.environ.get(CRASH_ENV)
    if not spec:
        return
    target, _, nth = spec.partition("@")
    if target != name:
        return
    with _lock:
        _reached[name] += 1
        hit = _reached[name] == int(nth or 1)
    if hit:
        os.kill(os.getpid(), signal.SIGKILL)
