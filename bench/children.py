"""Benchmarks that start other processes (``seed-agents train`` runs) stop them when stopped.

``subprocess.run`` kills its child on any exception while it waits (Ctrl-C, or SIGTERM
turned into ``SystemExit`` by ``stop_children_on_sigterm``), so a benchmark killed by its
pid does not leave a training run going on alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run_logged(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> tuple[int, float]:
    """Run ``cmd`` from the checkout (first on its ``PYTHONPATH``, the caller's after it), with
    ``env`` added to the environment, its output appended to ``log`` after the command line;
    (exit status, wall seconds)."""
    import shlex

    t0 = time.perf_counter()
    env = env or {}
    with log.open("a", encoding="utf-8") as f:
        f.write(f"\n$ {' '.join([*(f'{k}={shlex.quote(v)}' for k, v in env.items()), *cmd])}\n")
        f.flush()
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT,
                              env={**os.environ, **env, "PYTHONPATH": path})
    return proc.returncode, time.perf_counter() - t0


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def stop_children_on_sigterm() -> None:
    """SIGTERM (``kill PID``) ends the benchmark as Ctrl-C does, through ``finally``: the
    child ``run_logged`` waits on is stopped with it."""
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
