"""``SeedChatModel``: a langchain-core chat model that is token-exact and captured.

Swap it in for the chat model of any LangGraph agent and every call is rendered to token
ids client-side (the tokenizer's own chat template, tools included), sampled by a
``Backend`` (ids in, ids + logprobs out) and recorded into the active ``capture()`` scope.
That is the whole integration surface: nothing else in the user's graph changes.

It behaves like any LangChain chat model: ``invoke``/``ainvoke``/``batch``, token
streaming (``stream``/``astream``, and LangGraph's ``stream_mode="messages"``), ``stop``
sequences, ``bind_tools`` with ``tool_choice`` and ``with_structured_output``. Each call
is recorded once, complete, when it finishes; see ``seed_agents.reply`` for how stop
strings and streamed deltas stay token-exact, and ``SeedChatModel`` for ``tool_choice``.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Callable,
    Generator,
    Iterator,
    Sequence,
)
from dataclasses import dataclass, field
from typing import Any

from langchain_core.callbacks import (
    AsyncCallbackManagerForLLMRun,
    CallbackManagerForLLMRun,
)
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import ConfigDict, Field, model_validator

from seed_agents.backends.base import (
    BackendError,
    CompletionPiece,
    StreamingBackend,
    as_piece,
)
from seed_agents.backends.grammar import tool_call_tag
from seed_agents.capture import current_scope, record_call
from seed_agents.reply import ReplyBuilder
from seed_agents.tool_calls import format_tool_call
from seed_agents.types import LLMCall, Purpose, SamplingParams

_ROLES = {"system": "system", "human": "user", "ai": "assistant", "tool": "tool"}
_SAMPLING_KEYS = ("max_tokens", "temperature", "top_p", "seed", "structural_tag")

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
                tool_format: str = "auto", *, continue_final: bool = False) -> tuple[list[int], list[dict[str, Any]]]:
    """(prompt token ids, rendered message dicts): the chat template applied client-side,
    tools included. ``SeedChatModel`` and the capture gateway both render with this, so
    an agent sees the same prompt ids through either.

    ``continue_final``: the last message is an assistant message to be continued (a
    prefill) instead of a finished turn followed by a new assistant turn."""
    dicts = to_chat_dicts(messages)
    turn = {"continue_final_message": True} if continue_final else {"add_generation_prompt": True}
    if uses_native_tools(tokenizer, tool_format):
        text = tokenizer.apply_chat_template(dicts, tools=tools or None, tokenize=False, **turn)
    else:
        dicts = _hermes_fallback(dicts, tools)
        text = tokenizer.apply_chat_template(dicts, tokenize=False, **turn)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]), dicts


def forced_tool_prefix(tool_choice: str | None, tools: list[dict[str, Any]] | None) -> str:
    """The assistant-turn prefill that forces a Hermes tool call ("" when none is forced).

    "any"/"required" open a call and leave the name to the model (unless only one tool is
    bound); a tool's name also fixes the name. No trailing whitespace: chat templates
    strip the content of a continued message."""
    if tool_choice in (None, "auto", "none") or not tools:
        return ""
    names = [t["function"]["name"] for t in tools]
    if tool_choice in ("any", "required"):
        if len(names) != 1:
            return '<tool_call>\n{"name": "'
        tool_choice = names[0]
    if tool_choice not in names:
        raise ValueError(f"tool_choice {tool_choice!r} names no bound tool (bound: {names})")
    return '<tool_call>\n{"name": ' + json.dumps(tool_choice, ensure_ascii=False) + ', "arguments":'


def _continues_assistant(messages: Sequence[BaseMessage]) -> bool:
    """A trailing, non-empty assistant message: the call continues it (a prefill)."""
    return bool(messages) and messages[-1].type == "ai" and bool(messages[-1].content)


def _normalize_tool_choice(tool_choice: Any) -> str | None:
    """LangChain/OpenAI spellings -> None ("auto"), "none", "any" or a tool name."""
    if tool_choice is None or tool_choice == "auto" or tool_choice is False:
        return None
    if tool_choice is True or tool_choice in ("any", "required"):
        return "any"
    if isinstance(tool_choice, dict):  # {"type": "function", "function": {"name": ...}}
        tool_choice = (tool_choice.get("function") or {}).get("name") or tool_choice.get("name")
    if isinstance(tool_choice, str):
        return tool_choice
    raise ValueError(f"unsupported tool_choice {tool_choice!r}")


@dataclass
class _Turn:
    """One prepared call: what the backend gets and what the record will say."""

    prompt_ids: list[int]
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    params: SamplingParams
    builder: ReplyBuilder
    stream: bool = False  # a token stream was asked for (else: stream only to honour stop strings)
    prefill_len: int = 0  # a guided opening: the steering prefill's ids at the end of prompt_ids
    guided: bool = False
    t0: float = field(default_factory=time.perf_counter)


class SeedChatModel(BaseChatModel):
    """A chat model over a token-level ``Backend``; every call is captured.

    ``purpose`` labels the calls (``policy`` trains; ``analyzer`` writes hindsight
    skills); an enclosing ``capture(purpose=...)`` overrides it.

    LangChain's standard parameters ``temperature``, ``max_tokens``, ``top_p`` and
    ``seed`` may be given at construction (they set ``sampling``) or per call/``bind``;
    ``stop`` likewise. ``streaming=True`` makes ``invoke`` stream internally.

    ``bind_tools(..., tool_choice=...)``: "auto" (default) lets the model decide; "none"
    renders the prompt without the tools, so no call is offered or parsed; "any" /
    "required" / ``True`` / a tool name / ``{"type": "function", "function": {"name":
    ...}}`` force a call by prefilling the assistant turn with the start of a Hermes
    ``<tool_call>`` (and the name, when fixed). The prefill is part of the PROMPT (it ends
    ``prompt_ids`` and is the last, assistant, entry of the recorded ``messages``), never
    of ``completion_ids``: it was not sampled, so it is never trained on. A trailing
    ``AIMessage`` in the input is continued the same way (an assistant prefill), so a
    recorded call re-renders to the same ``prompt_ids``.

    Guided openings: inside a ``capture(guide=True)`` scope (the runner's guided training
    episodes), the first policy call left free to choose ("auto" with tools bound) is
    forced as "any" would be (with ``guide="first_call"``, only when it is the episode's
    first policy call). Its record says so (``LLMCall.guided``) and counts the
    prefill ids that the free prompt did not have (``prefill_len``), so that rows can
    train the prefill as the opening the model should learn to choose on its own.

    Constrained decoding: with tools bound (and ``constrain_tool_calls``, the default),
    the backend samples under ``backends.grammar.tool_call_tag``: the model still chooses
    between prose and a call, and a call it opens always parses and names a bound tool
    (unless ``max_tokens`` cuts it); under a forced ``tool_choice`` the reply is exactly
    one call. ``bind(structural_tag=...)`` constrains any call to
    another grammar (the hindsight analyzer's ``skill_tag``). The recorded logprobs are
    then those of the masked distribution; see ``docs/constrained_decoding.md``.

    A stream that its consumer abandons (the generator closed before the end) stops the
    generation and records the ids sampled so far as an incomplete call
    (``LLMCall.complete`` False, ``finish_reason`` "error"), which rows never train on: a
    call is recorded once, whole or marked incomplete, never half.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    backend: Any = Field(exclude=True, description="A seed_agents.backends.Backend.")
    tokenizer: Any = Field(exclude=True, description="A HF tokenizer whose chat template renders prompts.")
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    purpose: Purpose = "policy"
    tool_format: str = Field("auto", description="'native' (template renders tools), 'hermes' (we do), or 'auto'.")
    model_name: str = "seed-agents"
    stop: list[str] | None = Field(None, description="Default stop sequences (a call's own `stop` replaces them).")
    streaming: bool = Field(False, description="Stream internally even for invoke (LangChain's standard flag).")
    constrain_tool_calls: bool = Field(True, description=(
        "With tools bound, decode under a grammar in which <tool_call> opens only a call to a bound tool with "
        "arguments that follow its schema; prose stays free. False: sample freely."))

    @model_validator(mode="before")
    @classmethod
    def _standard_sampling_params(cls, data: Any) -> Any:
        """``temperature=``/``max_tokens=``/``top_p=``/``seed=`` at construction set ``sampling``."""
        if not isinstance(data, dict):
            return data
        given = {k: data[k] for k in _SAMPLING_KEYS if data.get(k) is not None}
        if not given:
            return data
        base = data.get("sampling") or SamplingParams()
        base = base if isinstance(base, SamplingParams) else SamplingParams.model_validate(base)
        rest = {k: v for k, v in data.items() if k not in _SAMPLING_KEYS}
        return {**rest, "sampling": base.model_copy(update=given)}

    @property
    def _llm_type(self) -> str:
        return "seed-agents"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model_name": self.model_name, **self.sampling.model_dump()}

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> Any:
        params = super()._get_ls_params(stop=stop, **kwargs)
        params["ls_provider"] = "seed_agents"
        params["ls_model_name"] = kwargs["model"] if isinstance(kwargs.get("model"), str) else self.model_name
        sampling = self._params(kwargs)
        params["ls_temperature"] = sampling.temperature
        params["ls_max_tokens"] = sampling.max_tokens
        stops = stop if stop is not None else self.stop
        if stops:
            params["ls_stop"] = list(stops)
        return params

    # -- rendering -----------------------------------------------------------------
    def native_tools(self) -> bool:
        """True when the tokenizer's template renders tools itself; False when we add
        them Hermes-style (then recorded messages already contain them)."""
        return uses_native_tools(self.tokenizer, self.tool_format)

    def render(self, messages: Sequence[BaseMessage], tools: list[dict[str, Any]] | None = None) -> tuple[list[int], list[dict[str, Any]]]:
        """Return (prompt token ids, rendered message dicts) for ``messages``; a trailing
        assistant message is continued (a prefill), not closed."""
        return render_chat(self.tokenizer, messages, tools, self.tool_format, continue_final=_continues_assistant(messages))

    def _params(self, kwargs: dict[str, Any]) -> SamplingParams:
        overrides = {k: kwargs[k] for k in _SAMPLING_KEYS if kwargs.get(k) is not None}
        stop_ids = set(self.sampling.stop_token_ids)
        for tok in (self.tokenizer.eos_token_id,):
            if tok is not None:
                stop_ids.add(int(tok))
        return self.sampling.model_copy(update={**overrides, "stop_token_ids": tuple(sorted(stop_ids))})

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    # -- one call ------------------------------------------------------------------
    def _prepare(self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any],
                 stream: bool = False) -> _Turn:
        tools = kwargs.get("tools")
        choice = _normalize_tool_choice(kwargs.get("tool_choice"))
        if choice == "none":
            tools = None  # nothing offered, nothing parsed
        scope = current_scope()
        free_ids: list[int] | None = None
        # an agent continuing its own assistant turn has made its choice: never steered
        free = choice is None and bool(tools) and not _continues_assistant(messages)
        if scope is not None and self._purpose(scope) == "policy" and scope.take_guide(free):
            free_ids, _ = self.render(messages, tools)  # what the model was offered, to measure the prefill
            choice = "any"
        prefix = forced_tool_prefix(choice, tools)
        if prefix:
            messages = [*messages, AIMessage(prefix)]
        prompt_ids, dicts = self.render(messages, tools)
        prefill_len = 0
        if free_ids is not None:
            # the forced render extends the free one by the prefill (the template's assistant
            # header is shared); where tokenization merged across the seam, the prefill starts
            # at the first id that differs, so every id of it is accounted for
            prefill_len = len(prompt_ids) - len(os.path.commonprefix([free_ids, prompt_ids]))  # lists too; no torch import
        stops = stop if stop is not None else (self.stop or [])
        builder = ReplyBuilder(self._decode, stop=stops, parse_tools=bool(tools), prefix=prefix)
        params = self._params(kwargs)
        if params.seed is None and scope is not None:
            # A reproducible run: the call's seed comes from its episode, its index there and
            # the policy version, never from when it reached the backend (None: unseeded).
            params = params.model_copy(update={"seed": scope.request_seed(self.backend.policy_version)})
        if tools and self.constrain_tool_calls and params.structural_tag is None:
            params = params.model_copy(update={"structural_tag": tool_call_tag(tools, prefix)})
        return _Turn(prompt_ids, dicts, tools, params, builder, stream, prefill_len=prefill_len,
                     guided=free_ids is not None)

    def _purpose(self, scope: Any) -> Purpose:
        """The calls' purpose: an enclosing scope's, else the model's own."""
        return scope.purpose if scope is not None and scope.purpose is not None else self.purpose

    def _record(self, turn: _Turn) -> AIMessage:
        """Record the finished call; return the reply it makes."""
        b = turn.builder
        if b.finish_reason is None:
            raise BackendError("the backend's stream ended without a finish reason; nothing was recorded")
        call = LLMCall(
            messages=turn.messages, tools=turn.tools, prompt_ids=turn.prompt_ids, completion_ids=list(b.token_ids),
            logprobs=list(b.logprobs), text=b.text, policy_version=b.policy_version, purpose=self._purpose(current_scope()),
            finish_reason=b.finish_reason, latency_s=time.perf_counter() - turn.t0, sampling=turn.params,
            guided=turn.guided, prefill_len=turn.prefill_len,
        )
        record_call(call)
        content, tool_calls, invalid = b.reply()
        metadata: dict[str, Any] = {
            "call_id": call.call_id, "finish_reason": call.finish_reason,
            "policy_version": call.policy_version, "model_name": self.model_name,
        }
        if b.stop_sequence is not None:
            metadata["stop_sequence"] = b.stop_sequence
        n_in, n_out = len(turn.prompt_ids), len(call.completion_ids)
        return AIMessage(content=content, tool_calls=tool_calls, invalid_tool_calls=invalid, response_metadata=metadata,
                         usage_metadata={"input_tokens": n_in, "output_tokens": n_out, "total_tokens": n_in + n_out})

    def _record_abandoned(self, turn: _Turn) -> None:
        """A stream its consumer left: record what was sampled, marked incomplete, so the
        trace is whole; rows never train on it (no outcome followed those tokens)."""
        b = turn.builder
        record_call(LLMCall(
            messages=turn.messages, tools=turn.tools, prompt_ids=turn.prompt_ids, completion_ids=list(b.token_ids),
            logprobs=list(b.logprobs), text=b.text, policy_version=b.policy_version, purpose=self._purpose(current_scope()),
            finish_reason="error", latency_s=time.perf_counter() - turn.t0, sampling=turn.params, complete=False,
            guided=turn.guided, prefill_len=turn.prefill_len,
        ))

    def _pieces(self, turn: _Turn) -> Generator[CompletionPiece, None, None]:
        """The completion as pieces: streamed when asked for or when stop strings may end
        it early (closing this generator then stops the backend), else one piece from
        ``generate`` (which batches on the local backend)."""
        if isinstance(self.backend, StreamingBackend) and (turn.stream or turn.builder.stop):
            yield from self.backend.stream(turn.prompt_ids, turn.params)
        else:
            yield as_piece(self.backend.generate(turn.prompt_ids, turn.params))

    async def _apieces(self, turn: _Turn) -> AsyncGenerator[CompletionPiece, None]:
        if isinstance(self.backend, StreamingBackend) and (turn.stream or turn.builder.stop):
            stream = self.backend.astream(turn.prompt_ids, turn.params)
            try:
                async for piece in stream:
                    yield piece
            finally:
                await stream.aclose()  # type: ignore[attr-defined]
        else:
            yield as_piece(await self.backend.agenerate(turn.prompt_ids, turn.params))

    # -- LangChain entry points ----------------------------------------------------
    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        turn = self._prepare(messages, stop, kwargs)
        pieces = self._pieces(turn)
        try:
            for piece in pieces:
                turn.builder.feed(piece)
                if turn.builder.done:
                    break
        finally:
            pieces.close()
        return ChatResult(generations=[ChatGeneration(message=self._record(turn))])

    async def _agenerate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                         run_manager: AsyncCallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        turn = self._prepare(messages, stop, kwargs)
        pieces = self._apieces(turn)
        try:
            async for piece in pieces:
                turn.builder.feed(piece)
                if turn.builder.done:
                    break
        finally:
            await pieces.aclose()
        return ChatResult(generations=[ChatGeneration(message=self._record(turn))])

    def _stream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        turn = self._prepare(messages, stop, kwargs, stream=True)
        pieces = self._pieces(turn)
        try:
            for piece in pieces:
                delta = turn.builder.feed(piece)
                if delta:
                    yield ChatGenerationChunk(message=AIMessageChunk(content=delta))
                if turn.builder.done:
                    break
        except GeneratorExit:  # the consumer stopped reading
            self._record_abandoned(turn)
            raise
        finally:
            pieces.close()  # also when the consumer stops reading: the backend stops generating
        yield self._last_chunk(turn)

    async def _astream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                       run_manager: AsyncCallbackManagerForLLMRun | None = None, **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        turn = self._prepare(messages, stop, kwargs, stream=True)
        pieces = self._apieces(turn)
        try:
            async for piece in pieces:
                delta = turn.builder.feed(piece)
                if delta:
                    yield ChatGenerationChunk(message=AIMessageChunk(content=delta))
                if turn.builder.done:
                    break
        except (GeneratorExit, asyncio.CancelledError):  # the consumer stopped reading
            self._record_abandoned(turn)
            raise
        finally:
            await pieces.aclose()
        yield self._last_chunk(turn)

    def _last_chunk(self, turn: _Turn) -> ChatGenerationChunk:
        """Record the call; the last chunk carries the rest of the content, the tool
        calls (as complete ``tool_call_chunks``), usage and response metadata."""
        msg = self._record(turn)
        calls = [{"name": tc["name"], "args": json.dumps(tc["args"], ensure_ascii=False), "id": tc["id"], "index": i,
                  "type": "tool_call_chunk"} for i, tc in enumerate(msg.tool_calls)]
        # A malformed call can travel only as a chunk, and LangChain re-parses chunk args
        # leniently (it would turn "{oops" into a call with empty arguments): send its raw
        # text as a JSON string, which parses to no object and so stays an invalid call.
        calls += [{"name": tc["name"], "args": json.dumps(tc["args"], ensure_ascii=False), "id": tc["id"],
                   "index": len(calls) + i, "type": "tool_call_chunk"} for i, tc in enumerate(msg.invalid_tool_calls)]
        chunk = AIMessageChunk(content=turn.builder.last_delta(str(msg.content)), tool_call_chunks=calls,
                               usage_metadata=msg.usage_metadata, response_metadata=msg.response_metadata,
                               chunk_position="last")
        return ChatGenerationChunk(message=chunk)

    def bind_tools(self, tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool], *,
                   tool_choice: str | dict[str, Any] | bool | None = None, **kwargs: Any) -> Runnable[LanguageModelInput, AIMessage]:
        """Offer ``tools`` to the model; ``tool_choice`` as in the class docstring."""
        schemas = [convert_to_openai_tool(t) for t in tools]
        choice = _normalize_tool_choice(tool_choice)
        forced_tool_prefix(choice, schemas)  # an unknown tool name fails here, not at call time
        if choice is not None:
            kwargs["tool_choice"] = choice
        return self.bind(tools=schemas, **kwargs)
