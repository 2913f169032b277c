"""bench/run_memory.py: each side is its own training process, reports its own peak, and
the two sides train the same batches."""

import argparse
import json

import pytest

pytest.importorskip("trl")

from bench import run_memory  # noqa: E402


@pytest.mark.slow  # whole training processes, one a side: the benchmarks' tier, not the default suite's budget
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


@pytest.mark.slow  # whole training processes, one a side: the benchmarks' tier, not the default suite's budget
def test_phases_report_the_main_jobs_peak_per_phase_beside_trl_on_the_same_tokens(tiny_model_dir, tmp_path, capsys):
    from seed_agents.memory import PeakRSS

    if not PeakRSS().reset():
        pytest.skip("needs Linux's /proc/self/clear_refs")
    run_memory.main(["--phases", "--model", tiny_model_dir, "--updates", "1", "--group", "2", "--heldout", "2",
                     "--results-dir", str(tmp_path)])
    doc = json.loads((tmp_path / "run_memory_phases.json").read_text())
    ours, trl = doc["results"]["ours"], doc["results"]["trl"]
    assert set(ours["phase_peak_gb"]) == {"rollout", "score", "update", "eval"}
    assert all(0.1 < v <= ours["process_peak_gb"] for v in ours["phase_peak_gb"].values())
    assert len(ours["updates"]) == 1 and ours["trl_batch_iteration"] == 0 and len(ours["evals"]) == 1
    assert 0.1 < trl["phase_peak_gb"]["score"] and 0.1 < trl["phase_peak_gb"]["update"] <= trl["process_peak_gb"]
    # TRL trained on the update's own rows: as many, and their prompt and sampled tokens
    assert trl["rows"] == ours["updates"][0]["rows"]
    assert trl["num_tokens"] == doc["results"]["batch_tokens"]
    ratio = doc["results"]["ours_over_trl"]
    assert ratio["update"] == pytest.approx(ours["updates"][0]["update"] / trl["phase_peak_gb"]["update"], rel=1e-4)
    assert doc["config"]["main_job"]["trainer"]["guide_share"] == 0.5
    assert "ours/TRL on that batch" in capsys.readouterr().out


def test_the_main_jobs_config_and_a_given_one(tmp_path):
    args = argparse.Namespace(model="smollm2-135m", updates=3, seed=1, group=8, heldout=100, config=None)
    config = run_memory.main_job_config(args, tmp_path, tmp_path / "out")
    assert config["graph"]["build"] == "examples.atlas_tasks:build_auto_agent" and config["iterations"] == 3
    assert (config["trainer"]["lora_r"], config["trainer"]["learning_rate"], config["trainer"]["lr_schedule"]) \
        == (8, 1e-3, "constant")
    assert config["skills"] == {"source": "self", "max_tokens": 64, "failures": "skip"}
    assert (config["sampling"]["temperature"], config["backend"]["max_batch_size"]) == (0.5, 32)
    assert config["eval"]["num_tasks"] == 100 and config["eval"]["every"] == 3
    assert len((tmp_path / "atlas_train_l0.jsonl").read_text().splitlines()) == 200
    given = tmp_path / "mine.yaml"
    given.write_text("num_tasks: 5\niterations: 9\nout: elsewhere\n")
    args.config = given
    assert run_memory.main_job_config(args, tmp_path, tmp_path / "out") == \
        {"num_tasks": 5, "iterations": 3, "out": str(tmp_path / "out")}
