"""The eval/train CLI is generated from the configs: every field a documented flag with its
default, today's short flags kept, defaults < YAML < flags; the paper's coefficients in one place."""

import argparse
import ast
import dataclasses
import inspect
import subprocess
import sys
import typing
import warnings
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from seed_agents.app.cli import _parser, build_eval_config
from seed_agents.app.flags import _RetiredEngineFlag
from seed_agents.config import (
    PAPER,
    ConfigError,
    EvalConfig,
    RenamedConfigKey,
    TrainConfig,
    TrainerConfig,
    agent_fields_given,
    load_config,
)

REPO = Path(__file__).resolve().parents[2]


def leaf_fields(model: type[BaseModel], prefix: str = ""):
    """(dotted path, FieldInfo) of every field that is not itself a config section."""
    for name, field in model.model_fields.items():
        sections = [a for a in (field.annotation, *typing.get_args(field.annotation))
                    if isinstance(a, type) and issubclass(a, BaseModel)]
        if sections:
            yield from leaf_fields(sections[0], f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", field


def subparser(command: str) -> argparse.ArgumentParser:
    """The parser of ``command``, e.g. "eval" or "skills collect"."""
    parser = _parser()
    for name in command.split():
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[name]
    return parser


def parse(*argv: str) -> argparse.ArgumentParser:
    return _parser().parse_args(list(argv))


def _configs():
    from seed_agents.app.commands.continual import ContinualConfig, DrillConfig, VersionChangeConfig, VersionsConfig
    from seed_agents.app.commands.observe import ReportConfig, StatusConfig
    from seed_agents.app.commands.serve import ServeConfig
    from seed_agents.app.commands.traces import ExportConfig
    from seed_agents.gateway.config import GatewayConfig
    from seed_agents.stage1.collect import CollectConfig
    from seed_agents.stage1.sft import SFTRunConfig
    from seed_agents.stage1.usefulness import UsefulnessConfig

    return {"eval": EvalConfig, "train": TrainConfig, "serve": ServeConfig, "skills collect": CollectConfig,
            "skills sft": SFTRunConfig, "skills eval": UsefulnessConfig, "gateway": GatewayConfig,
            "continual": ContinualConfig, "continual drill": DrillConfig, "versions list": VersionsConfig, "versions promote": VersionChangeConfig,
            "versions rollback": VersionChangeConfig, "status": StatusConfig, "report": ReportConfig,
            "traces export": ExportConfig}


COMMANDS = list(_configs())


def test_every_command_is_covered():
    """A new command (or subcommand) gets a config, and a row in ``_configs``."""
    def leaves(parser: argparse.ArgumentParser, prefix: str = ""):
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not any(a.required for a in subs):  # a leaf, or one that runs alone too (`continual`, beside `continual drill`)
            yield prefix.strip()
        for action in subs:
            for name, child in action.choices.items():
                yield from leaves(child, f"{prefix}{name} ")

    assert sorted(leaves(_parser())) == sorted(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_config_field_is_a_documented_flag(command):
    """``COMMAND --help`` lists every field of the command's config with its description and its default."""
    model = _configs()[command]
    parser = subparser(command)
    flags = {flag: action for action in parser._actions for flag in action.option_strings}
    help_text = " ".join(parser.format_help().split())
    for path, field in leaf_fields(model):
        flag = "--" + path.replace("_", "-")
        assert flag in flags, flag
        assert field.description, f"{command}: {path} has no description"
        assert " ".join(field.description.split())[:30] in help_text, path
        shown = " ".join((flags[flag].help or "").split())
        assert "(default: " in shown or "(required" in shown, (path, shown)
        assert "default factory" not in shown, (path, shown)
    for action in parser._actions:  # --config, --overwrite, --resume and the short flags too
        if isinstance(action, _RetiredEngineFlag):  # hidden: there only to say one line to an old command line
            continue
        assert action.help and action.help != argparse.SUPPRESS, action.option_strings


def test_help_shows_each_commands_own_defaults():
    def flag_help(command: str, flag: str) -> str:
        action = next(a for a in subparser(command)._actions if flag in a.option_strings)
        return action.help

    assert "(default: 24)" in flag_help("eval", "--sampling.max-tokens")  # EvalConfig's, not SamplingParams' 64
    assert "(default: 16)" in flag_help("train", "--sampling.max-tokens")
    assert "(default: 4)" in flag_help("train", "--runner.group-size")
    assert "(default: 5.0)" in flag_help("train", "--trainer.gate-sharpness")
    assert "(default: [])" in flag_help("train", "--trainer.report-to")


def test_todays_short_flags_still_set_their_fields(tmp_path):
    args = parse("eval", "--env", "webshop", "--split", "test", "--episodes", "6", "--group", "2", "--concurrency", "3",
                 "--episode-timeout", "9.5", "--backend", "vllm", "--model", "served", "--tokenizer", "tok",
                 "--base-url", "http://h:1", "--temperature", "0.3", "--max-tokens", "7", "--max-turns", "4",
                 "--history", "chat", "--history-window", "2", "--seed", "5", "--out", str(tmp_path / "o"))
    cfg = build_eval_config(args)
    assert (cfg.env, cfg.split, cfg.episodes, cfg.seed, cfg.out) == ("webshop", "test", 6, 5, tmp_path / "o")
    assert (cfg.runner.group_size, cfg.runner.concurrency, cfg.runner.episode_timeout_s) == (2, 3, 9.5)
    assert cfg.backend.model_dump(include={"kind", "model", "tokenizer", "base_url"}) == {
        "kind": "vllm", "model": "served", "tokenizer": "tok", "base_url": "http://h:1"}
    assert (cfg.sampling.temperature, cfg.sampling.max_tokens) == (0.3, 7)
    assert cfg.agent.model_dump() == {"max_turns": 4, "history": "chat", "history_window": 2}

    args = parse("train", "--from-store", "sqlite:///t.db", "--iterations", "2", "--backend", "vllm", "--model", "m",
                 "--base-url", "http://h:2", "--seed", "3", "--out", "runs/x", "--resume")
    cfg = load_config(TrainConfig, args.config, args.config_flags(args))
    assert cfg.store.url == "sqlite:///t.db" and (cfg.iterations, cfg.seed, str(cfg.out)) == (2, 3, "runs/x")
    assert (cfg.backend.kind, cfg.backend.model, cfg.backend.base_url) == ("vllm", "m", "http://h:2") and args.resume


def test_defaults_then_yaml_then_flags(tmp_path):
    yaml = tmp_path / "c.yaml"
    yaml.write_text("episodes: 4\nrunner:\n  group_size: 4\n  concurrency: 2\nsampling:\n  temperature: 0.2\n"
                    "env_options:\n  cache_dir: games\n")
    cfg = build_eval_config(parse("eval", "--config", str(yaml), "--group", "2", "--runner.progress",
                                  "--no-runner.progress", "--env-options", '{"seed_offset": 1}'))
    assert cfg.episodes == 4 and cfg.runner.group_size == 2  # the flag wins over the file
    assert cfg.runner.concurrency == 2 and cfg.sampling.temperature == 0.2  # the file wins over the defaults
    assert cfg.runner.progress is False and cfg.backend.model == "smollm2-135m"  # the last of two flags; a default
    assert cfg.env_options == {"cache_dir": "games", "seed_offset": 1}
    assert agent_fields_given(cfg) == set()
    assert agent_fields_given(build_eval_config(parse("eval", "--max-turns", "3"))) == {"max_turns"}
    # a section the command sets nothing in keeps the config's own default (not the section's)
    assert load_config(TrainConfig, None, parse("train").config_flags(parse("train"))).skills.max_tokens == 128


def test_paper_defaults_live_in_one_place():
    """The paper's coefficients are written once (``PAPER``); the trainer's own arguments
    default to them, and so does every config field no learning run here moved (the moved
    ones: opd_coef and the learning rate, docs/training.md, "Defaults and why")."""
    from seed_agents import distill
    from seed_agents.config import PAPER_LEARNING_RATE
    from seed_agents.trainers.seed_trainer import SEEDConfig

    trainer = TrainerConfig()
    assert (trainer.gate_sharpness, trainer.kl_coef, trainer.entropy_coef, trainer.clip_eps) == (
        PAPER.gate_sharpness, PAPER.kl, PAPER.entropy, PAPER.clip_eps) == (5.0, 0.01, 0.001, 0.2)
    assert PAPER.lam == 0.01
    defaults = {f.name: f.default for f in dataclasses.fields(SEEDConfig)}
    assert (defaults["opd_coef"], defaults["gate_sharpness"], defaults["beta"], defaults["entropy_coef"],
            defaults["epsilon"]) == (PAPER.lam, PAPER.gate_sharpness, PAPER.kl, PAPER.entropy, PAPER.clip_eps)
    assert defaults["learning_rate"] == PAPER_LEARNING_RATE == 1e-6
    assert inspect.signature(distill.gated_opd_loss).parameters["gate_sharpness"].default == PAPER.gate_sharpness
    assert distill.SEEDCoefficients() == PAPER
    # the numbers are written once: no config module repeats them as literals
    for path, paper in (("seed_agents/distill.py", {0.01, 5.0, 0.001, 0.2}),  # its 1e-6 is a std epsilon
                        ("trainers/seed_trainer.py", {0.01, 5.0, 0.001, 0.2, 1e-6})):
        literals = {node.value for node in ast.walk(ast.parse((REPO / path).read_text()))
                    if isinstance(node, ast.Constant) and isinstance(node.value, float)}
        assert not literals & paper, path


def test_seed_config_takes_every_coefficient_from_its_own_field(tmp_path):
    pytest.importorskip("trl")
    from seed_agents.app.policy import seed_config

    cfg = TrainConfig.model_validate({"trainer": {"opd_coef": 0.02, "gate_sharpness": 7.0, "kl_coef": 0.03,
                                                  "entropy_coef": 0.004, "clip_eps": 0.25, "report_to": ["tensorboard"]}})
    args = seed_config(cfg, tmp_path / "run")
    assert (args.opd_coef, args.gate_sharpness, args.beta, args.entropy_coef, args.epsilon) == (0.02, 7.0, 0.03, 0.004, 0.25)
    assert args.report_to == ["tensorboard"]
    # 0 is the ungated imitation control and reaches the trainer; below 0 is one clear error
    assert seed_config(TrainConfig.model_validate({"trainer": {"gate_sharpness": 0}}), tmp_path / "r").gate_sharpness == 0
    with pytest.raises(ValueError, match="gate_sharpness"):
        TrainConfig.model_validate({"trainer": {"gate_sharpness": -1}})


def test_the_update_layout_reaches_the_trainer_and_the_kv_reuse_the_backend(tmp_path):
    """TRL's padded layout stays one flag away (to compare against TRL); every prompt whole is
    an engine option of the local backend, for bench/demo_speed.py's old side."""
    pytest.importorskip("trl")
    from seed_agents.app.policy import seed_config
    from seed_agents.backends.engine import LocalEngineOptions

    assert (seed_config(TrainConfig(), tmp_path / "a").chunk_tokens, seed_config(TrainConfig(), tmp_path / "a").share_prefix) \
        == (8192, True)
    args = seed_config(TrainConfig.model_validate({"trainer": {"chunk_tokens": 0, "share_prefix": False}}), tmp_path / "b")
    assert (args.chunk_tokens, args.share_prefix) == (0, False)
    assert LocalEngineOptions().backend_kwargs() == {"kv_cache": "dynamic", "prefix_groups": True, "drop_finished": True}
    assert LocalEngineOptions(reuse_kv=False).backend_kwargs() == {
        "kv_cache": "dynamic", "prefix_groups": True, "drop_finished": True, "share_prefix": False, "turn_cache_bytes": 0}
    # freed heap memory goes back to the OS between a step's phases unless turned off
    assert seed_config(TrainConfig(), tmp_path / "e").release_memory
    assert not seed_config(TrainConfig.model_validate({"trainer": {"release_memory": False}}), tmp_path / "f").release_memory
    # the fused teacher reads the shared prefix's keys and values: on only with it, one clear error otherwise
    assert not seed_config(TrainConfig(), tmp_path / "c").fuse_teacher
    assert seed_config(TrainConfig.model_validate({"trainer": {"fuse_teacher": True}}), tmp_path / "d").fuse_teacher
    with pytest.raises(ValidationError, match="it needs share_prefix true"):
        TrainConfig.model_validate({"trainer": {"fuse_teacher": True, "share_prefix": False}})


@pytest.mark.parametrize(("schedule", "last_lr"), [("linear", 0.25e-3), ("constant", 1e-3)])
def test_the_learning_rate_schedule_reaches_the_trainer(tmp_path, schedule, last_lr):
    """TRL decays the learning rate to 0 over max_steps unless told otherwise: in an 8-update
    run the last steps train at a fraction of the rate the config names."""
    pytest.importorskip("trl")
    import torch
    from transformers import get_scheduler

    from seed_agents.app.policy import seed_config

    cfg = TrainConfig.model_validate({"iterations": 4, "trainer": {"learning_rate": 1e-3, "lr_schedule": schedule}})
    args = seed_config(cfg, tmp_path / "run")
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=args.learning_rate)
    sched = get_scheduler(args.lr_scheduler_type, opt, num_warmup_steps=args.get_warmup_steps(args.max_steps),
                          num_training_steps=args.max_steps)
    rates = []
    for _ in range(args.max_steps):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert rates[0] == pytest.approx(1e-3) and rates[-1] == pytest.approx(last_lr)


@pytest.mark.parametrize("on", [True, False])
def test_seed_config_switches_checkpointing_without_a_deprecation_warning(tmp_path, on):
    """transformers 5 warns on every run given the old ``gradient_checkpointing`` name."""
    pytest.importorskip("trl")
    from seed_agents.app.policy import seed_config

    cfg = TrainConfig.model_validate({"trainer": {"gradient_checkpointing": on}})
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        args = seed_config(cfg, tmp_path / "run")
    assert args.gradient_checkpointing is on  # what TRL reads


@pytest.mark.parametrize("keep_gb, passed", [("auto", None), (0.0, 0.0), (2.5, 2.5)])
def test_the_activation_budget_reaches_the_trainer(tmp_path, keep_gb, passed):
    """``trainer.keep_activations_gb``: 0 (the default) always recomputes; auto is a share of the
    free memory (None to the trainer); a negative number is refused, on the command line too."""
    pytest.importorskip("trl")
    from seed_agents.app.policy import seed_config

    cfg = TrainConfig.model_validate({"trainer": {"keep_activations_gb": keep_gb}})
    assert seed_config(cfg, tmp_path / "run").keep_activations_gb == passed
    assert TrainConfig().trainer.keep_activations_gb == 0
    assert load_config(TrainConfig, None, {"trainer.keep_activations_gb": "auto"}).trainer.keep_activations_gb == "auto"
    with pytest.raises(ValidationError, match="keep_activations_gb"):
        TrainConfig.model_validate({"trainer": {"keep_activations_gb": -1}})


def test_the_old_gate_key_still_loads_with_one_deprecation_line(tmp_path):
    yaml = tmp_path / "old.yaml"
    yaml.write_text("trainer:\n  opd_beta: 4.0\n")
    with pytest.warns(RenamedConfigKey, match="rename it to trainer.gate_sharpness"):
        assert load_config(TrainConfig, yaml, {}).trainer.gate_sharpness == 4.0
    yaml.write_text("trainer:\n  opd_beta: 4.0\n  gate_sharpness: 3.0\n")
    with warnings.catch_warnings(), pytest.raises(ConfigError, match="keep only gate_sharpness"):
        load_config(TrainConfig, yaml, {})
    yaml.write_text("trainer:\n  opd_beta: 4.0\n")
    console = subprocess.run([sys.executable, "-m", "seed_agents", "train", "--config", str(yaml), "--iterations", "0"],
                             capture_output=True, text=True, cwd=REPO, timeout=120)
    lines = console.stderr.strip().splitlines()
    assert console.returncode == 2 and len(lines) == 2, console.stderr  # the deprecation, then the one error
    assert lines[0] == ("seed-agents: warning: trainer.opd_beta is deprecated: rename it to "
                        "trainer.gate_sharpness (same meaning)")


@pytest.mark.parametrize("command", COMMANDS)
def test_the_user_config_offers_no_older_path_of_the_local_backend(command):
    """The local backend is the reference engine: its switches that only rebuilt an older, slower
    path are engine options a benchmark sets (seed_agents.backends.engine), not fields a user reads
    in --help or a config file, and no description tells history ("the path before")."""
    from seed_agents.backends.engine import LocalEngineOptions
    from seed_agents.config.core import LOCAL_ENGINE_KEYS

    fields = dict(leaf_fields(_configs()[command]))
    assert not {path for path in fields if path.rpartition(".")[2] in LOCAL_ENGINE_KEYS}
    assert not [path for path, field in fields.items() if "path before" in (field.description or "")]
    assert LOCAL_ENGINE_KEYS == LocalEngineOptions().model_dump()  # the value an old config may still name


def test_an_old_config_naming_an_engine_switch_gets_one_line(tmp_path):
    """At the value the engine runs (every old run's config.json), a warning and the key ignored;
    at another value, one error naming the key and where it went: never a traceback."""
    yaml = tmp_path / "old.yaml"
    yaml.write_text("backend:\n  reuse_kv: true\n  kv_cache: dynamic\n  precision: float32\n")
    with pytest.warns(RenamedConfigKey, match="backend reuse_kv, kv_cache: no longer settings"):
        assert load_config(TrainConfig, yaml, {}).backend.precision == "float32"
    yaml.write_text("backend:\n  kv_cache: concat\n  drop_finished: false\n")
    with pytest.raises(ConfigError, match="backend: kv_cache concat, drop_finished false: removed from the user config"):
        load_config(TrainConfig, yaml, {})
    with pytest.raises(ConfigError, match="reuse_kv false: removed from the user config.*SEED_AGENTS_BENCH_LOCAL_ENGINE"):
        load_config(EvalConfig, None, {"backend.reuse_kv": False})
    for argv, line in [(["--no-backend.drop-finished"], "seed-agents train: error: --no-backend.drop-finished: "
                                                         "drop_finished false: removed from the user config"),
                       (["--backend.kv-cache", "static"], "seed-agents train: error: --backend.kv-cache: kv_cache static: "
                                                          "removed from the user config"),
                       (["--config", str(yaml)], "seed-agents train: error: invalid ")]:
        console = subprocess.run([sys.executable, "-m", "seed_agents", "train", *argv, "--iterations", "0"],
                                 capture_output=True, text=True, cwd=REPO, timeout=120)
        assert console.returncode == 2 and len(console.stderr.strip().splitlines()) == 1, console.stderr
        assert console.stderr.startswith(line), console.stderr
    console = subprocess.run([sys.executable, "-m", "seed_agents", "train", "--backend.prefix-groups", "--iterations", "0"],
                             capture_output=True, text=True, cwd=REPO, timeout=120)
    lines = console.stderr.strip().splitlines()
    assert console.returncode == 2 and len(lines) == 2, console.stderr  # the notice, then the one error (iterations 0)
    assert lines[0] == ("seed-agents train: warning: backend prefix_groups: no longer a setting (the local backend "
                        "always runs prefix_groups true); ignored, remove it")


def test_a_benchmarks_engine_options_come_from_one_variable(monkeypatch):
    from seed_agents.backends.engine import ENGINE_ENV, LocalEngineOptions

    monkeypatch.delenv(ENGINE_ENV, raising=False)
    assert LocalEngineOptions.from_env() == LocalEngineOptions()
    options = LocalEngineOptions(kv_cache="concat", drop_finished=False)
    assert options.as_env() == {ENGINE_ENV: '{"drop_finished": false, "kv_cache": "concat"}'}
    assert LocalEngineOptions().as_env() == {ENGINE_ENV: "{}"}  # a child never inherits another side's
    monkeypatch.setenv(*options.as_env().popitem())
    assert LocalEngineOptions.from_env() == options
    monkeypatch.setenv(ENGINE_ENV, '{"kv_cache": "paged"}')
    with pytest.raises(ConfigError, match="SEED_AGENTS_BENCH_LOCAL_ENGINE: kv_cache: Input should be"):
        LocalEngineOptions.from_env()
    monkeypatch.setenv(ENGINE_ENV, "kv_cache=static")
    with pytest.raises(ConfigError, match="SEED_AGENTS_BENCH_LOCAL_ENGINE: .*give a JSON object"):
        LocalEngineOptions.from_env()


def test_building_the_cli_loads_no_model_or_trainer_stack():
    """Every command's flags (and --help) are built without transformers, torch, TRL or the
    app modules that import them (they load inside the command that runs)."""
    code = ("import sys; from seed_agents.app.cli import _parser; _parser(); "
            "print(sorted(m for m in ('transformers', 'trl', 'torch', 'seed_agents.app.train', 'seed_agents.app.policy', "
            "'seed_agents.app.continual') if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert loaded.stdout.strip() == "[]", loaded.stderr


def test_a_section_given_in_part_keeps_the_commands_other_defaults():
    """eval's sampling default is max_tokens 24 (the class says 64): one flag of the section
    must not silently bring back the class's value for the others."""
    from seed_agents.config import EvalConfig, TrainConfig, load_config

    assert load_config(EvalConfig, None, {"sampling.temperature": 0.3}).sampling.max_tokens == 24
    assert load_config(EvalConfig, None, {"sampling": {"temperature": 0.3}}).sampling.temperature == 0.3
    train = load_config(TrainConfig, None, {"sampling.temperature": 0.2})
    assert train.sampling.max_tokens == TrainConfig().sampling.max_tokens
    # agent fields stay unset, so an env suite's protocol defaults still fill them
    assert load_config(EvalConfig, None, {"agent.history": "window"}).agent.model_fields_set == {"history"}


def test_importing_the_package_loads_no_trainer_env_or_prebuilt_agent():
    """``import seed_agents`` is cheap: no TRL, torch, TextWorld, ALFWorld or LangGraph
    prebuilt agents (they load where a command needs them)."""
    code = ("import sys, seed_agents; heavy = ('trl', 'torch', 'transformers', 'textworld', 'alfworld', "
            "'langgraph.prebuilt', 'seed_agents.tools', 'seed_agents.graphs', 'seed_agents.trainers', 'seed_agents.app'); "
            "print(sorted(m for m in sys.modules if m in heavy or m.split('.')[0] in heavy[:5]))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == "[]"


@pytest.mark.parametrize(("reuse", "kv_cache", "attention"), [(True, "dynamic", "same"), (False, "static", "float32")])
def test_build_policy_gives_the_local_backend_the_kv_reuse_asked_for(tmp_path, tiny_model_dir, monkeypatch, reuse,
                                                                     kv_cache, attention):
    """A benchmark's engine options (SEED_AGENTS_BENCH_LOCAL_ENGINE) reach the backend `train` samples
    from (reuse_kv false: no shared prefix, no turn cache; the KV cache), and so does `backend.attention`
    (in bf16), there and in the backend `eval` and `collect` open."""
    pytest.importorskip("trl")
    from seed_agents.app.policy import build_policy
    from seed_agents.backends import make_backend
    from seed_agents.backends.engine import LocalEngineOptions
    from seed_agents.precision import FP32_ATTENTION

    monkeypatch.setenv(*LocalEngineOptions(reuse_kv=reuse, kv_cache=kv_cache).as_env().popitem())
    cfg = TrainConfig.model_validate({"backend": {"model": tiny_model_dir, "precision": "bfloat16", "attention": attention},
                                      "stage1": {"run": "off"}})
    for backend in (build_policy(cfg, tmp_path / "run").backend, make_backend(cfg.backend)[0]):
        assert backend.share_prefix is reuse and (backend.turn_cache.max_bytes > 0) is reuse
        assert backend.kv_cache == kv_cache
        base = backend.model.get_base_model() if hasattr(backend.model, "get_base_model") else backend.model
        assert (base.config._attn_implementation == FP32_ATTENTION) is (attention == "float32")
