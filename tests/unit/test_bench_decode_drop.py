"""bench/decode_drop.py: which recorded calls it batches together, and bad input."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import decode_drop


def _episode(iteration, turns, analyzer=True, fault=None):
    calls = [{"purpose": "agent", "scope": {"iteration": iteration}, "n": t} for t in range(turns)]
    if analyzer:
        calls.append({"purpose": "analyzer", "scope": {"iteration": iteration}, "n": "h"})
    return {"calls": calls, "fault": fault}


def test_turn_k_of_every_episode_goes_together_then_the_hindsight_prompts():
    trajectories = [_episode(0, 3), _episode(0, 1), _episode(1, 3), _episode(0, 2, fault="env"), _episode(0, 2, False)]
    batches, episodes = decode_drop.recorded_batches(trajectories, 0)
    assert episodes == 3  # iteration 1 and the faulted episode are not replayed
    assert [(kind, [(i, c["n"]) for i, c in rows]) for kind, rows in batches] == [
        ("agent", [(0, 0), (1, 0), (2, 0)]), ("agent", [(0, 1), (2, 1)]), ("agent", [(0, 2)]),
        ("hindsight", [(0, "h"), (1, "h")])]
    with pytest.raises(SystemExit, match="no clean episode of iteration 5"):
        decode_drop.recorded_batches(trajectories, 5)


def test_a_folder_that_is_not_a_run_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match="is not a readable train run"):
        decode_drop.main(["--run", str(tmp_path), "--results-dir", str(tmp_path / "r")])
