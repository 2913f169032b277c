"""``bench/continual_atlas.py`` end to end on a tiny random model: one loop cycle on the
atlas (the service as a subprocess, a seeded store, ``seed-agents continual --once``),
its figures read back and written.

A random model solves nothing, so its groups have equal rewards and the run reports that
as a miss; what must hold is that the run completes, that the forced first turn makes
every replay and canary episode call a tool, and that the result file has every figure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_one_atlas_cycle_reports_tool_calls_groups_and_the_gate(tmp_path: Path, tiny_model_dir: str) -> None:
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "continual_atlas.py"), "--model", tiny_model_dir,
                          "--sessions", "2", "--canary", "2", "--results-dir", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=900, check=False,
                         env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    doc = json.loads((tmp_path / "continual_atlas.json").read_text())
    r = doc["results"]
    assert r["loop_rc"] == 0 and r["cycle"]["state"] == "decided" and r["training"]["ran"]
    assert r["replays"]["replays"] == 2 * 4 and r["replays"]["with_tool_call"] == 8  # forced first call
    assert r["replays"]["requests"]["live_reads"] >= 8 and r["replays"]["requests"]["misses"] == 0
    assert r["canary"]["episodes"] == 2 * 2 and r["canary"]["with_tool_call"] == 4
    assert r["replays"]["groups"] == 2 and 0 <= r["replays"]["groups_unequal"] <= 2
    assert r["gate"]["action"] in ("promote", "reject") and r["gate"]["summary"]
    assert set(r["phases_s"]) == {"start", "replays", "train", "load_canary_gate"}
    assert doc["config"]["group_size"] == 4 and doc["paper"]
    last = run.stdout.strip().splitlines()
    assert any(line.startswith("replays with >= 1 tool call: 8/8") for line in last)
    assert any(line.startswith("groups with unequal rewards:") for line in last)
    if r["replays"]["groups_unequal"] == 0:
        assert "MISS: every group had equal rewards" in run.stdout
