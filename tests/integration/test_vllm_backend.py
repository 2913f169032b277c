"""``VLLMBackend`` against a real vLLM server on CPU, plus its failure modes.

The conformance suite runs against the session server (tiny random model); the error
paths run against a closed port and a tiny stub HTTP server, so they take milliseconds.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from seed_agents.backends.base import BackendError, BackendUnavailable
from seed_agents.backends.vllm import VLLMBackend
from seed_agents.serve import VLLMServer
from seed_agents.testing import ScriptedServer
from seed_agents.types import SamplingParams
from tests.conformance import BackendConformance

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tiny_reference_model(tiny_model_dir: str) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tiny_prompt_ids(tiny_model_dir: str) -> list[int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    messages = [{"role": "user", "content": "Go north, then take the key."}]
    return list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))


class TestVLLMConformance(BackendConformance):
    @pytest.fixture
    def backend(self, vllm_backend: VLLMBackend) -> VLLMBackend:
        return vllm_backend

    @pytest.fixture
    def reference_model(self, tiny_reference_model: Any) -> Any:
        return tiny_reference_model

    @pytest.fixture
    def prompt_ids(self, tiny_prompt_ids: list[int]) -> list[int]:
        return tiny_prompt_ids


_Served = tuple[VLLMBackend, Any, list[int]]


@pytest.fixture(scope="module")
def smollm2_served(smollm2_vllm_server: VLLMServer, smollm2_dir: str) -> Iterator[_Served]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    backend = VLLMBackend(smollm2_vllm_server.url, smollm2_vllm_server.served_model_name, max_retries=2)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    messages = [{"role": "user", "content": "You are in a kitchen with a fridge. What do you do first?"}]
    ids = list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))
    yield backend, model, ids
    backend.close()


@pytest.mark.slow
class TestVLLMConformanceSmolLM2(BackendConformance):
    """The same suite on real weights, where logits are peaked and kernels work harder."""

    @pytest.fixture
    def backend(self, smollm2_served: _Served) -> VLLMBackend:
        return smollm2_served[0]

    @pytest.fixture
    def reference_model(self, smollm2_served: _Served) -> Any:
        return smollm2_served[1]

    @pytest.fixture
    def prompt_ids(self, smollm2_served: _Served) -> list[int]:
        return smollm2_served[2]


def test_server_reports_url_and_health(vllm_server: VLLMServer, vllm_backend: VLLMBackend) -> None:
    assert vllm_server.is_running()
    assert vllm_server.startup_s is not None and vllm_server.startup_s > 0
    assert vllm_backend.health()


def test_score_rejects_empty_prompt(vllm_backend: VLLMBackend) -> None:
    with pytest.raises(ValueError):
        vllm_backend.score([], [1, 2])


def test_unknown_model_is_a_backend_error_with_the_servers_message(vllm_server: VLLMServer) -> None:
    backend = VLLMBackend(vllm_server.url, "no-such-model", max_retries=0)
    with pytest.raises(BackendError, match="no-such-model") as info:
        backend.generate([1, 2, 3], SamplingParams(max_tokens=2))
    assert not isinstance(info.value, BackendUnavailable)
    backend.close()


# -- failure modes without a real server --------------------------------------------


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_unreachable_server_is_backend_unavailable_quickly() -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    backend = VLLMBackend(url, "m", max_retries=2, backoff_s=0.01)
    started = time.perf_counter()
    with pytest.raises(BackendUnavailable) as info:
        backend.generate([1, 2, 3], SamplingParams(max_tokens=2))
    assert time.perf_counter() - started < 5.0
    assert url in str(info.value) and "seed-agents serve" in str(info.value)
    assert not backend.health()
    backend.close()


async def test_unreachable_server_async() -> None:
    backend = VLLMBackend(f"http://127.0.0.1:{_closed_port()}", "m", max_retries=1, backoff_s=0.01)
    with pytest.raises(BackendUnavailable):
        await backend.agenerate([1, 2, 3], SamplingParams(max_tokens=2))
    with pytest.raises(BackendUnavailable):
        await backend.ascore([1, 2, 3], [4])
    await backend.aclose()


@pytest.fixture
def stub_factory() -> Iterator[Any]:
    stubs: list[ScriptedServer] = []

    def make(answers: list[tuple[int, dict[str, Any]]]) -> ScriptedServer:
        stubs.append(ScriptedServer.replaying([(status, "application/json", json.dumps(body).encode())
                                               for status, body in answers]))
        return stubs[-1]

    yield make
    for s in stubs:
        s.close()


_OK = {
    "choices": [
        {
            "index": 0,
            "text": "ab",
            "token_ids": [5, 6],
            "logprobs": {"token_logprobs": [-0.5, -1.25], "tokens": ["a", "b"]},
            "finish_reason": "length",
        }
    ]
}
_ERR_500 = {"error": {"message": "engine hiccup", "type": "InternalServerError", "code": 500}}
_ERR_400 = {"error": {"message": "max_tokens must be at least 1", "type": "BadRequestError", "code": 400}}


def test_5xx_is_retried_then_succeeds(stub_factory: Any) -> None:
    stub = stub_factory([(500, _ERR_500), (200, _OK)])
    backend = VLLMBackend(stub.url, "m", max_retries=2, backoff_s=0.01, policy_version=4)
    c = backend.generate([1, 2, 3], SamplingParams(max_tokens=2, temperature=0.5, seed=9, stop_token_ids=(2,)))
    assert c.token_ids == [5, 6] and c.logprobs == [-0.5, -1.25]
    assert c.finish_reason == "length" and c.policy_version == 4
    assert len(stub.requests) == 2
    sent = stub.requests[-1]
    assert sent["prompt"] == [1, 2, 3] and sent["model"] == "m"
    assert sent["logprobs"] == 0 and sent["return_token_ids"] is True and sent["skip_special_tokens"] is False
    assert sent["seed"] == 9 and sent["stop_token_ids"] == [2] and sent["temperature"] == 0.5
    backend.close()


async def test_5xx_is_retried_async(stub_factory: Any) -> None:
    stub = stub_factory([(503, _ERR_500), (200, _OK)])
    backend = VLLMBackend(stub.url + "/v1/", "m", max_retries=1, backoff_s=0.01)
    c = await backend.agenerate([1], SamplingParams(max_tokens=2))
    assert c.token_ids == [5, 6] and len(stub.requests) == 2
    await backend.aclose()


def test_persistent_5xx_is_a_backend_error_quoting_the_server(stub_factory: Any) -> None:
    stub = stub_factory([(500, _ERR_500)])
    backend = VLLMBackend(stub.url, "m", max_retries=2, backoff_s=0.01)
    with pytest.raises(BackendError, match="engine hiccup") as info:
        backend.generate([1], SamplingParams(max_tokens=2))
    assert not isinstance(info.value, BackendUnavailable)
    assert len(stub.requests) == 3
    backend.close()


def test_4xx_is_not_retried_and_carries_the_message(stub_factory: Any) -> None:
    stub = stub_factory([(400, _ERR_400), (200, _OK)])
    backend = VLLMBackend(stub.url, "m", max_retries=3, backoff_s=0.01)
    with pytest.raises(BackendError, match="max_tokens must be at least 1") as info:
        backend.generate([1], SamplingParams(max_tokens=2))
    assert not isinstance(info.value, BackendUnavailable)
    assert len(stub.requests) == 1
    backend.close()


def test_score_parses_prompt_logprobs(stub_factory: Any) -> None:
    body = {
        "choices": [
            {
                "token_ids": [0],
                "finish_reason": "length",
                "prompt_logprobs": [
                    None,
                    {"8": {"logprob": -2.0, "rank": 3}},
                    {"9": {"logprob": -0.25, "rank": 1}},
                    {"9": {"logprob": -0.75, "rank": 2}, "4": {"logprob": -0.1, "rank": 1}},
                ],
            }
        ]
    }
    stub = stub_factory([(200, body)])
    backend = VLLMBackend(stub.url, "m", max_retries=0)
    assert backend.score([7, 8], [9, 9]) == [-0.25, -0.75]
    sent = stub.requests[-1]
    assert sent["prompt"] == [7, 8, 9, 9] and sent["prompt_logprobs"] == 0 and sent["max_tokens"] == 1
    backend.close()
