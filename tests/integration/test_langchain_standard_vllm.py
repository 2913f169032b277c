"""SeedChatModel on a real vLLM server (CPU, tiny random model): LangChain's standard
integration suite, and token-exact streaming, stop strings and forced tool calls.

Same xfails, by name and reason, as the local tiny-model module (a random model cannot
write a tool call's JSON arguments). Everything else of ``ChatModelIntegrationTests``
runs against the server: streaming is vLLM's streamed ``/v1/completions`` with token ids.
Seeded requests stay serial (vLLM 0.32 on CPU crashes on concurrent seeded requests that
chunked prefill splits); the suite's concurrent batch tests are greedy.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from langchain_tests.integration_tests import ChatModelIntegrationTests
from transformers import AutoTokenizer

from seed_agents.backends.vllm import VLLMBackend, completion_body
from seed_agents.capture import capture
from seed_agents.chat_model import SeedChatModel
from seed_agents.types import SamplingParams
from tests.conformance import TINY_MODEL_XFAILS, ChatModelConformance, xfail_by_name

pytestmark = pytest.mark.integration

_MODEL: dict[str, Any] = {}


@pytest.fixture(scope="module", autouse=True)
def _served(vllm_backend: VLLMBackend, tiny_model_dir: str) -> Iterator[None]:
    _MODEL.update(backend=vllm_backend, tokenizer=AutoTokenizer.from_pretrained(tiny_model_dir))
    yield
    _MODEL.clear()


@pytest.fixture
def vllm_llm() -> SeedChatModel:
    return SeedChatModel(**_MODEL, temperature=0.0, max_tokens=24)


@xfail_by_name(TINY_MODEL_XFAILS)
class TestSeedChatModelVLLM(ChatModelIntegrationTests):
    @property
    def chat_model_class(self) -> type[SeedChatModel]:
        return SeedChatModel

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {**_MODEL, "temperature": 0.0, "max_tokens": 32}


class TestVLLMChatConformance(ChatModelConformance):
    @pytest.fixture
    def chat_model(self, vllm_llm: SeedChatModel) -> SeedChatModel:
        return vllm_llm


def test_seeded_stream_records_the_same_ids_as_invoke(vllm_llm: SeedChatModel) -> None:
    with capture() as cap:
        vllm_llm.invoke("Tell me a story.", temperature=1.0, seed=77)
        list(vllm_llm.stream("Tell me a story.", temperature=1.0, seed=77))
    a, b = cap.calls
    assert a.completion_ids == b.completion_ids and a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_client_side_stop_matches_vllms_own_stop(vllm_server: Any, vllm_llm: SeedChatModel) -> None:
    """vLLM's server-side ``stop`` (with ``return_token_ids``) keeps the ids up to and
    including the token that completes the stop string and cuts only the text, exactly
    what SeedChatModel records (we stop on the client so both backends share one rule)."""
    with capture() as cap:
        vllm_llm.invoke("Tell me a story.")
    free = cap.calls[0]
    tok = vllm_llm.tokenizer
    word = tok.decode(free.completion_ids[3:4]).strip()
    if len(word) < 2:
        pytest.skip("no multi-character token to stop on")
    stop = word[:2]
    body = completion_body(vllm_server.served_model_name, free.prompt_ids, SamplingParams(max_tokens=24, temperature=0.0))
    body["stop"] = [stop]
    server = httpx.post(f"{vllm_server.url}/v1/completions", json=body, timeout=60).json()["choices"][0]
    with capture() as cap:
        msg = vllm_llm.invoke("Tell me a story.", stop=[stop])
    ours = cap.calls[0]
    assert ours.completion_ids == server["token_ids"] and server["finish_reason"] == "stop"
    assert msg.content == server["text"]
