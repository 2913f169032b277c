"""Gateway feedback: rewards, session end with verifiers, and the LLM judge.

Verifiers live in a throw-away module registered in ``sys.modules`` (they are loaded by
import path, as in a real config); the judge talks to a fake OpenAI endpoint through
``httpx.MockTransport`` with the real ``openai`` SDK.
"""

from __future__ import annotations

import json
import logging
import sys
import types
from typing import Any

import httpx
import openai
import pytest
from fastapi.testclient import TestClient

from seed_agents.gateway.app import build_app
from seed_agents.gateway.config import GatewayConfig, JudgeConfig
from seed_agents.gateway.judge import LLMJudge, parse_scores
from seed_agents.gateway.testing import FakeVLLM
from seed_agents.gateway.upstream import Upstream
from seed_agents.store import RewardPolicy, TraceStore

MODEL = "tiny"


@pytest.fixture
def verifiers(monkeypatch):
    module = types.ModuleType("gw_test_verifiers")
    module.seen = []

    def passes(session, calls):
        module.seen.append((session.session_id, session.ended_at is not None, len(calls)))
        return 1.0 if "Hello" in calls[-1].text else 0.0

    module.passes = passes
    module.no_opinion = lambda session, calls: None
    module.crashes = lambda session, calls: 1 / 0
    module.returns_text = lambda session, calls: "great"
    monkeypatch.setitem(sys.modules, "gw_test_verifiers", module)
    return module



def gateway(tokenizer: Any, store: TraceStore, **overrides: Any) -> TestClient:
    fake = FakeVLLM(tokenizer, model=MODEL)
    cfg = GatewayConfig(upstream="http://fake", model=MODEL, **overrides)
    upstream = Upstream("http://fake", MODEL, transport=fake.transport(), retries=0)
    return TestClient(build_app(cfg, store, upstream, tokenizer=tokenizer))


def new_session(c: TestClient, task_key: str | None = None, content: str = "hi") -> str:
    headers = {"X-Task-Key": task_key} if task_key else {}
    r = c.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": content}]}, headers=headers)
    assert r.status_code == 200, r.text
    return r.headers["x-session-id"]


# -- rewards -------------------------------------------------------------------------------------


def test_reward_is_stored_with_source_turn_and_comment(tokenizer, store):
    with gateway(tokenizer, store) as c:
        sid = new_session(c)
        r = c.post(f"/v1/sessions/{sid}/reward", json={"value": 0.5, "source": "user", "turn": 0, "comment": "thumbs up"})
        assert r.status_code == 200 and r.json()["session_id"] == sid
        (reward,) = store.rewards(sid)
        assert (reward.value, reward.source, reward.turn, reward.comment) == (0.5, "user", 0, "thumbs up")
        assert reward.reward_id == r.json()["reward_id"]


@pytest.mark.parametrize("body, status", [
    ({"value": "high"}, 400), ({}, 400), ({"value": 1, "turn": -1}, 400), ({"value": 1, "extra": 2}, 400),
])
def test_bad_rewards_are_400(tokenizer, store, body, status):
    with gateway(tokenizer, store) as c:
        sid = new_session(c)
        r = c.post(f"/v1/sessions/{sid}/reward", json=body)
        assert r.status_code == status and "error" in r.json()
        nan = c.post(f"/v1/sessions/{sid}/reward", content=b'{"value": NaN}', headers={"content-type": "application/json"})
        assert nan.status_code == 400
        assert store.rewards(sid) == []


def test_reward_for_unknown_session_is_404(tokenizer, store):
    with gateway(tokenizer, store) as c:
        r = c.post("/v1/sessions/nope/reward", json={"value": 1})
    assert r.status_code == 404 and r.json()["error"]["code"] == "session_not_found"


# -- who may send which source ------------------------------------------------------------------


@pytest.fixture
def role_keys(monkeypatch):
    monkeypatch.setenv("SEED_GATEWAY_CLIENT_KEYS", "client-key")
    monkeypatch.setenv("SEED_GATEWAY_FEEDBACK_KEYS", "feedback-key")
    monkeypatch.setenv("SEED_GATEWAY_VERIFIER_KEYS", "verifier-key")
    monkeypatch.setenv("SEED_GATEWAY_ADMIN_KEYS", "admin-key")


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.parametrize("key, asked, stored", [
    ("feedback-key", None, "user"), ("feedback-key", "user", "user"),
    ("feedback-key", "verifier", 403), ("feedback-key", "judge", 403), ("feedback-key", "env", 403),
    ("verifier-key", None, "verifier"), ("verifier-key", "verifier", "verifier"), ("verifier-key", "user", 403),
    ("admin-key", None, "user"), ("admin-key", "verifier", "verifier"), ("admin-key", "env", "env"),
    ("client-key", "user", 403),
])
def test_reward_source_is_what_the_key_may_send(tokenizer, store, role_keys, key, asked, stored):
    with gateway(tokenizer, store) as c:
        r = c.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
                   headers=bearer("client-key"))
        sid = r.headers["x-session-id"]
        body = {"value": 0.25} if asked is None else {"value": 0.25, "source": asked}
        r = c.post(f"/v1/sessions/{sid}/reward", json=body, headers=bearer(key))
    if stored == 403:
        err = r.json()["error"]
        assert r.status_code == 403 and err["type"] == "permission_error" and err["message"]
        assert err["code"] == ("forbidden" if key == "client-key" else "reward_source_forbidden")
        assert store.rewards(sid) == []
    else:
        assert r.status_code == 200 and r.json()["source"] == stored
        assert [(x.source, x.value) for x in store.rewards(sid)] == [(stored, 0.25)]


