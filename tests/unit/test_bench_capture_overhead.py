"""bench/capture_overhead.py's LangGraph floor: the bare graph takes the steps it is given."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
pytest.importorskip("textworld")

from bench.capture_overhead import run_bare_graph  # noqa: E402


def test_the_bare_graph_runs_each_episode_for_its_own_number_of_steps():
    wall, steps = asyncio.run(run_bare_graph([1, 3, 5, 2], concurrency=2))
    assert steps == 11 and wall > 0
    assert asyncio.run(run_bare_graph([], concurrency=2))[1] == 0
