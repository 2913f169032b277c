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
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from seed_agents.tool_calls import parse_tool_calls
from seed_agents.types import Task

if TYPE_CHECKING:
    from seed_agents.store.store import TraceStore

TRANSCRIPT_KEY = "transcript"
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


def record_transcript(store: TraceStore, session_id: str, transcript: Transcript) -> bool:
    """Keep ``transcript`` in the session's metadata unless a fuller one is there (a client
    that trimmed its history must not erase tool results seen earlier); True when written."""
    session = store.get_session(session_id)
    if session is None:
        return False
    old = session.metadata.get(TRANSCRIPT_KEY)
    new = transcript.model_dump()
    if old == new or (isinstance(old, dict) and len(old.get("tool_results") or []) > len(transcript.tool_results)):
        return False
    store.merge_session_metadata(session_id, {TRANSCRIPT_KEY: new})
    return True


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
