"""`eval` and `train` exit 0 after success, run after run, with concurrent episodes.

A script or CI job reads the exit code: an abort at the interpreter's exit ("terminate
called without an active exception", status 134) after the results were written reads as
a failed run. Each command runs in its own process here, as a user runs it, several times,
since the abort was a race between the exit and the worker threads (``seed_agents.aio``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CALC_TASKS = ROOT / "configs" / "data" / "calculator_train.jsonl"
RUNS = 3
ABORTS = ("terminate called", "Fatal Python error", "Aborted")


def cli(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "true"}
    return subprocess.run([sys.executable, "-m", "seed_agents", *argv], check=False, capture_output=True, text=True,
                          timeout=600, cwd=cwd, env=env)


def assert_clean(out: subprocess.CompletedProcess[str], what: str) -> None:
    aborted = [a for a in ABORTS if a in out.stderr]
    assert out.returncode == 0 and not aborted, f"{what}: exit {out.returncode}, {aborted}\n{out.stderr[-3000:]}"


def test_eval_with_concurrent_episodes_exits_zero_every_time(tmp_path, tiny_model_dir):
    cfg = tmp_path / "eval.yaml"
    cfg.write_text(f"env_options:\n  cache_dir: {tmp_path / 'tw-cache'}\n")
    for i in range(RUNS):
        out = cli("eval", "--config", str(cfg), "--env", "textworld", "--model", tiny_model_dir, "--backend", "local",
                  "--episodes", "4", "--group", "2", "--seed", str(i), "--temperature", "0.7", "--max-turns", "3",
                  "--max-tokens", "8", "--concurrency", "4", "--out", str(tmp_path / f"eval{i}"), cwd=tmp_path)
        assert_clean(out, f"eval run {i}")
        assert json.loads((tmp_path / f"eval{i}" / "summary.json").read_text())["episodes"] == 4


def test_train_with_concurrent_episodes_exits_zero_every_time(tmp_path, tiny_model_dir):
    import yaml

    for i in range(RUNS):
        cfg = tmp_path / f"train{i}.yaml"
        cfg.write_text(yaml.safe_dump({
            "num_tasks": 4, "tasks_per_iteration": 2, "iterations": 1, "seed": i, "out": str(tmp_path / f"train{i}"),
            "graph": {"build": "seed_agents.graphs.calculator:build_react_calculator", "tasks": str(CALC_TASKS),
                      "reward": "seed_agents.graphs.calculator:calculator_reward", "input": "messages"},
            "backend": {"kind": "local", "model": tiny_model_dir},
            "sampling": {"max_tokens": 8, "temperature": 1.0},
            "runner": {"group_size": 2, "concurrency": 4, "progress": False},
            "skills": {"source": "self", "max_tokens": 16, "answer_format": "described"},
            "trainer": {"learning_rate": 1e-3},
        }))
        out = cli("train", "--config", str(cfg), cwd=tmp_path)
        assert_clean(out, f"train run {i}")
        assert (tmp_path / f"train{i}" / "metrics.jsonl").exists()
