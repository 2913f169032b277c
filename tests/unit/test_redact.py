"""Redaction comes before truncation: a key cut in two by a length limit never leaks a part."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from langchain_core.messages import HumanMessage

from seed_agents.redact import MASK, redact
from seed_agents.stage1.analyzers import ERROR_CHARS, LangChainAnalyzer, OpenAIChatAnalyzer

KEY = "sk-TESTKEY-0123456789abcdefGHIJ"


def leaked_prefixes(text: str, secret: str = KEY, shortest: int = 4) -> list[str]:
    """Every prefix of ``secret`` of at least ``shortest`` characters that ``text`` contains."""
    return [secret[:n] for n in range(shortest, len(secret) + 1) if secret[:n] in text]


def test_literal_secrets_are_masked_longest_first():
    assert redact(f"key={KEY}!", [KEY], patterns=()) == f"key={MASK}!"
    assert redact("ab abcdefgh", ["abcd", "abcdefgh"], patterns=()) == f"ab {MASK}"
    assert redact("x marks the spot", ["x", None, ""], patterns=()) == "x marks the spot"  # not credentials


def test_max_chars_cuts_after_redacting():
    for start in range(ERROR_CHARS - len(KEY), ERROR_CHARS + 1):  # every cut that splits the key
        text = "e" * start + KEY + " and more text"
        old = text[:ERROR_CHARS].replace(KEY, MASK)  # the old order: cut, then redact
        if 4 <= ERROR_CHARS - start < len(KEY):
            assert leaked_prefixes(old), start  # the bug this guards against
        new = redact(text, [KEY], max_chars=ERROR_CHARS)
        assert len(new) <= ERROR_CHARS and not leaked_prefixes(new), (start, new[-40:])


def test_a_secret_cut_by_someone_else_loses_its_head_and_tail():
    assert redact("error: " + KEY[:9], [KEY], patterns=()) == "error: " + MASK
    assert redact(KEY[-6:] + " was rejected", [KEY], patterns=()) == MASK + " was rejected"
    assert redact("error: sk-", [KEY], patterns=()) == "error: sk-"  # 3 characters say nothing


def test_default_patterns_mask_credentials_whose_value_is_unknown():
    text = ("Authorization: Bearer abcdefghijkl0123 | sk-proj-ABCDEFGH12345678 | hf_abcdefghijklmnop | "
            "https://bob:hunter22@example.com/v1 | api_key=s3cr3tvalue&x=1 | {\"password\": \"p4ssw0rd\"}")
    out = redact(text)
    for secret in ("abcdefghijkl0123", "sk-proj-ABCDEFGH12345678", "hf_abcdefghijklmnop", "hunter22", "s3cr3tvalue",
                   "p4ssw0rd"):
        assert secret not in out
    assert "Bearer ***" in out and "https://bob:***@example.com/v1" in out and "api_key=***&x=1" in out


def _analyzer(monkeypatch, handler, **kw) -> OpenAIChatAnalyzer:
    monkeypatch.setenv("TEST_ANALYZER_KEY", KEY)
    a = OpenAIChatAnalyzer("http://analyzer.test", "m", api_key_env="TEST_ANALYZER_KEY", max_retries=0, **kw)
    client = httpx.AsyncClient(base_url=a.base_url, transport=httpx.MockTransport(handler))
    monkeypatch.setattr(a, "_client", lambda: client)
    return a


@pytest.mark.parametrize("status", [400, 401, 500, 200])
@pytest.mark.parametrize("shape", ["openai_json", "plain_text"])
def test_analyzer_errors_never_leak_a_key_prefix_at_the_cut(monkeypatch, status, shape):
    """The server quotes the key so that the old 300-character cut falls inside it."""
    for start in (ERROR_CHARS - 20, ERROR_CHARS - 4, ERROR_CHARS - 1, ERROR_CHARS - len(KEY) + 4):
        message = "Incorrect API key provided: " + "k" * (start - 28) + KEY + " (see the docs)"
        if status == 200:  # not a chat completion: the body is quoted back
            body = {"content": message.encode()}
        elif shape == "openai_json":
            body = {"json": {"error": {"message": message, "type": "invalid_request_error"}}}
        else:
            body = {"content": message.encode()}

        def handler(request: httpx.Request) -> httpx.Response:
            assert request.headers["authorization"] == f"Bearer {KEY}"  # the key is only ever sent here
            return httpx.Response(status, **body)

        reply = asyncio.run(_analyzer(monkeypatch, handler).analyze([HumanMessage("hi")]))
        assert reply.error is not None and not leaked_prefixes(reply.error), (status, shape, start, reply.error[-60:])


def test_langchain_provider_errors_are_redacted():
    class Provider:
        async def ainvoke(self, messages):
            raise RuntimeError(f"401: invalid key {KEY} for org-123")

    reply = asyncio.run(LangChainAnalyzer(Provider(), name="lc", max_retries=0).analyze([HumanMessage("hi")]))
    assert reply.error is not None and not leaked_prefixes(reply.error)
