"""Can a hindsight skill move SmolLM2 on the atlas? `skills eval` margins for four analyzers.

SEED's distillation signal is the shift in the policy's log-probability of its own sampled
actions when the episode's skill is put into its prompt (``skills eval``'s docstring). On
TextWorld every analyzer's margin was below zero (docs/results/skill_usefulness.json). This
script asks the same question on the task family the learning curve trains on (atlas level
0, first turn forced, ``bench/learning_curve.py``'s rollout settings), with four analyzers
writing a skill about each of the *same* episodes:

- ``policy``: the base policy itself, greedy under the skill grammar, with the learning
  curve's skill budget: what SEED's hindsight node writes at its first update;
- ``oracle-specific``: a skill that names the call the task needed, with its arguments
  ("Call lookup with place "Malam" and field "area", ..."), read from the task manifest: an
  upper bound of what a skill can say about one episode, and the kind of sentence a 135M
  model can copy;
- ``oracle-generic``: the same workflow without the arguments ("Call lookup with the place
  and the field the question names, ..."): does naming the arguments matter?
- ``episode``: hindsight read off each episode by rule (``EpisodeSkills``, the learning
  curve's ``seed-episode``): a success's own calls as a workflow, a failure's calls as what
  did not answer. Not in the default list (the stored result predates it): ``--analyzers
  episode,oracle-specific --result-name atlas_skills_episode``.
- ``policy-described``, ``policy-workflow``: the policy again, asked with another reply
  example than the paper's ``"string"`` (``skills.answer_format``; a 135M writer copies the
  example): what each value holds, or the skill as a sentence frame with slots. Also printed
  per analyzer: the share of valid skills that open with the paper example's ``string``.
  ``--analyzers policy,policy-described,policy-workflow --no-paired --result-name
  atlas_skills_formats``.

The policy (base SmolLM2, fp32) plays ``--tasks`` training tasks x ``--group`` episodes;
each analyzer writes its skills with ``seed-agents skills collect --from-trajectories``;
``seed-agents skills eval`` re-scores every episode's recorded tokens with and without its
skill (own), and each skill on its whole GRPO group (paired). Printed per analyzer: the
coverage, the mean Delta on successes and on failures, the margin (successes minus
failures: above 0 is the direction SEED needs) with a 95% bootstrap CI over tasks, and
the paired win rate. The result, with every scored episode, goes to
``docs/results/atlas_skills.json``.

    .venv/bin/python bench/atlas_skills.py --no-paired --note "nothing else ran"   # ~15 min on 2 cores
    .venv/bin/python bench/atlas_skills.py --tasks 2 --group 2 --work runs/as-smoke \
        --results-dir runs/as-smoke/results                                # smoke

Resumable: a re-run reuses the episodes and the skills already written (``skills collect``
resumes by construction); only ``skills eval`` runs again.

Its cost is the scoring: every policy call is an fp32 forward of ~500 tokens, twice per
episode and analyzer (with and without the skill), and the paired check adds one per member
of each mixed group. With the former scorer one analyzer's own-skill scoring of 128 episodes
ran over 20 minutes on 2 cores; since the scorer runs a batch's shared prompt tokens once
(``bench/skill_scoring_speed.py``), all three analyzers took 6 minutes (2026-12-03, with
``--no-paired``; playing the episodes 5 minutes, the policy's skills 3).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: bench/ and examples/ are on the path
from bench.results import add_results_args, config_of, now, write_result  # noqa: E402

from langchain_core.language_models.chat_models import BaseChatModel  # noqa: E402
from langchain_core.messages import AIMessage, BaseMessage  # noqa: E402
from langchain_core.outputs import ChatGeneration, ChatResult  # noqa: E402

ANALYZERS = ("policy", "oracle-specific", "oracle-generic", "episode", "policy-described", "policy-workflow")
NOUN = {"population": "population", "area": "area", "founded": "founding year"}


# -- the oracle: a skill from the task manifest ---------------------------------------------


def _questions() -> dict[str, dict[str, Any]]:
    """Every atlas question (both splits, every level) -> its task's data."""
    from examples.atlas_tasks import make_tasks

    return {t.data["question"]: t.data for split in ("train", "heldout") for t in make_tasks(split)}


def oracle_skill(data: dict[str, Any], style: Literal["specific", "generic"]) -> str:
    """The workflow that solves the task: its calls, with their arguments or without."""
    steps = []
    for call in data["calls"]:
        args = call["args"]
        if call["name"] == "lookup":
            steps.append(f'call lookup with place "{args["place"]}" and field "{args["field"]}"' if style == "specific"
                         else "call lookup with the place and the field the question names")
        else:
            steps.append(f'call {call["name"]} with a={args["a"]} and b={args["b"]}' if style == "specific"
                         else f"call {call['name']} with the numbers to combine")
    text = ", then ".join(steps) + ", then give the number it returns as the final answer."
    return text[0].upper() + text[1:]


