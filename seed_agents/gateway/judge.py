"""An LLM judge that scores sessions of one task against each other (group-relative).

GRPO needs rewards that rank the samples of one group; an absolute 0-10 grade from an
LLM is noisy across calls, while "which of these attempts at the same task went best"
is what a judge does well (OpenPipe ART's RULER makes the same bet). So the judge sees
every ended, unjudged, unflagged session of one task key at once, labelled A, B, C...,
and returns a score in [0, 1] per label. Each session's reward is stored with source
``"judge"``; its comment holds the whole prompt and the raw reply, so a score can always
be audited. A reply that does not parse (or misses a label, or leaves [0, 1]) stores
nothing and says so in ``JudgeResult.error``.

Any OpenAI-compatible endpoint works; the ``openai`` SDK does the retries (exponential
backoff on connection errors, 408/409/429 and 5xx). Its key comes from the environment
variable NAMED ``api_key_env``; it is never stored or logged.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from seed_agents.gateway.config import JudgeConfig

if TYPE_CHECKING:
    import openai

    from seed_agents.store import SessionRecord, TraceStore
    from seed_agents.types import LLMCall

log = logging.getLogger("seed_agents.gateway")

JUDGE_SOURCE = "judge"


@dataclass
class JudgeResult:
    """One judge call: who was compared, the scores (empty when unusable) and why."""

    task_key: str
    session_ids: list[str]
    scores: dict[str, float] = field(default_factory=dict)  # session id -> score
    prompt: str = ""
    raw: str = ""
    error: str | None = None
    reward_ids: list[int] = field(default_factory=list)


class LLMJudge:
    """Scores a task key's ended sessions relative to each other and stores the rewards."""

    def __init__(self, cfg: JudgeConfig, *, client: openai.OpenAI | None = None, redact: Callable[[str], str] = lambda s: s) -> None:
        self.cfg = cfg
        self.redact = redact
        self._client = client

    def client(self) -> openai.OpenAI:
        if self._client is None:
            import openai

            base = self.cfg.base_url.rstrip("/")
            self._client = openai.OpenAI(
                base_url=base if base.endswith("/v1") else base + "/v1",
                api_key=os.environ.get(self.cfg.api_key_env) or "unused",
                max_retries=self.cfg.max_retries, timeout=self.cfg.timeout_s,
            )
        return self._client

    def candidates(self, store: TraceStore, task_key: str) -> list[SessionRecord]:
        """Ended sessions of ``task_key`` that may train and carry no judge reward yet."""
        out = []
        for s in store.sessions(ended=True, task_key=task_key):
            if s.flagged_reason or s.consumed_by or s.num_calls == 0:
                continue
            if any(r.source == JUDGE_SOURCE for r in store.rewards(s.session_id)):
                continue
            out.append(s)
        out.sort(key=lambda s: s.created_at)
        return out[: self.cfg.max_group_size]

    def judge(self, store: TraceStore, task_key: str) -> JudgeResult:
        """Judge the current candidates of ``task_key``; store one reward per session."""
        group = self.candidates(store, task_key)
        ids = [s.session_id for s in group]
        if len(group) < self.cfg.min_group_size:
            return JudgeResult(task_key, ids, error=f"{len(group)} candidate session(s); the judge needs at least {self.cfg.min_group_size}")
        labels = list(string.ascii_uppercase[: len(group)])
        prompt = self.build_prompt(task_key, labels, [store.calls(sid) for sid in ids])
        result = JudgeResult(task_key, ids, prompt=prompt)
        raw = self._ask(prompt, result)
        if raw is None:
            return result
        result.raw = raw
        by_label = parse_scores(raw, labels)
        if by_label is None:
            result.error = "the judge's reply is not the expected JSON (a score in [0, 1] for every label); nothing stored"
            log.warning("judge reply for task %s unparsable; nothing stored", task_key)
            return result
        result.scores = {sid: by_label[lab] for sid, lab in zip(ids, labels, strict=True)}
        for sid, lab in zip(ids, labels, strict=True):
            comment = json.dumps({"judge": self.cfg.model, "task_key": task_key, "group": ids, "label": lab,
                                  "prompt": self.redact(prompt), "reply": self.redact(raw)}, ensure_ascii=False)
            result.reward_ids.append(store.add_reward(sid, result.scores[sid], source=JUDGE_SOURCE, comment=comment))
        return result

    def build_prompt(self, task_key: str, labels: Sequence[str], calls_per_session: Sequence[Sequence[LLMCall]]) -> str:
        blocks = [f"Task: {task_key}", f"{len(labels)} attempts follow."]
        for label, calls in zip(labels, calls_per_session, strict=True):
            blocks.append(f"=== Attempt {label} ===\n{self._transcript(calls)}\n=== End of attempt {label} ===")
        blocks.append(f"Score attempts {', '.join(labels)}.")
        return "\n\n".join(blocks)

    def _transcript(self, calls: Sequence[LLMCall]) -> str:
        """The last call's conversation plus its completion: the whole session as the agent saw it."""
        if not calls:
            return "(no calls)"
        last = calls[-1]
        lines = [f"[{m.get('role', '?')}] {_text_of(m)}" for m in last.messages if m.get("role") != "system"]
        lines.append(f"[assistant] {last.text}")
        text = "\n".join(lines)
        n = self.cfg.max_session_chars
        return text if len(text) <= n else text[: n // 2] + "\n[...]\n" + text[-n // 2:]

    def _ask(self, prompt: str, result: JudgeResult) -> str | None:
        import openai

        try:
            reply = self.client().chat.completions.create(
                model=self.cfg.model, temperature=self.cfg.temperature,
                messages=[{"role": "system", "content": self.cfg.instructions}, {"role": "user", "content": prompt}],
            )
        except openai.APIError as e:
            result.error = f"judge endpoint failed: {type(e).__name__}: {str(e)[:200]}"
            log.warning("judge for task %s failed: %s", result.task_key, result.error)
            return None
        content = reply.choices[0].message.content if reply.choices else None
        return content or ""


def _text_of(message: dict[str, Any]) -> str:
    content = message.get("content")
    text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    calls = message.get("tool_calls")
    return text + (" " + json.dumps(calls, ensure_ascii=False) if calls else "")


_JSON_OBJECT = re.compile(r"\{.*\}", re.DOTALL)


def parse_scores(raw: str, labels: Sequence[str]) -> dict[str, float] | None:
    """``{"scores": {label: float}}`` somewhere in ``raw`` -> scores, or None when any
    label is missing, a value is not a finite number in [0, 1], or there is no JSON."""
    match = _JSON_OBJECT.search(raw)
    if match is None:
        return None
    try:
        data = json.loads(match.group(0))
    except ValueError:
        return None
    scores = data.get("scores") if isinstance(data, dict) else None
    if not isinstance(scores, dict):
        return None
    out: dict[str, float] = {}
    for label in labels:
        v = scores.get(label)
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or not 0.0 <= v <= 1.0:
            return None
        out[label] = float(v)
    return out
