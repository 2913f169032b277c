"""Skill and tool-call parse rates with and without constrained decoding, on the same
prompts and episodes, and the logprob gap the grammar mask opens.

Usage (SmolLM2-135M on the local backend; ~10 min on 2 busy cores at the defaults):

    python scripts/constrained_parse_rates.py --tasks 8 --out constrained_parse_rates.json

Tool calls: the first turn of the calculator agent's prompt for each task (the tools
bound, ``--tool-choice`` auto or any, T=0.7, one seed per task), unconstrained then constrained.
Parse rate = calls whose ``<tool_call>`` blocks all parse and name a bound tool, over the
calls that open one. Skills: each task's unconstrained first turn is the episode the
analyzer (the same model, greedy) writes a skill about, unconstrained then constrained;
parse rate = ``Skill.valid``. Logprob gap (per sampled token of the constrained calls):
reported (masked) logprob minus the unconstrained distribution's logprob of the same
token, which the trainer recomputes; the share above -log(1 - 0.2) is where the PPO ratio
starts outside the clip range.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import time
from typing import Any

from langchain_core.messages import HumanMessage

from seed_agents.backends.local import LocalBackend
from seed_agents.capture import capture
from seed_agents.chat_model import SeedChatModel
from seed_agents.graphs.calculator import TOOLS, calculator_tasks
from seed_agents.graphs.hindsight import write_skill
from seed_agents.types import LLMCall


def tool_round(llm: SeedChatModel, questions: list[str], seed: int, choice: str | None) -> tuple[list[LLMCall], list[Any]]:
    bound = llm.bind_tools(TOOLS, tool_choice=choice)
    with capture() as scope:
        replies = [bound.invoke([HumanMessage(q)], seed=seed + i) for i, q in enumerate(questions)]
    return scope.calls, replies


def tool_stats(replies: list[Any], calls: list[LLMCall]) -> dict[str, Any]:
    names = {t.name for t in TOOLS}
    # a forced call's "<tool_call>" is in the prompt (the prefill), not in the sampled text
    opened = [r for r, c in zip(replies, calls, strict=True)
              if "<tool_call>" in c.text or "<tool_call>" in str(c.messages[-1].get("content", ""))]
    parsed = [r for r in opened if r.tool_calls and not r.invalid_tool_calls and {t["name"] for t in r.tool_calls} <= names]
    return {"calls": len(calls), "opened_a_tool_call": len(opened), "parsed": len(parsed),
            "parse_rate": len(parsed) / len(opened) if opened else None,
            "latency_s": sum(c.latency_s for c in calls), "tokens": sum(len(c.completion_ids) for c in calls)}


def gaps(backend: LocalBackend, calls: list[LLMCall]) -> list[float]:
    out = []
    for c in calls:
        raw = backend.score(c.prompt_ids, c.completion_ids)
        out += [m - r for m, r in zip(c.logprobs, raw, strict=True)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-tokens", type=int, default=64, help="policy turn budget")
    ap.add_argument("--analyzer-tokens", type=int, default=320)
    ap.add_argument("--tool-choice", default=None, help="None (auto: the model chooses) or any (a forced call)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    backend = LocalBackend(args.model)
    base = SeedChatModel(backend=backend, tokenizer=backend.tokenizer, temperature=0.7, max_tokens=args.max_tokens)
    questions = [t.data["question"] for t in calculator_tasks(args.tasks, seed=args.seed)]
    result: dict[str, Any] = {"model": args.model, "tasks": args.tasks, "tool_choice": args.tool_choice}

    t0 = time.perf_counter()
    free_calls, free = tool_round(base.model_copy(update={"constrain_tool_calls": False}), questions, args.seed,
                                  args.tool_choice)
    t1 = time.perf_counter()
    cons_calls, cons = tool_round(base, questions, args.seed, args.tool_choice)
    t2 = time.perf_counter()
    result["tool_calls"] = {"unconstrained": tool_stats(free, free_calls), "constrained": tool_stats(cons, cons_calls),
                            "wall_s": {"unconstrained": t1 - t0, "constrained": t2 - t1}}

    async def skills(constrained: bool) -> list[Any]:
        return [await write_skill(base, [c], q, False, max_tokens=args.analyzer_tokens, constrained=constrained)
                for c, q in zip(free_calls, questions, strict=True)]

    skill_calls = {}
    wall = {}
    written = {}
    for constrained in (False, True):
        t = time.perf_counter()
        with capture() as scope:
            written[constrained] = asyncio.run(skills(constrained))
        wall[constrained] = time.perf_counter() - t
        skill_calls[constrained] = scope.calls
    result["skills"] = {
        name: {"episodes": len(written[k]), "valid": sum(s.valid for s in written[k]),
               "parse_rate": sum(s.valid for s in written[k]) / len(written[k]),
               "reject_reasons": sorted({(s.reject_reason or "")[:60] for s in written[k] if not s.valid}),
               "tokens": sum(len(c.completion_ids) for c in skill_calls[k]), "wall_s": wall[k],
               "examples": [s.raw[:300] for s in written[k][:2]]}
        for name, k in (("unconstrained", False), ("constrained", True))}

    clip = -math.log(1 - 0.2)
    for name, calls in (("tool_calls", cons_calls), ("skills", skill_calls[True])):
        g = gaps(backend, calls)
        result[f"logprob_gap_{name}"] = {
            "tokens": len(g), "mean": statistics.fmean(g) if g else None, "max": max(g, default=None),
            "share_over_0.01": sum(x > 0.01 for x in g) / len(g) if g else None,
            "share_outside_clip_at_step_1": sum(x > clip for x in g) / len(g) if g else None,
        }
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