class _RuleWriter(BaseChatModel):
    """An analyzer answered by a rule: a subclass turns the analyzer prompt's text into the
    reply the analyzer contract asks for (``reply``); LangChain's plumbing is here once."""

    def reply(self, prompt: str) -> dict[str, str]:
        raise NotImplementedError

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        reply = self.reply("\n".join(str(m.content) for m in messages))
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=json.dumps(reply)))])


class OracleSkills(_RuleWriter):
    """A LangChain chat model that answers the analyzer prompt with the task's own solution.

    It finds the atlas question inside the analyzer's prompt (the episode's task is quoted
    there) and replies with the JSON the analyzer contract asks for. It reads no outcome and
    no trajectory: the same skill for every episode of a task, written from the manifest.
    """

    style: Literal["specific", "generic"] = "specific"

    @property
    def _llm_type(self) -> str:
        return f"atlas-oracle-{self.style}"

    def reply(self, prompt: str) -> dict[str, str]:
        found = [(q, d) for q, d in _QUESTIONS.items() if q in prompt]
        if len(found) != 1:
            raise ValueError(f"the analyzer prompt quotes {len(found)} atlas questions, expected 1")
        question, data = found[0]
        return {"episode_summary": f"The task asked: {question}", "episode_skill": oracle_skill(data, self.style)}


_QUESTIONS = _questions()


# -- hindsight read off the episode: what a rule can say without the manifest ---------------

_RESPONSE = re.compile(r"^Response: (.*?)(?=\n\nStep \d+\n|\n\n\[\.\.\. \d+ steps omitted|\Z)", re.DOTALL | re.MULTILINE)


def call_phrase(call: dict[str, Any]) -> str:
    """A parsed call in words: 'lookup with place "Malam" and field "area"'."""
    args = call.get("args") or {}
    return f"{call['name']} with " + " and ".join(f'{k} "{v}"' for k, v in args.items()) if args else call["name"]


GENERIC_SUCCESS = "Look the fact up with the tool first, then give the number it returns as the final answer."
"""``successes: generic``: the same sentence on every success, naming no tool, argument or
answer: a control for distilling on successes at all against the content of the skill."""


def episode_skill(prompt: str, failures: Literal["name", "none"],
                  successes: Literal["calls", "generic"] = "calls") -> str:
    """The skill a rule reads off the analyzer prompt's episode: on a success, the calls it
    made as a workflow (for a lookup task, the oracle's sentence when the call was right);
    on a failure, the calls that did not answer (``name``) or nothing, which the parser
    rejects and counts (``none``); without a call that parsed, that none did."""
    from seed_agents.tool_calls import parse_tool_calls

    success = "- episode_success: success" in prompt
    trajectory = prompt.split("- Interaction trajectory:", 1)[-1]
    calls = [c for r in _RESPONSE.findall(trajectory) for c in parse_tool_calls(r)[1]]
    if success and successes == "generic":
        return GENERIC_SUCCESS
    if success and calls:
        text = ", then ".join(f"call {call_phrase(c)}" for c in calls) + ", then give the number it returns as the final answer."
        return text[0].upper() + text[1:]
    if failures == "none":
        return ""
    if not calls:
        return "The episode made no tool call that parsed."
    return "Calling " + ", then ".join(call_phrase(c) for c in calls) + " did not answer this question."


class EpisodeSkills(_RuleWriter):
    """A LangChain chat model that answers the analyzer prompt with hindsight read off the
    episode it shows (the calls the agent made, the outcome), by rule: no manifest, no
    model. Between the oracle (the task's own call in every skill) and the policy's own
    skills (a 135M writer): what one episode's hindsight can carry when it is written well."""

    failures: Literal["name", "none"] = "name"
    successes: Literal["calls", "generic"] = "calls"

    @property
    def _llm_type(self) -> str:
        return f"atlas-episode-{self.failures}"

    def reply(self, prompt: str) -> dict[str, str]:
        if "- Interaction trajectory:" not in prompt:
            raise ValueError("not an analyzer prompt: no '- Interaction trajectory:' section")
        return {"episode_summary": "Read off the episode by rule.",
                "episode_skill": episode_skill(prompt, self.failures, self.successes)}


# -- the three steps -------------------------------------------------------------------------


