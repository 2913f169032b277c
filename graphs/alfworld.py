"""The ALFWorld agent: the env agent with a household-robot prompt and the paper's defaults.

The paper's protocol: the admissible actions in every prompt, the last 5 (observation,
action) pairs as history, at most 30 steps. Parsing, invalid actions and the history
layouts are ``graphs.env_agent``'s; only the prompt and the defaults live here.
"""

from __future__ import annotations

from typing import Any, Literal

from seed_agents.graphs.env_agent import build_env_agent

SYSTEM_PROMPT = (
    "You are an expert household robot acting in a text-based home (ALFWorld). Each turn you "
    "see what you observe and a numbered list of the actions admissible now. Complete the task "
    "given after \"Your task is to:\" in as few steps as possible. Answer with exactly one action "
    "from the list, copied exactly, and nothing else."
)
MAX_TURNS = 30
HISTORY_WINDOW = 5


def build_alfworld_agent(
    llm: Any,
    *,
    max_turns: int = MAX_TURNS,
    history: Literal["window", "chat"] = "window",
    history_window: int = HISTORY_WINDOW,
    system_prompt: str = SYSTEM_PROMPT,
) -> Any:
    """Compile the ALFWorld agent graph (input ``{"task": Task}``, env in ``configurable``)."""
    return build_env_agent(llm, max_turns=max_turns, history=history, history_window=history_window,
                           system_prompt=system_prompt)
