"""``SeedChatModel``: a langchain-core chat model that is token-exact and captured.

Swap it in for the chat model of any LangGraph agent and every call is rendered to token
ids client-side (the tokenizer's own chat template, tools included), sampled by a
``Backend`` (ids in, ids + logprobs out) and recorded into the active ``capture()`` scope.
That is the whole integration surface: nothing else in the user's graph changes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any, Callable

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import ConfigDict, Field

from seed_agents.capture import current_scope, record_call
from seed_agents.tool_calls import format_tool_call, parse_tool_calls
from seed_agents.types import Completion, LLMCall, Purpose, SamplingParams

_ROLES = {"system": "system", "human": "user", "ai": "assistant", "tool": "tool"}
_SAMPLING_KEYS = ("max_tokens", "temperature", "top_p", "seed")

HERMES_TOOLS_PROMPT = (
    "You may call functions to help with the request. The available functions are "
    "listed inside <tools></tools> as JSON schemas:\n<tools>\n{tools}\n</tools>\n"
    "To call a function, reply with a JSON object inside <tool_call></tool_call> tags:\n"
    '<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


def to_chat_dicts(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    """langchain messages -> the role/content dicts HF chat templates consume."""
    out: list[dict[str, Any]] = []
    for m in messages:
        role = _ROLES.get(m.type)
        if role is None:
            raise ValueError(f"unsupported message type {m.type!r}")
        content = m.content if isinstance(m.content, str) else _flatten(m.content)
        d: dict[str, Any] = {"role": role, "content": content}
        if isinstance(m, AIMessage) and m.tool_calls:
            d["tool_calls"] = [
                {"type": "function", "id": tc.get("id"), "function": {"name": tc["name"], "arguments": tc["args"]}}
                for tc in m.tool_calls
            ]
        if isinstance(m, ToolMessage):
            d["tool_call_id"] = m.tool_call_id
            if m.name:
                d["name"] = m.name
        out.append(d)
    return out


def _flatten(parts: list[Any]) -> str:
    return "".join(p if isinstance(p, str) else str(p.get("text", "")) for p in parts)


def _hermes_fallback(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """For templates that know nothing of tools (e.g. SmolLM2's ChatML): describe the tools
    in the system message and render calls/results as Hermes-style text."""
    out: list[dict[str, Any]] = []
    for d in messages:
        if d["role"] == "assistant" and d.get("tool_calls"):
            calls = "\n".join(format_tool_call(c["function"]["name"], c["function"]["arguments"]) for c in d["tool_calls"])
            out.append({"role": "assistant", "content": (d["content"] + "\n" + calls).strip()})
        elif d["role"] == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{d['content']}\n</tool_response>"})
        else:
            out.append({"role": d["role"], "content": d["content"]})
    if tools:
        block = HERMES_TOOLS_PROMPT.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + block}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out


def uses_native_tools(tokenizer: Any, tool_format: str = "auto") -> bool:
    """Whether ``tokenizer``'s chat template renders tools itself ('auto' looks)."""
    if tool_format != "auto":
        return tool_format == "native"
    return "tools" in (tokenizer.chat_template or "")


def render_chat(tokenizer: Any, messages: Sequence[BaseMessage], tools: list[dict[str, Any]] | None = None,
                tool_format: str = "auto") -> tuple[list[int], list[dict[str, Any]]]:
    """(prompt token ids, rendered message dicts): the chat template applied client-side,
    tools included. ``SeedChatModel`` and the capture gateway both render with this, so
    an agent sees the same prompt ids through either."""
    dicts = to_chat_dicts(messages)
    if uses_native_tools(tokenizer, tool_format):
        text = tokenizer.apply_chat_template(dicts, tools=tools or None, add_generation_prompt=True, tokenize=False)
    else:
        dicts = _hermes_fallback(dicts, tools)
        text = tokenizer.apply_chat_template(dicts, add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]), dicts