def test_open_gateway_takes_user_rewards_only_but_its_verifiers_still_count(tokenizer, store, verifiers):
    with gateway(tokenizer, store, verifiers=["gw_test_verifiers:passes"]) as c:
        sid = new_session(c)
        forged = c.post(f"/v1/sessions/{sid}/reward", json={"value": 0.0, "source": "verifier"})
        assert forged.status_code == 403 and forged.json()["error"]["code"] == "reward_source_forbidden"
        assert c.post(f"/v1/sessions/{sid}/reward", json={"value": 0.0}).json()["source"] == "user"
        assert c.post(f"/v1/sessions/{sid}/end").status_code == 200
    assert [(r.source, r.value) for r in store.rewards(sid)] == [("user", 0.0), ("verifier", 1.0)]
    assert store.session_reward(sid) == 1.0  # the in-gateway verifier, not a forged one, decides


# -- end and verifiers ------------------------------------------------------------------------------


def test_end_runs_verifiers_and_stores_their_rewards(tokenizer, store, verifiers):
    with gateway(tokenizer, store, verifiers=["gw_test_verifiers:passes", "gw_test_verifiers:no_opinion"]) as c:
        sid = new_session(c)
        c.post(f"/v1/sessions/{sid}/reward", json={"value": 0.0, "source": "user"})
        r = c.post(f"/v1/sessions/{sid}/end")
        assert r.status_code == 200
        out = r.json()
        assert out["ended"] and not out["already_ended"]
        assert [v["verifier"] for v in out["verifiers"]] == ["gw_test_verifiers:passes", "gw_test_verifiers:no_opinion"]
        assert out["verifiers"][0]["value"] == 1.0 and "value" not in out["verifiers"][1]
        again = c.post(f"/v1/sessions/{sid}/end").json()
    assert again["already_ended"] and verifiers.seen == [(sid, True, 1)]  # ran once, on the ended session
    assert [(r.source, r.value) for r in store.rewards(sid)] == [("user", 0.0), ("verifier", 1.0)]
    # precedence is the store's RewardPolicy: verifier over user by default
    assert store.session_reward(sid) == 1.0
    assert store.session_reward(sid, RewardPolicy(precedence=["user", "verifier"])) == 0.0


def test_a_failing_verifier_is_a_counted_fault_not_a_lost_session(tokenizer, store, verifiers, caplog):
    paths = ["gw_test_verifiers:crashes", "gw_test_verifiers:returns_text", "gw_test_verifiers:passes"]
    with caplog.at_level(logging.WARNING, logger="seed_agents.gateway"), gateway(tokenizer, store, verifiers=paths) as c:
        sid = new_session(c)
        r = c.post(f"/v1/sessions/{sid}/end")
        stats = c.get("/v1/admin/stats").json()
    assert r.status_code == 200
    crash, text, ok = r.json()["verifiers"]
    assert "ZeroDivisionError" in crash["error"] and "TypeError" in text["error"] and ok["value"] == 1.0
    assert store.get_session(sid).ended_at is not None
    assert [r.source for r in store.rewards(sid)] == ["verifier"]
    assert stats["verifier_errors"] == 2
    lines = [rec.getMessage() for rec in caplog.records if "verifier" in rec.getMessage()]
    assert len(lines) == 2 and all("\n" not in line for line in lines)


def test_bad_verifier_path_fails_at_build(tokenizer, store):
    with pytest.raises(ValueError, match="cannot import"):
        gateway(tokenizer, store, verifiers=["no_such_module_xyz:fn"])


def test_end_unknown_session_is_404(tokenizer, store):
    with gateway(tokenizer, store) as c:
        assert c.post("/v1/sessions/nope/end").status_code == 404


# -- the judge --------------------------------------------------------------------------------------


class FakeJudgeEndpoint:
    """An OpenAI chat endpoint that answers with ``reply`` (or fails with ``status``)."""

    def __init__(self, reply: str = "", status: int = 200) -> None:
        self.reply = reply
        self.status = status
        self.requests: list[dict[str, Any]] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(json.loads(request.content))
        if self.status != 200:
            return httpx.Response(self.status, json={"error": {"message": "judge down"}})
        return httpx.Response(200, json={
            "id": "x", "object": "chat.completion", "created": 0, "model": "judge",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": self.reply}, "finish_reason": "stop"}],
        })

    def judge(self, cfg: JudgeConfig, redact: Any = lambda s: s) -> LLMJudge:
        client = openai.OpenAI(base_url="http://judge.test/v1", api_key="judge-key", max_retries=0,
                               http_client=httpx.Client(transport=httpx.MockTransport(self.handler)))
        return LLMJudge(cfg, client=client, redact=redact)


