"""bench/run_memory.py: each side is its own training process, reports its own peak, and
the two sides train the same batches."""

import argparse
import json

import pytest

pytest.importorskip("trl")

from bench import run_memory  # noqa: E402


def test_each_side_reports_its_peak_and_both_train_the_same_batches(tiny_model_dir, tmp_path, capsys):
    run_memory.main(["--model", tiny_model_dir, "--updates", "1", "--group", "2", "--results-dir", str(tmp_path)])
    doc = json.loads((tmp_path / "run_memory.json").read_text())
    runs = doc["results"]["runs"]
    assert [r["release_memory"] for r in runs] == [True, False]
    assert all(r["peak_rss_gb"] > 0.1 and r["updates"] == 1 and r["step_s"] > 0 for r in runs)
    assert doc["results"]["same_batches"] is True and runs[0]["loss"] == runs[1]["loss"]
    assert "on/off" in capsys.readouterr().out


def test_the_side_config_is_the_curves_grpo_without_its_evaluation(tmp_path):
    args = argparse.Namespace(model="smollm2-135m", updates=3, seed=2, group=8)
    config, out = run_memory.side_config(args, tmp_path, False, 0)
    assert "eval" not in config and config["trainer"]["release_memory"] is False and config["iterations"] == 3
    assert (config["trainer"]["learning_rate"], config["trainer"]["opd_coef"], config["sampling"]["temperature"]) \
        == (3e-4, 0.0, 0.5)
    assert config["runner"]["group_size"] == 8 and config["tasks_per_iteration"] == 4
    assert config["seed"] == 2 and out == tmp_path / "off-0" and config["out"] == str(out)


def test_a_failed_side_is_one_line_naming_it(tmp_path):
    with pytest.raises(SystemExit, match="release_memory=true run failed"):
        run_memory.main(["--model", str(tmp_path / "no-such-model"), "--updates", "1", "--results-dir", str(tmp_path)])
