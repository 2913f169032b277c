"""When `seed-agents train` runs stage 1 first, and how its cache is keyed; a suite
written here (not in seed_agents/) that offers an offline analyzer gets automatic stage 1."""

from __future__ import annotations

import json
from typing import Any

from seed_agents.config import AgentConfig, TrainConfig, with_suite_defaults
from seed_agents.envs import EnvSuite
from seed_agents.graphs.env_agent import build_env_agent
from seed_agents.stage1.analyzers import Analyzer, AnalyzerReply
from seed_agents.stage1.auto import applies, cache_key, stage1_model
from seed_agents.testing import ScriptedEnv
from seed_agents.types import EpisodeRecord, SkillExample, Task


class DoorAnalyzer(Analyzer):
    """Writes a skill from the structured turns: the commands the env took, in order."""

    name = "rule-based-doors"

    async def analyze(self, messages: Any, episode: EpisodeRecord | None = None) -> AnalyzerReply:
        assert episode is not None and episode.steps, "the suite's analyzer gets the structured episode"
        taken = [s.action for s in episode.steps if not s.invalid]
        verdict = "worked" if episode.success else "did not finish the task"
        skill = f"Send {', then '.join(taken) or 'a listed command'} in this order and nothing else."
        return AnalyzerReply(text=json.dumps({"episode_summary": f"The agent {verdict}.", "episode_skill": skill}))


class DoorSuite(EnvSuite):
    """A tiny suite defined in this test file: scripted rooms and its own offline analyzer."""

    name = "doors"

    def __init__(self, analyzer: bool = True) -> None:
        self.analyzer = analyzer

    def tasks(self, split: str, n: int) -> list[Task]:
        return [Task(task_id=f"door{i}", split=split) for i in range(n)]

    def make_env(self, task: Task) -> ScriptedEnv:
        return ScriptedEnv()

    def build_graph(self, llm: Any, **options: Any) -> Any:
        return build_env_agent(llm, **options)

    def offline_analyzer(self) -> Analyzer | None:
        return DoorAnalyzer() if self.analyzer else None


def test_stage1_applies_to_seed_on_textworld_with_the_local_backend_only():
    assert applies(TrainConfig())[0]  # the Quickstart default
    for over, why in [
        ({"stage1": {"run": "off"}}, "off"),
        ({"skills": {"source": "none"}}, "skills.source"),
        ({"skills": {"source": "frozen"}}, "skills.source"),
        ({"graph": {"build": "seed_agents.graphs.calculator:build_react_calculator", "tasks": "t.jsonl", "reward": "m:r"}},
         "skills collect"),
        ({"backend": {"kind": "vllm"}}, "serve"),
        ({"backend": {"weights": "/some/model"}}, "backend.weights"),
    ]:
        ok, reason = applies(TrainConfig.model_validate(over))
        assert not ok and why in reason, (over, reason)


def test_stage1_applies_to_any_suite_with_an_offline_analyzer():
    assert applies(TrainConfig(env="alfworld"))[0]  # ALFWorld offers one (its goal and commands are data)
    assert applies(TrainConfig(env="doors"), DoorSuite())[0]
    ok, reason = applies(TrainConfig(env="doors"), DoorSuite(analyzer=False))
    assert not ok and "offers no offline analyzer" in reason and "skills collect" in reason


def test_a_suite_from_a_test_file_gets_automatic_stage1(tmp_path, tiny_model_dir):
    """Collect with the suite's own analyzer, then SFT, then the cached model is reused:
    nothing in seed_agents/ knows this suite."""
    cfg = TrainConfig.model_validate({
        "env": "doors", "backend": {"model": tiny_model_dir}, "runner": {"progress": False, "group_size": 2},
        "stage1": {"num_tasks": 2, "group_size": 2, "epochs": 1, "cache_dir": str(tmp_path / "cache")},
        "agent": {"max_turns": 2}, "sampling": {"max_tokens": 4}, "skills": {"max_tokens": 16},
    })
    logs: list[str] = []
    model_dir = stage1_model(cfg, logs.append, suite=DoorSuite())
    assert model_dir is not None and (model_dir / "config.json").is_file()
    root = model_dir.parents[1]
    assert (root / "DONE").is_file() and "doors's offline analyzer" in logs[-1]
    examples = [SkillExample.model_validate_json(line)
                for line in (root / "collect" / "examples.jsonl").read_text().splitlines()]
    assert len(examples) == 4 and {e.analyzer for e in examples} == {"rule-based-doors"}
    assert all(e.valid for e in examples)
    assert stage1_model(cfg, logs.append, suite=DoorSuite()) == model_dir and "cached" in logs[-1]


def _key(over: dict, model: str = "/m") -> str:
    """The stage-1 key of the demo's config with ``over``, in fp32 unless ``over`` names a
    format: the default (`auto`) resolves per machine, and the test must not."""
    backend = {"precision": "float32", **over.get("backend", {})}
    return cache_key(TrainConfig.model_validate({**over, "backend": backend}), model)