JUDGE_CFG = {"base_url": "http://judge.test", "model": "judge-model"}


def ended_group(c: TestClient, task_key: str, n: int) -> list[str]:
    sids = [new_session(c, task_key, content=f"attempt {i}") for i in range(n)]
    for sid in sids:
        assert c.post(f"/v1/sessions/{sid}/end").status_code == 200
    return sids


def test_judge_scores_a_group_relative_to_each_other(tokenizer, store):
    endpoint = FakeJudgeEndpoint('Sure: {"scores": {"A": 0.9, "B": 0.1, "C": 0.5}, "reason": "A solved it"}')
    with gateway(tokenizer, store, judge=JUDGE_CFG) as c:
        gw = c.app.state.gateway
        gw.judge = endpoint.judge(gw.cfg.judge, gw.redactor.text)
        sids = ended_group(c, "task-1", 3)
        new_session(c, "task-1")  # not ended: not judged
        r = c.post("/v1/tasks/task-1/judge")
        assert r.status_code == 200, r.text
        out = r.json()
        again = c.post("/v1/tasks/task-1/judge").json()
    assert out["stored"] and out["error"] is None and out["sessions"] == sids
    assert out["scores"] == {sids[0]: 0.9, sids[1]: 0.1, sids[2]: 0.5}
    (request,) = endpoint.requests
    prompt = request["messages"][1]["content"]
    assert "Attempt A" in prompt and "attempt 0" in prompt and "attempt 2" in prompt and request["model"] == "judge-model"
    for sid, value in zip(sids, (0.9, 0.1, 0.5), strict=True):
        (reward,) = store.rewards(sid)
        assert reward.source == "judge" and reward.value == value
        comment = json.loads(reward.comment)
        assert comment["prompt"] == prompt and comment["reply"].startswith("Sure:") and comment["group"] == sids
    assert again["stored"] is False and "candidate" in again["error"]  # judged sessions are not judged twice


@pytest.mark.parametrize("reply", [
    "I think A is best.", '{"scores": {"A": 0.9}}', '{"scores": {"A": 0.9, "B": 1.7}}', '{"scores": [0.9, 0.1]}', "",
])
def test_unparsable_judge_reply_stores_nothing(tokenizer, store, reply):
    endpoint = FakeJudgeEndpoint(reply)
    with gateway(tokenizer, store, judge=JUDGE_CFG) as c:
        gw = c.app.state.gateway
        gw.judge = endpoint.judge(gw.cfg.judge)
        sids = ended_group(c, "t", 2)
        out = c.post("/v1/tasks/t/judge").json()
    assert out["stored"] is False and "not the expected JSON" in out["error"]
    assert all(store.rewards(s) == [] for s in sids)


def test_judge_endpoint_failure_stores_nothing(tokenizer, store):
    endpoint = FakeJudgeEndpoint(status=500)
    with gateway(tokenizer, store, judge=JUDGE_CFG) as c:
        gw = c.app.state.gateway
        gw.judge = endpoint.judge(gw.cfg.judge)
        sids = ended_group(c, "t", 2)
        out = c.post("/v1/tasks/t/judge").json()
    assert "judge endpoint failed" in out["error"] and all(store.rewards(s) == [] for s in sids)


def test_judge_skips_flagged_sessions_and_auto_runs_on_end(tokenizer, store):
    endpoint = FakeJudgeEndpoint('{"scores": {"A": 1.0, "B": 0.0}}')
    with gateway(tokenizer, store, judge={**JUDGE_CFG, "auto_group_size": 2}) as c:
        gw = c.app.state.gateway
        gw.judge = endpoint.judge(gw.cfg.judge)
        flagged = new_session(c, "auto", content="my key sk-abcdefghijklmnopqrstuvwx")
        c.post(f"/v1/sessions/{flagged}/end")
        first = ended_group(c, "auto", 1)
        assert store.rewards(first[0]) == []  # one candidate (the flagged one does not count): no run yet
        second = ended_group(c, "auto", 1)
    assert [r.source for r in store.rewards(first[0])] == ["judge"] and store.rewards(second[0])[0].value == 0.0
    assert store.rewards(flagged) == [] and len(endpoint.requests) == 1


def test_no_judge_configured_is_404(tokenizer, store):
    with gateway(tokenizer, store) as c:
        r = c.post("/v1/tasks/t/judge")
    assert r.status_code == 404 and r.json()["error"]["code"] == "no_judge"


def test_parse_scores():
    assert parse_scores('```json\n{"scores": {"A": 1, "B": 0.25}}\n```', ["A", "B"]) == {"A": 1.0, "B": 0.25}
    assert parse_scores('{"scores": {"A": true, "B": 0.2}}', ["A", "B"]) is None
    assert parse_scores('{"scores": {"A": NaN, "B": 0.2}}', ["A", "B"]) is None
    assert parse_scores("no json", ["A"]) is None