def play(args: argparse.Namespace, path: Path) -> None:
    """The base policy plays the training tasks (the learning curve's rollout settings);
    the episodes go to ``path`` as they finish. Skipped when ``path`` holds them all."""
    import torch

    from examples.atlas_tasks import answer_reward, build_agent, make_tasks
    from seed_agents.app.builders import open_chat_model
    from seed_agents.capture import JsonlSink, capture, read_jsonl
    from seed_agents.config.core import BackendConfig, RunnerConfig
    from seed_agents.runner import EpisodeRunner
    from seed_agents.types import SamplingParams, Trajectory

    if path.exists() and len(read_jsonl(path, Trajectory)) == args.tasks * args.group:
        print(f"episodes: reusing {path}", flush=True)
        return
    path.unlink(missing_ok=True)  # a partial file from a killed run: play them all again, seeded
    torch.set_num_threads(args.threads)
    tasks = make_tasks("train", per_level=args.tasks, levels=[0])
    # fp32 as its stored results were: backend.precision defaults to auto (bf16 where the CPU has it)
    llm = open_chat_model(BackendConfig(kind="local", model=args.model, max_batch_size=args.tasks * args.group,
                                        precision="float32"),
                          SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature))
    t0 = time.perf_counter()
    try:
        with JsonlSink(path) as sink:
            runner = EpisodeRunner(build_agent(llm), RunnerConfig(group_size=args.group,
                                                                  concurrency=args.tasks * args.group, progress=False),
                                   reward_fn=answer_reward, sink=sink, seed=args.seed)
            with capture(run="atlas-skills", split="train"):
                asyncio.run(runner.run(tasks))
    finally:
        close = getattr(llm.backend, "close", None)
        if close is not None:
            close()
    print(f"episodes: {args.tasks * args.group} in {time.perf_counter() - t0:.0f}s", flush=True)


