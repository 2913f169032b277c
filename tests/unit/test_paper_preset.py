"""The paper's settings are one switch away (``train --preset paper``), whatever the defaults
become: the preset holds the paper's coefficients, configs/paper.yaml is the preset, every
configs/paper_*.yaml agrees with it, and it sits under the --config YAML and the flags."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from seed_agents.app.cli import _parser, build_train_config
from seed_agents.config import PAPER, PAPER_LEARNING_RATE, PAPER_PRESET, TrainConfig, load_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_the_paper_preset_holds_the_papers_coefficients():
    cfg = load_config(TrainConfig, None, {}, preset=PAPER_PRESET)
    t = cfg.trainer
    assert (t.opd_coef, t.gate_sharpness, t.kl_coef, t.entropy_coef, t.clip_eps) == (
        PAPER.lam, PAPER.gate_sharpness, PAPER.kl, PAPER.entropy, PAPER.clip_eps) == (0.01, 5.0, 0.01, 0.001, 0.2)
    assert (t.learning_rate, t.lr_schedule, t.lora_r, t.max_grad_norm, t.advantage_norm) == (
        PAPER_LEARNING_RATE, "linear", None, 1.0, "mean_std") and PAPER_LEARNING_RATE == 1e-6
    assert (t.guide_share, cfg.skills.failures, cfg.sampling.temperature) == (0.0, "write", 1.0)
    assert (cfg.stage1.temperature, cfg.stage1.epochs, cfg.stage1.learning_rate, cfg.stage1.lora_r) == (0.4, 3.0, 5e-6, None)


def test_the_preset_agrees_with_the_trainers_own_defaults():
    """SEEDConfig (the TRL arguments) defaults to the paper: the preset must say the same."""
    pytest.importorskip("trl")
    from seed_agents.trainers.seed_trainer import SEEDConfig

    defaults = {f.name: f.default for f in dataclasses.fields(SEEDConfig)}
    t = PAPER_PRESET["trainer"]
    assert (t["opd_coef"], t["gate_sharpness"], t["kl_coef"], t["entropy_coef"], t["clip_eps"], t["learning_rate"]) == (
        defaults["opd_coef"], defaults["gate_sharpness"], defaults["beta"], defaults["entropy_coef"], defaults["epsilon"],
        defaults["learning_rate"])


def test_configs_paper_yaml_is_the_preset():
    assert yaml.safe_load((CONFIGS / "paper.yaml").read_text()) == PAPER_PRESET


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("paper_*.yaml")), ids=lambda p: p.stem)
def test_every_paper_config_follows_the_preset(path):
    """Stage 1 aside (it runs on a local TextWorld backend only; these serve through vLLM)."""
    cfg = load_config(TrainConfig, path, {}).model_dump()
    for section, values in PAPER_PRESET.items():
        if section == "stage1":
            continue
        for key, value in values.items():
            assert cfg[section][key] == value, f"{path.name}: {section}.{key}"


def test_the_preset_sits_under_the_config_and_the_flags(tmp_path):
    own = tmp_path / "mine.yaml"
    own.write_text("trainer:\n  learning_rate: 1.0e-3\nsampling:\n  max_tokens: 32\n")
    args = _parser().parse_args(["train", "--preset", "paper", "--config", str(own), "--trainer.kl-coef", "0.02"])
    cfg = build_train_config(args)
    assert cfg.trainer.learning_rate == 1e-3 and cfg.trainer.kl_coef == 0.02  # the file, then the flag, win
    assert (cfg.trainer.opd_coef, cfg.trainer.lora_r, cfg.trainer.lr_schedule) == (0.01, None, "linear")  # the preset
    assert (cfg.sampling.max_tokens, cfg.sampling.temperature) == (32, 1.0)  # a section merges key by key
    bare = build_train_config(_parser().parse_args(["train", "--env", "textworld"]))
    assert bare == TrainConfig()  # no preset: the defaults (naming a task source leaves the main job out)
    with pytest.raises(SystemExit):
        _parser().parse_args(["train", "--preset", "nope"])


def test_a_command_lines_flags_never_reach_the_next_command(tmp_path):
    """The main job and the presets are module-level mappings laid under each command's
    config: one call's flags merged into a shared section leaked into the next call."""
    first = build_train_config(_parser().parse_args(["train", "--trainer.report-to", "tensorboard",
                                                     "--base-url", "http://127.0.0.1:9", "--preset", "paper"]))
    assert first.trainer.report_to == ["tensorboard"] and first.backend.base_url
    for argv in (["train"], ["train", "--preset", "paper"]):
        again = build_train_config(_parser().parse_args(argv))
        assert again.trainer.report_to == [] and again.backend.base_url == TrainConfig().backend.base_url
