"""What a reward function is handed where the gateway and the continual loop call it, against
what docs/deploy.md says (the ``deploy:rewards`` block and the table below it) and what
``seed_agents.types`` (``Verifier``, ``EpisodeReward``) says.

The page's example is imported as a user's module, ``mypkg.rewards``; probes beside it
(``mypkg.probes``) keep what each call received and pass it on to the page's functions. At the gateway a session of two
turns (a forced tool call, then the answer) gets its task with ``PUT .../metadata`` and ends,
which runs the verifier. In the loop a session with the same task is replayed by the loop's
own replay code, the agent forced to call a tool first as well, with the page's verifier and
then its episode-form reward as ``agent.reward`` (hindsight on, so skill-writing calls exist
and the reward is asked twice). A failure here means the page, the types or the code moved
apart.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from langchain_core.messages import BaseMessage

pytest.importorskip("trl")

from seed_agents.app.continual import ContinualLoop  # noqa: E402
from seed_agents.app.continual_config import ContinualConfig  # noqa: E402
from seed_agents.gateway.app import build_app  # noqa: E402
from seed_agents.gateway.config import GatewayConfig  # noqa: E402
from seed_agents.gateway.render import forced_prefix  # noqa: E402
from seed_agents.gateway.testing import FakeVLLM  # noqa: E402
from seed_agents.gateway.upstream import Upstream  # noqa: E402
from seed_agents.store import TraceStore  # noqa: E402
from seed_agents.testing import FakeBackend  # noqa: E402
from seed_agents.tool_calls import format_tool_call  # noqa: E402
from seed_agents.types import LLMCall, SessionRecord, Task, Trajectory  # noqa: E402
from tests.clinic_service import create_app  # noqa: E402
from tests.unit.test_sandbox_reset import FakeServing  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MODEL = "tiny"
TASK = Task(task_id="book-ana", data={"question": "Please book 09:00 on 2025-03-03 for Ana.", "expect": "09:00"})
ANSWER = "Booked: Ana, 09:00 on 2025-03-03."
SLOTS_CALL = ("list_slots", {"date": "2025-03-03"})
PROBES = """
from mypkg import rewards

SEEN = []


def verifier(session, calls):
    SEEN.append((session, list(calls)))
    return rewards.verifier(session, calls)


def reward(task, state):
    SEEN.append((task, dict(state)))
    return rewards.reward(task, state)
"""


def seen() -> list[tuple[Any, Any]]:
    """What the probes were handed, in call order."""
    return importlib.import_module("mypkg.probes").SEEN  # type: ignore[no-any-return]


@pytest.fixture(autouse=True)
def mypkg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The page's example as the user's own package, importable by name as a config names it,
    with the probes beside it."""
    found = re.search(r"<!-- deploy:rewards -->\n```python\n(.*?)```", (ROOT / "docs" / "deploy.md").read_text(), re.DOTALL)
    assert found, "docs/deploy.md lost its block deploy:rewards"
    (tmp_path / "user" / "mypkg").mkdir(parents=True)
    (tmp_path / "user" / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "user" / "mypkg" / "rewards.py").write_text(found.group(1))
    (tmp_path / "user" / "mypkg" / "probes.py").write_text(PROBES)
    monkeypatch.syspath_prepend(str(tmp_path / "user"))
    for name in ("mypkg", "mypkg.rewards", "mypkg.probes"):
        monkeypatch.delitem(sys.modules, name, raising=False)


