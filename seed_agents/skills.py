"""Hindsight skills: the analyzer prompt, a strict parser, and skill injection.

After an episode the policy itself (greedy) reads the task, the outcome and every step,
and writes ``{"episode_summary": ..., "episode_skill": ...}``. The skill is then put into
the prompt of every step of that episode to make the *teacher* context; the teacher
re-scores the completion tokens the policy already sampled, so only the prompt side of a
row changes (``teacher_prompt_ids``).

The parser is strict on purpose: a skill the policy cannot state cleanly gives no
distillation signal (the episode's RL term still applies), and a skill carrying chat
control tokens or role markers would corrupt the teacher prompt. It never raises on bad
model output; it returns a reason, which is recorded and counted.

The ``Analyzer`` contract (who writes a skill about an episode) lives here too, beside the
prompt it answers and the parser that checks it: the env suites' offline analyzers, the
stage-1 LLM analyzers (``seed_agents.stage1.analyzers``) and the hindsight node all meet
at it.
"""

from __future__ import annotations

import json
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.prompts import ChatPromptTemplate
from pydantic import BaseModel, Field

from seed_agents.types import AnswerFormat, EpisodeRecord, LLMCall

# -- the analyzer prompt (paper's stage-1 analyzer, episode skill only) ---------------

ANALYZER_SYSTEM = (
    "You analyze finished episodes of an AI agent and distill them into one short skill "
    "the agent can follow next time. You answer with a single JSON object and nothing else."
)

ANALYZER_USER = """Analyze the following agent episode and return ONLY valid JSON.

You need to complete two fields:
1. Write a concise episode_summary.
2. {skill_instruction}

Important constraints:
- Write episode_skill as one short policy-facing skill (one to three sentences), not as a retrospective explanation of the trajectory.
- Use the task description together with the episode context to judge progress and mistakes.
- Return only these top-level fields: episode_summary, episode_skill.

Return format:
{answer_format}

Episode context:
- Task description: {task}
- episode_success: {outcome}
- Interaction trajectory:
{trajectory}"""

SUCCESS_INSTRUCTION = (
    "Write one episode_skill that extracts the successful trajectory into workflow: the core "
    "decision rule and action ordering that made this trajectory work."
)
FAILURE_INSTRUCTION = (
    "Write one episode_skill that extracts the failed trajectory into avoidance rules: the core "
    "mistake and warning signs that the agent should avoid."
)

ANSWER_FORMATS: dict[str, str] = {
    "paper": '{\n  "episode_summary": "string",\n  "episode_skill": "string"\n}',
    "described": '{\n  "episode_summary": "<what the agent did and how the episode ended>",\n'
                 '  "episode_skill": "<the rule to follow next time>"\n}',
    "workflow": '{\n  "episode_summary": "<what the agent did and how the episode ended>",\n'
                '  "episode_skill": "To <reach the goal>, first <do this>, then <do that>."\n}',
}
"""The reply's format example in the analyzer prompt. A 135M writer copies whatever the
example holds, so the example is the skill's shape. ``paper``: the paper's, a type name per
value; most of SmolLM2-135M's own skills in a learning run opened ``string. This is a ...``
(the summary was ``string``). ``described``: what each value should hold, in angle
brackets (the convention larger models follow); SmolLM2 copies the words inside them ("The
rule to follow next time"). ``workflow``: the skill as a sentence frame with slots, which
the skill grammar's first words (letters only) make the writer fill ("To lookup the
population of ..."). ``bench/atlas_skills.py --analyzers policy,policy-described,
policy-workflow`` measures them on the same episodes."""

ANALYZER_PROMPT = ChatPromptTemplate.from_messages([("system", ANALYZER_SYSTEM), ("human", ANALYZER_USER)])
"""Variables: ``skill_instruction``, ``task``, ``outcome`` (success|failure), ``trajectory``,
``answer_format`` (a value of ``ANSWER_FORMATS``)."""


