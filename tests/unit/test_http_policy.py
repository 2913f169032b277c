"""The one HTTP retry policy (``seed_agents.http``) and its two clients: what is retried
(connection errors, 408, 429, 5xx), what is not (other 4xx), how long it waits (jittered
exponential backoff, Retry-After first, both capped), and that the vLLM backend and the
OpenAI-compatible analyzer follow it against a scripted server."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import pytest
from langchain_core.messages import HumanMessage

from seed_agents.backends.base import BackendError, BackendUnavailable
from seed_agents.backends.vllm import VLLMBackend
from seed_agents.http import (
    RetryableResponse,
    RetryPolicy,
    retry_after_seconds,
    retryable_status,
)
from seed_agents.stage1.analyzers import OpenAIChatAnalyzer
from seed_agents.testing import SKILL_JSON, ScriptedServer
from seed_agents.types import SamplingParams

COMPLETION = json.dumps({"choices": [{"token_ids": [5, 6], "finish_reason": "stop",
                                      "logprobs": {"token_logprobs": [-0.1, -0.2]}}]}).encode()
CHAT = json.dumps({"choices": [{"message": {"content": SKILL_JSON}}], "usage": {"prompt_tokens": 3,
                                                                                "completion_tokens": 2}}).encode()


def error(status: int, message: str, headers: dict[str, str] | None = None) -> tuple:
    body = json.dumps({"error": {"message": message}}).encode()
    return (status, "application/json", body, headers or {})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the policy ------------------------------------------------------------------------------------


@pytest.mark.parametrize("status,retried", [(408, True), (429, True), (500, True), (502, True), (503, True),
                                            (504, True), (400, False), (401, False), (403, False), (404, False),
                                            (409, False), (422, False), (200, False)])
def test_which_statuses_are_retried(status, retried):
    assert retryable_status(status) is retried


def test_retry_after_seconds_and_http_dates():
    assert retry_after_seconds("2.5") == 2.5 and retry_after_seconds("-3") == 0.0
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:10 GMT", now=1445412480.0) == 10.0
    assert retry_after_seconds(None) is None and retry_after_seconds("soon") is None


def waits(policy: RetryPolicy, errors: list[BaseException]) -> list[float]:
    """The sleeps ``policy`` takes on a call that raises ``errors`` in turn, then succeeds."""
    slept: list[float] = []
    it = iter(errors)

    def call() -> str:
        e = next(it, None)
        if e is not None:
            raise e
        return "ok"

    assert policy.retrying(sleep=slept.append)(call) == "ok"
    return slept


def test_backoff_is_exponential_with_full_jitter_and_capped():
    policy = RetryPolicy(max_retries=6, backoff_s=1.0, max_backoff_s=5.0)
    runs = [waits(policy, [httpx.ConnectError("refused")] * 6) for _ in range(200)]
    for k, cap in enumerate([1.0, 2.0, 4.0, 5.0, 5.0, 5.0]):
        at_k = [r[k] for r in runs]
        assert all(0.0 <= w <= cap for w in at_k), k  # never above backoff_s * 2**k, nor the cap
        assert max(at_k) > 0.8 * cap and min(at_k) < 0.2 * cap  # jittered over the whole range
    assert len({tuple(r) for r in runs}) == len(runs)  # clients that failed together do not retry together


def test_retry_after_wins_over_the_backoff_and_is_capped():
    policy = RetryPolicy(max_retries=3, backoff_s=100.0, max_backoff_s=7.0)
    assert waits(policy, [RetryableResponse(429, "slow down", retry_after=0.25),
                          RetryableResponse(503, "busy", retry_after=60.0)]) == [0.25, 7.0]


def test_gives_up_after_max_retries_and_reraises_the_last_error():
    calls = []

    def call() -> None:
        calls.append(1)
        raise RetryableResponse(503, f"busy {len(calls)}")

    with pytest.raises(RetryableResponse, match="busy 3"):
        RetryPolicy(max_retries=2, backoff_s=0.0).retrying(sleep=lambda s: None)(call)
    assert len(calls) == 3


def test_other_errors_are_never_retried():
    calls = []

    def call() -> None:
        calls.append(1)
        raise ValueError("a 400, or a bug")

    with pytest.raises(ValueError):
        RetryPolicy(max_retries=5, backoff_s=0.0).retrying(sleep=lambda s: None)(call)
    assert len(calls) == 1


def test_the_async_twin_follows_the_same_policy():
    slept: list[float] = []
    calls = []

    async def sleep(s: float) -> None:
        slept.append(s)

    async def call() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise RetryableResponse(429, "later", retry_after=0.5)
        return "ok"

    assert asyncio.run(RetryPolicy(max_retries=3).aretrying(sleep=sleep)(call)) == "ok"
    assert slept == [0.5, 0.5] and len(calls) == 3


# -- the vLLM backend -----------------------------------------------------------------------------


def backend(url: str, **kw) -> VLLMBackend:
    return VLLMBackend(url, "m", **{"max_retries": 3, "backoff_s": 0.01, **kw})


@pytest.mark.parametrize("status", [408, 429, 500, 503])
def test_vllm_retries_408_429_and_5xx(status):
    server = ScriptedServer.replaying([error(status, "busy"), (200, "application/json", COMPLETION)])
    try:
        for call in (lambda b: b.generate([1, 2], SamplingParams(max_tokens=2)),
                     lambda b: asyncio.run(b.agenerate([1, 2], SamplingParams(max_tokens=2)))):
            server.requests.clear()
            assert call(backend(server.url)).token_ids == [5, 6]
    finally:
        server.close()


def test_vllm_honours_retry_after_on_429():
    server = ScriptedServer.replaying([error(429, "slow down", {"Retry-After": "0.4"}),
                                       (200, "application/json", COMPLETION)])
    try:
        t0 = time.monotonic()
        assert backend(server.url).generate([1], SamplingParams(max_tokens=2)).token_ids == [5, 6]
        assert time.monotonic() - t0 >= 0.38  # waited as told, not the 10 ms backoff
    finally:
        server.close()


def test_vllm_never_retries_other_4xx_and_quotes_the_server():
    server = ScriptedServer.replaying([error(400, "prompt too long")])
    try:
        with pytest.raises(BackendError, match="HTTP 400.*prompt too long") as info:
            backend(server.url).generate([1], SamplingParams(max_tokens=2))
        assert not isinstance(info.value, BackendUnavailable) and len(server.requests) == 1
    finally:
        server.close()


def test_vllm_gives_up_with_its_own_error_lines():
    server = ScriptedServer.replaying([error(503, "overloaded")])
    try:
        with pytest.raises(BackendError, match=r"failed 3 times; last answer HTTP 503: overloaded"):
            backend(server.url, max_retries=2).generate([1], SamplingParams(max_tokens=2))
        assert len(server.requests) == 3
    finally:
        server.close()
    dead = backend(f"http://127.0.0.1:{free_port()}", max_retries=1)
    with pytest.raises(BackendUnavailable, match="cannot reach the vLLM server.*2 attempts"):
        dead.generate([1], SamplingParams(max_tokens=2))
    with pytest.raises(BackendUnavailable, match="circuit open"):  # the breaker: no new retries for a while
        asyncio.run(dead.agenerate([1], SamplingParams(max_tokens=2)))


# -- the OpenAI-compatible analyzer ----------------------------------------------------------------


def analyze(url: str, **kw) -> object:
    analyzer = OpenAIChatAnalyzer(url, "judge", **{"backoff_s": 0.01, "max_retries": 3, **kw})

    async def go() -> object:
        try:
            return await analyzer.analyze([HumanMessage("episode")])
        finally:
            await analyzer.aclose()
    return asyncio.run(go())


def test_the_analyzer_follows_the_same_policy():
    server = ScriptedServer.replaying([error(408, "timeout"), error(429, "later", {"Retry-After": "0.3"}),
                                       error(502, "bad gateway"), (200, "application/json", CHAT)])
    try:
        t0 = time.monotonic()
        reply = analyze(server.url)
        assert reply.error is None and reply.text == SKILL_JSON and reply.attempts == 4
        assert time.monotonic() - t0 >= 0.28
    finally:
        server.close()
    server = ScriptedServer.replaying([error(422, "bad field")])
    try:
        reply = analyze(server.url)
        assert reply.attempts == 1 and "HTTP 422 (not retried)" in reply.error and "bad field" in reply.error
    finally:
        server.close()