def collect_config(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """``skills collect``'s config for one analyzer. ``policy-described``, ``policy-workflow``:
    the policy again, asked with another reply example (``skills.ANSWER_FORMATS``) instead of
    the paper's ``"string"``, which SmolLM2 copies."""
    if name.startswith("policy-"):
        return {"analyzer": {**analyzer_config("policy", args), "name": name}, "answer_format": name.removeprefix("policy-")}
    return {"analyzer": analyzer_config(name, args)}


def copies_example(skills: list[dict[str, Any]]) -> float | None:
    """The share of valid skills that copy the paper's format example: a summary or a skill
    that opens with the word ``string``."""
    valid = [s for s in skills if s["valid"]]
    if not valid:
        return None

    def opens(text: str) -> bool:
        return re.match(r"\s*string\b", text, re.IGNORECASE) is not None
    return sum(opens(s["skill"]) or opens(s.get("summary", "")) for s in valid) / len(valid)


def analyzer_config(name: str, args: argparse.Namespace) -> dict[str, Any]:
    if name == "policy":  # as the hindsight node: greedy, under the skill grammar, the curve's budget
        return {"kind": "policy", "name": "policy", "model": args.model, "max_tokens": args.skill_tokens,
                "max_concurrency": args.tasks * args.group}
    if name == "episode":  # learning_curve's seed-episode: the rule reads each episode's own calls
        return {"kind": "langchain", "name": name, "spec": "bench.atlas_skills:EpisodeSkills",
                "kwargs": {"failures": "name"}}
    return {"kind": "langchain", "name": name, "spec": "bench.atlas_skills:OracleSkills",
            "kwargs": {"style": name.removeprefix("oracle-")}}


def run_cli(argv: Sequence[str], ok: Sequence[int] = (0,)) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    code = subprocess.run([sys.executable, "-m", "seed_agents", *argv], cwd=ROOT, env=env).returncode
    if code not in ok:
        raise SystemExit(f"error: seed-agents {argv[0]} {argv[1]} exited with {code}")


def bootstrap_margin(episodes: list[dict[str, Any]], *, n: int = 2000, seed: int = 0) -> tuple[float, float] | None:
    """95% percentile CI of the margin (mean Delta on successes minus on failures),
    resampling *tasks* with their episodes: the episodes of one task share a question and
    a skill, so they are not independent draws."""
    by_task: dict[str, list[dict[str, Any]]] = {}
    for e in episodes:
        if e["delta"] is not None:
            by_task.setdefault(e["task_id"], []).append(e)
    tasks = sorted(by_task)
    if not tasks:
        return None
    rng = random.Random(seed)

    def draws() -> Iterator[float]:
        for _ in range(n):
            picked = [e for _ in tasks for e in by_task[rng.choice(tasks)]]
            won = [e["delta"] for e in picked if e["success"]]
            lost = [e["delta"] for e in picked if not e["success"]]
            if won and lost:
                yield sum(won) / len(won) - sum(lost) / len(lost)

    values = sorted(draws())
    if len(values) < n // 2:  # most resamples lack one outcome: no interval worth printing
        return None
    return values[int(0.025 * len(values))], values[int(0.975 * len(values)) - 1]


def summarise(usefulness: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per analyzer: coverage, Delta by outcome, the margin with its CI over tasks, the paired win rate."""
    out = {}
    for row in usefulness["rows"]:
        name = row["analyzer"]
        out[name] = {**row, "margin_ci95": bootstrap_margin(usefulness["episodes"].get(name, []))}
    return out


def report(summary: dict[str, dict[str, Any]]) -> str:
    def f(x: Any, spec: str = "+.3f") -> str:
        return "-" if x is None else format(x, spec)

    lines = [f"{'analyzer':<17} {'coverage':>8} {'Delta succ':>10} {'Delta fail':>10} {'margin':>7} "
             f"{'95% CI':>17} {'paired win':>10}"]
    for name, s in summary.items():
        ci = s["margin_ci95"]
        lines.append(f"{name:<17} {f(s.get('coverage'), '.2f'):>8} {f(s.get('delta_success')):>10} "
                     f"{f(s.get('delta_failure')):>10} {f(s.get('margin')):>7} "
                     f"{('[' + f(ci[0]) + ', ' + f(ci[1]) + ']') if ci else '-':>17} "
                     f"{f(s.get('paired_win_rate'), '.2f'):>10}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--tasks", type=int, default=16, help="Atlas level-0 training tasks (the curve's first ones).")
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--temperature", type=float, default=0.5, help="The learning curve's training temperature.")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--skill-tokens", type=int, default=64, help="The policy analyzer's budget (the curve's).")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--work", type=Path, default=ROOT / "runs" / "atlas_skills")
    p.add_argument("--analyzers", default=",".join(ANALYZERS[:3]), help=f"Comma list of {', '.join(ANALYZERS)}.")
    p.add_argument("--paired", action=argparse.BooleanOptionalAction, default=True,
                   help="Also score each skill on its whole group (costs most of the scoring time).")
    p.add_argument("--note", default="", help="What else ran on the machine.")
    p.add_argument("--result-name", default="atlas_skills")
    add_results_args(p)
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    names = [n for n in args.analyzers.split(",") if n]
    if not names or set(names) - set(ANALYZERS):
        p.error(f"--analyzers: a comma list of {', '.join(ANALYZERS)}")
    started_at, t0 = now(), time.perf_counter()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    episodes = work / "episodes.jsonl"
    play(args, episodes)
    walls = {"play_s": time.perf_counter() - t0}
    for name in names:
        t = time.perf_counter()
        cfg = work / f"{name}.json"
        cfg.write_text(json.dumps(collect_config(name, args)))
        # exit 1: some requests failed (a re-run retries them); the table counts what parsed
        run_cli(["skills", "collect", "--config", str(cfg), "--from-trajectories", str(episodes),
                 "--out", str(work / name)], ok=(0, 1))
        walls[f"{name}_s"] = time.perf_counter() - t
    t = time.perf_counter()
    run_cli(["skills", "eval", "--model", args.model, "--trajectories", str(episodes),
             "--examples", *(str(work / n / "examples.jsonl") for n in names), "--out", str(work / "eval"),
             "--paired" if args.paired else "--no-paired"])
    walls["eval_s"] = time.perf_counter() - t
    usefulness = json.loads((work / "eval" / "usefulness.json").read_text())
    summary = summarise(usefulness)
    print(report(summary))
    examples = {n: [json.loads(line) for line in (work / n / "examples.jsonl").read_text().splitlines() if line]
                for n in names}
    skills = {n: [{"task_id": e["task_id"], "success": e["success"], "valid": e["valid"], "skill": e["skill"],
                   "summary": e["summary"]}
                  for e in sorted(ex, key=lambda e: (e["task_id"], e["trajectory_id"]))] for n, ex in examples.items()}
    from bench.learning_curve import skill_names
    from examples.atlas_tasks import make_tasks

    by_id = {t.task_id: t.data for t in make_tasks("train", per_level=args.tasks, levels=[0])}
    for n in names:  # what each analyzer's valid skills name about their task (the tool, its arguments, the answer)
        summary[n]["names"] = skill_names(skills[n], by_id)
        summary[n]["copies_example"] = copies_example(skills[n])
        if summary[n]["names"]:
            print(f"{n}: of {summary[n]['names']['valid']:.0f} valid skills, {summary[n]['names']['names_tool']:.2f} "
                  f"name the tool, {summary[n]['names']['names_args']:.2f} every argument, "
                  f"{summary[n]['names']['names_answer']:.2f} the answer, "
                  f"{summary[n]['copies_example']:.2f} open with the format example's \"string\"")
    write_result(args.result_name, {**config_of(args), "level": 0, "first_turn": "forced"},
                 {"summary": summary, "episodes": usefulness.get("episodes"), "pairs": usefulness.get("pairs"),
                  "counts": usefulness.get("counts"), "skills": skills, "wall_s": walls,
                  "total_wall_s": time.perf_counter() - t0},
                 paper={"model": "Qwen2.5-3B-Instruct"}, labels={"model": "base model"},
                 started_at=started_at, results_dir=args.results_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
