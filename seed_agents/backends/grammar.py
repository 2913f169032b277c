"""Constrained decoding: the grammars of the formats we parse, and the token mask that
enforces one on the local backend.

Why: a small policy often cannot write the formats our parsers read. Measured with
SmolLM2-135M (``scripts/constrained_parse_rates.py``): its hindsight skills and its tool
calls mostly fail to parse unconstrained, so SEED gets no skill to distil and a tool
agent no tool result to learn from. Decoding under a grammar makes every reply parse
while the model still writes the words.

One grammar, both backends: a grammar travels as an xgrammar *structural tag* (JSON
text) in ``SamplingParams.structural_tag``. vLLM compiles it with xgrammar (the request's
``structured_outputs.structural_tag``) and the local backend compiles the same text with
the same library (``GrammarMask``), so a constrained completion follows the same rules
on either backend. The mask is applied to the raw logits before temperature and top-p
(vLLM's order), and the logprob reported for a sampled token is its log-softmax under
the mask, which is what vLLM returns; ``docs/constrained_decoding.md`` says what that
means for the PPO ratio.

- ``skill_tag``: the analyzer's reply, ``{"episode_summary": ..., "episode_skill": ...}``
  with the rules ``seed_agents.skills.parse_skill`` checks built in (word counts, no
  control tokens), and bounded lengths so a reply that loops still closes.
- ``tool_call_tag``: free text without the tool format's tags, in which ``<tool_call>`` can
  only open a call to a bound tool whose arguments follow that tool's JSON schema; the
  model still chooses between answering and calling. A forced call (an assistant prefill) continues from the prefill.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from seed_agents.tool_calls import tool_call_frame

MAX_WHITESPACE = 4
"""Consecutive whitespace allowed between JSON tokens: enough for an indented object,
too little for the whitespace loops a greedy small model falls into."""

# The skill reply is spelled out as a fixed sequence, not as a JSON schema: compact JSON
# in a fixed key order (``parse_skill`` accepts any spacing; the model loses nothing) with
# bounded free text in the strings, so a reply that loops still closes within its budget.
# No quote, backslash or control character in the strings: no escapes to get wrong, and
# raw control characters are invalid JSON. The skill holds none of < > | [ ] (every chat
# control token and tag in ``skills.CONTROL_MARKERS`` has one). Its first words are words:
# a letter, then letters, ' _ or -, then one mark of punctuation at most (no ':', so it
# cannot open with a role marker such as "User:"). Any non-space run was allowed before, and
# SmolLM2 at a 64-token budget spent it on "words" such as "string.1.1.1.1.1.1.1", one token
# a character, so 43 of 96 skills of a learning-curve run were cut before they closed.
_NO_ESCAPES = ['"', "\\", *(chr(c) for c in range(32))]
_NO_MARKERS = [*_NO_ESCAPES, "<", ">", "|", "[", "]"]
_WORD_CHARS = 13  # the longest first word, its punctuation included
_WORD = r"[A-Za-z][A-Za-z'_\-]{0,11}[.,;!?]?"
# after "Call <tool> with", an argument's words may hold digits and = (a=3, "14.5")
_ARG_WORD = r"[A-Za-z0-9][A-Za-z0-9'_\-=.]{0,11}[,;]?"
_TOOL_NAME = re.compile(r"[A-Za-z0-9_]{1,64}")


def skill_tag(*, min_words: int = 5, max_words: int = 120, max_tokens: int = 512,
              summary_max_chars: int = 300, skill_max_chars: int = 400, call_names: Sequence[str] = ()) -> str:
    """The structural tag of a hindsight-skill reply that ``parse_skill`` (same word
    limits) accepts whatever the model writes: ``{"episode_summary": "...",
    "episode_skill": "..."}``, the skill ``min_words`` words, then free text short enough
    (two characters a word at most) that it cannot pass ``max_words``. The free text is
    also capped in tokens so that the whole reply closes within ``max_tokens`` (a model
    looping on one-character tokens would otherwise run out of budget mid-string).

    ``call_names`` (``skills.opening call``): the skill opens ``Call <name> with`` and one
    of these tool names, then its words: the writer chooses the tool and what follows, the
    grammar only makes it name one. A skill that names the call the task needed is what a
    135M model can copy (the oracle's skills, docs/results.md); its own skills never named
    a tool. Names that are not plain identifiers are left out; none left: the word opening."""
    if not 1 <= min_words <= max_words:
        raise ValueError(f"need 1 <= min_words <= max_words, got {min_words}, {max_words}")
    names = sorted({n for n in call_names if _TOOL_NAME.fullmatch(n)})
    n_args = max(min_words - 3, 1)
    if names and 3 + n_args <= max_words:
        # "Call", the name and "with" are three words; the rest of min_words are argument words
        first_words = f"Call ({'|'.join(names)}) with" + f"( {_ARG_WORD})" * n_args
        opening_chars = len("Call  with") + max(map(len, names)) + n_args * (_WORD_CHARS + 1)
        opening_words = 3 + n_args
    else:
        first_words = _WORD + (f"( {_WORD}){{{min_words - 1}}}" if min_words > 1 else "")
        opening_chars = min_words * (_WORD_CHARS + 1)
        opening_words = min_words
    # worst cases, one token a character: the fixed text 43, each first word and its space
    free_tokens = max_tokens - 48 - opening_chars
    # A small budget (skills.max_tokens 128, the CPU demo's: under 134) cannot cover that
    # worst case; words are ~1-2 tokens, not 21, so the free text gets two thirds of what
    # the fixed text leaves: the reply then closes unless the first words are spelled out
    # a character a token (then it is cut and parses as invalid, as an unconstrained one would).
    if free_tokens < 16:
        free_tokens = (max_tokens - 48) * 2 // 3
    # A budget too small for any skill still gets a grammar (the call is made and recorded,
    # and its cut reply parses as invalid, as an unconstrained one would), not an error
    # that would leave the episode without its analyzer call.
    free_tokens = max(free_tokens, 8)
    rest_chars = min(2 * (max_words - opening_words), skill_max_chars)
    return _tag({"type": "sequence", "elements": [
        {"type": "const_string", "value": '{"episode_summary": "'},
        {"type": "any_text", "excludes": _NO_ESCAPES, "max_chars": summary_max_chars, "max_tokens": free_tokens * 2 // 5},
        {"type": "const_string", "value": '", "episode_skill": "'},
        {"type": "regex", "pattern": first_words},
        {"type": "any_text", "excludes": _NO_MARKERS, "max_chars": rest_chars, "max_tokens": free_tokens * 3 // 5},
        {"type": "const_string", "value": '"}'},
    ]})


MAX_STRING_CHARS = 128
"""The length cap given to a tool argument string whose schema sets none (no
``maxLength``, ``pattern``, ``format``, ``enum`` or ``const``), so that a call closes
within the token budget. xgrammar then admits no JSON escapes in that string."""


def _bounded_strings(schema: Any, max_chars: int) -> Any:
    """``schema`` with ``maxLength`` on every unbounded string, nested ones included."""
    if isinstance(schema, list):
        return [_bounded_strings(s, max_chars) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: (v if k in ("enum", "const", "default", "examples") else _bounded_strings(v, max_chars))
           for k, v in schema.items()}
    if out.get("type") == "string" and not {"maxLength", "pattern", "format", "enum", "const"} & out.keys():
        out["maxLength"] = max_chars
    return out


def _arguments_schema(tool: dict[str, Any], max_string_chars: int) -> dict[str, Any]:
    """A bound tool's parameter schema, closed to unknown top-level keys (the tool would
    reject or drop them) unless it says otherwise, its strings bounded."""
    schema = dict(tool["function"].get("parameters") or {"type": "object", "properties": {}})
    schema.setdefault("type", "object")
    if schema.get("type") == "object":
        schema.setdefault("additionalProperties", False)
    return _bounded_strings(schema, max_string_chars)


ANSWER_EXCLUDES = ("<tool_r", "</tool", "tool_response", "<tool_call ", "<tool_call_", "<|im_")
"""What the free text of a reply that may call tools can never hold: the tool format's tags
outside a call, and their variants. A small model answering after a tool's result copies
that result's user turn whole, ``<tool_response>`` tag included; denied the exact tag, it
wrote ``<tool_response >`` and ``<tool_response_json>``. A user must never be shown either,
so the answer is decoded without them (the reward still pays nothing for markup,
``tool_calls.carries_markup``, where a reply is not decoded under this grammar). Prefixes,
because an exclusion is a literal string; ``<tool_call>`` itself stays the call's trigger."""


