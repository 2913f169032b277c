"""What is kept of each canary episode, so a gate decision can be read episode by episode.

The gate pairs numbers (``gate.CanaryResult``); an operator asking "why was v7 rejected?"
needs the episodes behind them: which tasks each side passed, and what the agent did
there. ``CanaryEpisode`` is one episode of one side with its ``EpisodeTrace``: the tool
calls with their arguments and their results or errors, the final answer, the stop
reason and the fault. ``VersionRegistry`` stores them with the decision, in its
transaction (the store's ``canary_episodes`` table); the report shows them.

Bounded: each text (arguments, result, error, answer) is cut to ``MAX_TEXT`` characters
and at most ``MAX_TOOL_CALLS`` tool calls are kept per episode (the count of the rest is
kept), so 16 tasks x 2 seeds x 2 sides stay well under a megabyte per decision. Texts
are redacted (``seed_agents.redact``) before they are cut. No token ids are kept: the
episode's calls are not stored, only what people read.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from seed_agents.continual.gate import CanaryResult
from seed_agents.redact import redact
from seed_agents.tool_calls import parse_tool_calls
from seed_agents.transcript import transcript_of
from seed_agents.types import FaultKind, Trajectory

if TYPE_CHECKING:  # LangChain loads where an episode is read, not with the registry (the CLI imports this package)
    from langchain_core.messages import BaseMessage

MAX_TEXT = 500
"""Characters kept of each text of a trace (arguments, result, error, answer)."""
MAX_TOOL_CALLS = 20
"""Tool calls kept per episode; ``EpisodeTrace.omitted_tool_calls`` counts the rest."""
ERROR_PREFIX = "Error"
"""How a failed tool answers the model (``faults.tool_error_message``, ``tools.openapi``)."""

Side = Literal["candidate", "promoted", "anchor"]
"""``anchor``: the version the gate's anchor check compares with (``GateConfig.anchor_margin``),
played as a third side when it is not the promoted version."""


def cut(text: str | None, limit: int = MAX_TEXT) -> str | None:
    """``text`` redacted, then cut to ``limit`` characters with a note of how much went."""
    if text is None:
        return None
    text = redact(text)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... [{len(text) - limit} more characters cut]"


class ToolCallTrace(BaseModel):
    """One tool call of an episode. Neither ``result`` nor ``error``: it never ran (the
    episode ended first, e.g. at the turn limit)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    args: str = Field(description="The arguments as JSON text (cut).")
    result: str | None = Field(None, description="What the tool answered (cut).")
    error: str | None = Field(None, description="What the tool answered when it failed (cut).")


class EpisodeTrace(BaseModel):
    """What the agent did in one episode, as people read it."""

    model_config = ConfigDict(extra="forbid")

    tool_calls: list[ToolCallTrace] = Field(default_factory=list)
    omitted_tool_calls: int = Field(0, description=f"Tool calls past the first {MAX_TOOL_CALLS}, not kept.")
    invalid_tool_calls: int = Field(0, description="Tool calls the model wrote that did not parse.")
    answer: str | None = Field(None, description="The final answer (cut); None when the episode ended on a tool call.")
    turns: int = Field(0, description="Model calls made.")
    stop_reason: str = "done"
    error: str | None = Field(None, description="Why the episode ended in an error or a fault (cut).")

    @classmethod
    def of(cls, trajectory: Trajectory, messages: Sequence[BaseMessage] | None = None) -> EpisodeTrace:
        """From the graph's final ``messages`` when the episode reached an end, else (a fault
        stopped it) from its recorded calls: the last call's prompt holds every earlier turn."""
        steps = _from_messages(messages) if messages else _from_calls(trajectory)
        calls, invalid, answer = steps
        return cls(tool_calls=calls[:MAX_TOOL_CALLS], omitted_tool_calls=max(0, len(calls) - MAX_TOOL_CALLS),
                   invalid_tool_calls=invalid, answer=cut(answer), turns=len(trajectory.policy_calls),
                   stop_reason=trajectory.stop_reason.value, error=cut(trajectory.error))

    def fingerprint(self) -> str:
        """What the agent did, hashed: its tool calls (names and arguments) and its answer.
        Two episodes with the same fingerprint look the same to a user (results are left
        out: the same calls on the same fresh sandbox get the same answers)."""
        did = [[c.name, c.args] for c in self.tool_calls] + [self.omitted_tool_calls, self.answer]
        return hashlib.sha256(json.dumps(did, ensure_ascii=False).encode()).hexdigest()[:16]


