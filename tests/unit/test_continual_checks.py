"""Item by item, what ``seed-agents continual`` checks before its first replay, and the one
reward signature the loop takes (``(task, state)``, or a gateway verifier's ``(session, calls)``)."""

from __future__ import annotations

import sys

import pytest

from seed_agents.app.commands.continual import check_continual
from seed_agents.app.continual_config import ContinualConfig
from seed_agents.capture import capture
from seed_agents.errors import UserError
from seed_agents.imports import load_reward, reward_form
from seed_agents.types import LLMCall, Task


def episode_reward(task, state):
    return 1.0 if state.get("answer") == task.data["expect"] else 0.0


def session_verifier(session, calls):
    return 1.0 if calls and "09:00" in calls[-1].text and session.metadata["task"]["task_id"] == "t" else 0.0


def no_opinion(session, calls):
    return None


def wrong(answer):
    return 1.0


def test_both_reward_forms_are_recognised_and_anything_else_is_one_line():
    assert reward_form(episode_reward) == "episode" and reward_form(session_verifier) == "session"
    with pytest.raises(ValueError, match=r"^reward 'wrong' takes \(answer\); a reward takes \(task, state\)") as e:
        reward_form(wrong)
    assert "\n" not in str(e.value)


def test_a_gateway_verifier_scores_a_replay_from_its_calls():
    here = "tests.unit.test_continual_checks"
    task = Task(task_id="t", data={"question": "q", "expect": "a"})
    assert load_reward(f"{here}:episode_reward")(task, {"answer": "a"}) == 1.0  # taken as it is
    reward = load_reward(f"{here}:session_verifier")
    with capture() as cap:
        cap.record(LLMCall(messages=[], prompt_ids=[1], completion_ids=[2], logprobs=[-0.1], text="Free at 09:00."))
        assert reward(task, {"answer": "x"}) == 1.0
        assert load_reward(f"{here}:no_opinion")(task, {}) == 0.0
    assert reward(task, {}) == 0.0  # outside an episode: no calls
    with pytest.raises(ValueError, match="fits|takes"):
        load_reward(f"{here}:wrong")


def _cfg(tmp_path, **agent) -> ContinualConfig:
    (tmp_path / "canary.jsonl").write_text("")
    return ContinualConfig.model_validate({
        "store": f"sqlite:///{tmp_path}/t.db", "trainer": {"lora_r": 4},
        "backend": {"kind": "vllm", "model": "m", "base_url": "http://127.0.0.1:9"},
        "agent": {"tools": {"base_url": "http://127.0.0.1:9", "allow_hosts": ["127.0.0.1"], **agent},
                  "reward": "tests.unit.test_continual_checks:episode_reward"},
        "canary": {"tasks": str(tmp_path / "canary.jsonl")}})


def test_a_broken_training_stack_is_one_line_before_anything_runs(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "trl", None)  # `import trl` raises ImportError
    with pytest.raises(UserError, match=r"the training stack does not import: `import trl` failed"):
        check_continual(_cfg(tmp_path))


def test_an_unset_api_key_variable_is_named(tmp_path, monkeypatch):
    monkeypatch.delenv("CLINIC_KEY_FOR_TEST", raising=False)
    cfg = _cfg(tmp_path, auth={"kind": "header", "env": "CLINIC_KEY_FOR_TEST", "header": "X-Api-Key"})
    with pytest.raises(UserError, match="agent.tools.auth reads the environment variable CLINIC_KEY_FOR_TEST, which is not set"):
        check_continual(cfg)


def test_an_unreachable_vllm_server_is_named(tmp_path, monkeypatch, tiny_model_dir):
    cfg = _cfg(tmp_path)
    cfg = cfg.model_copy(update={"backend": cfg.backend.model_copy(update={"tokenizer": tiny_model_dir})})
    with pytest.raises(UserError, match="no vLLM server answers at http://127.0.0.1:9"):
        check_continual(cfg)


def test_tool_choice_turns_reach_the_agent_builder(tmp_path):
    assert _cfg(tmp_path).agent.tool_choices() == {"first_tool_choice": None}
    forced = _cfg(tmp_path).agent.model_copy(update={"tool_choice": "list_slots", "tool_choice_turns": "every"})
    assert forced.tool_choices() == {"tool_choice": "list_slots"}
