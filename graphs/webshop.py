"""The WebShop agent: the generic env agent with a shopping system prompt and the
protocol's defaults (15 steps, the last 2 turns in each prompt)."""

from __future__ import annotations

from typing import Any, Literal

from seed_agents.graphs.env_agent import build_env_agent

SYSTEM_PROMPT = (
    "You are shopping on a website for the item described in the instruction. Each turn "
    "you see the current page, with clickable buttons in [brackets], and a numbered list "
    "of valid commands. Answer with exactly one command and nothing else:\n"
    "- search[your keywords] on the search page, e.g. search[red cotton t-shirt];\n"
    "- click[button] to click a button of the page, e.g. click[B07ABC1234] to open a "
    "product, click[large] to choose an option, click[< Prev] to go back.\n"
    "Open a product that matches the instruction, click each option the instruction asks "
    "for, then click[Buy Now]. Respect the price limit."
)


def build_webshop_agent(llm: Any, *, max_turns: int = 15, history: Literal["window", "chat"] = "window",
                        history_window: int = 2, system_prompt: str = SYSTEM_PROMPT) -> Any:
    """Compile the WebShop agent graph; ``llm`` is any langchain chat model."""
    return build_env_agent(llm, max_turns=max_turns, history=history, history_window=history_window,
                           system_prompt=system_prompt)