def episode_steps(calls: Sequence[LLMCall]) -> list[tuple[str, str]]:
    """(observation, response) for each *policy* call, in order.

    The observation is the content of the last user or tool message the model saw (with
    a history window it also holds the recent history; with a growing chat it is the
    newest turn); the response is the decoded completion, after the prefill it continued
    where the call had one. Works for any captured graph.
    """
    steps = []
    for call in calls:
        if call.purpose != "policy":
            continue
        observation = next(
            (str(m.get("content") or "") for m in reversed(call.messages) if m.get("role") in ("user", "tool")), ""
        )
        # a prefill the model continued (a forced or guided call's opening, the last,
        # assistant message) is part of the action: without it the analyzer reads a call
        # that starts mid-JSON ('lookup", "arguments": ...') and cannot tell what was done
        last = call.messages[-1] if call.messages else {}
        prefill = str(last.get("content") or "") if last.get("role") == "assistant" else ""
        steps.append((observation, prefill + call.text))
    return steps


def tool_names(calls: Sequence[LLMCall]) -> list[str]:
    """The names of the tools the episode's policy calls were offered (OpenAI-style schemas,
    ``{"type": "function", "function": {"name": ...}}`` or a bare ``{"name": ...}``), sorted:
    what a ``skills.opening call`` skill may name."""
    names = set()
    for call in calls:
        if call.purpose != "policy":
            continue
        for schema in call.tools or []:
            fn = schema.get("function") if isinstance(schema.get("function"), dict) else schema
            if isinstance(fn.get("name"), str):
                names.add(fn["name"])
    return sorted(names)


def first_user_message(calls: Sequence[LLMCall]) -> str:
    """The task as the analyzer sees it by default: the first user message of the first
    policy call (the hindsight node and ``skills collect`` both use it)."""
    for call in calls:
        if call.purpose != "policy":
            continue
        for m in call.messages:
            if m.get("role") == "user":
                return str(m.get("content") or "")
    return ""


def _clip(text: str, limit: int, head_share: float) -> str:
    """Keep ``limit`` chars of ``text``: a head share and the rest from the tail."""
    text = text.strip()
    if len(text) <= limit:
        return text
    head = int(limit * head_share)
    tail = limit - head
    omitted = len(text) - head - tail
    return f"{text[:head]}[... {omitted} chars omitted ...]{text[len(text) - tail:] if tail else ''}"


