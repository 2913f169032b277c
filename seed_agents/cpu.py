"""What this CPU can do, read without importing torch.

Kept apart from :mod:`seed_agents.precision` so that code which only records a machine
(``bench/results.py``, ``scripts/readme_tables.py``) does not pay torch's import to read a
flag list.
"""

from __future__ import annotations

from pathlib import Path


def cpu_flags() -> set[str]:
    """The CPU's feature flags (Linux ``/proc/cpuinfo``; empty elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()
