"""Sampled token ids -> the chat reply, token by token: stop strings, stream deltas, tool calls.

``SeedChatModel`` feeds every completion through one ``ReplyBuilder``, streamed or not, so
a streamed reply adds up to the same message as an invoked one and both record the same
ids. Three rules keep the record token-exact:

- Stop strings end the completion at the token where one first appears in the decoded
  text. The recorded ids (and logprobs) are exactly the ids up to and including that
  token, ``LLMCall.text`` is their decoding (stop string included), and the returned
  content ends before the stop string, as OpenAI's does. Text of that last token after
  the stop string is dropped from the content too; ids are never split.
- A ``prefix`` (the prefilled start of a forced tool call) belongs to the prompt: it is
  parsed with the sampled text but is never part of the recorded completion.
- Stream deltas hand out only text that cannot change any more: no trailing half UTF-8
  character, no trailing whitespace (a tokenizer clean-up or the final strip may remove
  it), nothing that may turn into a stop string or a ``<tool_call>`` tag. The rest comes
  with the last chunk, so the deltas concatenate to the non-streamed content.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from seed_agents.backends.base import CompletionPiece
from seed_agents.tool_calls import parse_tool_calls
from seed_agents.types import FinishReason

TOOL_OPEN = "<tool_call>"


def partial_suffix_len(text: str, patterns: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a pattern."""
    best = 0
    for pat in patterns:
        for n in range(min(len(pat) - 1, len(text)), best, -1):
            if text.endswith(pat[:n]):
                best = n
                break
    return best


class ReplyBuilder:
    """Accumulates one completion's pieces; says what to show and what to record."""

    def __init__(self, decode: Callable[[list[int]], str], *, stop: Sequence[str] = (),
                 parse_tools: bool = False, prefix: str = "") -> None:
        self._decode = decode
        self.stop = tuple(s for s in stop if s)
        self.parse_tools = parse_tools
        self.prefix = prefix
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.finish_reason: FinishReason | None = None
        self.policy_version = 0
        self.stop_sequence: str | None = None  # the stop string that ended the reply
        self._cut: int | None = None  # where the stop string starts in the sampled text
        self._emitted = ""
        self._in_tool_block = False
        self._decoded = (0, "")  # (number of ids, their text): decode once per new token
        self._scanned = 0  # text before this offset holds no stop string

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def text(self) -> str:
        """The decoded completion ids (what ``LLMCall.text`` records)."""
        if self._decoded[0] != len(self.token_ids):
            self._decoded = (len(self.token_ids), self._decode(self.token_ids))
        return self._decoded[1]

    def feed(self, piece: CompletionPiece) -> str:
        """Add a piece; return the content delta that is final now (possibly "").
        Tokens after a stop string are ignored: the caller should stop the stream."""
        if self.done:
            return ""
        self.policy_version = piece.policy_version
        for token_id, logprob in zip(piece.token_ids, piece.logprobs, strict=True):
            self.token_ids.append(token_id)
            self.logprobs.append(logprob)
            if self.stop and self._stopped_by_string():
                self.finish_reason = "stop"
                return ""  # the rest comes with the last chunk
        if piece.finish_reason is not None:
            self.finish_reason = piece.finish_reason
            return ""
        return self._advance(self._stable())

    def _stopped_by_string(self) -> bool:
        text = self.text
        hits = [(at, s) for s in self.stop if (at := text.find(s, self._scanned)) >= 0]
        if not hits:
            # A stop string that a later token completes starts near the end (slack for a
            # tokenizer clean-up that shifts the text by a few characters).
            self._scanned = max(0, len(text) - max(map(len, self.stop)) - 8)
            return False
        self._cut, self.stop_sequence = min(hits)
        return True

    def _visible(self) -> str:
        text = self.text
        return self.prefix + (text if self._cut is None else text[: self._cut])

    def _stable(self) -> str:
        if self._in_tool_block:
            return self._emitted
        stable = self._visible().rstrip("\ufffd")
        if self.stop:
            stable = stable[: len(stable) - partial_suffix_len(stable, self.stop)]
        if self.parse_tools:
            at = stable.find(TOOL_OPEN)
            if at >= 0:
                self._in_tool_block = True
                stable = stable[:at]
            else:
                stable = stable[: len(stable) - partial_suffix_len(stable, (TOOL_OPEN,))]
            stable = stable.lstrip()  # the final content is stripped
        return stable.rstrip()

    def _advance(self, stable: str) -> str:
        if len(stable) <= len(self._emitted) or not stable.startswith(self._emitted):
            return ""  # nothing new, or the text changed under us: the last chunk settles it
        delta, self._emitted = stable[len(self._emitted):], stable
        return delta

    def reply(self) -> tuple[str, list[dict[str, Any]], list[dict[str, Any]]]:
        """(content, tool_calls, invalid_tool_calls) of the finished completion."""
        visible = self._visible()
        if self.parse_tools:
            return parse_tool_calls(visible)
        return visible, [], []

    def last_delta(self, content: str) -> str:
        """What the last chunk must add so the deltas concatenate to ``content``."""
        return self._advance(content) if content.startswith(self._emitted) else ""