def tool_call_tag(tools: Sequence[dict[str, Any]], prefix: str = "", *,
                  max_string_chars: int = MAX_STRING_CHARS) -> str | None:
    """The structural tag of a reply that may call ``tools`` (OpenAI-style schemas).

    Free text that never holds ``ANSWER_EXCLUDES``, where ``<tool_call>`` opens a call
    ``tool_calls.format_tool_call`` writes:
    one of the bound names, then arguments that follow that tool's schema. ``prefix`` is a
    forced call's prefill (``chat_model.forced_tool_prefix``): the grammar then starts
    inside that call, and the reply is that one call. Prose after a forced call was a
    model answering before it had the tool's result: SmolLM2 wrote a made-up figure there
    ("Krubaim was founded in 2014.") and copied it into its answer next turn instead of
    the tool's. Further calls are not allowed either (OpenAI's ``required`` would allow
    them): given the chance, SmolLM2 repeated the same call until ``max_tokens`` cut the
    last copy, which then failed to parse (1 of 4 forced replies at 96 tokens,
    ``tests/integration/test_constrained_smollm2.py``). The agent calls again next turn
    if it needs to. None when no bound tool can continue ``prefix``.
    Unbounded argument strings get ``max_string_chars`` (``MAX_STRING_CHARS``).
    """
    calls = []
    for tool in tools:
        begin, end = tool_call_frame(tool["function"]["name"])
        args = {"type": "json_schema", "json_schema": _arguments_schema(tool, max_string_chars), "max_whitespace_cnt": MAX_WHITESPACE}
        calls.append((begin, args, end))
    if not calls:
        return None
    if not prefix:
        return _tag({"type": "triggered_tags", "triggers": ["<tool_call>"],
                     "tags": [{"type": "tag", "begin": b, "content": a, "end": e} for b, a, e in calls],
                     "excludes": list(ANSWER_EXCLUDES)})
    rest = []
    for begin, args, end in calls:
        if begin.startswith(prefix):
            head = [{"type": "const_string", "value": begin[len(prefix):]}] if len(begin) > len(prefix) else []
            rest.append({"type": "sequence", "elements": [*head, args, {"type": "const_string", "value": end}]})
    if not rest:
        return None
    return _tag(rest[0] if len(rest) == 1 else {"type": "or", "elements": rest})


