"""Parse tool calls out of model text (the Hermes / Qwen ``<tool_call>`` JSON format).

A small model often writes malformed calls; those come back as *invalid* tool calls with
the reason, never as an exception, so the agent graph can feed the error back or stop.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def _call_id() -> str:
    return "call_" + uuid.uuid4().hex[:12]


def parse_tool_calls(text: str) -> tuple[str, list[dict[str, Any]], list[dict[str, Any]]]:
    """Split ``text`` into (content, tool_calls, invalid_tool_calls).

    ``tool_calls`` items are langchain ``ToolCall`` dicts (name, args, id);
    ``invalid_tool_calls`` items carry the raw text in ``args`` and an ``error``.
    ``content`` is the text with the tool-call blocks removed.
    """
    calls: list[dict[str, Any]] = []
    invalid: list[dict[str, Any]] = []
    if "<tool_call>" not in text:
        return text.strip(), calls, invalid
    for raw in _BLOCK.findall(text):
        call_id = _call_id()
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            invalid.append({"name": None, "args": raw, "id": call_id, "error": f"not JSON: {e.msg}", "type": "invalid_tool_call"})
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
            invalid.append({"name": None, "args": raw, "id": call_id, "error": "missing string field 'name'", "type": "invalid_tool_call"})
            continue
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError:
                invalid.append({"name": obj["name"], "args": raw, "id": call_id, "error": "arguments is not a JSON object", "type": "invalid_tool_call"})
                continue
        if not isinstance(args, dict):
            invalid.append({"name": obj["name"], "args": raw, "id": call_id, "error": "arguments is not a JSON object", "type": "invalid_tool_call"})
            continue
        calls.append({"name": obj["name"], "args": args, "id": call_id, "type": "tool_call"})
    content = _BLOCK.sub("", text).strip()
    return content, calls, invalid


def tool_call_frame(name: str) -> tuple[str, str]:
    """(text before the arguments object, text after it) of a call to ``name``, exactly
    as ``format_tool_call`` writes it: the constrained-decoding grammar
    (``seed_agents.backends.grammar``) fixes these and leaves the arguments to the schema,
    so a constrained call re-renders to the same text in the next prompt."""
    return "<tool_call>\n{\"name\": " + json.dumps(name, ensure_ascii=False) + ', "arguments": ', "}\n</tool_call>"


def format_tool_call(name: str, args: dict[str, Any]) -> str:
    """The textual form a model is taught to emit (used when the template lacks tools)."""
    begin, end = tool_call_frame(name)
    return begin + json.dumps(args, ensure_ascii=False) + end


CHAT_MARKUP = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<|im_start|>", "<|im_end|>")
"""The tags a chat template writes around tool calls, tool results and turns (the Hermes
tool format, ChatML). A model that writes them in an answer is imitating its prompt: SmolLM2
sees a tool's result as a user turn ``<tool_response>\\n...\\n</tool_response>`` and, trained
on answers that quote it, learns to answer with the tags."""


_MARKUP = re.compile(r"</?\s*tool[_ ]?(?:call|response)|<\|im_(?:start|end)\|>", re.IGNORECASE)
"""``CHAT_MARKUP`` and the variants a model writes when the exact tags are denied it
(``<tool_response >``, ``<tool_response_json>``, ``</tool_response text>``): seen in a
learning run whose grammar excluded the exact tags only, and which the reward then paid."""


def carries_markup(text: str) -> bool:
    """Whether ``text`` holds any of ``CHAT_MARKUP``, or a variant of those tags: an answer
    that does is not one a user can be shown. Rewards and reports call this on the text
    exactly as the model wrote it: stripping the tags first would hide the habit from
    training and from the reader."""
    return _MARKUP.search(text) is not None
