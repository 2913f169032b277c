"""seed-agents: LLM agents that improve from their own experience (SEED).

The public surface of the core: wrap a LangGraph agent's chat model with
``SeedChatModel`` and every call made inside ``capture()`` is recorded token-exactly.

Exports resolve lazily (PEP 562) so that ``seed_agents.vllm_ext`` can be imported inside
the vLLM server's own environment, which has none of our dependencies.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "JsonlSink": "seed_agents.capture", "capture": "seed_agents.capture",
    "SeedChatModel": "seed_agents.chat_model",
    **{name: "seed_agents.types" for name in
       ("Completion", "LLMCall", "Row", "SamplingParams", "StopReason", "Task", "Trajectory")},
}
__all__ = sorted(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'seed_agents' has no attribute {name!r}")