class SeedChatModel(BaseChatModel):
    """A chat model over a token-level ``Backend``; every call is captured.

    ``purpose`` labels the calls (``policy`` trains; ``analyzer`` writes hindsight
    skills); an enclosing ``capture(purpose=...)`` overrides it.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    backend: Any = Field(exclude=True, description="A seed_agents.backends.Backend.")
    tokenizer: Any = Field(exclude=True, description="A HF tokenizer whose chat template renders prompts.")
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    purpose: Purpose = "policy"
    tool_format: str = Field("auto", description="'native' (template renders tools), 'hermes' (we do), or 'auto'.")
    model_name: str = "seed-agents"

    @property
    def _llm_type(self) -> str:
        return "seed-agents"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model_name": self.model_name, **self.sampling.model_dump()}

    # -- rendering -----------------------------------------------------------------
    def native_tools(self) -> bool:
        """True when the tokenizer's template renders tools itself; False when we add
        them Hermes-style (then recorded messages already contain them)."""
        return uses_native_tools(self.tokenizer, self.tool_format)

    def render(self, messages: Sequence[BaseMessage], tools: list[dict[str, Any]] | None = None) -> tuple[list[int], list[dict[str, Any]]]:
        """Return (prompt token ids, rendered message dicts) for ``messages``."""
        return render_chat(self.tokenizer, messages, tools, self.tool_format)

    def _params(self, kwargs: dict[str, Any]) -> SamplingParams:
        overrides = {k: kwargs[k] for k in _SAMPLING_KEYS if kwargs.get(k) is not None}
        stop_ids = set(self.sampling.stop_token_ids)
        for tok in (self.tokenizer.eos_token_id,):
            if tok is not None:
                stop_ids.add(int(tok))
        return self.sampling.model_copy(update={**overrides, "stop_token_ids": tuple(sorted(stop_ids))})

    # -- generation ----------------------------------------------------------------
    def _finish(self, messages: list[dict[str, Any]], tools: Any, prompt_ids: list[int], params: SamplingParams, comp: Completion, t0: float) -> ChatResult:
        text = self.tokenizer.decode(comp.token_ids, skip_special_tokens=True)
        scope = current_scope()
        purpose = scope.purpose if scope is not None and scope.purpose is not None else self.purpose
        call = LLMCall(
            messages=messages, tools=tools, prompt_ids=prompt_ids, completion_ids=comp.token_ids,
            logprobs=comp.logprobs, text=text, policy_version=comp.policy_version, purpose=purpose,
            finish_reason=comp.finish_reason, latency_s=time.perf_counter() - t0, sampling=params,
        )
        record_call(call)
        content, tool_calls, invalid = parse_tool_calls(text) if tools else (text, [], [])
        msg = AIMessage(
            content=content,
            tool_calls=tool_calls,
            invalid_tool_calls=invalid,
            response_metadata={
                "call_id": call.call_id, "finish_reason": comp.finish_reason,
                "policy_version": comp.policy_version, "model_name": self.model_name,
            },
            usage_metadata={
                "input_tokens": len(prompt_ids), "output_tokens": len(comp.token_ids),
                "total_tokens": len(prompt_ids) + len(comp.token_ids),
            },
        )
        return ChatResult(generations=[ChatGeneration(message=msg)])

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        _reject_stop(stop)
        tools = kwargs.get("tools")
        t0 = time.perf_counter()
        prompt_ids, dicts = self.render(messages, tools)
        params = self._params(kwargs)
        comp = self.backend.generate(prompt_ids, params)
        return self._finish(dicts, tools, prompt_ids, params, comp, t0)

    async def _agenerate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                         run_manager: AsyncCallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        _reject_stop(stop)
        tools = kwargs.get("tools")
        t0 = time.perf_counter()
        prompt_ids, dicts = self.render(messages, tools)
        params = self._params(kwargs)
        comp = await self.backend.agenerate(prompt_ids, params)
        return self._finish(dicts, tools, prompt_ids, params, comp, t0)

    def bind_tools(self, tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool], *,
                   tool_choice: str | None = None, **kwargs: Any) -> Runnable[LanguageModelInput, AIMessage]:
        """Offer ``tools`` to the model. ``tool_choice`` is accepted for API compatibility
        but not enforced: the model decides whether to call a tool."""
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)


def _reject_stop(stop: list[str] | None) -> None:
    if stop:
        raise ValueError(
            "SeedChatModel does not support stop strings: a text-level cut would make the "
            "recorded token ids disagree with the returned text; use stop_token_ids in SamplingParams"
        )
