"""bench/demo_speed.py: the two sides' settings, and what it computes from their runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import demo_speed  # noqa: E402
from seed_agents.config import TrainConfig  # noqa: E402


def test_the_before_side_switches_off_every_reuse_and_keeps_the_demo_otherwise():
    before = TrainConfig.model_validate(demo_speed.demo_config(demo_speed.side_overrides("before", "auto")))
    now = TrainConfig.model_validate(demo_speed.demo_config(demo_speed.side_overrides("now", "auto")))
    assert (before.backend.precision, before.backend.reuse_kv) == ("float32", False)
    assert (before.trainer.chunk_tokens, before.trainer.share_prefix) == (0, False)
    assert (now.backend.precision, now.backend.reuse_kv, now.trainer.chunk_tokens, now.trainer.share_prefix) \
        == ("auto", True, 8192, True)
    # nothing else differs from the embedded demo (TrainConfig's defaults)
    demo = TrainConfig()
    for cfg in (before, now):
        assert cfg.model_copy(update={"backend": demo.backend, "trainer": demo.trainer}) == demo


def test_iterations_start_from_one_model_and_the_ratios_read_against_the_goals(tmp_path, monkeypatch, capsys):
    calls = []

    def build_stage1(side, work, precision, log):
        calls.append(("stage1", side))
        return {"collect_s": 40.0 if side == "before" else 30.0, "sft_s": 60.0 if side == "before" else 10.0,
                "stage1_s": 100.0 if side == "before" else 40.0, "process_s": 1.0, "model": f"/{side}-model",
                "parse_rate_after": 1.0, "episodes": 16}

    def iterate(side, work, precision, model, repeat, log):
        calls.append(("iter", side, model, repeat))
        s = 200.0 if side == "before" else 90.0
        return {"time/step_s": s, "time/sync_s": 0.0, "time/rollout_s": s / 2, "time/score_s": 1.0, "iteration_s": s,
                "process_s": s + 5}

    monkeypatch.setattr(demo_speed, "build_stage1", build_stage1)
    monkeypatch.setattr(demo_speed, "iterate", iterate)
    demo_speed.main(["--repeats", "2", "--results-dir", str(tmp_path / "results"), "--work", str(tmp_path / "w")])
    assert calls == [("stage1", "before"), ("stage1", "now"), ("iter", "before", "/before-model", 0),
                     ("iter", "now", "/before-model", 0), ("iter", "now", "/before-model", 1),
                     ("iter", "before", "/before-model", 1)]
    doc = json.loads((tmp_path / "results" / "demo_speed.json").read_text())
    r = doc["results"]
    assert r["iteration_ratio"] == pytest.approx(0.45) and r["iteration_verdict"] == "missed by 0.05"
    assert r["stage1_ratio"] == pytest.approx(0.4) and r["stage1_verdict"] == "met"
    assert "model" not in r["stage1"]["before"]  # a folder of this machine stays out of the file
    assert doc["config"]["before"] == demo_speed.BEFORE
    assert "ratio 0.45 (goal <= 0.4: missed by 0.05)" in capsys.readouterr().out


def test_no_stage1_needs_a_model(capsys):
    with pytest.raises(SystemExit):
        demo_speed.main(["--no-stage1"])
    assert "--no-stage1 needs --model" in capsys.readouterr().err