def test_cache_key_changes_with_every_setting_that_changes_the_model():
    base = _key({})
    assert base == _key({})
    assert base == _key({"iterations": 50, "trainer": {"learning_rate": 1e-3}})  # RL settings don't matter
    for over in [{"stage1": {"epochs": 1}}, {"stage1": {"num_tasks": 3}}, {"stage1": {"temperature": 1.0}},
                 {"stage1": {"lora_r": 8}}, {"stage1": {"seed": 1}}, {"agent": {"max_turns": 5}}, {"sampling": {"max_tokens": 8}},
                 {"env_options": {"x": 1}}, {"backend": {"precision": "bfloat16", "attention": "same"}},
                 {"stage1": {"completion_head": False}}, {"skills": {"answer_format": "workflow"}},
                 {"skills": {"failures": "skip"}},
                 {"backend": {"precision": "bfloat16", "attention": "float32"}}]:
        assert _key(over) != base, over
    assert _key({}, "/other") != base
    # fp32 attention is bf16's option: in fp32 it changes nothing, so neither does the key
    assert _key({"backend": {"attention": "float32"}}) == base
    bf16_attn = _key({"backend": {"precision": "bfloat16", "attention": "float32"}})
    bf16_same = _key({"backend": {"precision": "bfloat16", "attention": "same"}})
    assert bf16_attn != bf16_same
    # a model cached before attention had `auto` (explicit bf16, attention left at its default
    # then, `same`) keeps its key: the key names attention only when it is fp32
    assert bf16_same == cache_key(TrainConfig.model_validate({"backend": {"precision": "bfloat16", "attention": "same"}}), "/m")
    # `auto` is keyed by what it resolves to on this machine, attention included: the default
    # shares a model with the explicit settings it picks (bf16 where the CPU has it, fp32 elsewhere)
    import torch

    from seed_agents.precision import resolve_attention, resolve_precision

    dtype = resolve_precision("auto")[0]
    default = cache_key(TrainConfig(), "/m")
    if dtype == torch.float32:
        assert default == base
    else:
        assert default == (bf16_attn if resolve_attention("auto", dtype)[0] else bf16_same)


def test_cache_key_changes_with_a_benchmarks_engine_options_under_the_keys_the_config_gave_them(monkeypatch):
    """The local backend's engine options (SEED_AGENTS_BENCH_LOCAL_ENGINE) change stage 1's
    episodes by float rounding: keyed when not the default, as the backend keys they were, so
    the models cached under those keys keep them; concat holds dynamic's numbers bit for bit."""
    from seed_agents.backends.engine import LocalEngineOptions

    base = _key({})
    for options in [{"reuse_kv": False}, {"kv_cache": "static"}, {"prefix_groups": False}, {"drop_finished": False},
                    {"kv_cache": "concat"}]:
        monkeypatch.setenv(*LocalEngineOptions(**options).as_env().popitem())
        assert (_key({}) == base) is (options == {"kv_cache": "concat"}), options
    monkeypatch.setenv(*LocalEngineOptions().as_env().popitem())
    assert _key({}) == base


def test_suite_defaults_fill_only_what_the_user_left_unset():
    defaults = {"max_turns": 30, "history": "window", "history_window": 5}
    assert with_suite_defaults(AgentConfig(), defaults, set()).model_dump() == defaults
    given = AgentConfig(max_turns=7)
    assert with_suite_defaults(given, defaults, {"max_turns"}).max_turns == 7
    assert with_suite_defaults(given, None, set()) is given



def test_build_passes_the_runs_format_and_sft_head_to_collect_and_sft(tmp_path, monkeypatch):
    from seed_agents.stage1 import auto, collect, sft

    seen = []
    monkeypatch.setattr(collect, "run_collect", lambda cfg, suite=None: seen.append(cfg) or {})
    monkeypatch.setattr(sft, "run_sft", lambda cfg: seen.append(cfg) or {})
    auto.build(TrainConfig.model_validate({"backend": {"precision": "bfloat16", "attention": "float32"},
                                           "stage1": {"completion_head": False},
                                           "skills": {"answer_format": "workflow", "failures": "skip"}}), "/m", tmp_path)
    auto.build(TrainConfig(), "/m", tmp_path)
    collected, trained, default_collected, default = seen
    assert collected.backend.precision == "bfloat16"  # the engine options reach collect's backend as the run's do
    # stage 1 trains on the prompt the run's hindsight node will ask with
    assert (collected.answer_format, default_collected.answer_format) == ("workflow", "paper")
    assert (collected.failures, default_collected.failures) == ("skip", "write")  # and only where it will ask
    assert collected.backend.attention == "float32"
    assert (trained.precision, trained.completion_head) == ("bfloat16", False)
    assert (default.precision, default.completion_head) == ("auto", True)
