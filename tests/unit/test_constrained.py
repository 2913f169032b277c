"""Constrained decoding (``seed_agents.backends.grammar``): grammars, the local backend's
mask, the chat model's switch, and the analyzer.

A tiny *random* model is the hardest writer there is: unconstrained it never produces a
parsable skill or tool call, so "always parses under the grammar" means the grammar, not
the model, did it.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import torch
import xgrammar as xgr
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool

from seed_agents.backends.grammar import (
    GrammarMask,
    _compiler,
    skill_tag,
    tool_call_tag,
)
from seed_agents.backends.local import LocalBackend
from seed_agents.backends.vllm import completion_body
from seed_agents.capture import capture
from seed_agents.chat_model import SeedChatModel, forced_tool_prefix
from seed_agents.graphs.hindsight import write_skill
from seed_agents.skills import parse_skill, tool_names
from seed_agents.stage1.analyzers import PolicyAnalyzer
from seed_agents.tool_calls import format_tool_call, parse_tool_calls
from seed_agents.types import LLMCall, SamplingParams


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def lookup(key: str) -> str:
    """Look a key up in the knowledge base."""
    return key


TOOLS = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                           "parameters": t.args_schema.model_json_schema()}} for t in (add, lookup)]


@pytest.fixture(scope="module")
def backend(tiny_model_dir):
    return LocalBackend(tiny_model_dir)


def _matcher(tokenizer, tag: str) -> xgr.GrammarMatcher:
    return xgr.GrammarMatcher(_compiler(tokenizer, len(tokenizer)).compile_structural_tag(tag))


def _accepts(tokenizer, tag: str, text: str) -> bool:
    m = _matcher(tokenizer, tag)
    return m.accept_string(text) and m.is_completed()


# -- grammars ----------------------------------------------------------------------------

def test_tool_call_grammar_admits_prose_and_calls_to_bound_tools_only(tokenizer):
    tag = tool_call_tag(TOOLS)
    assert _accepts(tokenizer, tag, "The answer is 4.")
    assert _accepts(tokenizer, tag, "Let me add.\n" + format_tool_call("add", {"a": 1, "b": 2}))
    assert _accepts(tokenizer, tag, format_tool_call("lookup", {"key": "x"}) + "\n" + format_tool_call("add", {"a": 1, "b": 2}))
    assert not _accepts(tokenizer, tag, format_tool_call("mul", {"a": 1, "b": 2}))  # not bound
    assert not _accepts(tokenizer, tag, format_tool_call("add", {"a": "one", "b": 2}))  # schema: int
    assert not _accepts(tokenizer, tag, format_tool_call("add", {"a": 1}))  # b is required
    assert not _accepts(tokenizer, tag, '<tool_call>\n{"name": 5 * 6}\n</tool_call>')  # what SmolLM2 wrote


def test_an_answer_beside_the_tools_never_holds_the_tool_formats_tags(tokenizer):
    """What SmolLM2 wrote after a tool's result: the result's user turn copied whole, tag
    included. The free text of a reply that may call tools cannot hold those tags."""
    tag = tool_call_tag(TOOLS)
    assert _accepts(tokenizer, tag, "The population of Broukroul is 301535.")
    assert _accepts(tokenizer, tag, "a < b and b > c")  # a bracket alone is prose
    assert _accepts(tokenizer, tag, "Let me look. " + format_tool_call("add", {"a": 1, "b": 2}))  # the trigger stays
    for copied in ("<tool_response>\nThe population of Broukroul is 301535.", "301535\n</tool_response>",
                   "done </tool_call>", "<tool_response >\n7810", "<tool_response_json>\n{", "<tool_call >x"):
        assert not _matcher(tokenizer, tag).accept_string(copied)


@pytest.mark.parametrize("choice", ["any", "add"])
def test_forced_call_grammar_continues_the_prefill(tokenizer, choice):
    prefix = forced_tool_prefix(choice, TOOLS)
    tag = tool_call_tag(TOOLS, prefix)
    full = format_tool_call("add", {"a": 1, "b": 2})
    assert full.startswith(prefix) and _accepts(tokenizer, tag, full[len(prefix):])
    assert not _accepts(tokenizer, tag, "")  # the call must be finished
    rest = full[len(prefix):]
    assert not _accepts(tokenizer, tag, rest + "\nThe answer is 3.")  # a forced reply is the call only
    assert not _accepts(tokenizer, tag, rest + "\n" + format_tool_call("add", {"a": 1, "b": 2}))  # one call
    assert tool_call_tag(TOOLS, '<tool_call>\n{"name": "nope"') is None


def test_skill_grammar_holds_the_parsers_rules(tokenizer):
    tag = skill_tag()
    good = json.dumps({"episode_summary": "It went well.", "episode_skill": "Take the key before opening the chest."})
    assert _accepts(tokenizer, tag, good) and parse_skill(good)[2] is None
    for skill in ("Too short here", "one two three four <|im_end|> five", "User: take the key now please"):
        assert not _accepts(tokenizer, tag, json.dumps({"episode_summary": "", "episode_skill": skill}))


def test_a_skills_first_words_are_words(tokenizer):
    """SmolLM2 at the learning curve's 64 tokens spent them on "words" such as
    "string.1.1.1.1.1.1.1", one token a character, and the reply was cut: the first five
    words are letters now (with ' _ - inside, one mark after); what follows is free."""
    tag = skill_tag(max_tokens=64)

    def accepts(skill: str) -> bool:
        return _accepts(tokenizer, tag, json.dumps({"episode_summary": "x", "episode_skill": skill}))

    assert accepts("Call lookup with place Malam, then field area 30153 (it's 7).")
    assert accepts("Don't guess: use get_book first, re-check it.") is False  # a colon in the first words
    assert accepts("Don't guess, use get_book first; re-check: it.")
    for cut in ("string.1.1.1.1.1.1.1 a b c d", "The answer is 30153 now", "Use (lookup) to find it"):
        assert not accepts(cut), cut


def test_a_call_opening_names_one_of_the_tools(tokenizer):
    """``skills.opening call``: the skill opens "Call <tool> with", the tool one of those
    offered; argument words may hold digits and =; names that are not identifiers are
    dropped, and with none left the opening is the words one."""
    tag = skill_tag(max_tokens=64, call_names=["lookup", "add", "not a name"])

    def accepts(skill: str, t: str = tag) -> bool:
        return _accepts(tokenizer, t, json.dumps({"episode_summary": "x", "episode_skill": skill}))

    assert accepts("Call lookup with place Malam and field area.")
    assert accepts("Call add with a=3 b=14.5, then answer.")
    for skill in ("Call multiply with a=3 and b=4", "Take the key before opening the chest.",
                  "Call not a name with x", "Call lookup with"):
        assert not accepts(skill), skill
    assert skill_tag(call_names=["not a name"]) == skill_tag()
    assert skill_tag(min_words=5, max_words=5, call_names=["add"]) != skill_tag(min_words=5, max_words=5)
    assert skill_tag(min_words=1, max_words=3, call_names=["add"]) == skill_tag(min_words=1, max_words=3)  # no room


def test_every_string_a_call_opening_lets_through_parses(tokenizer):
    gen = torch.Generator().manual_seed(1)
    mask = GrammarMask(skill_tag(max_words=20, summary_max_chars=60, call_names=["lookup", "add"]), tokenizer,
                       len(tokenizer), 1, [tokenizer.eos_token_id])
    ids, out = torch.zeros((1, 1), dtype=torch.long), []
    for _ in range(500):
        token = int(torch.multinomial(mask(ids, torch.zeros(1, len(tokenizer))).softmax(-1), 1, generator=gen))
        if token == tokenizer.eos_token_id:
            break
        out.append(token)
        ids = torch.tensor([[token]])
    summary, skill, reason = parse_skill(tokenizer.decode(out), max_words=20)
    assert reason is None and skill.split()[0] == "Call" and skill.split()[1] in ("lookup", "add"), skill


def test_the_skill_grammar_closes_within_its_token_budget(tokenizer):
    """A writer that always picks the allowed token with the fewest characters (a model
    looping on "1.1.1.") still closes the reply within ``max_tokens``."""
    budget = 200
    lengths = torch.tensor([len(tokenizer.decode([i])) or 99 for i in range(len(tokenizer))], dtype=torch.float)
    mask = GrammarMask(skill_tag(max_tokens=budget), tokenizer, len(tokenizer), 1, [tokenizer.eos_token_id])
    ids, out = torch.zeros((1, 1), dtype=torch.long), []
    for _ in range(budget):
        scores = mask(ids, -lengths.clone().unsqueeze(0))
        token = int(scores.argmax())
        if token == tokenizer.eos_token_id:
            break
        out.append(token)
        ids = torch.tensor([[token]])
    assert token == tokenizer.eos_token_id and parse_skill(tokenizer.decode(out))[2] is None, tokenizer.decode(out)


def test_every_string_the_skill_grammar_lets_through_parses(tokenizer):
    """Random walks through the grammar (uniform over the allowed tokens, forced to close
    by the length caps) always give a skill ``parse_skill`` accepts."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(2):
        mask = GrammarMask(skill_tag(max_words=20, summary_max_chars=60), tokenizer, len(tokenizer), 1, [tokenizer.eos_token_id])
        ids = torch.zeros((1, 1), dtype=torch.long)
        out: list[int] = []
        for _ in range(500):
            scores = mask(ids, torch.zeros(1, len(tokenizer)))
            token = int(torch.multinomial(scores.softmax(-1), 1, generator=gen))
            if token == tokenizer.eos_token_id:
                break
            out.append(token)
            ids = torch.tensor([[token]])
        text = tokenizer.decode(out)
        assert parse_skill(text)[2] is None, text


# -- the local backend -------------------------------------------------------------------

def _masked_logprobs(model, tokenizer, prompt_ids, completion_ids, tag) -> list[float]:
    """Independent reference: full logits, the matcher's allowed set, log-softmax over it."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + completion_ids])).logits[0, len(prompt_ids) - 1: -1].float()
    m = _matcher(tokenizer, tag)
    bitmask = xgr.allocate_token_bitmask(1, len(tokenizer))
    out = []
    for row, token in zip(logits, completion_ids, strict=True):
        m.fill_next_token_bitmask(bitmask)
        masked = row.clone().unsqueeze(0)
        xgr.apply_token_bitmask_inplace(masked, bitmask)
        out.append(float(masked.log_softmax(-1)[0, token]))
        assert m.accept_token(token)
    return out


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_local_backend_samples_under_the_mask_and_reports_its_logprobs(backend, tokenizer, temperature):
    tag = skill_tag(max_words=12, summary_max_chars=40, max_tokens=200)  # short caps: a random model writes to the cap
    prompt = tokenizer("Write the skill:", add_special_tokens=False)["input_ids"]
    params = SamplingParams(max_tokens=200, temperature=temperature, seed=3, structural_tag=tag,
                            stop_token_ids=(tokenizer.eos_token_id,))
    comp = backend.generate(prompt, params)
    text = tokenizer.decode(comp.token_ids, skip_special_tokens=True)
    assert comp.finish_reason == "stop" and parse_skill(text)[2] is None, text
    expected = _masked_logprobs(backend.model, tokenizer, prompt, comp.token_ids, tag)
    assert comp.logprobs == pytest.approx(expected, abs=1e-4)
    raw = backend.score(prompt, comp.token_ids)  # the unconstrained distribution, as the trainer scores
    assert all(c >= r - 1e-5 for c, r in zip(comp.logprobs, raw, strict=True))
    assert any(c - r > 1.0 for c, r in zip(comp.logprobs, raw, strict=True))  # the mask did move mass
    streamed = [p for piece in backend.stream(prompt, params) for p in zip(piece.token_ids, piece.logprobs, strict=True)]
    if temperature == 0:
        assert [t for t, _ in streamed] == comp.token_ids
        assert [lp for _, lp in streamed] == pytest.approx(comp.logprobs, abs=1e-5)


def test_unconstrained_requests_are_unchanged(backend, tokenizer):
    prompt = tokenizer("Hello there", add_special_tokens=False)["input_ids"]
    plain = SamplingParams(max_tokens=12, temperature=0.0)
    comp = backend.generate(prompt, plain)
    assert comp.logprobs == pytest.approx(backend.score(prompt, comp.token_ids), abs=1e-4)
    assert "structured_outputs" not in completion_body("m", prompt, plain)
    body = completion_body("m", prompt, plain.model_copy(update={"structural_tag": skill_tag()}))
    assert body["structured_outputs"] == {"structural_tag": skill_tag()}


# -- the chat model ----------------------------------------------------------------------

def _calls(llm, choice, n=3):
    bound = llm.bind_tools([add, lookup], tool_choice=choice)
    return [bound.invoke([HumanMessage("What is 2 + 3?")], seed=s) for s in range(n)]


def test_forced_tool_calls_always_parse_and_name_a_bound_tool(backend, tokenizer):
    llm = SeedChatModel(backend=backend, tokenizer=tokenizer, temperature=1.0, max_tokens=100)
    with capture() as scope:
        replies = _calls(llm, "any")
    assert all(r.tool_calls and not r.invalid_tool_calls for r in replies), [r.invalid_tool_calls for r in replies]
    assert {c["name"] for r in replies for c in r.tool_calls} <= {"add", "lookup"}
    assert all(c.sampling.structural_tag is not None for c in scope.calls)
    # the same random model, switched off: its calls do not parse
    off = llm.model_copy(update={"constrain_tool_calls": False, "sampling": llm.sampling.model_copy(update={"max_tokens": 30})})
    with capture() as scope:
        replies = _calls(off, "any", n=2)
    assert not any(r.tool_calls for r in replies)
    assert all(c.sampling.structural_tag is None for c in scope.calls)


def test_auto_tool_choice_leaves_prose_free(backend, tokenizer):
    llm = SeedChatModel(backend=backend, tokenizer=tokenizer, temperature=1.0, max_tokens=40)
    with capture() as scope:
        replies = _calls(llm, None)
    for reply, call in zip(replies, scope.calls, strict=True):
        assert not reply.invalid_tool_calls
        content, _, invalid = parse_tool_calls(call.text)
        assert not invalid and reply.content == content


# -- the analyzer ------------------------------------------------------------------------

def _episode() -> list[LLMCall]:
    return [LLMCall(messages=[{"role": "user", "content": "Find the key."}], prompt_ids=[1], completion_ids=[2],
                    logprobs=[-0.1], text="take key", scope={"trajectory_id": "t1", "task_id": "k"})]


@pytest.mark.parametrize("constrained", [True, False])
def test_analyzer_skills_parse_when_constrained(backend, tokenizer, constrained):
    llm = SeedChatModel(backend=backend, tokenizer=tokenizer)

    async def run():
        return await asyncio.gather(*(write_skill(llm, _episode(), "Find the key.", s, max_tokens=200 if constrained else 40,
                                                  max_words=10, constrained=constrained) for s in (True, False)))

    with capture() as scope:
        skills = asyncio.run(run())
    assert all(s.valid for s in skills) == constrained, [s.reject_reason for s in skills]
    assert all((c.sampling.structural_tag is not None) == constrained for c in scope.calls)


def test_write_skill_opens_with_a_tool_the_episode_was_offered(backend, tokenizer):
    llm = SeedChatModel(backend=backend, tokenizer=tokenizer)
    calls = [_episode()[0].model_copy(update={"tools": TOOLS}),
             _episode()[0].model_copy(update={"purpose": "analyzer", "tools": [{"function": {"name": "delete_all"}}]})]
    assert tool_names(calls) == ["add", "lookup"]  # the policy's calls only
    assert tool_names(_episode()) == []

    async def run():
        return [await write_skill(llm, calls, "Find the key.", True, max_tokens=200, max_words=10, opening=opening)
                for opening in ("call", "words")]

    with capture() as scope:
        call_skill, _ = asyncio.run(run())
    assert call_skill.valid and call_skill.skill.split()[:3] in (["Call", "add", "with"], ["Call", "lookup", "with"])
    tags = [c.sampling.structural_tag for c in scope.calls]
    assert tags[0] == skill_tag(max_tokens=200, max_words=10, call_names=["add", "lookup"]) and tags[1] == skill_tag(
        max_tokens=200, max_words=10)


def test_policy_analyzer_constrained_by_default(backend, tokenizer):
    llm = SeedChatModel(backend=backend, tokenizer=tokenizer)
    from seed_agents.skills import build_analyzer_messages

    messages = build_analyzer_messages("Find the key.", False, [("A room.", "take key")])
    reply = asyncio.run(PolicyAnalyzer(llm, max_tokens=400).analyze(messages))
    assert reply.error is None and parse_skill(reply.text)[2] is None, reply.text
