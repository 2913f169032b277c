"""When `seed-agents train` runs stage 1 first, and how its cache is keyed."""

from seed_agents.config import AgentConfig, TrainConfig, with_suite_defaults
from seed_agents.stage1.auto import applies, cache_key


def test_stage1_applies_to_seed_on_textworld_with_the_local_backend_only():
    assert applies(TrainConfig())[0]  # the Quickstart default
    for over, why in [
        ({"stage1": {"run": "off"}}, "off"),
        ({"skills": {"source": "none"}}, "skills.source"),
        ({"skills": {"source": "frozen"}}, "skills.source"),
        ({"env": "alfworld"}, "skills collect"),
        ({"backend": {"kind": "vllm"}}, "serve"),
        ({"backend": {"weights": "/some/model"}}, "backend.weights"),
    ]:
        ok, reason = applies(TrainConfig.model_validate(over))
        assert not ok and why in reason, (over, reason)


def test_cache_key_changes_with_every_setting_that_changes_the_model():
    base = cache_key(TrainConfig(), "/m")
    assert base == cache_key(TrainConfig(), "/m")
    assert base == cache_key(TrainConfig(iterations=50, trainer={"learning_rate": 1e-3}), "/m")  # RL settings don't matter
    for over in [{"stage1": {"epochs": 1}}, {"stage1": {"num_tasks": 3}}, {"stage1": {"temperature": 1.0}},
                 {"stage1": {"lora_r": 8}}, {"stage1": {"seed": 1}}, {"agent": {"max_turns": 5}}, {"sampling": {"max_tokens": 8}},
                 {"env_options": {"x": 1}}]:
        assert cache_key(TrainConfig.model_validate(over), "/m") != base, over
    assert cache_key(TrainConfig(), "/other") != base


def test_suite_defaults_fill_only_what_the_user_left_unset():
    defaults = {"max_turns": 30, "history": "window", "history_window": 5}
    assert with_suite_defaults(AgentConfig(), defaults, set()).model_dump() == defaults
    given = AgentConfig(max_turns=7)
    assert with_suite_defaults(given, defaults, {"max_turns"}).max_turns == 7
    assert with_suite_defaults(given, None, set()) is given
