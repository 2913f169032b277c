"""Crash points: named places where a test can kill the process as ``kill -9`` would.

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
