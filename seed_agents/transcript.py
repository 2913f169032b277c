"""What a session's own messages say about replaying it: the task and the tool results.

The continual loop replays each rewarded session G times. It needs the task (what the user
asked) and the tools' answers (so replayed reads and writes get what production gave).
Both are already in the conversation an agent sends on its last turn: the system prompt,
the first user message, and every tool call followed by the tool message that answered
it. ``transcript_of`` reads them from chat message dicts in either form that reaches the
store:

- OpenAI/structured: assistant ``tool_calls`` (arguments as JSON text or a dict) and
  ``tool`` messages with ``tool_call_id`` (what a client sends the gateway; what a native
  tool template renders).
- The Hermes fallback of ``chat_model.render_chat`` (templates without tools, SmolLM2's):
  ``<tool_call>`` blocks in assistant text and ``<tool_response>`` user messages, the
  tools' block appended to the system prompt. Parsed with the parser the replies use.

``record_transcript`` keeps the fullest transcript seen in the session's metadata
(``metadata["transcript"]``); the gateway and ``StoreSink`` call it on every stored call.
An explicit ``metadata["task"]`` / ``metadata["recording"]`` (the gateway's session
metadata endpoint, or ``TraceStore.merge_session_metadata``) takes precedence over it.

Given the call, it also keeps how the deployed agent sampled (``DeployedSampling`` in
``metadata["sampling"]``: max_tokens, temperature, tool_choice), so that the loop replays
a session as it was played: a replay with a smaller ``max_tokens`` cuts the forced calls
the deployment finished.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from seed_agents.tool_calls import parse_tool_calls
from seed_agents.types import LLMCall, Task

if TYPE_CHECKING:
    from seed_agents.store.store import TraceStore

TRANSCRIPT_KEY = "transcript"
SAMPLING_KEY = "sampling"
TOOL_CHOICE_LABEL = "tool_choice"
"""The call's scope label that holds the tool_choice it was sent with (the gateway sets it)."""
_RESPONSE_OPEN, _RESPONSE_CLOSE = "<tool_response>\n", "\n</tool_response>"


class ToolResult(BaseModel):
    """One tool call of the session and the tool message that answered it."""

    name: str
    args: dict[str, Any] = Field(default_factory=dict)
    content: str = Field(description="The tool message's text, as the client sent it on the next turn.")


class Transcript(BaseModel):
    """The replayable part of a session."""

    question: str | None = Field(None, description="The first user message.")
    system_prompt: str | None = Field(None, description="The system message, without a tools block the renderer added.")
    tools: list[str] = Field(default_factory=list, description="Names of the tools the agent was offered.")
    tool_results: list[ToolResult] = Field(default_factory=list)

    def task(self, task_id: str) -> Task | None:
        """The session's task as the tool agent plays it (None without a question)."""
        if not self.question:
            return None
        data: dict[str, Any] = {"question": self.question, "tools": self.tools}
        if self.system_prompt:
            data["system_prompt"] = self.system_prompt
        return Task(task_id=task_id, data=data)