def format_trajectory(steps: Sequence[tuple[str, str]], *, max_chars_per_step: int = 1500, max_steps: int = 30) -> str:
    """Steps as the analyzer reads them, 0-based. Long episodes keep their first third
    and their end (where the outcome shows) and say how many steps were left out; long
    observations keep their head and, mostly, their tail (the newest text)."""
    if not steps:
        return "(no steps)"
    shown: list[int | None] = list(range(len(steps)))
    if len(steps) > max_steps:
        n_head = max(1, max_steps // 3)
        n_tail = max(1, max_steps - n_head)
        shown = [*range(n_head), None, *range(len(steps) - n_tail, len(steps))]
    obs_limit = max(1, max_chars_per_step * 2 // 3)
    resp_limit = max(1, max_chars_per_step - obs_limit)
    blocks = []
    for i in shown:
        if i is None:
            blocks.append(f"[... {len(steps) - len(shown) + 1} steps omitted ...]")
            continue
        obs, resp = steps[i]
        blocks.append(f"Step {i}\nObservation: {_clip(obs, obs_limit, 1 / 3)}\nResponse: {_clip(resp, resp_limit, 1.0)}")
    return "\n\n".join(blocks)


def build_analyzer_messages(task_text: str, success: bool, steps: Sequence[tuple[str, str]], *,
                            max_chars_per_step: int = 1500, max_steps: int = 30,
                            answer_format: AnswerFormat = "paper") -> list[BaseMessage]:
    """The analyzer's chat messages for one episode (see ``ANALYZER_PROMPT``)."""
    if answer_format not in ANSWER_FORMATS:
        raise ValueError(f"answer_format must be one of {sorted(ANSWER_FORMATS)}, not {answer_format!r}")
    return ANALYZER_PROMPT.format_messages(
        answer_format=ANSWER_FORMATS[answer_format],
        skill_instruction=SUCCESS_INSTRUCTION if success else FAILURE_INSTRUCTION,
        task=task_text.strip() or "(not available)",
        outcome="success" if success else "failure",
        trajectory=format_trajectory(steps, max_chars_per_step=max_chars_per_step, max_steps=max_steps),
    )


# -- strict parsing -----------------------------------------------------------------

CONTROL_MARKERS = (
    "<|", "|>", "<s>", "</s>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
    "[INST]", "[/INST]", "<start_of_turn>", "<end_of_turn>", "<skill>", "</skill>",
)
"""Substrings a skill may not contain: chat-template control tokens (``<|im_start|>`` and
``<|eot_id|>`` both contain ``<|``), tool-call tags, and our own skill-block delimiters."""

_ROLE_LINE = re.compile(r"^\s*(system|user|assistant|human|tool)\s*:", re.IGNORECASE | re.MULTILINE)
_FENCE = re.compile(r"^```(?:json|JSON)?[ \t]*\n(.*)\n[ \t]*```$", re.DOTALL)


def parse_skill(text: str, *, min_words: int = 5, max_words: int = 120) -> tuple[str, str, str | None]:
    """``(summary, skill, reject_reason)`` from the analyzer's reply; reason None = valid.

    Accepts exactly one JSON object, optionally inside a ```json fence, with nothing
    else around it but whitespace. Both keys must be strings. The skill must have
    ``min_words``..``max_words`` words and no control tokens or role-marker lines.
    A rejected reply still returns whatever summary and skill could be read.
    """
    body = str(text or "").strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1).strip()
    if not body:
        return "", "", "empty reply"
    if not body.startswith("{"):
        return "", "", "not a JSON object: the reply must start with '{'"
    try:
        obj, end = json.JSONDecoder().raw_decode(body)
    except json.JSONDecodeError as e:
        return "", "", f"invalid JSON: {e.msg} at char {e.pos}"
    if body[end:].strip():
        return "", "", "text after the JSON object"
    if not isinstance(obj, dict):
        return "", "", "not a JSON object"
    for key in ("episode_summary", "episode_skill"):
        if key not in obj:
            return "", "", f"missing key {key!r}"
        if not isinstance(obj[key], str):
            return "", "", f"{key!r} is not a string"
    summary, skill = obj["episode_summary"].strip(), obj["episode_skill"].strip()
    words = len(skill.split())
    if words < min_words:
        return summary, skill, f"skill too short: {words} words (min {min_words})"
    if words > max_words:
        return summary, skill, f"skill too long: {words} words (max {max_words})"
    marker = next((m for m in CONTROL_MARKERS if m in skill), None)
    if marker is not None:
        return summary, skill, f"skill contains control token {marker!r}"
    role = _ROLE_LINE.search(skill)
    if role is not None:
        return summary, skill, f"skill contains role marker {role.group(1).lower()!r}"
    return summary, skill, None


# -- injection ----------------------------------------------------------------------

SKILL_HEADER = "## Skill from a previous attempt"


def skill_block(skill: str, header: str = SKILL_HEADER) -> str:
    """The delimited block the injectors insert (no surrounding blank lines)."""
    return f"{header}\n<skill>\n{skill.strip()}\n</skill>"


class SkillInjector(Protocol):
    """Puts a skill into a step's prompt. Pure: returns new messages, never mutates."""

    def inject(self, messages: list[BaseMessage], skill: str) -> list[BaseMessage]: ...


def _with_content(message: BaseMessage, content: str) -> BaseMessage:
    return message.model_copy(update={"content": content})


class SystemBlockInjector:
    """Default: append the skill block to the (first) system message, or add one."""

    def __init__(self, header: str = SKILL_HEADER) -> None:
        self.header = header

    def inject(self, messages: list[BaseMessage], skill: str) -> list[BaseMessage]:
        block = skill_block(skill, self.header)
        out = list(messages)
        for i, m in enumerate(out):
            if m.type == "system" and isinstance(m.content, str):
                out[i] = _with_content(m, f"{m.content}\n\n{block}" if m.content else block)
                return out
        return [SystemMessage(block), *out]


class TaskLineInjector:
    """ALFWorld-style (the paper's placement): the block goes right after the line that
    holds ``anchor`` ("Your task is to: ...") in the first user message that has one.

    Fallbacks, in order: before the final line of the last user message (the turn
    instruction, e.g. "Your command:"), as the paper does when the task line is absent;
    then, with no user message at all, the ``SystemBlockInjector`` placement.
    """

    def __init__(self, anchor: str = "Your task is to:", header: str = SKILL_HEADER) -> None:
        self.anchor = anchor
        self.header = header

    def inject(self, messages: list[BaseMessage], skill: str) -> list[BaseMessage]:
        block = skill_block(skill, self.header)
        out = list(messages)
        users = [i for i, m in enumerate(out) if m.type == "human" and isinstance(m.content, str)]
        for i in users:
            text = out[i].content
            at = text.find(self.anchor)
            if at >= 0:
                eol = text.find("\n", at)
                eol = len(text) if eol < 0 else eol
                rest = text[eol:].lstrip("\n")
                out[i] = _with_content(out[i], f"{text[:eol]}\n\n{block}" + (f"\n\n{rest}" if rest else ""))
                return out
        if users:
            i = users[-1]
            head, sep, last = out[i].content.rstrip().rpartition("\n")
            new = f"{head.rstrip()}\n\n{block}\n\n{last}" if sep else f"{block}\n\n{last}"
            out[i] = _with_content(out[i], new)
            return out
        return SystemBlockInjector(self.header).inject(messages, skill)


class LastTurnInjector:
    """The block goes after everything the step's prompt already holds, right before the
    model's turn: appended to the last message when it is the user's, else as a new user
    message (after a tool result, whose content is the tool's and is left as it was). A
    prefill the model continued (a forced call's opening, the last, assistant message) stays
    last, with the skill before it.

    Why it exists: with the skill this late, a teacher prompt shares every prompt token
    before the model's turn with its row's own prompt, and the teacher rows of a group
    share their system prompt, tool schemas and task, so the teacher pass's shared-prefix
    scoring computes them once per group, as the reference pass does (with the system
    block, each episode's skill splits them where the system message ends); and a teacher
    scored on top of the training forward's own prompt becomes possible
    (``bench/seed_overhead.py --injectors``). It is also the placement nearest the action,
    which a small model may follow more readily; whether it teaches as well as the system
    block is a learning question, not a given.
    """

    def __init__(self, header: str = SKILL_HEADER) -> None:
        self.header = header

    def inject(self, messages: list[BaseMessage], skill: str) -> list[BaseMessage]:
        if messages and messages[-1].type == "ai":  # a prefill the model continues: it stays last
            return [*self.inject(list(messages[:-1]), skill), messages[-1]]
        block = skill_block(skill, self.header)
        out = list(messages)
        if out and out[-1].type == "human" and isinstance(out[-1].content, str):
            last = out[-1].content.rstrip()
            out[-1] = _with_content(out[-1], f"{last}\n\n{block}" if last else block)
            return out
        return [*out, HumanMessage(block)]


INJECTORS: dict[str, Callable[[], SkillInjector]] = {
    "system": SystemBlockInjector, "task_line": TaskLineInjector, "last_turn": LastTurnInjector}


def make_injector(name: str) -> SkillInjector:
    """The injector a config names (``skills.injector``, ``skills eval``'s ``injector``)."""
    try:
        return INJECTORS[name]()
    except KeyError:
        raise ValueError(f"unknown skill injector {name!r}; choose from {', '.join(INJECTORS)}") from None


# -- teacher prompts ----------------------------------------------------------------

def messages_from_dicts(dicts: Sequence[dict[str, Any]]) -> list[BaseMessage]:
    """Inverse of ``chat_model.to_chat_dicts``: recorded role/content dicts -> messages."""
    out: list[BaseMessage] = []
    for d in dicts:
        role, content = d.get("role"), d.get("content") or ""
        if role == "system":
            out.append(SystemMessage(content))
        elif role == "user":
            out.append(HumanMessage(content))
        elif role == "assistant":
            calls = []
            for tc in d.get("tool_calls") or []:
                fn = tc.get("function", tc)
                args = fn.get("arguments", {})
                calls.append({"name": fn["name"], "args": json.loads(args) if isinstance(args, str) else args,
                              "id": tc.get("id"), "type": "tool_call"})
            out.append(AIMessage(content, tool_calls=calls))
        elif role == "tool":
            out.append(ToolMessage(content, tool_call_id=d.get("tool_call_id") or "", name=d.get("name")))
        else:
            raise ValueError(f"unsupported recorded role {role!r}")
    return out


def teacher_prompt_ids(llm: Any, call: LLMCall, skill: str, injector: SkillInjector | None = None) -> list[int]:
    """The prompt ids of ``call`` with ``skill`` injected, rendered like the original.

    The teacher row pairs these with the call's unchanged ``completion_ids``. With an
    injector that changes nothing, the result equals ``call.prompt_ids`` exactly.
    """
    messages = (injector or SystemBlockInjector()).inject(messages_from_dicts(call.messages), skill)
    return _render_like(llm, call, messages)


def rendered_prompt_ids(llm: Any, call: LLMCall) -> list[int]:
    """``call``'s own messages rendered again the way ``teacher_prompt_ids`` renders them,
    without a skill: what a teacher prompt is measured against."""
    return _render_like(llm, call, messages_from_dicts(call.messages))


def _render_like(llm: Any, call: LLMCall, messages: list[Any]) -> list[int]:
    # Templates without tool support record messages *after* the Hermes rewrite (tool
    # schemas already in the system message, calls and results as text): render those
    # without tools again, or the schemas would appear twice.
    tools = call.tools if llm.native_tools() else None
    prompt_ids, _ = llm.render(messages, tools)
    return prompt_ids


# -- the analyzer contract: who writes a skill about an episode ------------------------

class AnalyzerReply(BaseModel):
    """One analyzer answer. ``error`` set means no usable reply (the request failed)."""

    text: str = Field("", description="The raw reply (the SFT target when it parses).")
    prompt_tokens: int = Field(0, ge=0, description="As reported by the endpoint; 0 when unknown.")
    completion_tokens: int = Field(0, ge=0, description="As reported by the endpoint; 0 when unknown.")
    latency_s: float = Field(0.0, ge=0, description="Wall time of the request, retries included.")
    cost_usd: float = Field(0.0, ge=0, description="From the configured prices per 1M tokens; 0 when unpriced.")
    attempts: int = Field(1, ge=0, description="Requests sent for this reply (1 + retries).")
    error: str | None = Field(None, description="Why there is no reply; None on success.")


class Analyzer(ABC):
    """Writes one skill JSON per episode.

    LLM analyzers read ``messages`` (the analyzer prompt, the same one the policy gets in
    training); an offline analyzer (an env suite's ``offline_analyzer()``) reads the
    structured ``episode`` instead. Subclass it; ``graphs.hindsight`` tells an analyzer
    from a chat model by this type. ``analyze`` never raises for a failed request: the
    reply carries ``error``.
    """

    name: str = "analyzer"

    @abstractmethod
    async def analyze(self, messages: list[BaseMessage], episode: EpisodeRecord | None = None) -> AnalyzerReply:
        """The reply for one episode; ``episode`` is None where only the prompt exists."""

    async def aclose(self) -> None:
        """Release clients and backends this analyzer owns. Default: none."""


NO_STEPS = ("no structured steps recorded for this episode (metadata.env_steps): it was played by an older "
            "seed-agents or by a graph that is not the env agent; play it again to analyze it offline")
WORD_BUDGET = 110
"""Words a rule-written skill may use: under ``parse_skill``'s default maximum of 120."""


class RuleBasedAnalyzer(Analyzer):
    """Base of the env suites' offline analyzers: a pure ``summarize(episode)`` turned into
    the reply. An episode without structured steps is an error, never a guess from text."""

    #: Replaces a skill that would not parse (too long, too short).
    fallback_skill = "Each turn, copy exactly one command from the list that moves you toward the goal."

    async def analyze(self, messages: list[BaseMessage] | None = None,
                      episode: EpisodeRecord | None = None) -> AnalyzerReply:
        t0 = time.perf_counter()
        if episode is None or not episode.steps:
            return AnalyzerReply(error=NO_STEPS)
        return AnalyzerReply(text=self.write(episode), latency_s=time.perf_counter() - t0)

    def write(self, episode: EpisodeRecord) -> str:
        """The skill JSON for one episode (pure and deterministic)."""
        summary, skill = self.summarize(episode)
        if parse_skill(json.dumps({"episode_summary": summary, "episode_skill": skill}))[2] is not None:
            skill = self.fallback_skill
        return json.dumps({"episode_summary": summary, "episode_skill": skill}, ensure_ascii=False)

    @abstractmethod
    def summarize(self, episode: EpisodeRecord) -> tuple[str, str]:
        """(episode summary, skill) for an episode with at least one step."""


def fit_words(sentences: list[str], budget: int = WORD_BUDGET) -> str:
    """The leading sentences that fit in ``budget`` words (at least the first)."""
    out: list[str] = []
    for sentence in sentences:
        if len(" ".join([*out, sentence]).split()) > budget:
            break
        out.append(sentence)
    return " ".join(out or sentences[:1])


def count_of(n: int, noun: str) -> str:
    """'1 step', '3 steps'."""
    return f"{n} {noun}{'s' * (n != 1)}"
