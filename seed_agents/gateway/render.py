"""OpenAI chat requests -> prompt token ids, exactly as ``SeedChatModel`` renders them.

The gateway does not re-implement the chat template: OpenAI message dicts become
langchain messages (``convert_to_messages``, the same conversion LangChain applies to
dict input) and ``render_chat`` (what ``SeedChatModel`` renders with) turns them into token ids, tools included
(native template tools, or the Hermes fallback for templates that know none). So an agent
behind the gateway and the same agent on ``SeedChatModel`` see identical prompt ids.

``tool_choice`` is honoured the way ``SeedChatModel.bind_tools`` honours it: "none" offers
no tools, "auto" (the default) lets the model choose under a grammar in which
``<tool_call>`` opens only a valid call to a sent tool, "required" and a named tool
prefill the start of a call and constrain the rest to that call (``forced_tool_prefix``,
``backends.grammar.tool_call_tag``; vLLM gets the grammar as
``structured_outputs.structural_tag``). A forced reply therefore always parses as a call
unless ``max_tokens`` cuts it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

import jinja2
from langchain_core.messages import AIMessage, convert_to_messages
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from seed_agents.backends.grammar import tool_call_tag
from seed_agents.chat_model import forced_tool_prefix, render_chat
from seed_agents.gateway.errors import bad_request
from seed_agents.tool_calls import parse_tool_calls
from seed_agents.types import SamplingParams

# Accepted for client compatibility, with no effect on sampling or capture.
_IGNORED = {"user", "parallel_tool_calls", "metadata", "store", "service_tier", "stream_options"}


class ChatRequest(BaseModel):
    """The honoured part of an OpenAI chat request; other fields must be absent or default."""

    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    seed: int | None = None
    n: int | None = None

    @property
    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))


def parse_request(data: Any) -> ChatRequest:
    """Validate a decoded JSON body; anything we would silently not honour is a 400."""
    if not isinstance(data, dict):
        raise bad_request("the request body must be a JSON object")
    try:
        req = ChatRequest.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(x) for x in first["loc"]) or "(body)"
        raise bad_request(f"invalid request: {loc}: {first['msg']}", code="invalid_request") from None
    if req.n not in (None, 1):
        raise bad_request("n > 1 is not supported: send one request per sample", code="unsupported_parameter")
    unsupported = sorted(k for k, v in (req.model_extra or {}).items() if k not in _IGNORED and v not in (None, False, 0, "", [], {}))
    if unsupported:
        raise bad_request(
            f"unsupported parameter(s): {', '.join(unsupported)}. The capture gateway honours temperature, top_p, "
            f"max_tokens/max_completion_tokens, seed and n=1 (a stop string would cut the text away from the sampled token ids)",
            code="unsupported_parameter",
        )
    for i, m in enumerate(req.messages):
        _check_content(i, m.get("content"))
    for i, t in enumerate(req.tools or []):
        if t.get("type") != "function" or not isinstance(t.get("function"), dict) or not isinstance(t["function"].get("name"), str):
            raise bad_request(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., 'parameters': ...}}}}")
    tool_choice_of(req)  # a malformed choice is a 400 before anything runs
    return req


def tool_choice_of(req: ChatRequest) -> str | None:
    """OpenAI's ``tool_choice`` in ``SeedChatModel``'s terms: None (auto), "none", "any"
    (OpenAI's "required") or a tool's name; a 400 when it is malformed or names no sent tool."""
    choice = req.tool_choice
    names = [t["function"]["name"] for t in req.tools or []]
    if choice is None or choice == "auto":
        return None
    if choice == "none":
        return "none"
    if choice == "required":
        name = "any"
    elif isinstance(choice, dict) and choice.get("type") == "function" and isinstance((choice.get("function") or {}).get("name"), str):
        name = choice["function"]["name"]
    else:
        raise bad_request('tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}',
                          code="invalid_tool_choice")
    if not names:
        raise bad_request("tool_choice forces a tool call, but the request sends no tools", code="invalid_tool_choice")
    if name != "any" and name not in names:
        raise bad_request(f"tool_choice names {name!r}, which is not among the request's tools ({', '.join(names)})",
                          code="invalid_tool_choice")
    return name


def _check_content(i: int, content: Any) -> None:
    if content is None or isinstance(content, str):
        return
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return
    raise bad_request(f"messages[{i}].content: only text (a string or text parts) is supported")


@dataclass
class Reply:
    """What the client sees of a completion: content and OpenAI-format tool calls."""

    content: str | None
    tool_calls: list[dict[str, Any]]

    @property
    def finish_override(self) -> Literal["tool_calls"] | None:
        return "tool_calls" if self.tool_calls else None


def parse_reply(text: str, has_tools: bool) -> Reply:
    """The client's view of ``text``, as ``SeedChatModel`` builds its ``AIMessage``.

    Without tools the text is the content, untouched. With tools, ``<tool_call>`` blocks
    become OpenAI tool calls and leave the content; when every block is malformed the
    content is the whole text, so the agent sees what the model wrote (an OpenAI reply
    has no place for invalid calls).
    """
    if not has_tools:
        return Reply(text, [])
    content, calls, invalid = parse_tool_calls(text)
    if invalid and not calls:
        return Reply(text.strip(), [])
    tool_calls = [
        {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": json.dumps(c["args"], ensure_ascii=False)}}
        for c in calls
    ]
    return Reply(content if content or not tool_calls else None, tool_calls)


class Renderer:
    """Chat template rendering and (de)tokenization for one tokenizer.

    Not thread-safe (HF fast tokenizers mutate state per call): use it from the event
    loop only, where calls never overlap.
    """

    def __init__(self, tokenizer: Any, tool_format: Literal["auto", "native", "hermes"] = "auto") -> None:
        self.tokenizer = tokenizer
        self.tool_format = tool_format
        eos = tokenizer.eos_token_id
        self.stop_token_ids: tuple[int, ...] = () if eos is None else (int(eos),)

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
               prefix: str = "") -> tuple[list[int], list[dict[str, Any]]]:
        """(prompt ids, rendered message dicts) or a 400 naming what the template rejected.
        ``prefix``: a forced call's prefill, continued as the assistant's turn (as
        ``SeedChatModel`` renders it)."""
        # OpenAI lets an assistant message that calls tools omit ``content``; LangChain's
        # converter needs the key (None is fine), so it is added here and only here.
        messages = [{**m, "content": None} if m.get("role") == "assistant" and m.get("tool_calls") and "content" not in m
                    else m for m in messages]
        try:
            lc = convert_to_messages(messages)
            if prefix:
                lc = [*lc, AIMessage(prefix)]
            return render_chat(self.tokenizer, lc, tools, self.tool_format, continue_final=bool(prefix))
        except (ValueError, TypeError, KeyError) as e:
            raise bad_request(f"cannot render these messages: {_first_line(e)}", code="invalid_messages") from None
        except jinja2.TemplateError as e:
            raise bad_request(f"the model's chat template rejected these messages: {_first_line(e)}", code="invalid_messages") from None

    def decode(self, ids: list[int]) -> str:
        """Completion text as ``SeedChatModel`` records it (special tokens dropped)."""
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def sampling(self, req: ChatRequest, default_max_tokens: int, max_tokens_limit: int, *,
                 tools: list[dict[str, Any]] | None = None, prefix: str = "") -> SamplingParams:
        """The request's sampling; with ``tools``, constrained to ``tool_call_tag(tools, prefix)``
        (``SeedChatModel``'s grammar), so a call the client gets is a call to a sent tool."""
        max_tokens = req.max_completion_tokens or req.max_tokens or default_max_tokens
        if max_tokens > max_tokens_limit:
            raise bad_request(f"max_tokens {max_tokens} exceeds this gateway's limit of {max_tokens_limit}", code="max_tokens_too_large")
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            seed=req.seed,
            stop_token_ids=self.stop_token_ids,
            structural_tag=tool_call_tag(tools, prefix) if tools else None,
        )


def forced_prefix(choice: str | None, tools: list[dict[str, Any]] | None) -> str:
    """The prefill of a forced call ("" when the model chooses), as ``SeedChatModel`` writes it."""
    try:
        return forced_tool_prefix(choice, tools)
    except ValueError as e:
        raise bad_request(str(e), code="invalid_tool_choice") from None


def _first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0][:300]
