"""seed-agents: LLM agents that improve from their own experience (SEED).

The public surface of the core: wrap a LangGraph agent's chat model with
``SeedChatModel`` and every call made inside ``capture()`` is recorded token-exactly.
"""

from seed_agents.capture import JsonlSink, capture
from seed_agents.chat_model import SeedChatModel
from seed_agents.types import Completion, LLMCall, Row, SamplingParams, StopReason, Task, Trajectory

__all__ = [
    "Completion", "JsonlSink", "LLMCall", "Row", "SamplingParams", "SeedChatModel", "StopReason",
    "Task", "Trajectory", "capture",
]
__version__ = "0.1.0"
