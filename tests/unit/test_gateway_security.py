"""Gateway security: role keys, the upstream key, secret redaction and flagging.

The canary tests grep every byte the gateway wrote (the SQLite files, WAL included) and
every log record for the secrets.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from seed_agents.gateway import security
from seed_agents.gateway.app import build_app
from seed_agents.gateway.config import GatewayConfig, SecurityConfig
from seed_agents.gateway.security import REDACTED, KeyRing, RedactingFilter, Redactor, Role
from seed_agents.gateway.testing import FakeVLLM
from seed_agents.gateway.upstream import Upstream
from seed_agents.store import TraceStore

MODEL = "tiny"  # the conftest fake upstream serves this name
CANARY_KEY = "sk-canaryA1b2C3d4E5f6G7h8I9j0"  # matches the default sk- pattern
CANARY_ENV_VALUE = "zebra-canary-7f3e9b1c-env-value"  # only known through redact_env
HUMAN = [{"role": "user", "content": "hi"}]



def gateway(fake: FakeVLLM, store: TraceStore, tokenizer: Any, api_key: str | None = None, **overrides: Any) -> TestClient:
    cfg = GatewayConfig(upstream="http://fake", model=MODEL, **overrides)
    upstream = Upstream("http://fake", MODEL, api_key=api_key, transport=fake.transport(), retries=0)
    return TestClient(build_app(cfg, store, upstream, tokenizer=tokenizer))


def all_bytes(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file())


# -- role keys -------------------------------------------------------------------------------------


@pytest.fixture
def keyed_env(monkeypatch):
    monkeypatch.setenv("SEED_GATEWAY_CLIENT_KEYS", "client-key-1, client-key-2")
    monkeypatch.setenv("SEED_GATEWAY_FEEDBACK_KEYS", "feedback-key")
    monkeypatch.setenv("SEED_GATEWAY_ADMIN_KEYS", "admin-key")


def test_keys_by_role(fake, store, tokenizer, keyed_env, caplog):
    def auth(key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"}

    body = {"model": MODEL, "messages": HUMAN}
    with caplog.at_level(logging.DEBUG), gateway(fake, store, tokenizer) as c:
        assert c.post("/v1/chat/completions", json=body).status_code == 401
        r = c.post("/v1/chat/completions", json=body, headers=auth("wrong"))
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        ok = c.post("/v1/chat/completions", json=body, headers=auth("client-key-2"))
        assert ok.status_code == 200
        sid = ok.headers["x-session-id"]
        reward = {"value": 1.0}
        r = c.post(f"/v1/sessions/{sid}/reward", json=reward, headers=auth("client-key-1"))
        assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
        assert c.post("/v1/chat/completions", json=body, headers=auth("feedback-key")).status_code == 403
        assert c.post(f"/v1/sessions/{sid}/reward", json=reward, headers=auth("feedback-key")).status_code == 200
        assert c.post(f"/v1/sessions/{sid}/reward", json=reward, headers={"X-API-Key": "feedback-key"}).status_code == 200
        assert c.get(f"/v1/admin/sessions/{sid}", headers=auth("feedback-key")).status_code == 403
        assert c.get(f"/v1/admin/sessions/{sid}", headers=auth("admin-key")).status_code == 200
        assert c.post("/v1/chat/completions", json=body, headers=auth("admin-key")).status_code == 200
        assert c.get("/health").status_code == 200  # liveness needs no key
    logged = caplog.text
    for key in ("client-key-1", "client-key-2", "feedback-key", "admin-key"):
        assert key not in logged
    assert "no API keys configured" not in logged


def test_open_gateway_warns_once(fake, store, tokenizer, caplog):
    with caplog.at_level(logging.WARNING, logger="seed_agents.gateway"), gateway(fake, store, tokenizer) as c:
        c.post("/v1/chat/completions", json={"model": MODEL, "messages": HUMAN})
        c.post("/v1/chat/completions", json={"model": MODEL, "messages": HUMAN})
    assert caplog.text.count("no API keys configured") == 1


def test_keys_compare_in_constant_time(monkeypatch):
    seen = []
    real = security.hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        seen.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(security.hmac, "compare_digest", spy)
    ring = KeyRing({Role.CLIENT: ["short"], Role.ADMIN: ["a-much-longer-admin-key"]})
    ring.check("a-much-longer-admin-key", Role.FEEDBACK)  # admin passes everywhere
    # every configured key was compared, on equal-length digests, whatever matched
    assert seen == [(32, 32), (32, 32)]
    with pytest.raises(Exception) as e:
        ring.check("short", Role.ADMIN)
    assert e.value.status == 403


def test_verifier_keys_come_from_their_env_var_and_admit_the_reward_route_only():
    cfg = SecurityConfig(verifier_keys_env="MY_VERIFIER_KEYS")
    ring = KeyRing.from_config(cfg, environ={"MY_VERIFIER_KEYS": "v-key-1, v-key-2", "SEED_GATEWAY_ADMIN_KEYS": "adm"})
    assert ring.admit("v-key-2", Role.FEEDBACK, Role.VERIFIER) == {Role.VERIFIER}
    assert ring.admit("adm", Role.FEEDBACK, Role.VERIFIER) == {Role.ADMIN}
    for role in (Role.CLIENT, Role.FEEDBACK):  # a verifier key neither chats nor ends sessions
        with pytest.raises(Exception) as e:
            ring.check("v-key-1", role)
        assert e.value.status == 403
    assert KeyRing.from_config(SecurityConfig(), environ={}).admit(None, Role.FEEDBACK) == set()  # open: no roles
    with pytest.raises(ValidationError):
        SecurityConfig(verifier_keys_env="sk-live-abcdef0123456789")


def test_role_key_env_names_are_names_not_values():
    with pytest.raises(ValidationError) as e:
        SecurityConfig(client_keys_env="sk-live-abcdef0123456789")
    assert "sk-live" not in str(e.value).split("input_value")[0]
    with pytest.raises(ValidationError):
        GatewayConfig(upstream="http://x", model="m", upstream_api_key_env="not a name!")


# -- the upstream key ----------------------------------------------------------------------------


def test_upstream_key_goes_upstream_only(fake, store, tokenizer, tmp_path, caplog, monkeypatch):
    secret = "upstream-secret-3c1d9a77e2"
    monkeypatch.setenv("UPSTREAM_KEY_FOR_TEST", secret)
    fake.api_key = secret
    cfg = GatewayConfig(upstream="http://fake", model=MODEL, upstream_api_key_env="UPSTREAM_KEY_FOR_TEST")
    upstream = Upstream.from_env("http://fake", MODEL, cfg.upstream_api_key_env, transport=fake.transport(), retries=0)
    with caplog.at_level(logging.DEBUG), TestClient(build_app(cfg, store, upstream, tokenizer=tokenizer)) as c:
        ok = c.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": f"is {secret} safe?"}]})
        assert ok.status_code == 200
        fake.api_key = "rotated"  # the upstream now refuses the gateway's key
        refused = c.post("/v1/chat/completions", json={"model": MODEL, "messages": HUMAN})
        streamed = c.post("/v1/chat/completions", json={"model": MODEL, "messages": HUMAN, "stream": True})
    assert fake.auth_headers[0] == f"Bearer {secret}"
    assert refused.status_code == 502 and refused.json()["error"]["code"] == "upstream_auth"
    for r in (ok, refused, streamed):
        assert secret not in r.text and secret not in str(r.headers)
    assert secret.encode() not in all_bytes(tmp_path)
    assert secret not in caplog.text and secret not in repr(upstream)
    # the key is also a redaction literal: the prompt that quoted it got flagged
    assert store.get_session(ok.headers["x-session-id"]).flagged_reason == "secret"


# -- redaction and flagging ------------------------------------------------------------------------


def test_canary_secrets_never_reach_the_store_or_the_logs(fake, store, tokenizer, tmp_path, caplog, monkeypatch):
    monkeypatch.setenv("CANARY_ENV", CANARY_ENV_VALUE)
    fake.script = f"The key is {CANARY_KEY}."  # the model even echoes it back
    tools = [{"type": "function", "function": {"name": "read_config", "parameters": {"type": "object", "properties": {}}}}]
    messages = [
        {"role": "user", "content": "Read my config."},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "read_config", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": f"OPENAI_API_KEY={CANARY_KEY}\nDB_PASSWORD={CANARY_ENV_VALUE}"},
    ]
    with caplog.at_level(logging.DEBUG), gateway(fake, store, tokenizer, security={"redact_env": ["CANARY_ENV"]}) as c:
        plain = c.post("/v1/chat/completions", json={"model": MODEL, "messages": messages, "tools": tools})
        streamed = c.post("/v1/chat/completions", json={"model": MODEL, "messages": messages, "tools": tools, "stream": True},
                          headers={"X-Session-Id": "streamed"})
        fake.script = "Hello."
        clean = c.post("/v1/chat/completions", json={"model": MODEL, "messages": HUMAN})
        sid = plain.headers["x-session-id"]
        c.post(f"/v1/sessions/{sid}/reward", json={"value": 1, "comment": f"user pasted {CANARY_ENV_VALUE}"})
        exported = c.get(f"/v1/admin/sessions/{sid}").text
        stats = c.get("/v1/admin/stats").json()
    assert plain.status_code == streamed.status_code == 200
    assert CANARY_KEY in plain.text  # the client still gets its own conversation back

    written = all_bytes(tmp_path)
    for canary in (CANARY_KEY, CANARY_ENV_VALUE, CANARY_KEY[3:], CANARY_ENV_VALUE[:20]):
        assert canary.encode() not in written
        assert canary not in caplog.text and canary not in exported

    for session_id in (sid, "streamed"):
        assert store.get_session(session_id).flagged_reason == "secret"
        (call,) = store.calls(session_id)
        assert call.scope["flagged"] == "secret"
        assert REDACTED in call.text and REDACTED in call.messages[-1]["content"]
        for canary in (CANARY_KEY, CANARY_ENV_VALUE):
            assert canary not in tokenizer.decode(call.prompt_ids) and canary not in tokenizer.decode(call.completion_ids)
        assert len(call.completion_ids) == len(call.logprobs)
    assert store.get_session(clean.headers["x-session-id"]).flagged_reason is None
    assert stats["secret_calls"] == 2
    assert "flagged" in caplog.text


def test_flagged_call_ids_are_the_rendering_of_the_redacted_messages(fake, store, tokenizer):
    from seed_agents.gateway.render import Renderer

    messages = [{"role": "user", "content": f"my key: {CANARY_KEY}"}]
    with gateway(fake, store, tokenizer) as c:
        sid = c.post("/v1/chat/completions", json={"model": MODEL, "messages": messages}).headers["x-session-id"]
    (call,) = store.calls(sid)
    ids, rendered = Renderer(tokenizer).render([{"role": "user", "content": f"my key: {REDACTED}"}], None)
    assert call.prompt_ids == ids and call.messages == rendered
    assert call.completion_ids == fake.completion_ids(512)[0]  # no secret in the completion: kept as sampled


def test_redactor_defaults_and_env_values():
    r = Redactor.from_config(SecurityConfig(redact_env=["SHORT", "LONG", "MISSING"]), environ={"SHORT": "abc", "LONG": "longsecretvalue"})
    samples = {
        "sk-abcdefghijklmnop1234": True,
        "Authorization: Bearer abcdefghijklmnopqrstu": True,
        "AKIAABCDEFGHIJKLMNOP": True,
        "ghp_" + "a" * 36: True,
        "AIza" + "b" * 35: True,
        "hf_" + "c" * 34: True,
        "xoxb-1234567890-abc": True,
        "-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----": True,
        "the longsecretvalue leaked": True,
        "postgresql://app:hunter2pw@db.internal/prod": True,
        "see https://example.com/a:b and user@example.com": False,
        "abc is short and stays": False,
        "an ordinary sentence about skiing": False,
    }
    for text, secret in samples.items():
        assert r.found(text) is secret, text
        assert (REDACTED in r.text(text)) is secret
    assert r.obj({"a": ["x sk-abcdefghijklmnop1234"], "n": 3}) == {"a": [f"x {REDACTED}"], "n": 3}


def test_user_patterns_with_global_flags_combine():
    r = Redactor(["(?i)password=\\S+", "tok-[0-9]+"])
    assert r.text("PASSWORD=hunter2 and tok-123") == f"{REDACTED} and {REDACTED}"


def test_log_lines_are_redacted_before_they_are_truncated():
    r = Redactor(["sk-[A-Za-z0-9]{16,}"])
    record = logging.LogRecord("seed_agents.gateway", logging.INFO, __file__, 1, "%s%s", ("x" * 590, CANARY_KEY), None)
    RedactingFilter(r, max_chars=600).filter(record)
    message = record.getMessage()
    assert CANARY_KEY[:10] not in message  # a cut first would have left 'sk-canaryA'
    assert message.endswith("...") or message.endswith(REDACTED)