def transcript_of(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> Transcript:
    """The transcript of a conversation (see the module docstring for the accepted forms)."""
    names = [str(t.get("function", {}).get("name")) for t in tools or [] if isinstance(t, dict)]
    out = Transcript(tools=names)
    pending: dict[str, tuple[str, dict[str, Any]]] = {}  # tool_call_id -> call
    queue: list[tuple[str, dict[str, Any]]] = []  # calls not answered yet, in order
    for m in messages:
        role, text = m.get("role"), _text(m.get("content"))
        if role == "system" and out.system_prompt is None and out.question is None:
            out.system_prompt = _without_tools_block(text, tools) or None
        elif role == "user" and text.startswith(_RESPONSE_OPEN) and text.endswith(_RESPONSE_CLOSE) and queue:
            name, args = queue.pop(0)  # a Hermes-rendered tool message
            out.tool_results.append(ToolResult(name=name, args=args, content=text[len(_RESPONSE_OPEN):-len(_RESPONSE_CLOSE)]))
        elif role == "user" and out.question is None:
            out.question = text
        elif role == "assistant":
            for call in m.get("tool_calls") or []:
                fn = call.get("function") or {}
                args = _args(fn.get("arguments"))
                if isinstance(fn.get("name"), str) and args is not None:
                    queue.append((fn["name"], args))
                    if call.get("id"):
                        pending[str(call["id"])] = queue[-1]
            if not m.get("tool_calls") and "<tool_call>" in text:
                queue += [(c["name"], c["args"]) for c in parse_tool_calls(text)[1]]
        elif role == "tool":
            call_ = pending.pop(str(m.get("tool_call_id")), None) or (queue[0] if queue else None)
            if call_ is None:
                continue
            if call_ in queue:
                queue.remove(call_)
            out.tool_results.append(ToolResult(name=call_[0], args=call_[1], content=text))
    return out


class DeployedSampling(BaseModel):
    """How the deployed agent sampled one session, from its calls: what the continual loop
    replays it with where its config does not say otherwise."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_tokens: int = Field(ge=1, description="The largest max_tokens a call of the session asked for.")
    temperature: float = Field(ge=0, description="The first call's temperature.")
    tool_choice: str | None = Field(None, description=(
        "The first call's tool_choice: auto, none, required or a tool name; None: not recorded (not a gateway call)."))
    later_tool_choice: str | None = Field(None, description="The last later call's tool_choice; None: no later call.")

    @classmethod
    def of_call(cls, call: LLMCall) -> DeployedSampling | None:
        """What one call says (None when it recorded no sampling)."""
        if call.sampling is None:
            return None
        choice = call.scope.get(TOOL_CHOICE_LABEL)
        return cls(max_tokens=call.sampling.max_tokens, temperature=call.sampling.temperature,
                   tool_choice=choice if isinstance(choice, str) else None)

    def then(self, later: DeployedSampling) -> DeployedSampling:
        """The session's record after a later call (idempotent: the same call again changes nothing)."""
        return self.model_copy(update={"max_tokens": max(self.max_tokens, later.max_tokens),
                                       "later_tool_choice": later.tool_choice})

    @property
    def tool_choice_turns(self) -> Literal["first", "every"] | None:
        """Where a tool_choice other than auto applied, as the loop's ``agent.tool_choice_turns``
        says it: every turn when later turns sent the first one's again; None: auto, one turn,
        or not recorded."""
        if self.tool_choice in (None, "auto") or self.later_tool_choice is None:
            return None
        return "every" if self.later_tool_choice == self.tool_choice else "first"


def record_transcript(store: TraceStore, session_id: str, transcript: Transcript, *, call: LLMCall | None = None,
                      turn: int = 0) -> bool:
    """Keep ``transcript`` in the session's metadata unless a fuller one is there (a client
    that trimmed its history must not erase tool results seen earlier); True when written.

    ``call`` (the session's ``turn``-th, as ``add_call`` numbered it): also keep how it was
    sampled (``DeployedSampling``), in the same write."""
    session = store.get_session(session_id)
    if session is None:
        return False
    extra: dict[str, Any] = {}
    old = session.metadata.get(TRANSCRIPT_KEY)
    new = transcript.model_dump()
    if not (old == new or (isinstance(old, dict) and len(old.get("tool_results") or []) > len(transcript.tool_results))):
        extra[TRANSCRIPT_KEY] = new
    sampled = DeployedSampling.of_call(call) if call is not None else None
    if sampled is not None:
        before = session_sampling(session.metadata)
        kept = sampled if before is None or turn == 0 else before.then(sampled)
        if kept != before:
            extra[SAMPLING_KEY] = kept.model_dump()
    if extra:
        store.merge_session_metadata(session_id, extra)
    return TRANSCRIPT_KEY in extra


def session_transcript(metadata: dict[str, Any]) -> Transcript | None:
    """The transcript recorded with a session, if any."""
    raw = metadata.get(TRANSCRIPT_KEY)
    return Transcript.model_validate(raw) if isinstance(raw, dict) else None


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content)
    return "" if content is None else str(content)


def _args(raw: Any) -> dict[str, Any] | None:
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        try:
            value = json.loads(raw) if raw.strip() else {}
        except ValueError:
            return None
        return value if isinstance(value, dict) else None
    return {} if raw is None else None


def _without_tools_block(system: str, tools: list[dict[str, Any]] | None) -> str:
    """The system prompt as the agent wrote it: the Hermes fallback appends the tools."""
    if not tools:
        return system
    from seed_agents.chat_model import HERMES_TOOLS_PROMPT  # chat_model loads torch: only when tools were rendered

    block = HERMES_TOOLS_PROMPT.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
    if system == block:
        return ""
    return system.removesuffix("\n\n" + block)


def session_sampling(metadata: dict[str, Any]) -> DeployedSampling | None:
    """How the deployed agent sampled the session, if recorded."""
    raw = metadata.get(SAMPLING_KEY)
    if not isinstance(raw, dict):
        return None
    try:
        return DeployedSampling.model_validate(raw)
    except ValueError:  # a key of that name set by hand for something else: not ours to read
        return None
