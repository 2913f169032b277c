"""Streamed content deltas that add up to exactly the non-streaming reply.

Upstream sends token ids; the client wants text deltas. Decoding every prefix of the ids
and sending the difference would sometimes be wrong: a half-decoded UTF-8 character shows
as U+FFFD, a tokenizer clean-up may remove a space once the next token arrives, and with
tools the text may turn out to hold a ``<tool_call>`` block that the reply must not show
as content. So ``DeltaBuilder`` emits only text that cannot change any more (no trailing
replacement character or whitespace, nothing from a ``<tool_call>`` on), and ``finish``
sends the rest of what ``parse_reply`` says the final content is. Concatenated deltas
therefore equal the non-streaming ``content`` for the same ids.
"""

from __future__ import annotations

from collections.abc import Callable

from seed_agents.gateway.render import Reply, parse_reply

TOOL_OPEN = "<tool_call>"


def _partial_tag_len(text: str, tag: str = TOOL_OPEN) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class DeltaBuilder:
    """Feeds on completion token ids; hands out content deltas that are final."""

    def __init__(self, decode: Callable[[list[int]], str], has_tools: bool) -> None:
        self._decode = decode
        self.has_tools = has_tools
        self.token_ids: list[int] = []
        self.emitted = ""
        self._in_tool_block = False

    def feed(self, token_ids: list[int]) -> str:
        """Add new ids; return the content that may be sent now (possibly "")."""
        self.token_ids.extend(token_ids)
        if self._in_tool_block or not token_ids:
            return ""
        text = self._decode(self.token_ids)
        stable = text.rstrip("\ufffd")
        if self.has_tools:
            cut = stable.find(TOOL_OPEN)
            if cut >= 0:
                self._in_tool_block = True
                stable = stable[:cut]
            else:
                stable = stable[: len(stable) - _partial_tag_len(stable)]
            stable = stable.lstrip()  # the final content is stripped
        stable = stable.rstrip()  # trailing space may still be cleaned up or stripped
        return self._advance(stable)

    def finish(self) -> tuple[str, Reply]:
        """The last content delta and the whole reply (tool calls included)."""
        reply = parse_reply(self._decode(self.token_ids), self.has_tools)
        final = reply.content or ""
        return self._advance(final), reply

    def _advance(self, stable: str) -> str:
        if len(stable) <= len(self.emitted) or not stable.startswith(self.emitted):
            return ""  # nothing new, or the text changed under us: wait for the final form
        delta, self.emitted = stable[len(self.emitted):], stable
        return delta
