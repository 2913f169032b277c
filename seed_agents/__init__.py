"""seed-agents: LLM agents that improve from their own experience (SEED).

The public surface of the core: wrap a LangGraph agent's chat model with
``SeedChatModel`` and every call made inside ``capture()`` is recorded token-exactly.

``SeedChatModel`` resolves lazily (PEP 562) so that ``seed_agents.vllm_ext`` can be
imported inside the vLLM server's own environment, which has pydantic but not LangChain.
"""

from __future__ import annotations

from typing import Any

# Eager on purpose: binding the function here keeps ``seed_agents.capture`` the function,
# not the submodule of the same name that any later import would otherwise expose.
from seed_agents.capture import JsonlSink, capture
from seed_agents.types import Completion, LLMCall, Row, SamplingParams, StopReason, Task, Trajectory

__all__ = [
    "Completion", "JsonlSink", "LLMCall", "Row", "SamplingParams", "SeedChatModel", "StopReason",
    "Task", "Trajectory", "capture",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "SeedChatModel":
        from seed_agents.chat_model import SeedChatModel

        return SeedChatModel
    raise AttributeError(f"module 'seed_agents' has no attribute {name!r}")