class CanaryEpisode(BaseModel):
    """One canary episode of one side: the gate's result and the trace behind it.
    ``model_dump(mode="json")`` is the row ``VersionRegistry`` stores."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    side: Side
    version: int = Field(description="The version that played it.")
    task_id: str
    seed: int
    reward: float
    success: bool = False
    fault: FaultKind | None = None
    trace: EpisodeTrace = Field(default_factory=EpisodeTrace)

    @classmethod
    def of(cls, trajectory: Trajectory, *, side: Side, version: int, seed: int,
           messages: Sequence[BaseMessage] | None = None) -> CanaryEpisode:
        return cls(side=side, version=version, task_id=trajectory.task_id, seed=seed, reward=trajectory.reward,
                   success=trajectory.success, fault=trajectory.fault, trace=EpisodeTrace.of(trajectory, messages))

    def result(self) -> CanaryResult:
        """What the gate pairs."""
        return CanaryResult(task_id=self.task_id, seed=self.seed, reward=self.reward, success=self.success,
                            fault=self.fault, fingerprint=self.trace.fingerprint())


def split_sides(episodes: Sequence[CanaryEpisode]) -> tuple[list[CanaryResult], list[CanaryResult]]:
    """(promoted results, candidate results): ``gate.decide``'s arguments."""
    return ([e.result() for e in episodes if e.side == "promoted"],
            [e.result() for e in episodes if e.side == "candidate"])


def anchor_side(episodes: Sequence[CanaryEpisode]) -> list[CanaryResult]:
    """The anchor's results, when it played as a side of its own."""
    return [e.result() for e in episodes if e.side == "anchor"]


# -------------------------------------------------------------------- reading the episode

_Steps = tuple[list[ToolCallTrace], int, str | None]  # tool calls, invalid ones, the final answer


def _call(name: str, args: Any, answer: str | None = None, *, failed: bool = False) -> ToolCallTrace:
    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False, sort_keys=True, default=str)
    failed = failed or (answer or "").startswith(ERROR_PREFIX)
    return ToolCallTrace(name=name, args=cut(text) or "", result=None if failed else cut(answer),
                         error=cut(answer) if failed else None)


def _from_messages(messages: Sequence[BaseMessage]) -> _Steps:
    """The final state's messages: every AI tool call, matched to its tool message by id."""
    from langchain_core.messages import AIMessage, ToolMessage

    calls: list[tuple[str, Any, str | None, bool]] = []
    where: dict[str, int] = {}
    invalid, answer = 0, None
    for m in messages:
        if isinstance(m, AIMessage):
            invalid += len(m.invalid_tool_calls)
            for tc in m.tool_calls:
                where[str(tc.get("id"))] = len(calls)
                calls.append((tc["name"], tc.get("args", {}), None, False))
            answer = None if m.tool_calls else (m.content if isinstance(m.content, str) else str(m.content))
        elif isinstance(m, ToolMessage) and m.tool_call_id in where:
            name, args, _, _ = calls[where[m.tool_call_id]]
            content = m.content if isinstance(m.content, str) else json.dumps(m.content, ensure_ascii=False)
            calls[where[m.tool_call_id]] = (name, args, content, m.status == "error")
    return [_call(n, a, r, failed=f) for n, a, r, f in calls], invalid, answer


def _from_calls(trajectory: Trajectory) -> _Steps:
    """The recorded calls of an episode that ended without a final state: the tool calls
    answered before its last turn (``transcript_of`` the last prompt), then the last reply."""
    policy = trajectory.policy_calls
    if not policy:
        return [], 0, None
    last = policy[-1]
    answered = [_call(r.name, r.args, r.content) for r in transcript_of(last.messages).tool_results]
    content, pending, _ = parse_tool_calls(last.text)
    invalid = sum(len(parse_tool_calls(c.text)[2]) for c in policy)
    return answered + [_call(c["name"], c["args"]) for c in pending], invalid, None if pending else content or None