def check_rendered(calls: list[LLMCall], prefix: str) -> None:
    """The table's rows on ``calls[i].messages`` and ``.text``, for a forced call then an answer,
    rendered for SmolLM2's template (which knows no tools)."""
    forced, answer = calls
    for call in calls:
        assert all(isinstance(m, dict) and isinstance(m["role"], str) and isinstance(m["content"], str)
                   for m in call.messages)
        assert call.messages[0]["role"] == "system" and "<tools>" in call.messages[0]["content"]
    assert forced.messages[-1] == {"role": "assistant", "content": prefix}  # the prefill: the last, assistant, entry
    assert prefix + forced.text == format_tool_call(*SLOTS_CALL)  # the reply without it
    assert [m["role"] for m in answer.messages] == ["system", "user", "assistant", "user"]
    assert "<tool_call>" in answer.messages[2]["content"] and "<tool_response>" in answer.messages[3]["content"]
    assert answer.text == ANSWER


# ------------------------------------------------------------------------------ the gateway


def test_at_the_gateway_the_verifier_gets_the_stored_session_and_all_its_calls(tokenizer, tmp_path):
    store = TraceStore.open(f"sqlite:///{tmp_path / 'traces.db'}")
    fake = FakeVLLM(tokenizer, model=MODEL)
    cfg = GatewayConfig(upstream="http://fake", model=MODEL, verifiers=["mypkg.probes:verifier"])
    app = build_app(cfg, store, Upstream("http://fake", MODEL, transport=fake.transport(), retries=0), tokenizer=tokenizer)
    spec = create_app().openapi()["paths"]["/slots"]["get"]
    tools = [{"type": "function", "function": {"name": "list_slots", "description": spec["summary"], "parameters": {
        "type": "object", "properties": {"date": {"type": "string"}}, "required": ["date"]}}}]
    prefix = forced_prefix("required", tools)
    chat = [{"role": "system", "content": "You book appointments at the clinic."},
            {"role": "user", "content": TASK.data["question"]}]
    with TestClient(app) as c:
        fake.script = format_tool_call(*SLOTS_CALL)[len(prefix):]
        first = c.post("/v1/chat/completions", headers={"X-Task-Key": "book"},
                       json={"model": MODEL, "messages": chat, "tools": tools, "tool_choice": "required"})
        assert first.status_code == 200, first.text
        sid = first.headers["x-session-id"]
        (tool_call,) = first.json()["choices"][0]["message"]["tool_calls"]
        fake.script = ANSWER
        chat += [{"role": "assistant", "content": None, "tool_calls": [tool_call]},
                 {"role": "tool", "tool_call_id": tool_call["id"], "content": '{"date": "2025-03-03", "free": ["09:00"]}'}]
        second = c.post("/v1/chat/completions", headers={"X-Session-Id": sid},
                        json={"model": MODEL, "messages": chat, "tools": tools})
        assert second.status_code == 200, second.text
        assert c.put(f"/v1/sessions/{sid}/metadata", json={"task": TASK.model_dump()}).status_code == 200
        ended = c.post(f"/v1/sessions/{sid}/end").json()
    assert ended["verifiers"] == [{"verifier": "mypkg.probes:verifier", "value": 1.0, "reward_id": 1}]

    ((session, calls),) = seen()
    assert type(session) is SessionRecord and session.session_id == sid and session.task_key == "book"
    assert session.ended_at is not None
    assert set(session.metadata) == {"task", "transcript", "sampling"}  # sampling: how the deployed agent sampled
    raw = session.metadata["task"]
    assert type(raw) is dict and raw == {"task_id": "book-ana", "split": "train", "data": TASK.data}
    assert Task.model_validate(raw) == TASK
    assert all(type(call) is LLMCall for call in calls) and len(calls) == 2  # every call of the session, in order
    check_rendered(calls, prefix)
    store.close()


# ------------------------------------------------------------------------------ the loop


def forced_then_answer(tokenizer: Any) -> FakeBackend:
    """The loop's agent, forced to call ``list_slots`` first: the rest of that call, then the
    answer once a tool response is in the prompt (skill-writing calls get the answer too)."""
    def reply(prompt_ids: list[int]) -> str:
        prompt = tokenizer.decode(prompt_ids)
        if "<tool_response>" in prompt:
            return ANSWER
        return format_tool_call(*SLOTS_CALL)[len(prompt.rsplit("<|im_start|>assistant\n", 1)[1]):]
    return FakeBackend(tokenizer, reply)