def _tag(fmt: dict[str, Any]) -> str:
    # Key order is kept: a JSON schema's properties come in the order they are declared.
    return json.dumps({"type": "structural_tag", "format": fmt}, ensure_ascii=False)


# -- the local backend's mask ----------------------------------------------------------

_COMPILERS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_COMPILERS_LOCK = threading.Lock()


def _compiler(tokenizer: Any, vocab_size: int) -> Any:
    """One xgrammar compiler per tokenizer; it caches compiled grammars by their text
    (the skill grammar takes seconds to compile, then nothing)."""
    import xgrammar as xgr

    with _COMPILERS_LOCK:
        by_size = _COMPILERS.setdefault(tokenizer, {})
        if vocab_size not in by_size:
            info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
            by_size[vocab_size] = xgr.GrammarCompiler(info, cache_enabled=True)
        return by_size[vocab_size]


class GrammarMask:
    """A transformers logits processor: each row of a batch follows the grammar.

    Called once per generated position with the batch's ids so far and the logits; it
    feeds each row's matcher the token sampled last, then sets every token the grammar
    forbids to -inf. ``log_mass_B_T`` keeps, per row and step, the log of the probability
    mass the mask let through (<= 0): the masked log-softmax of a token is its raw
    log-softmax minus that. Use one instance per ``generate`` call (matchers hold state).
    """

    def __init__(self, structural_tag: str, tokenizer: Any, vocab_size: int, batch_size: int,
                 stop_token_ids: Sequence[int]) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        compiled = _compiler(tokenizer, vocab_size).compile_structural_tag(structural_tag)
        # The stop ids end the completion only where the grammar is complete (as in vLLM,
        # which passes the request's stop ids the same way).
        stops = sorted(set(stop_token_ids))
        self.matchers = [xgr.GrammarMatcher(compiled, override_stop_tokens=stops) for _ in range(batch_size)]
        self.vocab_size = vocab_size
        self.bitmask = xgr.allocate_token_bitmask(batch_size, vocab_size)
        self.log_mass: list[torch.Tensor] = []
        self._started = False

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if input_ids.shape[0] != len(self.matchers):
            raise ValueError(f"batch of {input_ids.shape[0]} rows for {len(self.matchers)} matchers")
        for i, m in enumerate(self.matchers):
            if self._started and not m.is_terminated():
                token = int(input_ids[i, -1])
                if not m.accept_token(token):
                    raise RuntimeError(f"row {i} sampled token {token}, which its grammar forbids")
            if m.is_terminated():  # finished rows only see padding: leave them unmasked
                self.bitmask[i].fill_(-1)
            else:
                m.fill_next_token_bitmask(self.bitmask, i)
        self._started = True
        lse_all = scores.float().logsumexp(-1)
        # A copy: transformers keeps the tensor it passed in as the step's raw logits.
        scores = scores.clone()
        self._xgr.apply_token_bitmask_inplace(scores, self.bitmask.to(scores.device), vocab_size=self.vocab_size)
        self.log_mass.append((scores.float().logsumexp(-1) - lse_all).cpu())
        return scores

    def streamed(self, on_token: Callable[[int, float], None]) -> Callable[[int, float], None]:
        """``on_token`` of a one-row stream, handed the masked logprob instead of the raw
        one (a streamer sees step k's token after this mask ran for step k)."""
        steps = itertools.count()

        def masked(token: int, logprob: float) -> None:
            on_token(token, logprob - float(self.log_mass[next(steps)][0]))

        return masked

    def log_mass_B_T(self, steps: int) -> torch.Tensor:
        """[batch, steps] log allowed mass for the first ``steps`` generated positions."""
        if steps == 0:
            return torch.zeros(len(self.matchers), 0)
        return torch.stack(self.log_mass[:steps], dim=1)


def grammar_mask(structural_tag: str | None, tokenizer: Any, vocab_size: int, batch_size: int,
                 stop_token_ids: Sequence[int]) -> GrammarMask | None:
    """A ``GrammarMask`` for a constrained request; None for an unconstrained one."""
    if structural_tag is None:
        return None
    return GrammarMask(structural_tag, tokenizer, vocab_size, batch_size, stop_token_ids)