def replay_once(tmp_path: Path, tiny_model_dir: str, tokenizer: Any, reward: str) -> list[Trajectory]:
    """The loop's own replays (G=2) of one session holding ``TASK``, with ``reward`` as agent.reward."""
    (tmp_path / "spec.json").write_text(json.dumps(create_app().openapi()))
    (tmp_path / "canary.jsonl").write_text(TASK.model_dump_json() + "\n")  # read at start, not played here
    cfg = ContinualConfig.model_validate({
        "name": "clinic-agent", "store": f"sqlite:///{tmp_path / 'traces.db'}", "out": str(tmp_path / "run"),
        "backend": {"kind": "local", "model": tiny_model_dir}, "sampling": {"max_tokens": 64},
        "skills": {"source": "self", "max_tokens": 16}, "trainer": {"lora_r": 4},
        "runner": {"concurrency": 2, "progress": False, "episode_timeout_s": 60},
        "agent": {"tools": {"base_url": "http://127.0.0.1:9", "allow_hosts": ["127.0.0.1"]}, "spec": str(tmp_path / "spec.json"),
                  "tool_choice": "list_slots", "max_turns": 2, "reward": reward},
        "replay": {"read_source": "recording_only"}, "group_size": 2, "canary": {"tasks": str(tmp_path / "canary.jsonl")},
    })
    loop = ContinualLoop(cfg, store=TraceStore.open(cfg.store), serving=FakeServing(forced_then_answer(tokenizer)),
                         log=lambda _: None)
    sid = loop.store.create_session("s1", task_key="book", metadata={"task": TASK.model_dump(mode="json")})
    try:
        promoted = loop.store.promoted_version("clinic-agent")
        trajs, unusable = asyncio.run(loop._replays(1, [sid], promoted))  # type: ignore[arg-type]
    finally:
        loop.close()
    assert not unusable and [t.fault for t in trajs] == [None, None], [t.error for t in trajs]
    return trajs


def test_in_a_replay_the_verifier_gets_the_task_as_a_dict_and_that_replays_policy_calls(tmp_path, tiny_model_dir, tokenizer):
    trajs = replay_once(tmp_path, tiny_model_dir, tokenizer, "mypkg.probes:verifier")
    assert [t.reward for t in trajs] == [1.0, 1.0]  # the page's verifier, adapted for replays

    prefix = forced_prefix("list_slots", [{"type": "function", "function": {"name": "list_slots"}}])
    assert len(seen()) == 4  # asked twice an episode: by the hindsight node, then by the runner
    for session, calls in seen():
        assert type(session) is SessionRecord and session.session_id == session.task_key == TASK.task_id
        assert session.metadata == {"task": TASK.model_dump(mode="json")} and type(session.metadata["task"]) is dict
        assert Task.model_validate(session.metadata["task"]) == TASK
        (traj,) = [t for t in trajs if t.calls[0].call_id == calls[0].call_id]
        assert [c.call_id for c in calls] == [c.call_id for c in traj.policy_calls]  # no skill-writing call
        assert any(c.purpose == "analyzer" for c in traj.calls)  # ... though the episode has one
        assert all(type(call) is LLMCall for call in calls)
        check_rendered(calls, prefix)


def test_in_a_replay_the_episode_form_gets_a_task_and_the_agents_final_state(tmp_path, tiny_model_dir, tokenizer):
    trajs = replay_once(tmp_path, tiny_model_dir, tokenizer, "mypkg.probes:reward")
    assert [t.reward for t in trajs] == [1.0, 1.0]
    assert len(seen()) == 4
    for task, state in seen():
        assert type(task) is Task and task == TASK
        assert state["answer"] == ANSWER
        assert state["messages"] and all(isinstance(m, BaseMessage) for m in state["messages"])
